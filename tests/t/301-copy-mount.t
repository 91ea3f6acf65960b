#!/usr/bin/python3
"""Copies of a mount are exact (issue 28 item 8): `tar c` of a fresh mount (nothing read
before) is extracted and every file compared with `cat` of it from the mount; every file's
size in a stat before its first read is the length of what a read then gives (stats.json
included: its entries have a fixed width, so its size is known before it is computed).
"""
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from mount_checks import mounted, run  # noqa: E402


def body(tap, ckptfs, root):
    src = os.path.join(root, "sharded")
    if not os.path.isdir(src):
        tap.skip("tar of a fresh mount", "no sharded fixture")
        return
    work = tempfile.mkdtemp(prefix="ckptfs-t91.")

    def checks(mnt):
        sizes = {}
        for d, _, files in os.walk(mnt):
            for f in files:
                p = os.path.join(d, f)
                sizes[os.path.relpath(p, mnt)] = os.stat(p).st_size
        tar = os.path.join(work, "copy.tar")
        p = subprocess.run(["tar", "cf", tar, "-C", mnt, "."], capture_output=True, timeout=120)
        tap.ok(p.returncode == 0, "tar c of a fresh mount", [p.stderr[-300:]])
        out = os.path.join(work, "x")
        os.mkdir(out)
        subprocess.run(["tar", "xf", tar, "-C", out], check=False, timeout=120)
        bad = []
        for rel, size in sorted(sizes.items()):
            got = subprocess.run(["cat", os.path.join(mnt, rel)], capture_output=True,
                                 timeout=60).stdout
            try:
                with open(os.path.join(out, rel), "rb") as f:
                    copied = f.read()
            except OSError as e:
                copied = e
            if copied != got:
                bad.append("%s: tar has %s bytes, cat %d" % (
                    rel, len(copied) if isinstance(copied, bytes) else copied, len(got)))
            if size != len(got):
                bad.append("%s: stat said %d before the first read, cat gives %d" % (
                    rel, size, len(got)))
        tap.ok(not bad and ".ckptfs/stats.json" in sizes,
               "every file of the tar = cat of it, and its size was right before any read "
               "(%d files, stats.json %d bytes)" % (len(sizes), sizes.get(".ckptfs/stats.json", -1)),
               bad[:8])

    try:
        mounted(tap, ckptfs, src, "sharded", checks)
    finally:
        shutil.rmtree(work, ignore_errors=True)


sys.exit(run(body))
