#!/usr/bin/python3
"""A convert a user can trust, and a model's storage counted once.

Environment: CKPTFS, FIXTURES (as for the other tests).

- OUT that exists is refused without --force (left byte-identical) and replaced with it;
  OUT that is the source file, a file inside the source directory, or a directory holding a
  source file is refused before anything is written (exit 1, nothing changes).
- --include/--exclude keep exactly the tensors Python's fnmatch picks, with their bytes.
- --dtype bf16|f16|f32: every float element (F64, F32, F16, BF16 sources; specials, ties,
  subnormals, overflow) equals an independent round-to-nearest-even reference (numpy astype
  for F16/F32, exact rational arithmetic for BF16); NaN stays NaN; integer tensors keep dtype
  and bytes; Q8_0 stays Q8_0 unless --cast-quantized, then it is the dequantized values
  rounded. Tensors of more than a million elements (cast a chunk at a time as the writer reads
  them) equal torch's BF16 and numpy's F16 in a file, a seekable .zst and HF shards.
- convert DIR x.safetensors says which of DIR's files (config.json...) are not carried.
- summary.json of a torch file with tied weights counts the tied storage once
  (parameter_count = numel of distinct storages per torch), alias_count the others; in a
  mount st_blocks is 0 for .npy files, the .ckptfs/hf view and the tied twin.
"""

import fnmatch
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
from fractions import Fraction

import warnings

import numpy as np

warnings.simplefilter("ignore", RuntimeWarning)  # the reference casts overflow on purpose

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
sys.path.insert(0, os.path.join(HERE, "..", "lib", "readers"))
from ckptfs_test import Watchdog, run_cases, run_capture, unmount  # noqa: E402
import gguf_reader  # noqa: E402

CKPTFS = os.environ.get("CKPTFS")
FIXTURES = os.environ.get("FIXTURES")
COMMITTED = os.path.join(HERE, "..", "fixtures")


def convert(*args):
    rc, out, err = run_capture([CKPTFS, "convert"] + list(args), 120)
    return rc, err.decode(errors="replace")


def read_st(path):
    with open(path, "rb") as f:
        buf = f.read()
    n = struct.unpack("<Q", buf[:8])[0]
    header = json.loads(buf[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, h in header.items():
        a, b = h["data_offsets"]
        out[name] = (h["dtype"], h["shape"], buf[8 + n + a:8 + n + b])
    return out


def write_st(path, tensors):
    header, data = {}, b""
    for name, (dtype, shape, payload) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(payload)]}
        data += payload
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


def digest(path):
    with open(path, "rb") as f:
        return f.read()


# ---- independent references -------------------------------------------------------------

def bf16_bits_exact(x):
    """Round-to-nearest-even of the float64 x to bfloat16, by exact rational comparison of the
    two bfloat16 neighbours; NaN handled by the caller."""
    if np.isinf(x):
        return 0xFF80 if x < 0 else 0x7F80
    if x == 0:
        return 0x8000 if np.signbit(x) else 0
    sign = 0x8000 if x < 0 else 0
    ax = abs(float(x))
    f32max = np.finfo(np.float32).max
    f = np.float32(ax) if ax < float(f32max) else f32max  # then step toward zero if above
    if Fraction(float(f)) > Fraction(ax):
        f = np.nextafter(f, np.float32(0))
    bits = int(np.array(f, dtype=np.float32).view(np.uint32)) & 0xFFFF0000
    lo = bits >> 16
    hi = lo + 1

    def value(b):
        if (b & 0x7F80) == 0x7F80:
            return None  # infinity
        return Fraction(float(np.array(b << 16, dtype=np.uint32).view(np.float32)))
    vlo, vhi, vx = value(lo), value(hi), Fraction(ax)
    if vhi is None:
        # beyond the largest finite: infinity once x reaches the halfway point to 2^128
        top = Fraction(2) ** 128
        half = (vlo + top) / 2
        pick = hi if vx > half or (vx == half and lo & 1) else lo
    elif vx - vlo < vhi - vx:
        pick = lo
    elif vx - vlo > vhi - vx:
        pick = hi
    else:
        pick = lo if lo & 1 == 0 else hi
    return sign | pick


def bf16_to_f64(bits):
    return np.array(np.asarray(bits, dtype=np.uint32) << 16, dtype=np.uint32).view(np.float32) \
        .astype(np.float64)


