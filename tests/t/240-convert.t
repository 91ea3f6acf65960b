#!/bin/bash
# ckptfs convert: every tensor lands in OUT with the same bytes (checked by verify against the
# fixture manifests), tensors a format cannot hold are refused by name, and a refused or
# failed conversion leaves neither OUT nor a temporary file.
n=0; fail=0
ok() { n=$((n + 1)); if [ "$1" = 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; fail=1; fi; }
root=$(cd "$(dirname "$(realpath "$0")")/../.." && pwd)
CKPTFS=${CKPTFS:-$root/build/ckptfs}
if [ ! -d "${FIXTURES:-}/sharded" ]; then echo "1..0 # SKIP no FIXTURES"; exit 0; fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

convert_and_verify() { # SOURCE MANIFEST OUT DESCRIPTION [ARGS]
    local src=$1 manifest=$2 out=$3 desc=$4; shift 4
    "$CKPTFS" convert "$src" "$out" "$@" 2>"$tmp/err"
    ok $? "$desc: convert exits 0"
    "$CKPTFS" verify "$out" --manifest "$manifest" >"$tmp/verify" 2>&1
    ok $? "$desc: every tensor byte-identical ($(tail -2 "$tmp/verify" | head -1))"
}

convert_and_verify "$FIXTURES/sharded" "$FIXTURES/sharded/manifest.json" "$tmp/a.safetensors" \
    "HF shards -> .safetensors"
convert_and_verify "$FIXTURES/dtypes/model.safetensors" "$FIXTURES/dtypes/manifest.json" \
    "$tmp/hfdir" "every dtype -> HF directory with 100-byte shards" --max-shard-size 100
[ -f "$tmp/hfdir/model.safetensors.index.json" ] && [ "$(ls "$tmp"/hfdir/model-*.safetensors | wc -l)" -gt 1 ]
ok $? "HF directory: several shards and an index"
convert_and_verify "$FIXTURES/sharded" "$FIXTURES/sharded/manifest.json" "$tmp/b.gguf" \
    "HF shards -> .gguf (names as they are)" --profile container
convert_and_verify "$FIXTURES/gguf/v3/model.gguf" "$FIXTURES/gguf/v3/manifest.json" \
    "$tmp/c.gguf" "GGUF with block types -> .gguf"
convert_and_verify "$FIXTURES/sharded" "$FIXTURES/sharded/manifest.json" "$tmp/d.bpk" \
    "HF shards -> .bpk"
convert_and_verify "$FIXTURES/dcphf/dim1x4" "$FIXTURES/dcphf/dim1x4/manifest.json" \
    "$tmp/e.safetensors" "DCP shards assembled -> .safetensors"

"$CKPTFS" convert "$FIXTURES/gguf/v3/model.gguf" "$tmp/f.safetensors" 2>"$tmp/err"
st=$?
[ $st = 2 ] && grep -q 'Q[0-9]' "$tmp/err" && [ "$(wc -l < "$tmp/err")" = 1 ]
ok $? "GGUF block types -> .safetensors refused with one line naming the tensor (exit $st)"
[ ! -e "$tmp/f.safetensors" ] && [ -z "$(ls -A "$tmp" | grep partial)" ]
ok $? "refused: no OUT and no temporary file"
"$CKPTFS" convert "$FIXTURES/sharded" "$tmp/x.unknown" 2>"$tmp/err"
[ $? = 2 ] && grep -q "output format" "$tmp/err"; ok $? "unknown OUT extension says which names work"
"$CKPTFS" convert "$FIXTURES/sharded" 2>/dev/null; [ $? = 1 ]; ok $? "missing OUT: usage error"
"$CKPTFS" convert "$FIXTURES/sharded" "$tmp/y" --max-shard-size nope 2>/dev/null
[ $? = 1 ]; ok $? "bad --max-shard-size: usage error"
# A read-only destination. Root writes through mode bits, so as root the directory is a
# tmpfs mounted read-only in a private mount namespace (gone when the command ends).
mkdir "$tmp/ro" && chmod 555 "$tmp/ro"
ro_convert() {
    "$CKPTFS" convert "$FIXTURES/sharded" "$tmp/ro/z.safetensors" 2>"$tmp/err"
    echo "exit $?: $(head -1 "$tmp/err")"
}
if [ "$(id -u)" != 0 ]; then
    how="mode 555"; got=$(ro_convert)
elif unshare -m --propagation private true 2>/dev/null; then
    how="read-only tmpfs"
    got=$(tmp=$tmp CKPTFS=$CKPTFS FIXTURES=$FIXTURES unshare -m --propagation private bash -c \
          'mount -t tmpfs -o ro tmpfs "$1" || exit 99; '"$(declare -f ro_convert)"'; ro_convert' \
          _ "$tmp/ro" 2>&1)
else
    how=""
fi
if [ -n "$how" ]; then
    case $got in "exit 4: "*"$tmp/ro"*) r=0 ;; *) r=1 ;; esac
    ok $r "read-only destination ($how): exit 4, one line naming it [$got]"
else
    echo "ok $((n += 1)) - read-only destination # SKIP root without unshare -m: no way to make a directory root cannot write"
fi
echo "1..$n"
exit $fail
