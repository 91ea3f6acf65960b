#!/usr/bin/python3
"""Mount options users type (issue 28 item 7):
- -o uid=N,gid=N,umask=077: every file and directory shows that owner, and the mode bits the
  umask takes off are off (never added: a 0600 source stays 0600 whatever the umask);
- -o fsname=X,subtype=Y are passed on: /proc/self/mountinfo shows source X, type fuse.Y;
- mounting over a live mount is refused (exit 3) naming what is mounted there, and nothing is
  stacked on it;
- `ckptfs umount DIR` of a plain directory says "not a ckptfs mount" (exit 1) and leaves it;
  of the fsname/subtype mount it unmounts.
"""
import os
import shutil
import stat
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from ckptfs_test import is_mounted, run_capture, unmount  # noqa: E402
from mount_checks import run  # noqa: E402
from staging import write_st  # noqa: E402


def mounts_at(mnt):
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, right = line.split(" - ", 1)
            if left.split()[4] == mnt:
                out.append((right.split()[0], right.split()[1]))
    return out


def body(tap, ckptfs, _root):
    work = tempfile.mkdtemp(prefix="ckptfs-t89.")
    src = os.path.join(work, "model.safetensors")
    write_st(src, {"a.b": ("F32", [2], bytes(8))})
    os.chmod(src, 0o644)
    mnt = os.path.join(work, "mnt")
    plain = os.path.join(work, "plain")
    os.mkdir(mnt)
    os.mkdir(plain)
    try:
        rc, _, err = run_capture([ckptfs, src, mnt, "-o", "uid=4242,gid=4343,umask=077"], 30)
        if tap.ok(rc == 0 and is_mounted(mnt), "mount -o uid=4242,gid=4343,umask=077", [err]):
            f, d = os.stat(os.path.join(mnt, "a", "b")), os.stat(os.path.join(mnt, "a"))
            tap.ok((f.st_uid, f.st_gid, d.st_uid, d.st_gid) == (4242, 4343, 4242, 4343),
                   "uid= and gid= own every file and directory",
                   [(f.st_uid, f.st_gid, d.st_uid, d.st_gid)])
            tap.ok(stat.S_IMODE(f.st_mode) == 0o400 and stat.S_IMODE(d.st_mode) == 0o500,
                   "umask=077 takes group and other bits off (0644 source: file 0400, dir 0500)",
                   [oct(f.st_mode), oct(d.st_mode)])
            rc2, _, err2 = run_capture([ckptfs, src, mnt], 30)
            e = err2.decode(errors="replace")
            tap.ok(rc2 == 3 and src in e and "fuse.ckptfs" in e and len(mounts_at(mnt)) == 1,
                   "a second mount over the live one is refused, naming it; nothing stacked",
                   [rc2, e, mounts_at(mnt)])
            unmount(mnt)
        os.makedirs(mnt, exist_ok=True)  # unmount() takes the mount point away
        rc, _, err = run_capture([ckptfs, src, mnt, "-o", "fsname=my-model,subtype=tensors"], 30)
        if tap.ok(rc == 0 and is_mounted(mnt), "mount -o fsname=my-model,subtype=tensors", [err]):
            tap.ok(mounts_at(mnt) == [("fuse.tensors", "my-model")],
                   "fsname= and subtype= are passed on (mountinfo: fuse.tensors my-model)",
                   [mounts_at(mnt)])
            rc, _, err = run_capture([ckptfs, "umount", mnt], 30)
            tap.ok(rc == 0 and not is_mounted(mnt), "ckptfs umount unmounts it", [err])
        rc, _, err = run_capture([ckptfs, "umount", plain], 30)
        e = err.decode(errors="replace")
        tap.ok(rc == 1 and "not a ckptfs mount" in e and os.path.isdir(plain),
               "ckptfs umount of a plain directory: not a ckptfs mount", [rc, e])
        os.makedirs(mnt, exist_ok=True)
        rc, _, err = run_capture([ckptfs, src, mnt, "-o", "umask=9"], 30)
        tap.ok(rc == 1 and b"umask=9" in err and not is_mounted(mnt),
               "umask=9 is refused (octal)", [rc, err])
    finally:
        if is_mounted(mnt):
            unmount(mnt)
        shutil.rmtree(work, ignore_errors=True)


sys.exit(run(body))