def decode(dtype, raw):
    if dtype == "F64":
        return np.frombuffer(raw, "<f8").astype(np.float64)
    if dtype == "F32":
        return np.frombuffer(raw, "<f4").astype(np.float64)
    if dtype == "F16":
        return np.frombuffer(raw, "<f2").astype(np.float64)
    if dtype == "BF16":
        return bf16_to_f64(np.frombuffer(raw, "<u2"))
    raise ValueError(dtype)


def expected_bits(values, target):
    """uint array of the reference rounding of float64 values to target."""
    if target == "F16":
        return values.astype(np.float16).view(np.uint16)
    if target == "F32":
        return values.astype(np.float32).view(np.uint32)
    return np.array([bf16_bits_exact(v) if not np.isnan(v) else 0x7FC0 for v in values],
                    dtype=np.uint16)


def special_values():
    f32max = float(np.finfo(np.float32).max)
    vals = [0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, 1 / 3, -2 / 3, 65504.0, 65520.0, 65519.99,
            6.1e-5, 5.96e-8, 2.98e-8, 2.9802322387695312e-08, 1e-40, -1e-45, 1.5e-39,
            f32max, -f32max, 3.3895313892515355e38, 3.39e38, 1e300, 1e-300,
            1 + 2 ** -8, 1 + 3 * 2 ** -9, 1 + 2 ** -9, 1 + 2 ** -11, 1 + 3 * 2 ** -11,
            1 + 2 ** -24, 1 + 2 ** -23 + 2 ** -24, 2049.0, 2051.0, 257.0, 259.0]
    rng = np.random.default_rng(7)
    vals += list(rng.standard_normal(300) * 10.0 ** rng.integers(-12, 12, 300))
    return np.array(vals, dtype=np.float64)


def main():
    return run_cases("ckptfs-trust-", refusals, selection, casting, casting_large, quantized,
                     counts)


def refusals(tap, work):
    src = os.path.join(work, "src")
    shutil.copytree(os.path.join(FIXTURES, "sharded"), src)
    before = {n: digest(os.path.join(src, n)) for n in os.listdir(src)}

    out = os.path.join(work, "out.safetensors")
    rc, err = convert(src, out)
    tap.ok(rc == 0 and os.path.exists(out), "HF dir -> new .safetensors: exit 0", [err])
    tap.ok("note:" in err and "config.json" in err and "tokenizer.json" in err,
           "the folder's config.json and tokenizer.json are named as not carried", [err])
    first = digest(out)
    with open(out, "r+b") as f:
        f.seek(100)
        f.write(b"\xff")
    mark = digest(out)
    rc, err = convert(src, out)
    tap.ok(rc == 1 and "--force" in err and digest(out) == mark,
           "existing OUT without --force: exit 1, untouched, --force named", [rc, err])
    rc, err = convert(src, out, "--force")
    tap.ok(rc == 0 and digest(out) == first, "--force replaces OUT with the conversion",
           [rc, err])

    shard = os.path.join(src, "model-00001-of-00003.safetensors")
    rc, err = convert(shard, shard, "--force")
    tap.ok(rc == 1 and "source" in err, "OUT == the source file: refused even with --force",
           [rc, err])
    rc, err = convert(src, os.path.join(src, "x.safetensors"), "--force")
    tap.ok(rc == 1 and "inside the source" in err and
           not os.path.exists(os.path.join(src, "x.safetensors")),
           "OUT inside the source directory: refused, nothing created", [rc, err])
    rc, err = convert(src, os.path.join(src, "sub") + "/")
    tap.ok(rc == 1 and not os.path.exists(os.path.join(src, "sub")),
           "directory OUT inside the source directory: refused", [rc, err])
    rc, err = convert(shard, src, "--force")
    tap.ok(rc == 1 and "holds" in err, "directory OUT holding a source file: refused", [rc, err])
    link = os.path.join(work, "link.safetensors")
    os.symlink(shard, link)
    rc, err = convert(src, link, "--force")
    tap.ok(rc == 1 and "a file of the source" in err,
           "OUT a symlink to a file of the source: refused", [rc, err])
    # a directory source reached through a symlink
    rc, err = convert(src + "/", os.path.realpath(src) + "/../src/y.gguf")
    tap.ok(rc == 1, "OUT inside the source named another way (../src/): refused", [rc, err])
    # the name is checked before the source is opened: a cast would come before the write
    rc, err = convert(os.path.join(work, "no-such-source"), os.path.join(work, "out.npz"),
                      "--dtype", "bf16")
    tap.ok(rc == 2 and "cannot tell the output format" in err and "no-such-source" not in err,
           "an OUT name no writer takes: refused before the source is read", [rc, err])
    after = {n: digest(os.path.join(src, n)) for n in os.listdir(src)}
    tap.ok(after == before, "the source directory is byte-identical after all refusals",
           [sorted(set(after) ^ set(before))])
    tap.ok(not [n for n in os.listdir(work) if ".partial-" in n],
           "no temporary files left beside OUT")

    outdir = os.path.join(work, "hf")
    rc, err = convert(src, outdir + "/")
    tap.ok(rc == 0 and "note:" not in err and os.path.exists(os.path.join(outdir, "config.json")),
           "HF dir -> directory OUT: config files carried, no note", [rc, err])
    rc, err = convert(src, outdir + "/")
    tap.ok(rc == 1 and "--force" in err, "existing directory OUT without --force: refused",
           [rc, err])
    with open(os.path.join(outdir, "README.md"), "w") as f:
        f.write("mine")
    rc, err = convert(src, outdir + "/", "--force")
    tap.ok(rc == 0 and os.path.exists(os.path.join(outdir, "README.md")),
           "--force replaces a directory OUT, keeping the user's other files", [rc, err])
    empty = os.path.join(work, "empty")
    os.mkdir(empty)
    rc, err = convert(src, empty)
    tap.ok(rc == 0, "an empty existing directory is no OUT to protect", [rc, err])


