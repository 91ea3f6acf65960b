#!/usr/bin/python3
"""NAME.npy next to every tensor numpy can hold: numpy.load and numpy.load(mmap_mode="r") give
the tensor, equal to the raw file read with the sidecar's numpy_dtype; -o nonpy hides them."""
import glob
import json
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from ckptfs_test import Tap, run_capture, skip_reason, unmount  # noqa: E402

CKPTFS, FIXTURES = os.environ.get("CKPTFS"), os.environ.get("FIXTURES")


def mount(tap, src, opts=()):
    mnt = tempfile.mkdtemp(prefix="ckptfs-npy.")
    rc, _, err = run_capture([CKPTFS, src, mnt, *opts], 30)
    if not tap.ok(rc == 0, "mount %s %s" % (os.path.relpath(src, FIXTURES), " ".join(opts)), [err]):
        unmount(mnt)
        return None
    return mnt


def main():
    tap = Tap()
    reason = skip_reason(CKPTFS, FIXTURES)
    if reason:
        print("1..0 # SKIP " + reason)
        return 0
    for case in ("dtypes", "odd", "sharded"):
        manifest = json.load(open(os.path.join(FIXTURES, case, "manifest.json")))
        src = os.path.normpath(os.path.join(FIXTURES, case, manifest["source"]))
        mnt = mount(tap, src)
        if not mnt:
            continue
        try:
            for t in manifest["tensors"]:
                raw = os.path.join(mnt, t["path"])
                base = raw[:-4] if raw.endswith(".raw") else raw
                npy = base + ".npy"
                if t["numpy_dtype"] is None:
                    tap.ok(not os.path.exists(npy), "%s: %s has no .npy (numpy has no %s)"
                           % (case, t["name"], t["dtype"]))
                    continue
                want = np.fromfile(raw, dtype=t["numpy_dtype"]).reshape(t["shape"])
                a = np.load(npy)
                m = np.load(npy, mmap_mode="r")
                tap.ok(a.dtype == np.dtype(t["numpy_dtype"]) and list(a.shape) == t["shape"]
                       and a.tobytes() == want.tobytes() and np.asarray(m).tobytes() == want.tobytes(),
                       "%s: %s.npy loads (and mmaps) as %s %s with the tensor's bytes"
                       % (case, t["name"], t["numpy_dtype"], t["shape"]),
                       ["dtype %s shape %s" % (a.dtype, a.shape)])
                tap.ok(os.path.getsize(npy) % 64 == (t["nbytes"] % 64) and
                       (os.path.getsize(npy) - t["nbytes"]) % 64 == 0,
                       "%s: %s.npy data starts 64-byte aligned" % (case, t["name"]))
        finally:
            unmount(mnt)
    src = os.path.join(FIXTURES, "dtypes", "model.safetensors")
    mnt = mount(tap, src, ("-o", "nonpy"))
    if mnt:
        try:
            found = glob.glob(os.path.join(mnt, "**", "*.npy"), recursive=True)
            tap.ok(not found, "-o nonpy shows no .npy files", found[:3])
        finally:
            unmount(mnt)
    tap.done()
    return 1 if tap.failed else 0


if __name__ == "__main__":
    sys.exit(main())
