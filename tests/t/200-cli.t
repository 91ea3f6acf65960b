#!/bin/bash
# Command line: exit codes scripts can rely on, one-line errors, nothing mounted on failure.
n=0; fail=0
ok() { n=$((n + 1)); if [ "$1" = 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; fail=1; fi; }
root=$(dirname "$(realpath "$0")")/../..
CKPTFS=${CKPTFS:-$root/build/ckptfs}
tmp=$(mktemp -d)
mnt=$tmp/mnt
mkdir -p "$mnt"
trap 'mountpoint -q "$mnt" && fusermount3 -u "$mnt"; rm -rf "$tmp"' EXIT

expect() { # expect STATUS DESCRIPTION ARGS...
    local want=$1 desc=$2; shift 2
    timeout 20 "$CKPTFS" "$@" >"$tmp/out" 2>"$tmp/err"
    local got=$?
    [ "$got" = "$want" ]; ok $? "$desc: exit $want (got $got)"
}
"$CKPTFS" --version | grep -q '^ckptfs [0-9]'; ok $? "--version names the program and version"
expect 0 "--help" --help
expect 1 "no arguments"
grep -q "expected SOURCE and MOUNTPOINT" "$tmp/err"; ok $? "no arguments: says what is missing"
expect 1 "one argument" "$tmp"
expect 1 "three arguments" a b c
printf 'not a checkpoint at all, just text\n' > "$tmp/text.bin"
expect 2 "unknown format" "$tmp/text.bin" "$mnt"
[ "$(wc -l < "$tmp/err")" = 1 ] && grep -q "text.bin" "$tmp/err"; ok $? "unknown format: one line naming the file"
expect 2 "missing source" "$tmp/nope.safetensors" "$mnt"
grep -q "No such file" "$tmp/err"; ok $? "missing source: says so"
mkdir -p "$tmp/emptydir"
expect 2 "directory without a model" "$tmp/emptydir" "$mnt"
grep -q "model.safetensors" "$tmp/err"; ok $? "empty directory: names the files it looked for"
! mountpoint -q "$mnt"; ok $? "nothing mounted after failures"

if [ -e /dev/fuse ] && [ -n "${FIXTURES:-}" ] && [ -d "$FIXTURES/dtypes" ]; then
    src=$FIXTURES/dtypes/model.safetensors
    expect 1 "bad mount point" "$src" "$tmp/no/such/dir"
    expect 1 "unknown -o option" "$src" "$mnt" -o no_such_option
    ! mountpoint -q "$mnt"; ok $? "unknown option: nothing mounted"
    expect 0 "mount with -o readahead_kb=2048,max_threads=2" "$src" "$mnt" -o readahead_kb=2048,max_threads=2
    grep -q " $mnt fuse.ckptfs ro," /proc/mounts; ok $? "listed in /proc/mounts as fuse.ckptfs, read-only"
    grep -q "^$src $mnt " /proc/mounts; ok $? "fsname is the source path"
    if [ "$(id -u)" = 0 ]; then
        dev=$(mountpoint -d "$mnt")
        [ "$(cat /sys/class/bdi/$dev/read_ahead_kb 2>/dev/null)" = 2048 ]
        ok $? "readahead_kb=2048 reached the mount's BDI"
    fi
    touch "$mnt/x" 2>"$tmp/err"; grep -q "Read-only file system" "$tmp/err"
    ok $? "creating a file fails with EROFS"
    fusermount3 -u "$mnt"; ok $? "fusermount3 -u unmounts"
    sleep 0.3
    ! pgrep -f "ckptfs $src $mnt" >/dev/null; ok $? "the daemon exited after unmount"
    timeout 20 "$CKPTFS" -f "$src" "$mnt" & pid=$!
    for _ in $(seq 50); do mountpoint -q "$mnt" && break; sleep 0.1; done
    mountpoint -q "$mnt"; ok $? "-f mounts in the foreground"
    kill -TERM "$pid"; wait "$pid"; st=$?
    [ "$st" = 0 ] && ! mountpoint -q "$mnt"; ok $? "SIGTERM unmounts cleanly (status $st)"
else
    echo "# skipping mount checks: no /dev/fuse or FIXTURES"
fi
echo "1..$n"
exit $fail