def selection(tap, work):
    src = os.path.join(FIXTURES, "sharded")
    full = os.path.join(work, "full.safetensors")
    convert(src, full)
    names = read_st(full)
    cases = [(["--include", "*self_attn*"], ["*self_attn*"], []),
             (["--include", "*.0.*", "--include", "*embed*"], ["*.0.*", "*embed*"], []),
             (["--exclude", "*proj*"], [], ["*proj*"]),
             (["--include", "*layers*", "--exclude", "*.weight", "--exclude", "*k_proj*"],
              ["*layers*"], ["*.weight", "*k_proj*"])]
    for i, (args, inc, exc) in enumerate(cases):
        want = sorted(n for n in names
                      if (not inc or any(fnmatch.fnmatchcase(n, g) for g in inc)) and
                      not any(fnmatch.fnmatchcase(n, g) for g in exc))
        out = os.path.join(work, "sel%d.safetensors" % i)
        rc, err = convert(src, out, *args)
        if not want:
            tap.ok(rc == 1 and "no tensor" in err and not os.path.exists(out),
                   "%s: nothing left is refused" % " ".join(args), [rc, err])
            continue
        got = read_st(out) if rc == 0 else {}
        tap.ok(rc == 0 and sorted(got) == want and
               all(got[n] == names[n] for n in want),
               "%s: exactly the %d tensors fnmatch picks, bytes unchanged" %
               (" ".join(args), len(want)), [rc, err, sorted(got), want])
    rc, err = convert(src, os.path.join(work, "none.safetensors"), "--include", "nothing*")
    tap.ok(rc == 1 and "no tensor" in err, "--include matching nothing: exit 1", [rc, err])


