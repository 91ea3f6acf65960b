#!/bin/bash
# make install / uninstall with a PREFIX (and with a DESTDIR): every file lands under it and
# nowhere else; the installed helper runs the ckptfs installed beside it (not one on PATH, not
# one baked into it). As root, `mount -t fuse.ckptfs` and an fstab line go through the freshly
# installed helper: in a private mount namespace its directory is bind-mounted where mount(8)
# looks for helpers (and its bin/ on mount's PATH), so whatever /sbin holds on this machine is
# never what is tested.
n=0; fail=0
ok() { n=$((n + 1)); if [ "$1" = 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; fail=1; fi; }
root=$(cd "$(dirname "$(realpath "$0")")/../.." && pwd)
CKPTFS=${CKPTFS:-$root/build/ckptfs}
B=$(dirname "$CKPTFS")
tmp=$(mktemp -d)
mnt=$tmp/mnt
mkdir -p "$mnt"
cleanup() {
    mountpoint -q "$mnt" && fusermount3 -u "$mnt"
    rm -rf "$tmp"
}
trap cleanup EXIT
unset CKPTFS_ENV
files="bin/ckptfs sbin/mount.fuse.ckptfs share/man/man1/ckptfs.1 share/man/man5/ckptfs.5
       share/man/man8/mount.fuse.ckptfs.8 share/bash-completion/completions/ckptfs
       share/zsh/vendor-completions/_ckptfs share/fish/vendor_completions.d/ckptfs.fish
       lib/libckpt.so.0 lib/libckpt.so include/ckpt/ckpt.h include/ckpt/read/segread.h
       lib/pkgconfig/libckpt.pc"

# 1. PREFIX alone: nothing outside it (a marker file dates the run; / is searched for newer
#    files named like ours outside PREFIX).
prefix=$tmp/prefix
touch "$tmp/.start"
make -s -C "$root" install B="$B" PREFIX="$prefix" >/dev/null
ok $? "make install PREFIX=DIR"
for f in $files; do
    [ -e "$prefix/$f" ]; ok $? "installed PREFIX/$f"
done
outside=$(find /sbin/ /usr/sbin/ /usr/local/ /usr/bin/ /bin/ -xdev -newer "$tmp/.start" \
          \( -name 'mount.fuse.ckptfs' -o -name ckptfs -o -name 'ckptfs.[158]' \) 2>/dev/null)
[ -z "$outside" ]; ok $? "nothing written outside PREFIX ($outside)"
[ -e "$prefix/sbin/mount.fuse.ckptfs" ] && ! grep -q "$prefix" "$prefix/sbin/mount.fuse.ckptfs"
ok $? "the installed helper names no install path"
"$prefix/bin/ckptfs" --version | grep -q '^ckptfs '; ok $? "installed binary runs"
bash -n "$prefix/share/bash-completion/completions/ckptfs"; ok $? "bash completion parses"

# The installed helper finds the ckptfs beside it: a stand-in on PATH that would be run
# instead records itself and fails; ckptfs's own usage error (status 1) proves which ran.
mkdir -p "$tmp/decoy"
printf '#!/bin/sh\necho decoy >> %s/decoy.log\nexit 42\n' "$tmp" > "$tmp/decoy/ckptfs"
chmod 755 "$tmp/decoy/ckptfs"
env -u CKPTFS PATH="$tmp/decoy:/usr/bin:/bin" "$prefix/sbin/mount.fuse.ckptfs" \
    /nonexistent "$mnt" -o bogus_option >/dev/null 2>&1
rc=$?
[ "$rc" != 42 ] && [ ! -e "$tmp/decoy.log" ]
ok $? "installed helper runs PREFIX/bin/ckptfs, not one on PATH (status $rc)"
ln -s "$prefix/sbin/mount.fuse.ckptfs" "$tmp/decoy/mount.fuse.ckptfs"
env -u CKPTFS PATH="$tmp/decoy:/usr/bin:/bin" "$tmp/decoy/mount.fuse.ckptfs" \
    /nonexistent "$mnt" >/dev/null 2>&1
[ ! -e "$tmp/decoy.log" ]; ok $? "called through a symbolic link, it still finds PREFIX/bin/ckptfs"
# Without one beside it, the first ckptfs on PATH.
mkdir -p "$tmp/alone"
cp "$root/mount-helpers/mount.fuse.ckptfs" "$tmp/alone/"
env -u CKPTFS PATH="$tmp/decoy:/usr/bin:/bin" "$tmp/alone/mount.fuse.ckptfs" \
    /nonexistent "$mnt" >/dev/null 2>&1
[ $? = 42 ] && [ -e "$tmp/decoy.log" ]; ok $? "a helper alone runs the ckptfs on PATH"
make -s -C "$root" uninstall PREFIX="$prefix" >/dev/null
left=$(find "$prefix" ! -type d | wc -l)
[ "$left" = 0 ]; ok $? "make uninstall PREFIX=DIR removes every file ($left left)"

# 2. DESTDIR + PREFIX=/usr, as a package build does.
dest=$tmp/dest
make -s -C "$root" install B="$B" DESTDIR="$dest" PREFIX=/usr >/dev/null
ok $? "make install DESTDIR=... PREFIX=/usr"
for f in $files; do
    [ -e "$dest/usr/$f" ]; ok $? "installed DESTDIR/usr/$f"
done
others=$(find "$dest" -type f | grep -v "^$dest/usr/" | wc -l)
[ "$others" = 0 ]; ok $? "nothing outside DESTDIR/usr"

# 3. mount(8) through the helper just installed in DESTDIR.
src=${FIXTURES:-}/sharded
if [ "$(id -u)" = 0 ] && [ -e /dev/fuse ] && [ -d "$src" ] && command -v mount >/dev/null &&
   command -v unshare >/dev/null; then
    sbin=$(readlink -f /sbin)
    cat > "$tmp/inside.sh" <<EOF
set -u
n=$n
ok() { n=\$((n + 1)); if [ "\$1" = 0 ]; then echo "ok \$n - \$2"; else echo "not ok \$n - \$2"; fi; }
mount --make-rprivate /
mount --bind "$dest/usr/sbin" "$sbin" || exit 1
# mount(8) gives helpers its own PATH (/usr/local/sbin:/usr/local/bin:/usr/sbin:...): the
# fresh ckptfs is found there, in /usr/local/bin, with nothing else of this machine's.
mount --bind "$dest/usr/bin" /usr/local/bin || exit 1
[ "\$(ls "$sbin")" = mount.fuse.ckptfs ]; ok \$? "only the fresh helper is where mount(8) looks"
unset CKPTFS
timeout 30 mount -t fuse.ckptfs "$src" "$mnt" -o view=hf,nofail
ok \$? "mount -t fuse.ckptfs SRC MNT -o view=hf (the fresh helper)"
[ -f "$mnt/model.safetensors" ] && [ -f "$mnt/config.json" ]
ok \$? "view=hf: model.safetensors and config.json at the root"
pid=\$(pgrep -n -f "^ckptfs $src ")
[ -n "\$pid" ] && [ "\$(stat -L -c %d:%i /proc/\$pid/exe)" = "\$(stat -c %d:%i "$dest/usr/bin/ckptfs")" ]
ok \$? "the daemon is DESTDIR's ckptfs"
timeout 30 umount "$mnt"; ok \$? "umount"
printf '%s %s fuse.ckptfs ro,noauto,nofail,x-systemd.automount,readahead_kb=512 0 0\n' \
    "$src" "$mnt" > "$tmp/fstab"
timeout 30 mount -T "$tmp/fstab" "$mnt"; ok \$? "mount from an fstab line"
[ -f "$mnt/.ckptfs/summary.json" ]; ok \$? "fstab mount shows the tree"
timeout 30 umount "$mnt"; ok \$? "umount"
EOF
    out=$(unshare --mount bash "$tmp/inside.sh")
    echo "$out"
    echo "$out" | grep -q '^not ok' && fail=1
    added=$(echo "$out" | grep -c '^\(not \)\?ok ')
    [ "$added" = 8 ] || { echo "not ok $((n + added + 1)) - the namespace checks ran ($added of 8)"; fail=1; added=$((added + 1)); }
    n=$((n + added))
else
    echo "# mount(8) checks not run: they need root, /dev/fuse, unshare and FIXTURES"
fi
make -s -C "$root" uninstall DESTDIR="$dest" PREFIX=/usr >/dev/null
left=$(find "$dest" -type f | wc -l)
[ "$left" = 0 ]; ok $? "make uninstall DESTDIR=... removes every file ($left left)"
echo "1..$n"
exit $fail
