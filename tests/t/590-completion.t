#!/bin/bash
# bash completion (mount-helpers/ckptfs.bash-completion) driven the way bash drives it, with
# bash-completion's own library: subcommands, each subcommand's flags as its --help lists them,
# -o option names as `ckptfs --help` lists them (after a comma and in the -oOPTS form too).
n=0; fail=0
ok() { n=$((n + 1)); if [ "$1" = 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; fail=1; fi; }
root=$(cd "$(dirname "$(realpath "$0")")/../.." && pwd)
CKPTFS=${CKPTFS:-$root/build/ckptfs}
lib=/usr/share/bash-completion/bash_completion
if [ ! -r "$lib" ]; then echo "1..0 # SKIP bash-completion is not installed (make deps)"; exit 0; fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# The completion asks the binary for its commands (`ckptfs help --commands`): this ckptfs first.
mkdir "$tmp/bin" && ln -s "$CKPTFS" "$tmp/bin/ckptfs" && export PATH="$tmp/bin:$PATH"

# complete WORDS...: the candidates for the last word, one per line, sorted.
complete_words() {
    bash --norc --noprofile -c '
        source "$1" >/dev/null 2>&1; source "$2"; shift 2
        compopt() { :; } # only valid while bash itself runs a completion
        COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1))
        COMP_LINE="$*"; COMP_POINT=${#COMP_LINE}
        cd "$3" 2>/dev/null
        _ckptfs ckptfs "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"
        printf "%s\n" "${COMPREPLY[@]}"' _ "$lib" "$root/mount-helpers/ckptfs.bash-completion" "$@" |
        sort
}
has() { grep -qxF -- "$2" <<<"$1"; }

out=$(complete_words ckptfs ve)
[ "$out" = verify ]; ok $? "subcommand name: ve -> verify ($out)"
# Every subcommand `ckptfs help` lists is offered.
cmds=$("$CKPTFS" help | sed -n '/^  [a-z]/s/^  \([a-z]*\) .*/\1/p')
offered=$(complete_words ckptfs "")
missing=""
for c in $cmds; do has "$offered" "$c" || missing="$missing $c"; done
[ -n "$cmds" ] && [ -z "$missing" ]; ok $? "every subcommand of ckptfs help is offered (missing:$missing)"
# ... and exactly the table's commands, stage, commit and umount among them.
mkdir "$tmp/empty"
table=$(cd "$tmp/empty" && complete_words ckptfs "" | grep -vxF -e "" | tr '\n' ' ')
want=$(printf '%s\n' ls info cat verify convert stats diff serve stage commit umount help | sort | tr '\n' ' ')
[ "$table" = "$want" ]; ok $? "the offered commands are the table's ($table)"

# Every flag a subcommand's --help lists is offered after `ckptfs CMD -`.
for cmd in ls info cat verify convert stats diff stage serve; do
    # The flag column of the help: lines that start with spaces and a dash, up to two spaces.
    flags=$("$CKPTFS" "$cmd" --help 2>&1 | grep -E '^ +-' | sed -E 's/^ +//; s/  .*//' |
            grep -oE '(^|, )--?[a-z][a-z-]*' | sed 's/^, //' | sort -u)
    offered=$(complete_words ckptfs "$cmd" -)
    missing=""
    for f in $flags; do has "$offered" "$f" || missing="$missing $f"; done
    [ -n "$flags" ] && [ -z "$missing" ]; ok $? "ckptfs $cmd -<TAB> offers every flag of its --help (missing:$missing)"
done
out=$(complete_words ckptfs verify --wr)
[ "$out" = --write-manifest ]; ok $? "verify --wr -> --write-manifest ($out)"

# -o option names: every one `ckptfs --help` lists under Options.
names=$("$CKPTFS" --help | sed -n '/^Options (-o):/,/^$/p' | grep -E '^  [a-z]' |
        grep -v '^  and ' | sed -E 's/^ +//; s/  .*//' | grep -oE '(^|, )[a-z0-9_]+=?' |
        sed 's/^, //' | sort -u)
offered=$(complete_words ckptfs src mnt -o "")
missing=""
for o in $names; do
    grep -q "^$o" <<<"$offered" || missing="$missing $o"
done
[ -n "$names" ] && [ -z "$missing" ]; ok $? "ckptfs SRC MNT -o <TAB> offers every option of --help (missing:$missing)"
out=$(complete_words ckptfs src mnt -o rea)
[ "$out" = readahead_kb= ]; ok $? "-o rea -> readahead_kb= ($out)"
out=$(complete_words ckptfs src mnt -o view=hf,max_t)
[ "$out" = view=hf,max_threads= ]; ok $? "after a comma: view=hf,max_t -> view=hf,max_threads= ($out)"
out=$(complete_words ckptfs src mnt -onos)
[ "$out" = -onosplice ]; ok $? "-oOPTS form: -onos -> -onosplice ($out)"
out=$(complete_words ckptfs src mnt -o npy,view=)
[ "$(echo $out)" = "npy,view=hf npy,view=tree" ]; ok $? "view= values after a comma ($(echo $out))"
out=$(complete_words ckptfs verify -o t)
[ "$out" = tp_split= ]; ok $? "subcommands' -o: tp_split= ($out)"
out=$(complete_words ckptfs src mnt -o s3_)
[ "$(echo $out)" = "s3_addressing= s3_endpoint= s3_region=" ]; ok $? "remote -o options: s3_ ($(echo $out))"
out=$(complete_words ckptfs ls src -o cache_)
[ "$(echo $out)" = "cache_dir= cache_ram= cache_size=" ]; ok $? "subcommands' remote -o options: cache_ ($(echo $out))"
out=$(complete_words ckptfs src mnt -o s3_addressing=)
[ "$(echo $out)" = "s3_addressing=path s3_addressing=virtual" ]; ok $? "s3_addressing= values ($(echo $out))"
out=$(complete_words ckptfs diff a b --map me)
[ "$out" = meta-to-hf ]; ok $? "--map me -> meta-to-hf ($out)"
out=$(complete_words ckptfs stats src -)
has "$out" -q; ok $? "stats -<TAB> offers -q"
out=$(complete_words ckptfs stage out mnt -o no)
[ "$out" = nocommit ]; ok $? "stage -o: nocommit ($out)"
touch "$tmp/m.json"
out=$(complete_words ckptfs verify src --manifest "$tmp/m.js")
[ "$out" = "$tmp/m.json" ]; ok $? "--manifest completes file names ($out)"
echo "1..$n"
exit $fail
