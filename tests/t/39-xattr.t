#!/usr/bin/python3
"""Extended attributes of tensor files: user.ckpt.dtype, user.ckpt.shape and user.ckpt.sha256
(computed on first request) equal the manifest; other files have none; writes are refused."""
import errno
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from ckptfs_test import Tap, run_capture, skip_reason, unmount  # noqa: E402

CKPTFS, FIXTURES = os.environ.get("CKPTFS"), os.environ.get("FIXTURES")
NAMES = ["user.ckpt.dtype", "user.ckpt.shape", "user.ckpt.sha256"]


def main():
    tap = Tap()
    reason = skip_reason(CKPTFS, FIXTURES)
    if reason:
        print("1..0 # SKIP " + reason)
        return 0
    for case in ("dtypes", "odd", "sharded", "dcphf/dim1x4"):
        manifest = json.load(open(os.path.join(FIXTURES, case, "manifest.json")))
        src = os.path.normpath(os.path.join(FIXTURES, case, manifest.get("source", ".")))
        mnt = tempfile.mkdtemp(prefix="ckptfs-xattr.")
        rc, _, err = run_capture([CKPTFS, src, mnt], 30)
        if not tap.ok(rc == 0, "%s: mount" % case, [err]):
            unmount(mnt)
            continue
        try:
            for t in manifest["tensors"]:
                if t.get("incomplete"):
                    continue
                p = os.path.join(mnt, t["path"])
                got = {n: os.getxattr(p, n).decode() for n in NAMES}
                want = {"user.ckpt.dtype": t["dtype"],
                        "user.ckpt.shape": "[" + ",".join(map(str, t["shape"])) + "]",
                        "user.ckpt.sha256": t["sha256"]}
                tap.ok(got == want and sorted(os.listxattr(p)) == sorted(NAMES),
                       "%s: %s xattrs" % (case, t["name"]), ["got %r" % got, "want %r" % want])
            side = os.path.join(mnt, ".ckptfs", "summary.json")
            tap.ok(os.listxattr(side) == [], "%s: summary.json has no xattrs" % case)
            p = os.path.join(mnt, manifest["tensors"][0]["path"])
            try:
                os.setxattr(p, "user.x", b"1")
                tap.ok(False, "%s: setxattr refused" % case)
            except OSError as e:
                tap.ok(e.errno in (errno.EROFS, errno.ENOTSUP, errno.EPERM),
                       "%s: setxattr refused (%s)" % (case, errno.errorcode.get(e.errno)))
        finally:
            unmount(mnt)
    tap.done()
    return 1 if tap.failed else 0


if __name__ == "__main__":
    sys.exit(main())
