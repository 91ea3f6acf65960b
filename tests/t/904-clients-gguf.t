#!/usr/bin/python3
"""gguf-py (llama.cpp's own Python package, gguf 0.19) against ckptfs, both ways.

- gguf-py's GGUFWriter writes a GGUF with a key-value of every type (ints of each width, f32,
  f64, bool, UTF-8 string, arrays of ints and strings) and tensors F32, F16 and every type
  gguf.quants.quantize can make (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, TQ1_0, TQ2_0, MXFP4), plus
  Q4_K and Q6_K blocks of random bits (gguf-py dequantizes those but cannot quantize them).
  ckptfs mounts it: metadata.json's gguf holds every KV GGUFReader reads, in file order, with
  equal values (FLOAT32 values compared as float32: ckptfs prints the shortest text that reads
  back to the same float32); every tensor's bytes equal GGUFReader's tensor data, with its
  ggml type name and shape (ne reversed).
- With -o as_dtype=f32 every one of those tensors reads as float32 whose bits equal
  gguf.quants.dequantize(data, type) exactly (the uint32 views compared; none are NaN), and
  its sidecar says F32.
- Every GGUF ckptfs writes is read by GGUFReader, agreeing on every KV and tensor with what a
  ckptfs mount of the same file shows and with the source: `ckptfs convert X.safetensors
  y.gguf` (F64, F32, F16, BF16, I8, I16, I32, I64; bytes equal safetensors' safe_open of the
  source), convert of the gguf-py file above (its KVs and quantized blocks kept, as GGUFReader
  reads both files), and convert of a tiny Hugging Face Llama folder (llama.cpp names and
  hyper-parameters).
"""

import json
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
from clients_env import under_clients  # noqa: E402

under_clients("gguf", "numpy", "safetensors", "torch")

import gguf  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from gguf import GGMLQuantizationType as Q, GGUFValueType as V  # noqa: E402
from gguf.quants import dequantize, quantize  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

import llama_ref  # noqa: E402
import mount_checks as mc  # noqa: E402
from ckptfs_test import run_capture  # noqa: E402

QUANTIZABLE = (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.TQ1_0, Q.TQ2_0, Q.MXFP4)


def random_k_blocks(rng, qtype, nblocks):
    """Blocks of random bits whose f16 scales are finite (so dequantize makes no NaN)."""
    size = gguf.GGML_QUANT_SIZES[qtype][1]
    b = rng.integers(0, 256, (nblocks, size), dtype=np.uint8)
    scale = rng.uniform(-0.5, 0.5, (nblocks, 2)).astype(np.float16).view(np.uint8)
    if qtype == Q.Q4_K:      # f16 d, f16 dmin first
        b[:, 0:4] = scale
    else:                    # Q6_K: f16 d last
        b[:, size - 2:] = scale[:, :2]
    return b


def write_gguf_py(path):
    """The gguf-py fixture; returns {name: ggml type} of its tensors."""
    w = gguf.GGUFWriter(path, "llama")
    w.add_uint8("t.u8", 250)
    w.add_int8("t.i8", -3)
    w.add_uint16("t.u16", 65000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4000000000)
    w.add_int32("t.i32", -2000000000)
    w.add_uint64("t.u64", 2 ** 40 + 1)
    w.add_int64("t.i64", -(2 ** 50))
    w.add_float32("t.f32", 0.1)
    w.add_float64("t.f64", 1 / 3)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "h\u00e9llo \u4e16\u754c")
    w.add_array("t.ints", [1, -2, 3])
    w.add_array("t.strs", ["a", "", "\u00df"])
    w.add_array("t.floats", [0.5, 0.1, -2.25])
    rng = np.random.default_rng(27)
    x = rng.standard_normal((3, 512)).astype(np.float32)
    types = {}
    for q in QUANTIZABLE:
        data = quantize(x, q)
        w.add_tensor("q." + q.name.lower(), data, raw_shape=data.shape, raw_dtype=q)
        types["q." + q.name.lower()] = q
    for q in (Q.Q4_K, Q.Q6_K):
        data = random_k_blocks(rng, q, 6).reshape(3, -1)
        w.add_tensor("k." + q.name.lower(), data, raw_shape=data.shape, raw_dtype=q)
        types["k." + q.name.lower()] = q
    w.add_tensor("plain.f32", x)
    w.add_tensor("plain.f16", x.astype(np.float16))
    types.update({"plain.f32": Q.F32, "plain.f16": Q.F16})
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return types


def kv_list(reader):
    """[(key, value type, element type or None, value)] of a GGUFReader, in file order."""
    out = []
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        sub = field.types[1] if field.types[0] == V.ARRAY and len(field.types) > 1 else None
        out.append((key, field.types[0], sub, field.contents()))
    return out