def casting(tap, work):
    vals = special_values()
    f16 = vals.astype(np.float16)
    bf = np.array([bf16_bits_exact(v) for v in vals], dtype=np.uint16)
    nan64 = np.array([np.nan, -np.nan, struct.unpack("<d", struct.pack("<Q", 0x7FF0000000000001))[0]])
    tensors = {
        "a.f64": ("F64", [len(vals)], vals.astype("<f8").tobytes()),
        "b.f32": ("F32", [len(vals)], vals.astype("<f4").tobytes()),
        "c.f16": ("F16", [len(vals)], f16.astype("<f2").tobytes()),
        "d.bf16": ("BF16", [len(vals)], bf.astype("<u2").tobytes()),
        "e.nan": ("F64", [3], nan64.astype("<f8").tobytes()),
        "f.i32": ("I32", [4], np.array([1, -2, 3, 1 << 30], "<i4").tobytes()),
        "g.i8": ("I8", [3], b"\x00\x7f\xff"),
        "h.empty": ("F32", [0, 3], b""),
        "i.scalar": ("F64", [], np.array([0.1], "<f8").tobytes()),
    }
    src = os.path.join(work, "cast-src.safetensors")
    write_st(src, tensors)
    for target, width in (("bf16", 2), ("f16", 2), ("f32", 4)):
        T = target.upper()
        for ext in (".safetensors", ".gguf"):
            out = os.path.join(work, "cast-%s%s" % (target, ext))
            rc, err = convert(src, out, "--dtype", target)
            if not tap.ok(rc == 0, "--dtype %s -> %s: exit 0" % (target, ext), [err]):
                continue
            if ext == ".gguf":
                g = gguf_reader.read(out)
                got = {t.name: (t.type_name, bytes(g.tensor_bytes(t))) for t in g.tensors}
            else:
                got = {n: (d, b) for n, (d, s, b) in read_st(out).items()}
            bad = []
            for name, (dtype, shape, raw) in tensors.items():
                if name not in got:
                    bad.append("%s missing" % name)
                    continue
                gd, gb = got[name]
                if dtype in ("I32", "I8"):
                    if gd != dtype or gb != raw:
                        bad.append("%s: integer tensor changed (%s)" % (name, gd))
                    continue
                if gd != T and not (dtype == T):
                    bad.append("%s: dtype %s, expected %s" % (name, gd, T))
                    continue
                src_vals = decode(dtype, raw)
                want = expected_bits(src_vals, T)
                have = np.frombuffer(gb, "<u%d" % width)
                nan = np.isnan(src_vals)
                if len(have) != len(want):
                    bad.append("%s: %d elements, expected %d" % (name, len(have), len(want)))
                    continue
                have_f = decode(T, gb)
                if not np.all(np.isnan(have_f[nan])):
                    bad.append("%s: a NaN did not stay NaN" % name)
                mism = np.nonzero((have != want) & ~nan)[0]
                if len(mism):
                    k = mism[0]
                    bad.append("%s[%d]: %r -> 0x%x, reference 0x%x (%d mismatches)"
                               % (name, k, src_vals[k], have[k], want[k], len(mism)))
            tap.ok(not bad, "--dtype %s -> %s: every float element is the round-to-nearest-even "
                   "reference, NaN kept, integers untouched" % (target, ext), bad)


