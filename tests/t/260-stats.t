#!/usr/bin/python3
"""ckptfs stats: per-tensor figures checked against numpy/float64 and math.fsum.

A safetensors file written here (independently of core/) holds every dtype the statistics read:
all 65536 F16 and BF16 bit patterns and all 256 of each float8 format (so NaN, infinities,
subnormals and both zeros are in), F32 and F64 with NaN/Inf/denormals, integers at their
extremes, BOOL, empty and 0-d tensors, and a 1.5M-element F32 tensor with mean 1e6 and std ~1
(three work units: the merge of partial results and the variance's stability). The values are
decoded here from the bytes; the GGUF block types come from the gguf/v3 fixture with the
reference dequantizers of 380-as-dtype.t. Then: the same figures in .ckptfs/stats.json and
user.ckpt.stats of a mount, and the SVG pictures parse and hold one panel per family.
"""
import importlib.machinery
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

import numpy as np

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
from mount_checks import check_help, mounted, read_json, run  # noqa: E402

AS_DTYPE = importlib.machinery.SourceFileLoader("as_dtype", os.path.join(HERE, "380-as-dtype.t")
                                                ).load_module()
TIMEOUT = 120
np.seterr(all="ignore")  # NaN and Inf are the point here


def ck(ckptfs, *args):
    p = subprocess.run([ckptfs] + [str(a) for a in args], capture_output=True, timeout=TIMEOUT)
    return p.returncode, p.stdout, p.stderr


# ---- values from bytes, written here ----

def f8(raw, man_bits, bias, fnuz):
    b = np.frombuffer(raw, np.uint8).astype(np.int64)
    exp_bits = 7 - man_bits
    exp, man = (b >> man_bits) & ((1 << exp_bits) - 1), b & ((1 << man_bits) - 1)
    frac = man / float(1 << man_bits)
    v = np.where(exp == 0, frac * 2.0 ** (1 - bias), (1 + frac) * np.exp2(exp - float(bias)))
    v = np.where(b & 0x80, -v, v)
    if fnuz:
        v[b == 0x80] = np.nan
    elif man_bits == 3:  # e4m3fn: S.1111.111 is NaN, no infinities
        v[(exp == 15) & (man == 7)] = np.nan
    else:  # e5m2: IEEE-like
        v[(exp == 31) & (man == 0)] = np.inf * np.where(b[(exp == 31) & (man == 0)] & 0x80, -1, 1)
        v[(exp == 31) & (man != 0)] = np.nan
    return v


def e8m0(raw):
    b = np.frombuffer(raw, np.uint8).astype(np.float64)
    v = np.exp2(b - 127)
    v[b == 255] = np.nan
    return v


DECODE = {
    "F16": lambda r: np.frombuffer(r, "<f2").astype(np.float64),
    "BF16": lambda r: (np.frombuffer(r, "<u2").astype(np.uint32) << 16).view(np.float32)
    .astype(np.float64),
    "F32": lambda r: np.frombuffer(r, "<f4").astype(np.float64),
    "F64": lambda r: np.frombuffer(r, "<f8").copy(),
    "F8_E4M3": lambda r: f8(r, 3, 7, False),
    "F8_E5M2": lambda r: f8(r, 2, 15, False),
    "F8_E4M3FNUZ": lambda r: f8(r, 3, 8, True),
    "F8_E5M2FNUZ": lambda r: f8(r, 2, 16, True),
    "F8_E8M0": e8m0,
    "BOOL": lambda r: np.frombuffer(r, np.uint8).astype(bool).astype(np.float64),
}
for _n, _t in (("U8", "u1"), ("I8", "i1"), ("U16", "<u2"), ("I16", "<i2"), ("U32", "<u4"),
               ("I32", "<i4"), ("U64", "<u8"), ("I64", "<i8")):
    DECODE[_n] = (lambda t: lambda r: np.frombuffer(r, t).astype(np.float64))(_t)
# The ggml block types stats decodes: those -o as_dtype=f32 converts.
BLOCK_TYPES = {"Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q6_K", "TQ1_0", "TQ2_0", "MXFP4"}
for _q in sorted(BLOCK_TYPES):
    DECODE[_q] = (lambda f: lambda r: f(r).astype(np.float64))(AS_DTYPE.CONVERT[_q])