def same_value(vtype, sub, want, got):
    if V.FLOAT32 in (vtype, sub):
        w, g = np.asarray(want, np.float32), np.asarray(got, np.float32)
        return w.shape == g.shape and np.array_equal(w.view(np.uint32), g.view(np.uint32))
    if vtype == V.BOOL:
        return got is want
    return type(got) is type(want) and got == want if vtype != V.ARRAY else got == want


def kv_problems(reader, metadata):
    """Where metadata.json's gguf differs from GGUFReader's key-values."""
    got = metadata.get("gguf", {})
    kvs = kv_list(reader)
    problems = []
    if list(got) != [k for k, _, _, _ in kvs]:
        problems.append("keys %r, GGUFReader %r" % (list(got), [k for k, _, _, _ in kvs]))
    for key, vtype, sub, value in kvs:
        if key in got and not same_value(vtype, sub, value, got[key]):
            problems.append("%s (%s): ckptfs %r, GGUFReader %r" % (key, vtype.name, got[key],
                                                                    value))
    return problems


def tensor_path(name):
    return name.replace(".", "/")


def tensor_problems(reader, mnt):
    """Where the mount's tensors differ from GGUFReader's: bytes, type, shape, the set."""
    problems = []
    with open(os.path.join(mnt, ".ckptfs", "tensors.tsv")) as f:
        listed = {line.split("\t")[0] for line in f.read().splitlines()[1:]}
    names = {t.name for t in reader.tensors}
    if listed != names:
        problems.append("ckptfs lists %r, GGUFReader %r" % (sorted(listed), sorted(names)))
    for t in reader.tensors:
        path = os.path.join(mnt, tensor_path(t.name))
        try:
            with open(path, "rb") as f:
                data = f.read()
            side = mc.read_json(path + ".json")
        except OSError as e:
            problems.append("%s: %s" % (t.name, e))
            continue
        shape = [int(n) for n in reversed(t.shape)]
        if side["dtype"] != t.tensor_type.name or side["shape"] != shape:
            problems.append("%s: ckptfs %s %r, GGUFReader %s %r" % (
                t.name, side["dtype"], side["shape"], t.tensor_type.name, shape))
        if data != t.data.tobytes():
            problems.append("%s: %d bytes differ from GGUFReader's %d" % (
                t.name, len(data), t.data.nbytes))
    return problems


def read_gguf(tap, path, label):
    try:
        return gguf.GGUFReader(path)
    except Exception as e:
        tap.ok(False, "%s: GGUFReader reads it" % label, ["%s: %s" % (type(e).__name__, e)])
        return None


def agree(tap, ckptfs, path, label):
    """GGUFReader and a ckptfs mount of path agree on every KV and tensor; the reader."""
    reader = read_gguf(tap, path, label)
    if reader is None:
        return None

    def checks(mnt):
        meta = mc.read_json(os.path.join(mnt, ".ckptfs", "metadata.json"))
        tap.ok(not kv_problems(reader, meta), "%s: every KV of GGUFReader, in order, in "
               "metadata.json" % label, kv_problems(reader, meta))
        bad = tensor_problems(reader, mnt)
        tap.ok(not bad, "%s: %d tensors: bytes, type and shape equal GGUFReader's"
               % (label, len(reader.tensors)), bad)
    mc.mounted(tap, ckptfs, path, label, checks)
    return reader


def as_f32_checks(tap, ckptfs, path, reader):
    def checks(mnt):
        for t in reader.tensors:
            want = dequantize(t.data, t.tensor_type).astype(np.float32, copy=False).reshape(-1)
            p = os.path.join(mnt, tensor_path(t.name))
            try:
                with open(p, "rb") as f:
                    got = np.frombuffer(f.read(), np.float32)
                side = mc.read_json(p + ".json")
            except OSError as e:
                tap.ok(False, "as_dtype=f32: %s reads" % t.name, [e])
                continue
            diff = (["%d values, want %d" % (got.size, want.size)] if got.size != want.size
                    else ["first differing values at %s" % np.nonzero(
                        got.view(np.uint32) != want.view(np.uint32))[0][:5]])
            tap.ok(not np.isnan(want).any() and got.size == want.size and
                   np.array_equal(got.view(np.uint32), want.view(np.uint32)) and
                   side["dtype"] == "F32",
                   "as_dtype=f32: %s (%s) equals gguf.quants.dequantize bit for bit, %d values"
                   % (t.name, t.tensor_type.name, want.size), diff + [side.get("dtype")])
    mc.mounted(tap, ckptfs, path, "gguf-py file, -o as_dtype=f32", checks,
               options=["-o", "as_dtype=f32"])


def convert(tap, ckptfs, src, out, label):
    rc, _, err = run_capture([ckptfs, "convert", src, out], 120)
    return tap.ok(rc == 0 and os.path.isfile(out), "%s: ckptfs convert" % label,
                  [rc, err.decode(errors="replace")])