def q8_0_dequant(raw):
    out = []
    for b in range(len(raw) // 34):
        blk = raw[34 * b:34 * b + 34]
        d = np.frombuffer(blk[:2], "<f2").astype(np.float32)[0]
        q = np.frombuffer(blk[2:], np.int8).astype(np.float32)
        out.append(q * d)
    return np.concatenate(out).astype(np.float64)


def casting_large(tap, work):
    """Tensors larger than one cast chunk (2^20 elements), of odd lengths, into each kind of
    output: what the writer reads of the cast, in whatever pieces it reads, is numpy's/torch's."""
    import torch
    rng = np.random.default_rng(11)
    f32 = (rng.standard_normal(1500 * 1001) * 10.0 ** rng.integers(-6, 6, 1500 * 1001))
    f32 = f32.astype(np.float32)
    f32[::99991] = np.inf
    f32[7::99991] = np.nan
    f64 = rng.standard_normal(300001) * 1e3
    f16 = (rng.standard_normal(1000001) * 100).astype(np.float16)
    tensors = {
        "big.f32": ("F32", [1500, 1001], f32.astype("<f4").tobytes()),
        "mid.f64": ("F64", [300001], f64.astype("<f8").tobytes()),
        "odd.f16": ("F16", [1000001], f16.astype("<f2").tobytes()),
        "small.i32": ("I32", [3], np.array([1, 2, 3], "<i4").tobytes()),
    }
    src = os.path.join(work, "large-src.safetensors")
    write_st(src, tensors)

    def bf16(values32):
        values32 = np.ascontiguousarray(values32, dtype=np.float32)
        out = torch.from_numpy(values32).to(torch.bfloat16).view(torch.int16).numpy()
        out = out.view(np.uint16).copy()
        # torch 1.13 writes every NaN as 0xFFFF; ckpt(5) keeps sign and leading payload bits
        # and sets the quiet bit (checked on its own in casting() above)
        nan = np.isnan(values32)
        out[nan] = (values32.view(np.uint32)[nan] >> 16).astype(np.uint16) | 0x40
        return out.astype("<u2").tobytes()

    expect = {
        "bf16": {"big.f32": bf16(f32), "odd.f16": bf16(f16.astype(np.float32)),
                 # F64 rounds once, straight to BF16: torch would go through F32 first
                 "mid.f64": None},
        "f16": {"big.f32": f32.astype("<f2").tobytes(), "mid.f64": f64.astype("<f2").tobytes(),
                "odd.f16": tensors["odd.f16"][2]},
    }
    for target, kind in (("bf16", ".safetensors"), ("bf16", ".safetensors.zst"), ("f16", "/")):
        out = os.path.join(work, "large-%s%s" % (target, kind))
        extra = ["--max-shard-size", "3MB"] if kind == "/" else []
        rc, err = convert(src, out, "--dtype", target, *extra)
        if not tap.ok(rc == 0, "--dtype %s of tensors past a chunk -> %s: exit 0"
                      % (target, kind), [err]):
            continue
        got = {}
        if kind == "/":
            shards = sorted(f for f in os.listdir(out) if f.endswith(".safetensors"))
            for f in shards:
                got.update(read_st(os.path.join(out, f)))
            tap.ok(len(shards) > 2, "--max-shard-size 3MB gives %d shards" % len(shards))
        elif kind.endswith(".zst"):
            plain = out[:-4]
            subprocess.run(["zstd", "-q", "-d", "-f", out, "-o", plain], check=True)
            got = read_st(plain)
        else:
            got = read_st(out)
        bad = []
        for name, want in expect[target].items():
            dtype, shape, raw = got.get(name, (None, None, b""))
            if dtype != target.upper() or shape != tensors[name][1]:
                bad.append("%s: %s %s" % (name, dtype, shape))
            elif want is not None and raw != want:
                diff = next(i for i in range(min(len(raw), len(want))) if raw[i] != want[i]) \
                    if len(raw) == len(want) else -1
                bad.append("%s: %d bytes, first difference at byte %d" % (name, len(raw), diff))
            elif want is None:  # F64 to BF16: the exact reference, on a sample
                vals = np.frombuffer(raw, "<u2")
                for i in list(range(0, 300001, 7919)) + [300000]:
                    if int(vals[i]) != bf16_bits_exact(f64[i]):
                        bad.append("mid.f64[%d]: %04x, expected %04x"
                                   % (i, int(vals[i]), bf16_bits_exact(f64[i])))
                        break
        kept = got.get("small.i32", (None, None, b""))
        if kept[0] != "I32" or kept[2] != tensors["small.i32"][2]:
            bad.append("small.i32 changed: %r" % (kept[:2],))
        tap.ok(not bad, "--dtype %s -> %s: tensors of 300,001 to 1,501,500 elements equal the "
               "reference byte for byte" % (target, kind), bad[:5])


def quantized(tap, work):
    src = os.path.join(FIXTURES, "gguf", "v3", "model.gguf")
    g0 = gguf_reader.read(src)
    q = [t for t in g0.tensors if t.name == "blk.1.attn_q.weight"][0]
    qraw = bytes(g0.tensor_bytes(q))
    out = os.path.join(work, "q-keep.gguf")
    rc, err = convert(src, out, "--dtype", "f16")
    g = gguf_reader.read(out) if rc == 0 else None
    t = [t for t in g.tensors if t.name == q.name][0] if g else None
    tap.ok(t is not None and t.type_name == "Q8_0" and bytes(g.tensor_bytes(t)) == qraw,
           "--dtype f16 leaves a Q8_0 tensor as it is", [rc, err])
    ints = {t.name: bytes(g0.tensor_bytes(t)) for t in g0.tensors if t.type_name[0] == "I"}
    tap.ok(g is not None and all(bytes(g.tensor_bytes(t)) == ints[t.name] for t in g.tensors
                                 if t.name in ints),
           "--dtype f16 leaves I8/I16/I32/I64 tensors as they are")
    out = os.path.join(work, "q-cast.gguf")
    rc, err = convert(src, out, "--dtype", "f16", "--cast-quantized",
                      "--include", "blk.1.attn_q.weight")
    g = gguf_reader.read(out) if rc == 0 else None
    t = g.tensors[0] if g else None
    want = q8_0_dequant(qraw).astype(np.float16)
    tap.ok(t is not None and t.type_name == "F16" and
           np.array_equal(np.frombuffer(bytes(g.tensor_bytes(t)), "<f2"), want),
           "--cast-quantized: Q8_0 dequantized (d * q) and rounded to F16", [rc, err])
    rc, err = convert(src, os.path.join(work, "x.gguf"), "--cast-quantized")
    tap.ok(rc == 1, "--cast-quantized without --dtype: usage error", [rc, err])
    rc, err = convert(src, os.path.join(work, "x.gguf"), "--dtype", "f8")
    tap.ok(rc == 1 and "bf16" in err, "--dtype f8: usage error naming the choices", [rc, err])


def torch_storages(path):
    import torch
    sd = torch.load(path, map_location="cpu")
    flat = {}

    def walk(prefix, v):
        if isinstance(v, torch.Tensor):
            flat[prefix] = v
        elif isinstance(v, dict):
            for k, x in v.items():
                walk("%s.%s" % (prefix, k) if prefix else str(k), x)
    walk("", sd)
    seen, params, aliases = set(), 0, 0
    for name in sorted(flat):
        t = flat[name]
        key = (t.untyped_storage().data_ptr() if hasattr(t, "untyped_storage")
               else t.storage().data_ptr(), t.storage_offset(), t.numel())
        if key in seen:
            aliases += 1
        else:
            seen.add(key)
            params += t.numel()
    return params, aliases, len(flat)


def counts(tap, work):
    path = os.path.join(COMMITTED, "torch", "tied.pt")
    rc, out, err = run_capture([CKPTFS, "info", "--json", path], 60)
    summary = json.loads(out) if rc == 0 else {}
    try:
        params, aliases, n = torch_storages(path)
    except ImportError:
        tap.skip("tied.pt counted against torch", "python3-torch is not installed")
        return
    tap.ok(summary.get("parameter_count") == params and summary.get("alias_count") == aliases
           and aliases >= 1 and summary.get("tensor_count") == n,
           "tied.pt: parameter_count %d counts each storage once, alias_count %d (torch)"
           % (params, aliases), [summary, (params, aliases, n)])
    rc, out, err = run_capture([CKPTFS, "info", path], 60)
    tap.ok(rc == 0 and b"aliases" in out, "info shows the alias line", [out])
    rc, out, _ = run_capture([CKPTFS, "info", "--json", os.path.join(FIXTURES, "sharded")], 60)
    s2 = json.loads(out)
    tap.ok(s2.get("alias_count") == 0, "an HF folder without ties: alias_count 0", [s2])

    mnt = tempfile.mkdtemp(prefix="ckptfs-du-")
    try:
        rc, _, err = run_capture([CKPTFS, path, mnt, "-o", "npy"], 30)
        if not tap.ok(rc == 0, "mount tied.pt with -o npy", [err]):
            return
        with Watchdog(mnt, 60):
            blocks = {}
            for root, dirs, files in os.walk(mnt):
                for f in files:
                    p = os.path.join(root, f)
                    blocks[os.path.relpath(p, mnt)] = os.lstat(p)
            npy = [p for p in blocks if p.endswith(".npy")]
            hf = [p for p in blocks if p.startswith(".ckptfs/hf/")]
            tap.ok(npy and all(blocks[p].st_blocks == 0 and blocks[p].st_size > 0 for p in npy),
                   "%d .npy files: st_blocks 0, st_size their bytes" % len(npy))
            tap.ok(hf and all(blocks[p].st_blocks == 0 for p in hf),
                   ".ckptfs/hf files report st_blocks 0", [hf])
            tensors = [p for p in blocks if not p.startswith(".ckptfs") and
                       not p.endswith(".npy") and not p.endswith(".json")]
            zero = [p for p in tensors if blocks[p].st_blocks == 0 and blocks[p].st_size > 0]
            tap.ok(len(zero) == aliases,
                   "the tied twin takes no blocks (%d of %d tensor files)" % (len(zero),
                                                                              len(tensors)),
                   [zero])
            du = subprocess.run(["du", "-s", "-B1", mnt], capture_output=True, text=True)
            stored = sum(blocks[p].st_blocks for p in blocks) * 512
            tap.ok(du.returncode == 0 and int(du.stdout.split()[0]) >= stored,
                   "du of the mount runs and counts the tensors' own blocks", [du.stdout])
    finally:
        unmount(mnt)


if __name__ == "__main__":
    sys.exit(main())
