#!/usr/bin/python3
"""BF16 gets a .npy under -o as_dtype=f32 (issue 28 item 9): the tensor reads as float32 there
and its sidecar says "<f4", so NAME.npy is there too, holding the float32 values:
numpy.load (and mmap_mode="r") gives them, compared with BF16 bits widened here; so does an F16
tensor; read in odd-sized pieces (a piece spanning the header and the data) it is the same
bytes. Without as_dtype a BF16 tensor has no .npy (numpy has no bfloat16).
"""
import json
import os
import struct
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from mount_checks import mounted, run  # noqa: E402
from staging import write_st  # noqa: E402


def pieces(path, n):
    out = b""
    with open(path, "rb", buffering=0) as f:
        while True:
            b = f.read(n)
            if not b:
                return out
            out += b


def body(tap, ckptfs, _root):
    work = tempfile.mkdtemp(prefix="ckptfs-t93.")
    rng = np.random.default_rng(3)
    vals = rng.standard_normal(3000).astype(np.float32)
    bits = (vals.view(np.uint32) >> 16).astype(np.uint16)  # truncated to BF16
    want_bf = (bits.astype(np.uint32) << 16).view(np.float32).reshape(30, 100)
    f16 = rng.standard_normal(77).astype(np.float16)
    src = os.path.join(work, "m.safetensors")
    write_st(src, {"w.bf": ("BF16", [30, 100], bits.tobytes()),
                   "w.h": ("F16", [77], f16.tobytes())})

    def checks(mnt):
        p = os.path.join(mnt, "w", "bf.npy")
        got = np.load(p) if os.path.exists(p) else None
        tap.ok(got is not None and got.dtype == np.float32 and np.array_equal(got, want_bf),
               "BF16 under as_dtype=f32: bf.npy loads as the float32 values", [got is None])
        m = np.load(p, mmap_mode="r") if got is not None else None
        tap.ok(m is not None and np.array_equal(np.asarray(m), want_bf), "and mmapped")
        whole = open(p, "rb").read() if got is not None else b""
        tap.ok(whole and pieces(p, 37) == whole and pieces(p, 4093) == whole,
               "read in 37- and 4093-byte pieces: the same bytes")
        h = os.path.join(mnt, "w", "h.npy")
        tap.ok(os.path.exists(h) and np.array_equal(np.load(h), f16.astype(np.float32)),
               "F16 under as_dtype=f32: h.npy holds its float32 values")
        side = json.load(open(os.path.join(mnt, "w", "bf.json")))
        tap.ok(side.get("numpy_dtype") == "<f4" and side.get("dtype") == "F32",
               "the sidecar says what the .npy holds", [side])

    mounted(tap, ckptfs, src, "as_dtype=f32", checks, options=["-o", "as_dtype=f32"])
    mounted(tap, ckptfs, src, "stored", lambda mnt: tap.ok(
        not os.path.exists(os.path.join(mnt, "w", "bf.npy")) and
        os.path.exists(os.path.join(mnt, "w", "h.npy")),
        "without as_dtype: no bf.npy (numpy has no bfloat16), h.npy as stored"))


sys.exit(run(body))
