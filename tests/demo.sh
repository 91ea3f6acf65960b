#!/bin/bash
# make demo: write a tiny sharded Hugging Face checkpoint, mount it, look around, unmount.
set -euo pipefail
CKPTFS=$(realpath "${1:-build/ckptfs}")
here=$(dirname "$(realpath "$0")")
work=$(mktemp -d /tmp/ckptfs-demo.XXXXXX)
mnt="$work/mnt"
mkdir -p "$mnt"
cleanup() {
    if mountpoint -q "$mnt" 2>/dev/null; then fusermount3 -u "$mnt" || umount -l "$mnt" || true; fi
    rm -rf "$work"
}
trap cleanup EXIT
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "A sample checkpoint: two safetensors shards + index + config (tests/gen/sample_model.py)"
/usr/bin/python3 "$here/gen/sample_model.py" "$work/tiny-llama"
ls -l "$work/tiny-llama"

step "ckptfs $work/tiny-llama $mnt"
"$CKPTFS" "$work/tiny-llama" "$mnt"
grep " $mnt " /proc/mounts

step "The tree (both shards as one model)"
(cd "$mnt" && find . -path ./.ckptfs -prune -o -print | sort | head -40)
echo "..."
(cd "$mnt" && ls .ckptfs .ckptfs/hf)

step "A sidecar: model/layers/0/self_attn/q_proj/weight.json"
cat "$mnt/model/layers/0/self_attn/q_proj/weight.json"

step "First values of that tensor (raw little-endian float32)"
od -A d -t f4 -N 32 "$mnt/model/layers/0/self_attn/q_proj/weight"

step "Its bytes equal the source range the sidecar names"
side="$mnt/model/layers/0/self_attn/q_proj/weight.json"
read -r file offset length < <(/usr/bin/python3 -c '
import json, sys
s = json.load(open(sys.argv[1]))["sources"][0]
print(s["file"], s["offset"], s["length"])' "$side")
if cmp <(tail -c "+$((offset + 1))" "$work/tiny-llama/$file" | head -c "$length") \
       "$mnt/model/layers/0/self_attn/q_proj/weight"; then
    echo "identical: $length bytes at offset $offset of $file"
else
    echo "MISMATCH" >&2
    exit 1
fi

step "grep-able table of every tensor (.ckptfs/tensors.tsv)"
head -5 "$mnt/.ckptfs/tensors.tsv"
step "Summary"
head -20 "$mnt/.ckptfs/summary.json"

step "Read-only: writes fail"
if touch "$mnt/new" 2>/dev/null; then echo "unexpectedly writable" >&2; exit 1; fi
echo "touch: $(touch "$mnt/new" 2>&1 | sed 's/.*: //')"

step "fusermount3 -u $mnt"
fusermount3 -u "$mnt"
echo "unmounted; demo done"
