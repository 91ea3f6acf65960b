#!/usr/bin/python3
"""Extended attributes of tensor files: user.ckpt.dtype, user.ckpt.shape and user.ckpt.sha256
(computed on first request) equal the manifest; other files have none; writes are refused."""
import errno
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from mount_checks import mounted, read_json, run  # noqa: E402

NAMES = ["user.ckpt.dtype", "user.ckpt.shape", "user.ckpt.sha256"]


def main(tap, ckptfs, fixtures):
    for case in ("dtypes", "odd", "sharded", "dcphf/dim1x4"):
        manifest = read_json(os.path.join(fixtures, case, "manifest.json"))

        def checks(mnt):
            for t in manifest["tensors"]:
                if t.get("incomplete"):
                    continue
                p = os.path.join(mnt, t["path"])
                got = {n: os.getxattr(p, n).decode() for n in NAMES}
                want = {"user.ckpt.dtype": t["dtype"],
                        "user.ckpt.shape": "[" + ",".join(map(str, t["shape"])) + "]",
                        "user.ckpt.sha256": t["sha256"]}
                # user.ckpt.stats is checked against numpy in 260-stats.t
                listed = [n for n in os.listxattr(p) if n != "user.ckpt.stats"]
                tap.ok(got == want and sorted(listed) == sorted(NAMES),
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

        src = os.path.normpath(os.path.join(fixtures, case, manifest.get("source", ".")))
        mounted(tap, ckptfs, src, case, checks)


if __name__ == "__main__":
    sys.exit(run(main))
