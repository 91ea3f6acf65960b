#!/usr/bin/python3
"""NumPy .npz archives, written by numpy itself (np.savez, np.savez_compressed) and by hand for
the hostile cases, against what np.load returns.

Environment: CKPTFS (the ckptfs binary), FIXTURES (unused but required by the harness).

- np.savez of every dtype ckptfs and numpy share (float16/32/64, int8..64, uint8..64, bool), a
  0-d array, an empty one, C and Fortran order, names holding '.' and '/': the mount holds one
  raw file per array whose bytes are np.load's array in C order, sidecars with the dtype and
  shape, and `ckptfs cat` gives the same bytes without FUSE;
- np.savez_compressed is refused, naming the member and the way out;
- hostile archives (a member that is not .npy, a header whose shape does not match the member's
  size, a big-endian array, a header length past the member, a truncated archive) are refused
  with the member named, and never crash the decoder.
"""

import io
import json
import os
import struct
import subprocess
import sys
import zipfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from ckptfs_test import run_cases  # noqa: E402
from mount_checks import mounted, read_bytes, sidecar_path, tree_files  # noqa: E402

CKPTFS = os.environ.get("CKPTFS")
DTYPE = {"float16": "F16", "float32": "F32", "float64": "F64", "int8": "I8", "int16": "I16",
         "int32": "I32", "int64": "I64", "uint8": "U8", "uint16": "U16", "uint32": "U32",
         "uint64": "U64", "bool": "BOOL"}


def arrays():
    rng = np.random.default_rng(96)
    out = {}
    for name in DTYPE:
        if name == "bool":
            out["b"] = rng.integers(0, 2, (3, 5)).astype(bool)
        elif name.startswith("float"):
            out[name] = rng.standard_normal((4, 3)).astype(name)
        else:
            info = np.iinfo(name)
            out[name] = rng.integers(info.min, info.max, (2, 7), dtype=name, endpoint=True)
    out["scalar"] = np.array(3.25, dtype=np.float32)
    out["empty"] = np.zeros((0, 4), dtype=np.float32)
    out["fortran2d"] = np.asfortranarray(rng.standard_normal((5, 3)).astype(np.float32))
    out["fortran3d"] = np.asfortranarray(np.arange(2 * 3 * 4, dtype=np.int32).reshape(2, 3, 4))
    out["model.layers.0.weight"] = rng.standard_normal((2, 2)).astype(np.float32)
    out["nested/dir/bias"] = rng.standard_normal(6).astype(np.float64)
    return out


def tree_path(name):
    return name.replace(".", "/")


def ckptfs(*args):
    p = subprocess.run([CKPTFS] + list(args), capture_output=True, timeout=120)
    return p.returncode, p.stdout, p.stderr.decode(errors="replace")


def good(tap, work):
    want = arrays()
    src = os.path.join(work, "arrays.npz")
    np.savez(src, **want)
    got = np.load(src)
    assert got["fortran2d"].flags["F_CONTIGUOUS"]  # numpy kept the order the test is about

    def checks(mnt):
        problems = []
        for name in want:
            raw = os.path.join(mnt, tree_path(name))
            ref = np.ascontiguousarray(got[name]).tobytes()
            try:
                data = read_bytes(raw)
                sc = json.loads(read_bytes(os.path.join(mnt, sidecar_path(tree_path(name)))))
            except (OSError, ValueError) as e:
                problems.append("%s: %s" % (name, e))
                continue
            if data != ref:
                problems.append("%s: %d bytes differ from np.load's %d" % (name, len(data),
                                                                           len(ref)))
            if sc.get("dtype") != DTYPE[got[name].dtype.name] or \
                    sc.get("shape") != list(got[name].shape) or sc.get("name") != name:
                problems.append("%s: sidecar %r" % (name, {k: sc.get(k) for k in
                                                           ("name", "dtype", "shape")}))
        tap.ok(not problems, "np.savez: every array's bytes, dtype and shape equal np.load's "
               "(%d arrays, Fortran order included)" % len(want), problems)
        files = set(tree_files(mnt, []))
        expect = {tree_path(n) for n in want} | {sidecar_path(tree_path(n)) for n in want}
        tap.ok(files == expect, "np.savez: the tree holds one raw file and one sidecar per "
               "array, nothing else", sorted(files ^ expect))
        meta = json.loads(read_bytes(os.path.join(mnt, ".ckptfs", "metadata.json")))
        tap.ok(meta.get("format") == "npz", "np.savez: metadata.json says format npz",
               [meta.get("format")])

    mounted(tap, CKPTFS, src, "np.savez", checks)
    bad = []
    for name in ("fortran3d", "int64", "scalar"):
        rc, out, err = ckptfs("cat", src, name)
        if rc != 0 or out != np.ascontiguousarray(got[name]).tobytes():
            bad.append("%s: rc %r, %d bytes, %s" % (name, rc, len(out), err.strip()))
    tap.ok(not bad, "ckptfs cat gives np.load's C-order bytes without FUSE", bad)
    rc, out, err = ckptfs("ls", src)
    tap.ok(rc == 0 and b"fortran3d" in out and b"model.layers.0.weight" in out,
           "ckptfs ls lists the arrays by their keys", [rc, err])
    rc, out, err = ckptfs("verify", src)
    tap.ok(rc == 0, "ckptfs verify passes (zip CRC-32 of every member)", [rc, err])

    positional = os.path.join(work, "positional.npz")
    np.savez(positional, np.arange(4, dtype=np.int16), np.ones((2, 2), dtype=np.float32))
    rc, out, err = ckptfs("cat", positional, "arr_1")
    tap.ok(rc == 0 and out == np.ones((2, 2), dtype=np.float32).tobytes(),
           "positional arrays are arr_0, arr_1, as np.load names them", [rc, err])


