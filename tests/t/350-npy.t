#!/usr/bin/python3
"""NAME.npy next to every tensor numpy can hold: numpy.load and numpy.load(mmap_mode="r") give
the tensor, equal to the raw file read with the sidecar's numpy_dtype; -o nonpy hides them."""
import glob
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from mount_checks import mounted, read_json, run  # noqa: E402


def main(tap, ckptfs, fixtures):
    def mount(src, checks, opts=()):
        label = "mount %s %s" % (os.path.relpath(src, fixtures), " ".join(opts))
        mounted(tap, ckptfs, src, label.rstrip(), checks, opts, mount_desc=label)

    for case in ("dtypes", "odd", "sharded"):
        manifest = read_json(os.path.join(fixtures, case, "manifest.json"))

        def npy_views(mnt):
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

        mount(os.path.normpath(os.path.join(fixtures, case, manifest["source"])), npy_views)

    def no_npy(mnt):
        found = glob.glob(os.path.join(mnt, "**", "*.npy"), recursive=True)
        tap.ok(not found, "-o nonpy shows no .npy files", found[:3])

    mount(os.path.join(fixtures, "dtypes", "model.safetensors"), no_npy, ("-o", "nonpy"))


if __name__ == "__main__":
    sys.exit(run(main))
