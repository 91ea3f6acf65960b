#!/usr/bin/python3
"""1,500 shards under the users' default soft `ulimit -n` of 1024 (hard 8192): `info`, `ls`, a
mount and `serve` hold a descriptor per shard, so each raises its soft limit to the hard one as
`stage` does (issue 29, item 21). The shards are written here (numpy); every tensor's bytes in
the mount are compared with what was written.

Environment: CKPTFS.  Needs prlimit (util-linux).
"""

import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from ckptfs_test import Tap, is_mounted, unmount  # noqa: E402

SHARDS = 1500


def write_shard(path, name, values):
    t = np.asarray(values, "<f4")
    h = json.dumps({name: {"dtype": "F32", "shape": [t.size], "data_offsets": [0, t.nbytes]}})
    h += " " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h.encode() + t.tobytes())


def limited(argv):
    """argv under a soft limit of 1024 descriptors (hard 8192)."""
    return subprocess.run(["prlimit", "--nofile=1024:8192", "--"] + argv, capture_output=True,
                          timeout=240, stdin=subprocess.DEVNULL)


def main():
    ckptfs = os.environ.get("CKPTFS", "")
    if not os.access(ckptfs, os.X_OK) or not shutil.which("prlimit"):
        print("1..0 # SKIP CKPTFS or prlimit missing")
        return 0
    tap = Tap()
    work = tempfile.mkdtemp(prefix="ckptfs-t87.")
    try:
        src = os.path.join(work, "model")
        os.mkdir(src)
        weight_map, want = {}, {}
        for i in range(SHARDS):
            name = "layers.%d.w" % i
            shard = "model-%05d-of-%05d.safetensors" % (i + 1, SHARDS)
            vals = np.full(4, i, np.float32)
            write_shard(os.path.join(src, shard), name, vals)
            weight_map[name] = shard
            want[name] = vals.tobytes()
        with open(os.path.join(src, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": weight_map}, f)
        p = limited([ckptfs, "info", src])
        tap.ok(p.returncode == 0 and b"1500" in p.stdout,
               "info of 1,500 shards under ulimit -n 1024", [p.returncode, p.stderr[-400:]])
        p = limited([ckptfs, "ls", src])
        tap.ok(p.returncode == 0 and p.stdout.count(b"layers.") == SHARDS,
               "ls of 1,500 shards under ulimit -n 1024", [p.returncode, p.stderr[-400:]])
        mnt = os.path.join(work, "mnt")
        os.mkdir(mnt)
        p = limited([ckptfs, src, mnt])
        tap.ok(p.returncode == 0 and is_mounted(mnt), "mount of 1,500 shards under ulimit -n 1024",
               [p.returncode, p.stderr[-400:]])
        if is_mounted(mnt):
            bad = []
            for name, data in want.items():
                try:
                    with open(os.path.join(mnt, name.replace(".", "/")), "rb") as f:
                        got = f.read()
                except OSError as e:
                    got = str(e)
                if got != data:
                    bad.append(name)
            tap.ok(not bad, "every tensor of the 1,500 shards reads its bytes", bad[:5])
            unmount(mnt)
    finally:
        if is_mounted(os.path.join(work, "mnt")):
            unmount(os.path.join(work, "mnt"))
        shutil.rmtree(work, ignore_errors=True)
    tap.done()
    return 0 if tap.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