def compressed(tap, work):
    src = os.path.join(work, "c.npz")
    np.savez_compressed(src, w=np.zeros((64, 64), dtype=np.float32))
    rc, _, err = ckptfs("ls", src)
    tap.ok(rc != 0 and "w.npy" in err and "compressed" in err and "np.savez(" in err,
           "np.savez_compressed is refused, naming the member and how to re-save it",
           [rc, err])


def npy_bytes(header, payload):
    h = header.encode()
    h += b" " * (64 - (10 + len(h) + 1) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h + payload


def write_zip(path, members):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for name, data in members:
            z.writestr(name, data)


def hostile(tap, work):
    ok_member = ("good.npy", npy_bytes("{'descr': '<f4', 'fortran_order': False, "
                                       "'shape': (2,), }", b"\0" * 8))
    cases = {
        "not-npy": ([ok_member, ("notes.txt", b"hello")], "notes.txt"),
        "short-data": ([("a.npy", npy_bytes("{'descr': '<f4', 'fortran_order': False, "
                                            "'shape': (3, 3), }", b"\0" * 20))], "a"),
        "long-data": ([("a.npy", npy_bytes("{'descr': '<f4', 'fortran_order': False, "
                                           "'shape': (1,), }", b"\0" * 8))], "a"),
        "big-endian": ([("a.npy", npy_bytes("{'descr': '>f4', 'fortran_order': False, "
                                            "'shape': (2,), }", b"\0" * 8))], "big-endian"),
        "header-past-end": ([("a.npy", b"\x93NUMPY\x01\x00\xff\x7f{'descr'")], "a"),
        "shape-overflow": ([("a.npy", npy_bytes("{'descr': '<f8', 'fortran_order': False, "
                                                "'shape': (4294967296, 4294967296), }", b""))],
                           "overflow"),
        "no-magic": ([("a.npy", b"just bytes, no header at all")], "a"),
    }
    problems = []
    for label, (members, needle) in cases.items():
        path = os.path.join(work, label + ".npz")
        write_zip(path, members)
        rc, _, err = ckptfs("ls", path)
        if rc in (0, None) or rc < 0 or needle not in err or path not in err:
            problems.append("%s: rc %r, %s" % (label, rc, err.strip()))
    # a truncated archive: its central directory is gone
    path = os.path.join(work, "truncated.npz")
    np.savez(path, a=np.zeros(1000, dtype=np.float32))
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 30)
    rc, _, err = ckptfs("ls", path)
    if rc in (0, None) or rc < 0:
        problems.append("truncated: rc %r, %s" % (rc, err.strip()))
    tap.ok(not problems, "hostile .npz archives are refused with the member named, exit 2, "
           "no crash (%d cases)" % (len(cases) + 1), problems)


if __name__ == "__main__":
    sys.exit(run_cases("ckptfs-npz-", good, compressed, hostile))
