#!/usr/bin/python3
"""Messages name what they mean, and options that would do nothing or something else are refused.

names    a refusal names a tensor whose name holds a NUL byte escaped as the tree escapes it
         ("w%00evil"), not as the other, valid tensor its first bytes spell ("w"): the
         safetensors reader (a shape its bytes do not fill), the GGUF reader (an unknown type), the
         writers of .lwt (F16 refused), .gguf (the name refused) and a safetensors name over
         120 bytes cut with "..." rather than silently.
options  -o max_threads=-1, =4x, =0; timeout=nan, =inf, =-1; readahead_kb=-1; as_dtype=f32 with
         view=hf; and `ckptfs stage -o max_threads=-1` exit with status 1 naming the option,
         with nothing mounted; tp_split on a safetensors source is refused by the mount and by
         `ckptfs ls`; max_threads=1, timeout=0.5, readahead_kb=0 still mount.
"""
import json
import os
import shutil
import struct
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from ckptfs_test import is_mounted, run_capture, unmount  # noqa: E402
from mount_checks import run  # noqa: E402

QUICK = 30


def safetensors_bytes(entries, data):
    """entries: [(name bytes, dtype, shape, begin, end)] -> bytes; the header is written by
    hand, so names may hold any byte JSON can escape."""
    parts = []
    for name, dtype, shape, a, b in entries:
        key = json.dumps(name.decode("latin-1")).encode("latin-1")  # \u0000 for NUL
        parts.append(b'%s: {"dtype": "%s", "shape": %s, "data_offsets": [%d, %d]}'
                     % (key, dtype.encode(), json.dumps(shape).encode(), a, b))
    text = b"{" + b", ".join(parts) + b"}"
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def gguf_bytes(tensors):
    """tensors: [(name bytes, ggml type, dims)] -> a GGUF v3 file with no KVs."""
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), 0)
    for name, typ, dims in tensors:
        out += struct.pack("<Q", len(name)) + name + struct.pack("<I", len(dims))
        out += b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", typ, 0)
    out += b"\0" * (-len(out) % 32)
    return out + b"\0" * 64


def run_err(argv):
    rc, _, err = run_capture(argv, QUICK)
    return rc, err.decode("utf-8", "replace").strip()


def names_cases(tap, ckptfs, scratch):
    def refusal(label, argv, want, not_want):
        rc, err = run_err(argv)
        tap.ok(rc not in (0, None) and want in err and not_want not in err,
               "names: %s names %s" % (label, want),
               ["exit %r" % rc, "stderr: " + err, "must not hold: %r" % not_want])

    st = os.path.join(scratch, "nul.safetensors")
    with open(st, "wb") as f:
        f.write(safetensors_bytes([(b"w", "F32", [2], 0, 8), (b"w\0evil", "F32", [4], 8, 16)],
                                  b"\0" * 16))
    refusal("safetensors reader", [ckptfs, "ls", st], '"w%00evil"', '"w"')

    gg = os.path.join(scratch, "nul.gguf")
    with open(gg, "wb") as f:
        f.write(gguf_bytes([(b"w", 0, [2]), (b"w\0evil", 999, [2])]))
    refusal("GGUF reader", [ckptfs, "ls", gg], '"w%00evil"', '"w"')

    f16 = os.path.join(scratch, "nul16.safetensors")
    with open(f16, "wb") as f:
        f.write(safetensors_bytes([(b"w", "F32", [2], 0, 8), (b"w\0evil", "F16", [4], 8, 16)],
                                  b"\0" * 16))
    refusal("the .lwt writer", [ckptfs, "convert", f16, os.path.join(scratch, "o.lwt")],
            '"w%00evil"', '"w"')
    refusal("the .gguf writer", [ckptfs, "convert", f16, os.path.join(scratch, "o.gguf")],
            '"w%00evil"', '"w"')

    long_name = b"n" * 130 + b"\0tail"
    lg = os.path.join(scratch, "long.safetensors")
    with open(lg, "wb") as f:
        f.write(safetensors_bytes([(long_name, "F32", [4], 0, 64)], b"\0" * 16))
    rc, err = run_err([ckptfs, "ls", lg])
    tap.ok(rc not in (0, None) and '"' + "n" * 120 + '..."' in err,
           "names: a name over 120 bytes is cut with a visible ...", ["stderr: " + err])


def options_cases(tap, ckptfs, fixtures, scratch):
    src = os.path.join(fixtures, "odd", "model.safetensors")
    for opt, names in (("max_threads=-1", "max_threads=-1"), ("max_threads=4x", "max_threads=4x"),
                       ("max_threads=0", "max_threads=0"), ("timeout=nan", "timeout=nan"),
                       ("timeout=inf", "timeout=inf"), ("timeout=-1", "timeout=-1"),
                       ("readahead_kb=-1", "readahead_kb=-1"),
                       ("as_dtype=f32,view=hf", "as_dtype=f32")):
        mnt = tempfile.mkdtemp(prefix="ckptfs-t56.")
        rc, err = run_err([ckptfs, src, mnt, "-o", opt])
        tap.ok(rc == 1 and names in err and not is_mounted(mnt),
               "options: -o %s is refused with status 1, nothing mounted" % opt,
               ["exit %r" % rc, "stderr: " + err, "mounted: %s" % is_mounted(mnt)])
        unmount(mnt)
    mnt = tempfile.mkdtemp(prefix="ckptfs-t56.")
    rc, err = run_err([ckptfs, "stage", os.path.join(scratch, "s.safetensors"), mnt,
                       "-o", "max_threads=-1"])
    tap.ok(rc == 1 and "max_threads=-1" in err and not is_mounted(mnt),
           "options: ckptfs stage -o max_threads=-1 is refused", ["exit %r" % rc, err])
    unmount(mnt)

    mnt = tempfile.mkdtemp(prefix="ckptfs-t56.")
    rc, err = run_err([ckptfs, src, mnt, "-o", "tp_split=*:0"])
    tap.ok(rc not in (0, None) and "tp_split" in err and not is_mounted(mnt),
           "options: tp_split on a safetensors source is refused by the mount",
           ["exit %r" % rc, err])
    unmount(mnt)
    rc, err = run_err([ckptfs, "ls", src, "-o", "tp_split=*:0"])
    tap.ok(rc not in (0, None) and "tp_split" in err,
           "options: tp_split on a safetensors source is refused by ls", ["exit %r" % rc, err])

    mnt = tempfile.mkdtemp(prefix="ckptfs-t56.")
    rc, err = run_err([ckptfs, src, mnt, "-o", "max_threads=1,timeout=0.5,readahead_kb=0"])
    tap.ok(rc == 0 and is_mounted(mnt), "options: valid values still mount",
           ["exit %r" % rc, err])
    unmount(mnt)


def body(tap, ckptfs, fixtures):
    scratch = tempfile.mkdtemp(prefix="ckptfs-t56-src.")
    try:
        names_cases(tap, ckptfs, scratch)
        options_cases(tap, ckptfs, fixtures, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


sys.exit(run(body))
