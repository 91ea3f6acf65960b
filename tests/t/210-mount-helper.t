#!/bin/bash
# mount.fuse.ckptfs: the form mount(8) and fstab use, with fstab-only options filtered out.
n=0; fail=0
ok() { n=$((n + 1)); if [ "$1" = 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; fail=1; fi; }
root=$(dirname "$(realpath "$0")")/../..
export CKPTFS=${CKPTFS:-$root/build/ckptfs}
helper=$root/mount-helpers/mount.fuse.ckptfs
if [ ! -e /dev/fuse ] || [ ! -d "${FIXTURES:-}/dtypes" ]; then echo "1..0 # SKIP no /dev/fuse or FIXTURES"; exit 0; fi
tmp=$(mktemp -d); mnt=$tmp/mnt; mkdir "$mnt"
trap 'mountpoint -q "$mnt" && fusermount3 -u "$mnt"; rm -rf "$tmp"' EXIT
src=$FIXTURES/dtypes/model.safetensors

timeout 20 "$helper" "$src" "$mnt" -o rw,noauto,nofail,_netdev,x-systemd.automount,readahead_kb=512,nodev,nosuid
ok $? "helper mounts with fstab-style options"
grep -q " $mnt fuse.ckptfs ro," /proc/mounts; ok $? "mounted read-only as fuse.ckptfs"
[ -f "$mnt/.ckptfs/summary.json" ]; ok $? "tree is there"
fusermount3 -u "$mnt"; ok $? "unmounted"
timeout 20 "$helper" "$src" "$mnt" -obogus_option 2>"$tmp/err"
[ $? = 1 ]; ok $? "unknown options still reach ckptfs and fail with status 1"
timeout 20 "$helper" "$src" 2>/dev/null
[ $? = 1 ]; ok $? "missing mount point: usage error"
echo "1..$n"
exit $fail