def reference(v):
    """The figures ckptfs(1) documents, the slow and sure way."""
    fin = v[np.isfinite(v)]
    r = {"count": int(v.size), "finite": int(fin.size), "nan": int(np.isnan(v).sum()),
         "posinf": int(np.isposinf(v).sum()), "neginf": int(np.isneginf(v).sum()),
         "zeros": int((fin == 0).sum())}
    if fin.size:
        r.update(min=float(fin.min()), max=float(fin.max()), absmax=float(np.abs(fin).max()),
                 mean=math.fsum(fin.tolist()) / fin.size, std=float(np.std(fin)),
                 l2norm=math.sqrt(math.fsum((fin * fin).tolist())),
                 scale=math.fsum(np.abs(fin).tolist()) / fin.size)
    else:
        r.update(min=None, max=None, absmax=None, mean=None, std=None, l2norm=0.0, scale=0)
    return r


def compare(got, want):
    bad = []
    for k in ("count", "finite", "nan", "posinf", "neginf", "zeros", "min", "max", "absmax"):
        if got.get(k) != want[k]:
            bad.append("%s: got %r, want %r" % (k, got.get(k), want[k]))
    if want["mean"] is None:
        for k in ("mean", "std"):
            if got.get(k) is not None:
                bad.append("%s: got %r for no finite values" % (k, got.get(k)))
    else:
        # pairwise sums: error bound ~ log2(n) * eps * sum|x|; 1e-13 of the mean magnitude
        if abs(got["mean"] - want["mean"]) > 1e-13 * want["scale"]:
            bad.append("mean: got %r, want %r" % (got["mean"], want["mean"]))
        if abs(got["std"] - want["std"]) > 1e-11 * max(want["std"], 1e-300):
            bad.append("std: got %r, want %r" % (got["std"], want["std"]))
    if abs(got["l2norm"] - want["l2norm"]) > 1e-13 * max(want["l2norm"], 1e-300):
        bad.append("l2norm: got %r, want %r" % (got["l2norm"], want["l2norm"]))
    return bad


# ---- a safetensors file written here ----

def write_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def build_tensors(rng):
    t = []
    every16 = np.arange(65536, dtype=np.uint16).tobytes()
    t.append(("all.f16", "F16", [256, 256], every16))
    t.append(("all.bf16", "BF16", [65536], every16))
    every8 = bytes(range(256))
    for dt in ("F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F8_E8M0"):
        t.append(("all." + dt.lower(), dt, [16, 16], every8))
    special = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, -1e-45, 3.4e38, -1.5, 2.5],
                       np.float32)
    f32 = np.concatenate([special, rng.standard_normal(5000).astype(np.float32)])
    t.append(("model.layers.0.special.f32", "F32", [f32.size], f32.tobytes()))
    f64 = np.concatenate([[np.nan, np.inf, 5e-324, -2.2e-308, 0.0],
                          rng.standard_normal(3001) * 1e5])
    t.append(("model.layers.0.special.f64", "F64", [f64.size], f64.tobytes()))
    big = (1e6 + rng.standard_normal(1_500_000)).astype(np.float32)
    t.append(("model.layers.1.special.f32", "F32", [1500, 1000], big.tobytes()))
    for dt, np_t in (("U8", np.uint8), ("I8", np.int8), ("U16", np.uint16), ("I16", np.int16),
                     ("U32", np.uint32), ("I32", np.int32), ("U64", np.uint64),
                     ("I64", np.int64)):
        info = np.iinfo(np_t)
        v = rng.integers(info.min, info.max, 999, dtype=np_t, endpoint=True)
        v[:3] = [info.min, info.max, 0]
        t.append(("ints." + dt.lower(), dt, [v.size], v.tobytes()))
    t.append(("ints.bool", "BOOL", [77], (rng.random(77) < 0.3).astype(np.uint8).tobytes()))
    t.append(("empty.f32", "F32", [0], b""))
    t.append(("empty.bf16", "BF16", [3, 0], b""))
    t.append(("scalar.f32", "F32", [], struct.pack("<f", -7.25)))
    t.append(("nan_only.f16", "F16", [4], np.array([np.nan] * 4, "<f2").tobytes()))
    t.append(("unsupported.c64", "C64", [2], np.zeros(2, np.complex64).tobytes()))
    return t


