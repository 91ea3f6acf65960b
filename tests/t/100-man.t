#!/bin/bash
# Man pages lint clean and document every option that --help lists.
n=0; fail=0
ok() { n=$((n + 1)); if [ "$1" = 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; fail=1; fi; }
root=$(dirname "$(realpath "$0")")/../..
CKPTFS=${CKPTFS:-$root/build/ckptfs}
for page in "$root"/man/*.[1-8]; do
    out=$(mandoc -T lint -W warning "$page" 2>&1)
    ok $? "mandoc -T lint $(basename "$page")"
    [ -n "$out" ] && echo "$out" | sed 's/^/#   /'
done
help=$("$CKPTFS" --help)
ok $? "ckptfs --help exits 0"
lines=$(printf '%s\n' "$help" | wc -l)
[ "$lines" -le 24 ]; ok $? "--help fits a 24-line screen ($lines lines)"
# The -o names of --help: the first column of the Options lines ("splice, nosplice",
# "max_threads=N") and the "also spool=DIR, nocommit, ..." list of the staging line.
opts=$(printf '%s\n' "$help" | sed -n '/^Options (-o):/,/^$/p' |
       sed -nE 's/^  ([a-z0-9_]+(=[A-Za-z0-9:_]+)?(, [a-z0-9_]+(=[A-Za-z0-9:_]+)?)*)( {2,}.*|$)/\1/p;
                s/^ +also (.*)$/\1/p' | grep -oE '(^|, )[a-z0-9_]+' | tr -d ' ,' | sort -u)
[ "$(printf '%s\n' $opts | wc -l)" -ge 22 ]; ok $? "--help lists the -o options ($(echo $opts))"
# Each must be documented as an option: a whole word (so "splice" is not found inside
# "nosplice", nor "view" inside "overview") on a bold font line, as the OPTIONS entries are.
for opt in $opts; do
    grep -qE "^\.(B|BI|BR|RB)( |.*[ \"(])$opt([^a-z_0-9]|\$)" "$root/man/ckptfs.1"
    ok $? "option $opt is in ckptfs(1) (whole word, bold)"
done
# Every command of the table (`ckptfs help --commands`) has its entry in ckptfs(1), and the
# man page documents no command the binary lacks.
cmds=$("$CKPTFS" help --commands)
[ -n "$cmds" ]; ok $? "ckptfs help --commands lists the commands ($(echo $cmds))"
for c in $cmds; do
    grep -qE "^\.BR? \"?ckptfs $c( |\"|\$)" "$root/man/ckptfs.1"
    ok $? "command $c has an entry in ckptfs(1)"
done
documented=$(sed -nE 's/^\.BR? "?ckptfs ([a-z]+)( |"|$).*/\1/p' "$root/man/ckptfs.1" | sort -u)
extra=$(comm -23 <(printf '%s\n' $documented) <(printf '%s\n' $cmds | sort))
[ -z "$extra" ]; ok $? "ckptfs(1) names no command the table lacks (extra: $(echo $extra))"
echo "1..$n"
exit $fail
