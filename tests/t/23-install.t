#!/bin/bash
# make install / uninstall into a DESTDIR; as root, `mount -t fuse.ckptfs` through the installed
# helper and an fstab line (mount -T with a private fstab, so /etc/fstab is untouched).
n=0; fail=0
ok() { n=$((n + 1)); if [ "$1" = 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; fail=1; fi; }
root=$(cd "$(dirname "$(realpath "$0")")/../.." && pwd)
CKPTFS=${CKPTFS:-$root/build/ckptfs}
B=$(dirname "$CKPTFS")
tmp=$(mktemp -d)
mnt=$tmp/mnt
mkdir -p "$mnt"
helper_installed=""
cleanup() {
    mountpoint -q "$mnt" && fusermount3 -u "$mnt"
    [ -n "$helper_installed" ] && rm -f /sbin/mount.fuse.ckptfs
    rm -rf "$tmp"
}
trap cleanup EXIT

dest=$tmp/dest
make -s -C "$root" install B="$B" DESTDIR="$dest" PREFIX=/usr MOUNTHELPERDIR=/usr/sbin >/dev/null
ok $? "make install DESTDIR=... PREFIX=/usr"
for f in usr/bin/ckptfs usr/sbin/mount.fuse.ckptfs usr/share/man/man1/ckptfs.1 \
         usr/share/man/man5/ckptfs.5 usr/share/man/man8/mount.fuse.ckptfs.8 \
         usr/share/bash-completion/completions/ckptfs; do
    [ -e "$dest/$f" ]; ok $? "installed /$f"
done
"$dest/usr/bin/ckptfs" --version | grep -q '^ckptfs '; ok $? "installed binary runs"
grep -q '^CKPTFS=${CKPTFS:-/usr/bin/ckptfs}' "$dest/usr/sbin/mount.fuse.ckptfs"
ok $? "installed helper runs /usr/bin/ckptfs by default"
bash -n "$dest/usr/share/bash-completion/completions/ckptfs"; ok $? "bash completion parses"
make -s -C "$root" uninstall DESTDIR="$dest" PREFIX=/usr MOUNTHELPERDIR=/usr/sbin >/dev/null
left=$(find "$dest" -type f | wc -l)
[ "$left" = 0 ]; ok $? "make uninstall removes every file ($left left)"

src=${FIXTURES:-}/sharded
if [ "$(id -u)" = 0 ] && [ -e /dev/fuse ] && [ -d "$src" ] && command -v mount >/dev/null; then
    if [ ! -e /sbin/mount.fuse.ckptfs ]; then
        sed "s|^CKPTFS=.*|CKPTFS=\${CKPTFS:-$CKPTFS}|" "$root/mount-helpers/mount.fuse.ckptfs" \
            > /sbin/mount.fuse.ckptfs && chmod 755 /sbin/mount.fuse.ckptfs && helper_installed=1
    fi
    timeout 30 mount -t fuse.ckptfs "$src" "$mnt" -o view=hf,nofail
    ok $? "mount -t fuse.ckptfs SRC MNT -o view=hf"
    [ -f "$mnt/model.safetensors" ] && [ -f "$mnt/config.json" ]
    ok $? "view=hf: model.safetensors and config.json at the root"
    timeout 30 umount "$mnt"; ok $? "umount"
    printf '%s %s fuse.ckptfs ro,noauto,nofail,x-systemd.automount,readahead_kb=512 0 0\n' \
        "$src" "$mnt" > "$tmp/fstab"
    timeout 30 mount -T "$tmp/fstab" "$mnt"; ok $? "mount from an fstab line"
    [ -f "$mnt/.ckptfs/summary.json" ]; ok $? "fstab mount shows the tree"
    timeout 30 umount "$mnt"; ok $? "umount"
else
    echo "# skipping mount(8) checks: needs root, /dev/fuse and FIXTURES"
fi
echo "1..$n"
exit $fail