def by_name(doc):
    return {(e.get("prefix", "") + e["name"]): e for e in doc["tensors"]}


def check_source(tap, ckptfs, src, label, values):
    rc, out, err = ck(ckptfs, "stats", "--json", src)
    tap.ok(rc == 0, "%s: ckptfs stats --json exits 0" % label, [rc, err[-500:]])
    try:
        doc = json.loads(out)
    except ValueError as e:
        tap.ok(False, "%s: JSON parses" % label, [e])
        return None
    got = by_name(doc)
    for name, v in values.items():
        if v is None:
            tap.ok("error" in got.get(name, {}) and "not supported" in got[name]["error"],
                   "%s: %s: dtype not supported, said so" % (label, name), [got.get(name)])
            continue
        want = reference(v)
        bad = compare(got.get(name, {}), want)
        tap.ok(not bad, "%s: %s (%s, %d values) = numpy/fsum" % (label, name,
                                                                 got.get(name, {}).get("dtype"),
                                                                 v.size), bad)
    rc1, out1, _ = ck(ckptfs, "stats", "--json", "-j", "1", src)
    tap.ok(rc1 == 0 and out1 == out, "%s: one thread gives the same bytes as all CPUs" % label)
    return doc


def main(tap, ckptfs, fixtures):
    rng = np.random.default_rng(26)
    tmp = tempfile.mkdtemp(prefix="ckptfs-t26.")
    src = os.path.join(tmp, "values.safetensors")
    tensors = build_tensors(rng)
    write_safetensors(src, tensors)
    values = {n: (DECODE[dt](raw) if dt in DECODE else None) for n, dt, _, raw in tensors}
    doc = check_source(tap, ckptfs, src, "safetensors", values)
    tap.ok(set(DECODE) - BLOCK_TYPES <=
           {dt for _, dt, _, _ in tensors}, "every decoded plain dtype is in the fixture")

    # GGUF block types from the fixture, values from the reference dequantizers.
    gdir = os.path.join(fixtures, "gguf", "v3")
    manifest = read_json(os.path.join(gdir, "manifest.json"))
    gvals, seen = {}, set()
    for t in manifest["tensors"]:
        with open(os.path.join(gdir, t["file"]), "rb") as f:
            f.seek(t["offset"])
            raw = f.read(t["nbytes"])
        gvals[t["name"]] = DECODE[t["dtype"]](raw) if t["dtype"] in DECODE else None
        seen.add(t["dtype"])
    check_source(tap, ckptfs, os.path.join(gdir, "model.gguf"), "gguf/v3", gvals)
    tap.ok(BLOCK_TYPES <= seen, "gguf/v3 has every dequantized block type",
           [sorted(seen)])

    # Text table: a header and one line per tensor, names last.
    rc, out, err = ck(ckptfs, "stats", src, "all.*")
    lines = out.decode().splitlines()
    tap.ok(rc == 0 and lines[0].split()[:2] == ["DTYPE", "MIN"] and len(lines) == 8 and
           all(ln.split()[-1].startswith("all.") for ln in lines[1:]),
           "text table: header + one line per matching tensor", [rc, err, lines[:3]])
    rc, _, err = ck(ckptfs, "stats", src, "nothing*")
    tap.ok(rc == 2 and b"no tensor matches" in err, "a GLOB matching nothing: exit 2", [rc, err])
    rc, _, err = ck(ckptfs, "stats", src, "--bins", "0")
    tap.ok(rc == 1, "--bins 0: usage error", [rc, err])

    # Pictures: per-layer panels and a histogram, both well-formed SVG.
    svg = os.path.join(tmp, "layers.svg")
    rc, _, err = ck(ckptfs, "stats", src, "--plot", svg)
    ok = rc == 0
    try:
        root = ET.parse(svg).getroot()
        texts = ["".join(e.itertext()) for e in root.iter("{http://www.w3.org/2000/svg}text")]
        ok = ok and root.get("width") == "1200" and "model.layers.*.special.f32" in texts and \
            any("NaN" in x for x in texts) and "layer" in texts
        lines_n = len(list(root.iter("{http://www.w3.org/2000/svg}polyline")))
        ok = ok and lines_n >= 2
    except (ET.ParseError, OSError) as e:
        ok, texts = False, [str(e)]
    tap.ok(ok, "--plot: SVG 1200 px wide, a panel per family, axes labelled, NaN marks", [rc, err])
    hist = os.path.join(tmp, "hist.svg")
    rc, _, err = ck(ckptfs, "stats", src, "--hist", "model.layers.1.special.f32", "--plot", hist,
                    "--bins", "50")
    try:
        root = ET.parse(hist).getroot()
        bars = [e for e in root.iter("{http://www.w3.org/2000/svg}rect")][2:]
        total = len(bars)
        ok = rc == 0 and 10 < total <= 50
    except (ET.ParseError, OSError) as e:
        ok, total = False, str(e)
    tap.ok(ok, "--hist: SVG with up to 50 bars (%s)" % total, [rc, err])
    rc, _, err = ck(ckptfs, "stats", src, "--hist", "all.f16")
    tap.ok(rc == 1, "--hist without --plot: usage error", [rc, err])
    # Values near +-DBL_MAX: hi - lo overflows, so every value went to one bin (and a NaN
    # bin index was cast to size_t). 1000 evenly spread values and a NaN in 10 bins: 100 each.
    huge_src = os.path.join(tmp, "huge.safetensors")
    big = np.finfo(np.float64).max
    vals = np.concatenate([np.linspace(-0.9, 0.9, 1000) * big, [np.nan]]).astype("<f8")
    write_safetensors(huge_src, [("huge", "F64", (vals.size,), vals.tobytes())])
    hist = os.path.join(tmp, "huge.svg")
    rc, _, err = ck(ckptfs, "stats", huge_src, "--hist", "huge", "--plot", hist, "--bins", "10")
    try:
        root = ET.parse(hist).getroot()
        heights = [float(e.get("height")) for e in root.iter("{http://www.w3.org/2000/svg}rect")
                   if e.get("fill") == "#1f77b4"]
        full = [h for h in heights if h > 0]
        ok = rc == 0 and len(full) == 10 and max(full) - min(full) < 0.05 * max(full)
    except (ET.ParseError, OSError, TypeError, ValueError) as e:
        ok, heights = False, str(e)
    tap.ok(ok, "--hist of F64 values near +-DBL_MAX and a NaN: 10 equal bars", [rc, err, heights])

    # The mount: .ckptfs/stats.json is the same document; user.ckpt.stats per tensor.
    def checks(mnt):
        path = os.path.join(mnt, ".ckptfs", "stats.json")
        before = os.stat(path).st_size
        with open(path, "rb") as f:
            data = f.read()
        try:
            mdoc = json.loads(data)
        except ValueError as e:
            mdoc = {"error": str(e)}
        tap.ok(doc is not None and mdoc == doc, ".ckptfs/stats.json = ckptfs stats --json",
               [data[:300]])
        tap.ok(before == len(data) and os.stat(path).st_size == len(data),
               "stats.json: its size is right before the first read (%d)" % len(data),
               [before, len(data)])
        for name in ("all.bf16", "model.layers.1.special.f32", "empty.f32"):
            p = os.path.join(mnt, name.replace(".", "/"))
            try:
                x = json.loads(os.getxattr(p, "user.ckpt.stats"))
            except OSError as e:
                x = {"error": str(e)}
            want = {k: v for k, v in by_name(doc)[name].items()
                    if k not in ("name", "dtype", "shape")}
            tap.ok(x == want and "user.ckpt.stats" in os.listxattr(p),
                   "user.ckpt.stats of %s = its stats.json entry" % name, [x, want])
        p = os.path.join(mnt, "unsupported", "c64")
        tap.ok("user.ckpt.stats" not in os.listxattr(p),
               "no user.ckpt.stats on a C64 tensor (values not decoded)")

    mounted(tap, ckptfs, src, "stats mount", checks)

    check_help(tap, ckptfs, "stats")
    shutil.rmtree(tmp, ignore_errors=True)

if __name__ == "__main__":
    sys.exit(run(main))