def safetensors_source(path):
    g = torch.Generator().manual_seed(5)
    t = {
        "f64": torch.randn(3, 5, generator=g, dtype=torch.float64),
        "f32": torch.randn(7, 4, generator=g),
        "f16": torch.randn(2, 3, 4, generator=g).half(),
        "bf16": torch.randn(33, generator=g).bfloat16(),
        "ints.i8": torch.tensor([-128, 0, 127], dtype=torch.int8),
        "ints.i16": torch.arange(-6, 6, dtype=torch.int16).reshape(3, 4),
        "ints.i32": torch.arange(10, dtype=torch.int32) * -100000,
        "ints.i64": torch.tensor([2 ** 62, -1], dtype=torch.int64),
        "scalar": torch.tensor(2.5),
    }
    save_file(t, path)


GGML_OF = {torch.float64: Q.F64, torch.float32: Q.F32, torch.float16: Q.F16,
           torch.bfloat16: Q.BF16, torch.int8: Q.I8, torch.int16: Q.I16, torch.int32: Q.I32,
           torch.int64: Q.I64}


def main():
    started = mc.start()
    if not started:
        return 0
    tap, ckptfs, _ = started
    work = tempfile.mkdtemp(prefix="ckptfs-t91.")
    try:
        fixture = os.path.join(work, "gguf-py.gguf")
        types = write_gguf_py(fixture)
        reader = agree(tap, ckptfs, fixture, "gguf-py file")
        if reader is not None:
            tap.ok({t.name: t.tensor_type for t in reader.tensors} == types,
                   "gguf-py file: GGUFReader reads back the %d types written" % len(types))
            as_f32_checks(tap, ckptfs, fixture, reader)

        # ckptfs writes, gguf-py reads.
        st = os.path.join(work, "src.safetensors")
        safetensors_source(st)
        out = os.path.join(work, "from-safetensors.gguf")
        if convert(tap, ckptfs, st, out, "safetensors -> gguf"):
            r = agree(tap, ckptfs, out, "safetensors -> gguf")
            if r is not None:
                bad = []
                with safe_open(st, "pt") as f:
                    by = {t.name: t for t in r.tensors}
                    if set(by) != set(f.keys()):
                        bad.append("names %r, source %r" % (sorted(by), sorted(f.keys())))
                    for name in sorted(set(by) & set(f.keys())):
                        src = f.get_tensor(name)
                        t = by[name]
                        raw = src.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
                        shape = [int(n) for n in reversed(t.shape)]  # [] for a scalar
                        if t.tensor_type != GGML_OF[src.dtype] or shape != list(src.shape) or \
                                t.data.tobytes() != raw:
                            bad.append("%s: %s %r vs source %s %r" % (
                                name, t.tensor_type.name, list(t.shape), src.dtype,
                                list(src.shape)))
                tap.ok(not bad, "safetensors -> gguf: GGUFReader's tensors equal the source's "
                       "(safe_open): types, shapes, bytes", bad)

        out = os.path.join(work, "from-gguf.gguf")
        if reader is not None and convert(tap, ckptfs, fixture, out, "gguf -> gguf"):
            r = agree(tap, ckptfs, out, "gguf -> gguf")
            if r is not None:
                src_kvs = [kv for kv in kv_list(reader)]
                got_kvs = {k: (vt, sub, v) for k, vt, sub, v in kv_list(r)}
                bad = ["%s: %r" % (k, got_kvs.get(k)) for k, vt, sub, v in src_kvs
                       if k not in got_kvs or got_kvs[k][:2] != (vt, sub) or
                       not same_value(vt, sub, v, got_kvs[k][2])]
                tap.ok(not bad, "gguf -> gguf: every KV of the source kept, same type", bad)
                want = {t.name: (t.tensor_type, list(t.shape), t.data.tobytes())
                        for t in reader.tensors}
                got = {t.name: (t.tensor_type, list(t.shape), t.data.tobytes())
                       for t in r.tensors}
                tap.ok(got == want, "gguf -> gguf: every tensor kept, blocks as they were",
                       [sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))])

        hf = os.path.join(work, "llama")
        llama_ref.make_folder(hf)
        out = os.path.join(work, "llama.gguf")
        if convert(tap, ckptfs, hf, out, "HF llama folder -> gguf"):
            r = agree(tap, ckptfs, out, "HF llama folder -> gguf")
            if r is not None:
                kv = {k: v for k, _, _, v in kv_list(r)}
                cfg = llama_ref.CONFIG
                tap.ok(kv.get("general.architecture") == "llama" and
                       kv.get("llama.block_count") == cfg["num_hidden_layers"] and
                       kv.get("llama.attention.head_count_kv") == cfg["num_key_value_heads"]
                       and len(kv.get("tokenizer.ggml.tokens", [])) == cfg["vocab_size"],
                       "HF llama folder -> gguf: GGUFReader sees the llama KVs and vocabulary",
                       [{k: kv.get(k) for k in ("general.architecture", "llama.block_count")}])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return mc.finish(tap)


if __name__ == "__main__":
    sys.exit(main())
