#!/usr/bin/python3
"""Write MLFramework tensor-parallel checkpoint fixtures for ckptfs.

usage: mlfw_fixtures.py OUTDIR

The format (shared/formats/gptrs-burnpack-lwt-tp.md section 4) is what the C#
BinaryWriter of werwedc/ml-framework writes: int32/int64 little-endian, strings
as a 7-bit encoded UTF-8 byte count + the bytes.  A checkpoint is either a
directory (metadata.bin + shard_rank{N}.pt) or one "centralized" file (the
metadata, int32 shard_count, then {int32 size; shard bytes} per shard).

This generator has its own BinaryWriter and its own restatement of how ckptfs
consolidates the ranks, independent of core/:
  - a name on every rank with one dtype and rank (number of dims) and the same
    bytes everywhere is "replicated" (rank 0's copy);
  - otherwise the split dim comes from tp_split=GLOB:DIM rules (first fnmatch
    match), else from layer-name rules, else dim 0 ("default"); the ranks are
    concatenated in rank order (numpy.concatenate);
  - a payload whose length is numel x 4 while the tag says 8- or 2-byte
    elements is float32.
Deterministic: the same OUTDIR contents come out on every run.

Layout of OUTDIR (every good case is CASE/manifest.json + what it names):
  dir2/                2 ranks, transformer-like: column/row/replicated/default
  dir4_override/       4 ranks, Megatron/legacy/class names, uneven split, rank
                       files in different entry orders, tensors missing on some
                       ranks, "mystery" weights split on dim 1; mounted with no
                       option, with -o tp_split=*.mystery.weight:1, and with a
                       three-rule tp_split (commas escaped for fuse_opt)
  dtype_quirk/         Int64/Float64/Float16 tags with float32 payloads, true
                       8- and 2-byte payloads, a tag mismatch between ranks
  reader_order/        metadata.bin in the C# reader's field order, mesh [2,1],
                       version 3 (the writer's order cannot fit)
  reader_order_v1/     the same with version 1: both orders fit, only the
                       reader's matches the size exactly
  trailing/            metadata.bin with stale bytes of an older, longer save;
                       a shard file with trailing bytes
  stray_files/         2 ranks + files that only look like shard files
                       (shard_rank01.pt, shard_rank+3.pt, ...: not ranks);
                       SavedAt of Local kind
  saved_at_default/    SavedAt 0 (default DateTime): "0001-01-01T00:00:00Z"
  centralized_one/     centralized file, shard_count 1
  centralized_short/   centralized file, shard_count 4 but only rank 0 written
  centralized_two/     centralized file, 2 shards
  hostile/             refused inputs, listed in cases.tsv:
                       path<TAB>needle<TAB>description<TAB>options
                       (needle: words joined by '&', all required, each may be
                       alternatives joined by '|'; options: -o argument or empty)

manifest.json:
  {"source": what to mount, relative to the case dir,
   "layout": "directory" | "centralized",
   "ranks_tree": whether .ckptfs/ranks/ exists,
   "metadata": the expected .ckptfs/metadata.json "mlframework" object,
   "ranks": [{"rank", "name", "path", "dtype", "shape", "nbytes", "sha256",
              "mlframework_dtype", "payload" (bool: float32 under another tag),
              "file", "offset"}],
   "mounts": [{"label", "options" (list of argv words after SOURCE MNT),
               "warnings" (needles: each matches a distinct summary warning,
                           and every warning matches one),
               "tensors": [{"name", "path", "dtype", "shape", "nbytes",
                            "sha256" (consolidated row-major bytes),
                            "split_rule", "split_dim", "guessed", "ranks",
                            "mlframework_dtype", "payload",
                            "sources": [{"file", "offset", "length",
                                         "box": {"offsets", "sizes"} | null}]}]}]}
"""

import datetime
import fnmatch
import hashlib
import json
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
from fixture_lib import generate, write_cases  # noqa: E402

SEED = 20250101

# TensorDataType tags: (name, ckptfs dtype, numpy dtype)
TAGS = {0: ("Float32", "F32", "<f4"), 1: ("Float64", "F64", "<f8"), 2: ("Int32", "I32", "<i4"),
        3: ("Int64", "I64", "<i8"), 4: ("Float16", "F16", "<f2")}
F32, F64, I32, I64, F16 = 0, 1, 2, 3, 4

ROW_LAYERS = ["o_proj", "out_proj", "down_proj", "dense_4h_to_h", "linear_fc2", "linear_proj",
              "fc2"]
COL_LAYERS = ["q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "fc1", "dense_h_to_4h",
              "linear_fc1", "lm_head", "output_layer", "linear_qkv", "query_key_value", "wte"]
ROW_PARTS = ["Row", "InputParallel"]
COL_PARTS = ["Column", "OutputParallel", "qkv", "embed"]

CASES = ["dir2", "dir4_override", "dtype_quirk", "reader_order", "reader_order_v1",
         "trailing", "stray_files", "saved_at_default", "centralized_one",
         "centralized_short", "centralized_two", "bound_central_4096", "hostile"]


# ---------------------------------------------------------------------------
# .NET BinaryWriter

def i32(v):
    return struct.pack("<i", v)


def i64(v):
    return struct.pack("<q", v)


def enc7(n):
    """Write7BitEncodedInt: LEB128 of the value as uint32."""
    v = n & 0xFFFFFFFF
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def wstring(s):
    b = s.encode("utf-8") if isinstance(s, str) else s
    return enc7(len(b)) + b


TICKS_AT_UNIX_EPOCH = 621355968000000000


def to_binary_utc(dt):
    """DateTime.ToBinary() of a UTC DateTime: ticks | 0x4000000000000000."""
    delta = dt - datetime.datetime(1, 1, 1)
    ticks = (delta.days * 86400 + delta.seconds) * 10 ** 7 + delta.microseconds * 10
    return ticks | (1 << 62)


def binary_of(when):
    """A datetime is saved as DateTime.UtcNow is; an int is the raw ToBinary() value."""
    return when if isinstance(when, int) else to_binary_utc(when)


def iso_of_binary(raw):
    # Utc, Unspecified and Local kinds all keep the UTC instant's ticks in bits 0-61.
    ticks = raw & ((1 << 62) - 1)
    t = datetime.datetime(1, 1, 1) + datetime.timedelta(microseconds=ticks // 10)
    # ISO 8601 wants 4-digit years (strftime's %Y gives "1" for year 1).
    return "%04d-%02d-%02dT%02d:%02d:%02dZ" % (t.year, t.month, t.day, t.hour, t.minute,
                                               t.second)


def signed64(v):
    return v - (1 << 64) if v >= 1 << 63 else v


def self_test():
    # The notes' worked examples, byte for byte.
    assert enc7(5) == b"\x05" and enc7(127) == b"\x7f" and enc7(200) == b"\xc8\x01"
    assert enc7(300) == b"\xac\x02" and enc7(16384) == b"\x80\x80\x01"
    t = to_binary_utc(datetime.datetime(2025, 1, 1))
    assert i64(t) == bytes.fromhex("0040313cf729dd48"), i64(t).hex()
    md = metadata_bytes("Model", datetime.datetime(2025, 1, 1), 2, [], 1)
    assert md.hex() == ("054d6f64656c" "0040313cf729dd48" "02000000" "00000000" "01000000")
    data = np.arange(6, dtype="<f4").reshape(2, 3)
    sh, _ = shard_bytes([("fc.weight", F32, data, False)])
    assert len(sh) == 58 and sh[:34].hex() == (
        "01000000" "0966632e776569676874" "02000000" "0200000003000000" "00000000" "18000000")


# ---------------------------------------------------------------------------
# File layouts

def metadata_bytes(name, when, world_size, mesh, version, reader_order=False):
    head = wstring(name) + struct.pack("<Q", binary_of(when)) + i32(world_size)
    if reader_order:  # what Deserialize reads: Version, meshDims, MeshShape
        return head + i32(version) + i32(len(mesh)) + b"".join(i32(m) for m in mesh)
    return head + i32(len(mesh)) + b"".join(i32(m) for m in mesh) + i32(version)


def payload_of(tag, arr, f32_payload):
    want = "<f4" if f32_payload else TAGS[tag][2]
    assert arr.dtype == np.dtype(want), (tag, arr.dtype, want)
    return np.asarray(arr).tobytes()


def shard_bytes(entries, count=None):
    """entries: (name, tag, array, f32_payload). Returns (bytes, data offsets)."""
    out = bytearray(i32(len(entries) if count is None else count))
    offsets = []
    for name, tag, arr, f32 in entries:
        out += wstring(name) + i32(arr.ndim) + b"".join(i32(d) for d in arr.shape) + i32(tag)
        data = payload_of(tag, arr, f32)
        out += i32(len(data))
        offsets.append(len(out))
        out += data
    return bytes(out), offsets


def centralized_bytes(meta, shards, declared):
    out = bytearray(meta + i32(declared))
    starts = []
    for sh in shards:
        out += i32(len(sh))
        starts.append(len(out))
        out += sh
    return bytes(out), starts


# ---------------------------------------------------------------------------
# Expected consolidation (a restatement of the rules, not the C code)

def tree_path(name):
    return name.replace(".", "/")  # ordinary names only: no empty or odd components


def dim_by_name(name, ndim):
    comps = name.split(".")
    for w in ROW_LAYERS:
        if w in comps:
            return w, 1 if ndim >= 2 else 0
    if "attention.dense" in name and "attention.dense_" not in name:
        return "attention.dense", 1 if ndim >= 2 else 0
    for w in ROW_PARTS:
        if w in name:
            return w, 1 if ndim >= 2 else 0
    for w in COL_LAYERS:
        if w in comps:
            return w, 0
    for w in COL_PARTS:
        if w in name:
            return w, 0
    return None, None


def eff_dtype(tag, f32):
    return "F32" if f32 else TAGS[tag][1]


def sha(b):
    return hashlib.sha256(b).hexdigest()


class Case:
    """One checkpoint: per-rank entry lists + where each entry's bytes live."""

    def __init__(self, nranks):
        self.ranks = [[] for _ in range(nranks)]  # (name, tag, arr, f32)

    def add(self, name, tag, arrays, f32=False, on=None):
        """arrays: one per rank (None = absent on that rank)."""
        for r, a in enumerate(arrays):
            if a is not None and (on is None or r in on):
                self.ranks[r].append((name, tag, a, f32))

    def reorder(self, r, order):
        self.ranks[r] = [self.ranks[r][i] for i in order]


def consolidate(case, files, offsets, rules):
    """files[r], offsets[r][i]: where rank r's entry i lives. Returns (tensors, partial names)."""
    n = len(case.ranks)
    by_name = [{e[0]: (i, e) for i, e in enumerate(rk)} for rk in case.ranks]
    tensors, partial = [], []
    names = []
    for rk in case.ranks:
        for e in rk:
            if e[0] not in names:
                names.append(e[0])
    for name in names:
        ents = [by_name[r].get(name) for r in range(n)]
        if any(x is None for x in ents) or \
                len({(eff_dtype(x[1][1], x[1][3]), x[1][2].ndim) for x in ents}) != 1:
            partial.append(name)
            continue
        (i0, (_, tag0, a0, f0)) = ents[0]
        arrs = [x[1][2] for x in ents]
        dt = eff_dtype(tag0, f0)
        es = {"F32": 4, "F64": 8, "I32": 4, "I64": 8, "F16": 2}[dt]
        t = {"name": name, "path": tree_path(name), "dtype": dt, "ranks": n,
             "mlframework_dtype": TAGS[tag0][0], "payload": bool(f0)}
        same = all(a.shape == a0.shape and a.tobytes() == a0.tobytes() for a in arrs)
        if same:
            full = a0
            t.update(split_rule="replicated", split_dim=None, guessed=False)
            t["sources"] = [{"file": files[0], "offset": offsets[0][i0],
                             "length": a0.size * es, "box": None}]
        else:
            dim, rule, guessed = None, None, True
            for glob, d in rules:
                if fnmatch.fnmatchcase(name, glob):
                    dim, rule, guessed = d, "tp_split=%s:%d" % (glob, d), False
                    break
            if dim is None:
                word, dim = dim_by_name(name, a0.ndim)
                rule = "name:%s" % word if word else None
            if dim is None:
                dim, rule = 0, "default"
            assert dim < a0.ndim, name
            full = np.concatenate(arrs, axis=dim)
            t.update(split_rule=rule, split_dim=dim, guessed=guessed)
            t["sources"] = []
            at = 0
            for r, x in enumerate(ents):
                offs = [0] * a0.ndim
                offs[dim] = at
                at += x[1][2].shape[dim]
                t["sources"].append({"file": files[r], "offset": offsets[r][x[0]],
                                     "length": x[1][2].size * es,
                                     "box": {"offsets": offs, "sizes": list(x[1][2].shape)}})
        data = np.asarray(full).tobytes()
        t.update(shape=list(full.shape), nbytes=len(data), sha256=sha(data))
        tensors.append(t)
    return tensors, partial


def partial_needles(partial):
    # Each tensor missing from some rank is named in a warning, or counted in one.
    return ["%s|%d tensors" % (p, len(partial)) for p in partial]


def rank_manifest(case, files, offsets):
    out = []
    for r, rk in enumerate(case.ranks):
        for i, (name, tag, arr, f32) in enumerate(rk):
            data = arr.tobytes()
            out.append({"rank": r, "name": name,
                        "path": ".ckptfs/ranks/%d/%s" % (r, tree_path(name)),
                        "dtype": eff_dtype(tag, f32), "shape": list(arr.shape),
                        "nbytes": len(data), "sha256": sha(data),
                        "mlframework_dtype": TAGS[tag][0], "payload": bool(f32),
                        "file": files[r], "offset": offsets[r][i]})
    return out


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def write_json(path, obj):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1, ensure_ascii=False)
        f.write("\n")


def meta_doc(name, when, ws, mesh, version, nranks, order, layout, declared=None):
    raw = binary_of(when)
    d = {"model_name": name, "saved_at": iso_of_binary(raw), "saved_at_binary": signed64(raw),
         "tp_world_size": ws, "ranks_found": nranks, "mesh_shape": list(mesh),
         "version": version, "field_order": order, "layout": layout}
    if declared is not None:
        d["declared_shards"] = declared
    return d


def write_dir_case(out, case_name, case, meta, md, mounts, shard_tail=None):
    """mounts: [(label, options argv, rules, extra warning needles)]."""
    root = os.path.join(out, case_name)
    ck = os.path.join(root, "ckpt")
    write(os.path.join(ck, "metadata.bin"), meta)
    files, offsets = [], []
    for r, rk in enumerate(case.ranks):
        data, offs = shard_bytes(rk)
        if shard_tail and r in shard_tail:
            data += shard_tail[r]
        fn = "shard_rank%d.pt" % r
        write(os.path.join(ck, fn), data)
        files.append(fn)
        offsets.append(offs)
    manifest = {"source": "ckpt", "layout": "directory", "ranks_tree": True, "metadata": md,
                "ranks": rank_manifest(case, files, offsets), "mounts": []}
    for label, opts, rules, needles in mounts:
        tensors, partial = consolidate(case, files, offsets, rules)
        manifest["mounts"].append({"label": label, "options": opts, "tensors": tensors,
                                   "warnings": needles + partial_needles(partial)})
    write_json(os.path.join(root, "manifest.json"), manifest)


def write_central_case(out, case_name, fname, case, meta, md, declared, needles):
    root = os.path.join(out, case_name)
    shards = [shard_bytes(rk) for rk in case.ranks]
    data, starts = centralized_bytes(meta, [s[0] for s in shards], declared)
    write(os.path.join(root, fname), data)
    files = [fname] * len(case.ranks)
    offsets = [[starts[r] + o for o in shards[r][1]] for r in range(len(case.ranks))]
    tensors, partial = consolidate(case, files, offsets, [])
    manifest = {"source": fname, "layout": "centralized", "ranks_tree": len(case.ranks) > 1,
                "metadata": md, "ranks": rank_manifest(case, files, offsets),
                "mounts": [{"label": "default", "options": [], "tensors": tensors,
                            "warnings": needles + partial_needles(partial)}]}
    write_json(os.path.join(root, "manifest.json"), manifest)


# ---------------------------------------------------------------------------
# Values

class Values:
    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)

    def __call__(self, tag, *shape):
        np_dt = TAGS[tag][2]
        if tag in (F32, F64, F16):
            return np.asarray(self.rng.standard_normal(shape), dtype=np_dt)
        return np.asarray(self.rng.integers(-(1 << 20), 1 << 20, size=shape), dtype=np_dt)

    def f32(self, *shape):
        return np.asarray(self.rng.standard_normal(shape), dtype="<f4")


def split(full, dim, n):
    return list(np.split(full, n, axis=dim))


def same(arr, n):
    return [arr] * n


# ---------------------------------------------------------------------------
# Good cases

def gen_dir2(out):
    v = Values(SEED + 1)
    n, h, inter, vocab = 2, 8, 16, 12
    c = Case(n)
    c.add("model.embed_tokens.weight", F32, split(v(F32, vocab, h), 0, n))
    L = "model.layers.0."
    c.add(L + "input_layernorm.weight", F32, same(v(F32, h), n))
    c.add(L + "self_attn.q_proj.weight", F32, split(v(F32, h, h), 0, n))
    c.add(L + "self_attn.q_proj.bias", F32, split(v(F32, h), 0, n))
    c.add(L + "self_attn.k_proj.weight", F32, split(v(F32, 4, h), 0, n))
    c.add(L + "self_attn.k_proj.bias", F32, same(v(F32, 4), n))  # same bytes: replicated wins
    c.add(L + "self_attn.v_proj.weight", F32, split(v(F32, 4, h), 0, n))
    c.add(L + "self_attn.o_proj.weight", F32, split(v(F32, h, h), 1, n))
    c.add(L + "self_attn.o_proj.bias", F32, same(v(F32, h), n))
    c.add(L + "post_attention_layernorm.weight", F32, same(v(F32, h), n))
    c.add(L + "mlp.gate_proj.weight", F32, split(v(F32, inter, h), 0, n))
    c.add(L + "mlp.up_proj.weight", F32, split(v(F32, inter, h), 0, n))
    c.add(L + "mlp.down_proj.weight", F32, split(v(F32, h, inter), 1, n))
    c.add(L + "mlp.down_proj.bias", F32, same(v(F32, h), n))
    c.add("encoder.fc2.scale", F32, split(v(F32, 4), 0, n))  # row layer, 1-D: dim 0
    c.add("model.norm.weight", F32, same(v(F32, h), n))
    c.add("model.empty_buffer", F32, same(v(F32, 0, 4), n))
    c.add("model.step", F32, same(v(F32), n))  # 0-dim, replicated
    c.add("lm_head.weight", F32, split(v(F32, vocab, h), 0, n))
    c.add("Linear_param_0", F32, [v(F32, 3, 4), v(F32, 3, 4)])  # unknown: dim 0, guessed
    c.add("Linear_param_1", F32, [v(F32, 3), v(F32, 3)])  # 1-D bias that differs
    name, when = "Tiny-Llama \u00e9\u2713 tp2", datetime.datetime(2025, 1, 1)
    meta = metadata_bytes(name, when, n, [], 1)
    md = meta_doc(name, when, n, [], 1, n, "writer", "directory")
    write_dir_case(out, "dir2", c, meta, md, [("default", [], [], [])])


def gen_dir4_override(out):
    v = Values(SEED + 2)
    n = 4
    c = Case(n)
    c.add("blocks.0.mystery.weight", F32, split(v(F32, 6, 16), 1, n))
    c.add("blocks.1.mystery.weight", F32, split(v(F32, 32, 4096), 1, n))  # 512 KiB
    c.add("blocks.0.mystery.bias", F32, [v(F32, 4) for _ in range(n)])
    c.add("blocks.0.uneven.weight", F32, [v(F32, 3, 4), v(F32, 3, 4), v(F32, 3, 4), v(F32, 2, 4)])
    D = "decoder.layers.0."
    c.add("embedding.word_embeddings.weight", F32, split(v(F32, 16, 8), 0, n))
    c.add(D + "self_attention.linear_qkv.weight", F32, split(v(F32, 24, 8), 0, n))
    c.add(D + "self_attention.linear_proj.weight", F32, split(v(F32, 8, 16), 1, n))
    c.add(D + "mlp.linear_fc1.weight", F32, split(v(F32, 32, 8), 0, n))
    c.add(D + "mlp.linear_fc2.weight", F32, split(v(F32, 8, 32), 1, n))
    c.add(D + "mlp.linear_fc2.bias", F32, same(v(F32, 8), n))
    c.add("output_layer.weight", F32, split(v(F32, 16, 8), 0, n))
    T = "transformer.layers.0."
    c.add(T + "attention.query_key_value.weight", F32, split(v(F32, 24, 8), 0, n))
    c.add(T + "attention.dense.weight", F32, split(v(F32, 8, 8), 1, n))
    c.add(T + "mlp.dense_h_to_4h.weight", F32, split(v(F32, 32, 8), 0, n))
    c.add(T + "mlp.dense_4h_to_h.weight", F32, split(v(F32, 8, 32), 1, n))
    c.add("transformer.wte.weight", F32, split(v(F32, 16, 8), 0, n))
    c.add("transformer.h.0.attn.qkv.weight", F32, split(v(F32, 24, 8), 0, n))
    c.add("model.layers.0.self_attn.out_proj.weight", F32, split(v(F32, 8, 8), 1, n))
    c.add("model.fc1.weight", F32, split(v(F32, 16, 8), 0, n))
    c.add("model.fc2.weight", F32, split(v(F32, 8, 16), 1, n))
    c.add("RowParallelLinear_param_0", F32, split(v(F32, 8, 16), 1, n))
    c.add("RowParallelLinear_param_1", F32, same(v(F32, 8), n))
    c.add("ColumnParallelLinear_param_0", F32, split(v(F32, 16, 8), 0, n))
    c.add("ColumnParallelLinear_param_1", F32, split(v(F32, 16), 0, n))
    c.add("Conv2dInputParallel_param_0", F32, split(v(F32, 4, 8, 3, 3), 1, n))
    c.add("Conv2dOutputParallel_param_0", F32, split(v(F32, 8, 2, 3, 3), 0, n))
    c.add("final_layernorm.weight", F32, same(v(F32, 8), n))
    c.add("rank0_only.extra_state", F32, [v(F32, 2), None, None, None])
    c.add("rank2_only.extra_state", F32, [None, None, v(F32, 2), None])
    c.add("ranks01.extra_state", F32, [v(F32, 2), v(F32, 2), None, None])
    # .NET Dictionary order is not guaranteed: other ranks list entries differently.
    for r in range(1, n):
        k = len(c.ranks[r])
        order = [(i + 5 * r) % k for i in range(k)]
        c.reorder(r, order[::-1] if r % 2 else order)
    name, when = "megatron-like", datetime.datetime(2024, 6, 7, 12, 34, 56, 789000)
    # The repo's SaveAsync hard-codes TPWorldSize = 1.
    meta = metadata_bytes(name, when, 1, [4], 1)
    md = meta_doc(name, when, 1, [4], 1, n, "writer", "directory")
    ws = ["TPWorldSize"]
    write_dir_case(out, "dir4_override", c, meta, md, [
        ("no option", [], [], ws),
        ("tp_split one rule", ["-o", "tp_split=*.mystery.weight:1"], [("*.mystery.weight", 1)],
         ws),
        ("tp_split three rules", ["-o", r"tp_split=blocks.1.*:0\,*.mystery.weight:1\,*.bias:0"],
         [("blocks.1.*", 0), ("*.mystery.weight", 1), ("*.bias", 0)], ws),
    ])


def gen_dtype_quirk(out):
    v = Values(SEED + 3)
    n = 2
    c = Case(n)
    # What the C# writer really does: float32 payload whatever the tag says.
    c.add("quirk.int64_tag", I64, same(v.f32(4, 3), n), f32=True)
    c.add("quirk.step", I64, same(v.f32(), n), f32=True)
    c.add("quirk.layers.0.q_proj.weight", F16, split(v.f32(4, 4), 0, n), f32=True)
    c.add("quirk.float64_tag", F64, [v.f32(3), v.f32(3)], f32=True)
    # True element widths, as a spec-following writer would store them.
    c.add("true.int64", I64, [v(I64, 5), v(I64, 5)])
    c.add("true.float64", F64, same(v(F64, 3, 2), n))
    c.add("true.int32", I32, same(v(I32, 4), n))
    c.add("true.layers.0.down_proj.weight", F16, split(v(F16, 2, 8), 1, n))
    c.add("true.float32", F32, same(v(F32, 2, 2), n))
    c.add("true.float16_empty", F16, same(v(F16, 0), n))
    # Same name, different tags on the two ranks: not consolidated.
    c.add("mixed.tag", F32, [v(F32, 2), None])
    c.add("mixed.tag", I32, [None, v(I32, 2)])
    name, when = "dtypes", datetime.datetime(2023, 12, 31, 23, 59, 59)
    meta = metadata_bytes(name, when, n, [], 1)
    md = meta_doc(name, when, n, [], 1, n, "writer", "directory")
    write_dir_case(out, "dtype_quirk", c, meta, md, [("default", [], [], [])])


def small_pair(v, n):
    c = Case(n)
    c.add("layer.q_proj.weight", F32, split(v(F32, 4, 4), 0, n))
    c.add("layer.o_proj.weight", F32, split(v(F32, 4, 4), 1, n))
    c.add("layer.norm.weight", F32, same(v(F32, 4), n))
    return c


def gen_reader_order(out):
    v = Values(SEED + 4)
    n = 2
    c = small_pair(v, n)
    # Written as Deserialize reads it: Version, meshDims, MeshShape. Version 3 makes the
    # writer's order impossible (3 mesh dims + version need 16 bytes, 12 remain).
    name, when = "r" * 200, datetime.datetime(2025, 3, 4, 5, 6, 7)
    meta = metadata_bytes(name, when, n, [2, 1], 3, reader_order=True)
    md = meta_doc(name, when, n, [2, 1], 3, n, "reader", "directory")
    write_dir_case(out, "reader_order", c, meta, md, [("default", [], [], [])])

    # Version 1 (the default) and mesh [2,1]: the writer's order fits too (mesh [2], version 2,
    # 4 bytes left over), but only the reader's order matches the file size exactly, and the
    # notes' rule tries exact sizes before tolerating trailing bytes.
    c = small_pair(v, n)
    meta = metadata_bytes("exact", when, n, [2, 1], 1, reader_order=True)
    md = meta_doc("exact", when, n, [2, 1], 1, n, "reader", "directory")
    write_dir_case(out, "reader_order_v1", c, meta, md, [("default", [], [], [])])


def gen_trailing(out):
    v = Values(SEED + 5)
    n = 2
    c = small_pair(v, n)
    when = datetime.datetime(2025, 2, 1)
    old = metadata_bytes("an-older-save-with-a-much-longer-model-name" * 4,
                         datetime.datetime(2024, 1, 1), 8, [2, 2, 2], 1)
    new = metadata_bytes("short", when, n, [2], 1)
    meta = new + old[len(new):]  # File.OpenWrite does not truncate
    assert len(meta) > len(new) + 100
    md = meta_doc("short", when, n, [2], 1, n, "writer", "directory")
    write_dir_case(out, "trailing", c, meta, md, [("default", [], [], ["shard_rank1.pt&3 bytes"])],
                   shard_tail={1: b"\x00\x01\x02"})


def gen_stray_files(out):
    v = Values(SEED + 7)
    n = 2
    c = small_pair(v, n)
    # DateTime.Now.ToBinary(): Local kind, bits 0-61 the UTC instant.
    when = (to_binary_utc(datetime.datetime(2025, 5, 6, 7, 8, 9)) & ((1 << 62) - 1)) | (2 << 62)
    meta = metadata_bytes("stray", when, n, [], 1)
    md = meta_doc("stray", when, n, [], 1, n, "writer", "directory")
    write_dir_case(out, "stray_files", c, meta, md, [("default", [], [], [])])
    # Files that are not shard_rank{N}.pt as the writer names them (decimal, no padding,
    # no sign): not ranks.
    ck = os.path.join(out, "stray_files", "ckpt")
    junk = shard_bytes([("junk.weight", F32, v(F32, 3), False)])[0]
    for name in ("shard_rank01.pt", "shard_rank1.pt.bak", "shard_rank2.pt~", "shard_rank+3.pt",
                 "shard_rank 4.pt", "shard_rank-4294967295.pt", "shard_rank.pt",
                 "xshard_rank5.pt", "shard_rank99999999999999999999.pt", "metadata.bin.old"):
        write(os.path.join(ck, name), junk)


def gen_saved_at_default(out):
    v = Values(SEED + 8)
    n = 2
    c = small_pair(v, n)
    # A metadata object whose SavedAt was never set: default(DateTime).ToBinary() == 0.
    meta = metadata_bytes("never-saved", 0, n, [], 1)
    md = meta_doc("never-saved", 0, n, [], 1, n, "writer", "directory")
    write_dir_case(out, "saved_at_default", c, meta, md, [("default", [], [], [])])


def gen_centralized(out):
    v = Values(SEED + 6)
    # shard_count 1: what the manager really writes.
    c = Case(1)
    c.add("fc.weight", F32, [np.arange(6, dtype="<f4").reshape(2, 3)])
    c.add("fc.bias", F32, [v(F32, 2)])
    c.add("Linear_param_0", I64, [v.f32(3)], f32=True)
    when = datetime.datetime(2025, 1, 1)
    meta = metadata_bytes("Model", when, 1, [], 1)
    write_central_case(out, "centralized_one", "centralized_one.ckpt", c, meta,
                       meta_doc("Model", when, 1, [], 1, 1, "writer", "centralized", 1), 1, [])

    # shard_count = world size 4, but only rank 0's shard (the gather is unimplemented).
    c = Case(1)
    c.add("layers.0.q_proj.weight", F32, [v(F32, 2, 4)])
    c.add("layers.0.o_proj.weight", F32, [v(F32, 4, 2)])
    meta = metadata_bytes("short-file", when, 4, [4], 1)
    write_central_case(out, "centralized_short", "centralized_short.ckpt", c, meta,
                       meta_doc("short-file", when, 4, [4], 1, 1, "writer", "centralized", 4), 4,
                       ["declared|present"])

    # shard_count at its limit, 4096 (one shard present).
    c = Case(1)
    c.add("fc.weight", F32, [v(F32, 2, 2)])
    meta = metadata_bytes("limit", when, 4, [4], 1)
    write_central_case(out, "bound_central_4096", "bound_central_4096.ckpt", c, meta,
                       meta_doc("limit", when, 4, [4], 1, 1, "writer", "centralized", 4096), 4096,
                       ["4096 shards declared, 1 present"])

    c = Case(2)
    c.add("layers.0.q_proj.weight", F32, split(v(F32, 4, 4), 0, 2))
    c.add("layers.0.o_proj.weight", F32, split(v(F32, 4, 6), 1, 2))
    c.add("layers.0.norm.weight", F32, same(v(F32, 4), 2))
    c.add("Linear_param_3", F64, [v(F64, 2, 2), v(F64, 1, 2)])
    name = "zwei-R\u00e4nge"
    meta = metadata_bytes(name, when, 2, [2], 1)
    write_central_case(out, "centralized_two", "centralized_two.ckpt", c, meta,
                       meta_doc(name, when, 2, [2], 1, 2, "writer", "centralized", 2), 2, [])


# ---------------------------------------------------------------------------
# Hostile inputs

class Hostile:
    def __init__(self, root):
        self.root = root
        self.rows = []
        self.meta = metadata_bytes("hostile", datetime.datetime(2025, 1, 1), 2, [], 1)

    def dir(self, rel, needle, desc, shards, meta=None, options=""):
        """shards: bytes per rank, or {rank: bytes}."""
        d = os.path.join(self.root, rel)
        write(os.path.join(d, "metadata.bin"), self.meta if meta is None else meta)
        items = shards.items() if isinstance(shards, dict) else enumerate(shards)
        for r, data in items:
            write(os.path.join(d, "shard_rank%d.pt" % r), data)
        self.rows.append((rel, needle, desc, options))

    def file(self, rel, needle, desc, data):
        write(os.path.join(self.root, rel), data)
        self.rows.append((rel, needle, desc, ""))

    def finish(self):
        write_cases(self.root, self.rows, ("path", "needle", "description", "options"))


def entry(name, shape, tag, length=None, data=None, raw_name=None, ndim=None):
    """One shard entry with optional damage; returns bytes."""
    nb = (raw_name if raw_name is not None else wstring(name))
    out = bytearray(nb)
    out += i32(len(shape) if ndim is None else ndim)
    for d in shape:
        out += i32(d)
    out += i32(tag)
    if data is None:
        numel = 1
        for d in shape:
            numel *= max(d, 0)
        es = {0: 4, 1: 8, 2: 4, 3: 8, 4: 2}.get(tag, 4)
        data = bytes((i * 7) & 0xFF for i in range(numel * es))
    out += i32(len(data) if length is None else length)
    out += data
    return bytes(out)


def good_shard(seed=0):
    a = np.arange(12, dtype="<f4").reshape(3, 4) + seed
    b = np.arange(4, dtype="<f4")
    return shard_bytes([("fc.q_proj.weight", F32, a, False), ("fc.norm.weight", F32, b, False)])[0]


def field_spans_shard():
    """(label needle, start, end) of every field of good_shard(), in order."""
    spans = [("count", 0, 4)]
    at = 4
    for name, shape in (("fc.q_proj.weight", (3, 4)), ("fc.norm.weight", (4,))):
        nb = wstring(name)
        spans.append(("name", at, at + len(nb)))
        at += len(nb)
        spans.append(("rank", at, at + 4))
        at += 4
        for _ in shape:
            spans.append(("dim", at, at + 4))
            at += 4
        spans.append(("dtype", at, at + 4))
        at += 4
        spans.append(("data_length", at, at + 4))
        at += 4
        numel = int(np.prod(shape))
        spans.append(("data_length", at, at + numel * 4))
        at += numel * 4
    return spans, at


def gen_hostile(out):
    h = Hostile(os.path.join(out, "hostile"))
    ok = good_shard()
    ok1 = good_shard(100)

    h.dir("missing_rank1", "missing&shard_rank1", "shard_rank1.pt missing, rank 2 present",
          {0: ok, 2: ok1})
    h.dir("no_metadata_bin", "metadata.bin", "shard_rank0.pt without metadata.bin", [ok])
    os.remove(os.path.join(h.root, "no_metadata_bin", "metadata.bin"))
    h.dir("count_negative", "count", "tensor count -1", [i32(-1) + ok[4:]])
    h.dir("count_huge", "count", "tensor count 2^31-1", [i32(0x7FFFFFFF) + ok[4:]])
    h.dir("count_past_entries", "name", "tensor count 3, two entries follow",
          [i32(3) + ok[4:]])
    h.dir("name_past_eof", "name", "name length 200, 30 bytes follow",
          [i32(1) + enc7(200) + b"x" * 30])
    h.dir("name_len_5th_byte", "name&length", "7-bit length, 5th byte 0x10",
          [i32(1) + b"\x80\x80\x80\x80\x10" + b"x" * 40])
    h.dir("name_len_6_bytes", "name&length", "7-bit length continuing past 5 bytes",
          [i32(1) + b"\x80\x80\x80\x80\x8f\x01" + b"x" * 40])
    h.dir("name_len_max", "name", "7-bit length 0xFFFFFFFF (5 bytes, 5th 0x0F)",
          [i32(1) + b"\xff\xff\xff\xff\x0f" + b"x" * 40])
    h.dir("name_bad_utf8", "name&utf-8|utf8", "tensor name with an invalid UTF-8 byte",
          [i32(1) + entry(None, (2,), F32, raw_name=wstring(b"fc.\xffweight"))])
    h.dir("name_overlong_utf8", "name&utf-8|utf8", "tensor name with an overlong UTF-8 '/'",
          [i32(1) + entry(None, (2,), F32, raw_name=wstring(b"fc\xc0\xafweight"))])
    h.dir("dim_negative", "dim", "dim -3", [i32(1) + entry("w", (2, -3), F32, data=b"")])
    h.dir("dims_overflow", "dim|element", "dims multiply past 2^64",
          [i32(1) + entry("w", (0x7FFFFFFF,) * 3, F32, data=b"")])
    h.dir("dims_over_int32", "dim|element", "numel 2^31 (data_length is an int32)",
          [i32(1) + entry("w", (1 << 16, 1 << 15), F16, length=0, data=b"")])
    h.dir("rank_33", "rank", "33 dims",
          [i32(1) + entry("w", (1,) * 33, F32)])
    h.dir("rank_negative", "rank", "rank -1",
          [i32(1) + entry("w", (), F32, ndim=-1, data=b"")])
    h.dir("dtype_7", "dtype", "dtype tag 7", [i32(1) + entry("w", (2,), 7, data=b"\0" * 8)])
    h.dir("dtype_negative", "dtype", "dtype tag -1",
          [i32(1) + entry("w", (2,), -1, data=b"\0" * 8)])
    h.dir("len_mismatch", "data_length", "Float64 [2,3] with 20 bytes (neither 48 nor 24)",
          [i32(1) + entry("w", (2, 3), F64, data=b"\0" * 20)])
    h.dir("len_mismatch_f32", "data_length", "Float32 [2] with 16 bytes",
          [i32(1) + entry("w", (2,), F32, data=b"\0" * 16)])
    h.dir("len_past_eof", "data_length", "data_length 24, 10 bytes follow",
          [i32(1) + entry("w", (2, 3), F32, length=24, data=b"\0" * 10)])
    h.dir("len_negative", "data_length", "data_length -4",
          [i32(1) + entry("w", (2,), F32, length=-4, data=b"\0" * 8)])
    h.dir("dup_name_rank0", "twice", "fc.w twice in shard_rank0.pt",
          [i32(2) + entry("fc.w", (2,), F32) + entry("fc.w", (2,), F32), ok1])
    h.dir("dup_name_rank1", "twice", "fc.w twice in shard_rank1.pt (once in rank 0)",
          [i32(1) + entry("fc.w", (2,), F32),
           i32(2) + entry("fc.w", (2,), F32) + entry("fc.w", (2,), F32)])
    a = np.arange(32, dtype="<f4")
    h.dir("shape_off_split_dim", "dim", "q_proj [4,8] on rank 0, [4,6] on rank 1 (split dim 0)",
          [shard_bytes([("l.q_proj.weight", F32, a.reshape(4, 8), False)])[0],
           shard_bytes([("l.q_proj.weight", F32, a[:24].reshape(4, 6), False)])[0]])
    h.dir("scalar_differs", "dim", "a 0-dim tensor that differs between ranks",
          [shard_bytes([("step", F32, np.float32(1).reshape(()), False)])[0],
           shard_bytes([("step", F32, np.float32(2).reshape(()), False)])[0]])
    mystery = [shard_bytes([("b.mystery.weight", F32, a[:16].reshape(4, 4) + r, False)])[0]
               for r in range(2)]
    h.dir("override_missing_dim", "dim", "tp_split names dim 3 of a 2-D tensor", mystery,
          options="tp_split=*.mystery.weight:3")
    h.dir("override_1d_dim1", "dim", "tp_split names dim 1 of a 1-D tensor",
          [shard_bytes([("x.bias", F32, a[:4] + r, False)])[0] for r in range(2)],
          options="tp_split=*.bias:1")
    for rel, opt, desc in (("tp_split_no_colon", "tp_split=*.mystery.weight", "no :DIM"),
                           ("tp_split_bad_dim", "tp_split=*.mystery.weight:x", "DIM not a number"),
                           ("tp_split_empty_glob", "tp_split=:1", "empty GLOB"),
                           ("tp_split_dim_32", "tp_split=*.w:32", "DIM 32"),
                           ("tp_split_trailing_comma", r"tp_split=*.w:1\,", "empty rule"),
                           ("tp_split_dim_sign", "tp_split=*.w:-1", "DIM -1")):
        h.dir(rel, "tp_split", "bad tp_split syntax: " + desc, mystery, options=opt)
    # Metadata damage.
    meta = metadata_bytes("hostile", datetime.datetime(2025, 1, 1), 2, [2], 1)
    h.dir("meta_name_past_eof", "modelname", "ModelName length 100 in a %d-byte metadata.bin"
          % (len(meta) - 7), [ok], meta=enc7(100) + meta[8:])
    h.dir("meta_mesh_negative", "mesh", "MeshShape length -1, reader order impossible too",
          [ok], meta=meta[:20] + i32(-1) + i32(-1) + i32(1))
    h.dir("meta_mesh_huge", "mesh", "MeshShape length 1000",
          [ok], meta=meta[:20] + i32(1000) + i32(1000) + i32(1))
    cuts = [(0, "modelname"), (1, "modelname"), (5, "modelname"), (8, "savedat"),
            (12, "savedat"), (16, "tpworldsize"), (18, "tpworldsize"), (20, "mesh"),
            (22, "mesh"), (24, "mesh|version"), (28, "mesh|version"), (30, "mesh|version")]
    for cut, needle in cuts:
        h.dir("meta_cut_%d" % cut, needle, "metadata.bin cut at byte %d of %d" % (cut, len(meta)),
              [ok], meta=meta[:cut])
    # Shard truncated at (and inside) every field.
    spans, total = field_spans_shard()
    assert total == len(ok)
    seen = set()
    for label, start, end in spans:
        for cut in sorted({start, start + 1, end - 1} - {end}):
            if cut in seen or cut >= total:
                continue
            seen.add(cut)
            needle = label
            if cut < 4 + 13 * 2 and label != "count":
                needle = "count|" + label
            h.dir("shard_cut_%d" % cut, needle, "shard_rank0.pt cut at byte %d of %d"
                  % (cut, total), [ok[:cut], ok1])
    # Centralized file damage.
    cmeta = metadata_bytes("central", datetime.datetime(2025, 1, 1), 2, [], 1)
    h.file("central_blob_past_eof.ckpt", "shard size", "shard size 1000, 60 bytes follow",
           cmeta + i32(1) + i32(1000) + ok[:60])
    h.file("central_blob_negative.ckpt", "shard size", "shard size -5",
           cmeta + i32(1) + i32(-5) + ok)
    h.file("central_count_negative.ckpt", "shard_count", "shard_count -1",
           cmeta + i32(-1) + i32(len(ok)) + ok)
    h.file("central_count_huge.ckpt", "shard_count", "shard_count 100000",
           cmeta + i32(100000) + i32(len(ok)) + ok)
    h.file("central_nothing_after_count.ckpt", "shard_count", "shard_count 2, file ends after it",
           cmeta + i32(2))
    h.file("central_cut_size.ckpt", "shard size", "file ends inside a shard size",
           cmeta + i32(2) + i32(len(ok)) + ok + b"\x10\x00")
    dt_at = next(s for lab, s, e in spans if lab == "dtype")
    h.file("central_bad_dtype.ckpt", "dtype", "a shard blob with dtype tag 9",
           cmeta + i32(1) + i32(len(ok)) + ok[:dt_at] + i32(9) + ok[dt_at + 4:])
    h.file("central_blob_short.ckpt", "data_length",
           "shard size smaller than the shard it holds",
           cmeta + i32(1) + i32(len(ok) - 8) + ok)
    h.file("central_dup_name.ckpt", "twice", "shard_count 1, the shard names a tensor twice",
           cmeta + i32(1) + i32(4 + 2 * len(entry("a.w", (2,), F32))) +
           i32(2) + entry("a.w", (2,), F32) + entry("a.w", (2,), F32))
    gen_bound_hostile(h, ok, ok1, cmeta)
    h.finish()


def gen_bound_hostile(h, ok, ok1, cmeta):
    """The shard reader's checks one over their bound (refused by that check), and at the bound
    where the next check refuses the input instead, naming itself (bound_*)."""
    # tensor count against the bytes after it, 13 per entry at least: one 13-byte entry (empty
    # name, rank 0, Float32, data_length 0) passes the count and fails its data_length.
    tiny = enc7(0) + i32(0) + i32(F32) + i32(0)
    assert len(tiny) == 13
    h.dir("bound_count_exact_room", "data_length 0&neither", "tensor count 1, 13 bytes follow",
          [i32(1) + tiny, ok1])
    h.dir("bound_count_room_plus_1", "tensor count 2&more than the data can hold",
          "tensor count 2, 13 bytes follow", [i32(2) + tiny, ok1])
    # A name reaching exactly the end of the data, and one byte past it.
    h.dir("bound_name_to_end", "rank&runs past the end", "name length 20, 20 bytes follow",
          [i32(1) + enc7(20) + b"n" * 20, ok1])
    h.dir("bound_name_past_end_1", "tensor name 21&length runs past the end",
          "name length 21, 20 bytes follow", [i32(1) + enc7(21) + b"n" * 20, ok1])
    # rank 32 passes (then dtype 9 is refused), 33 does not.
    h.dir("bound_rank_32", "dtype 9&not a TensorDataType", "32 dims of 1, dtype tag 9",
          [i32(1) + entry("w", (1,) * 32, 9, data=b"\0" * 4), ok1])
    h.dir("bound_rank_33", "rank (number of dims) 33", "33 dims of 1",
          [i32(1) + entry("w", (1,) * 33, F32), ok1])
    # rank 0 (a scalar) passes (then dtype 9), -1 does not. ("rank" alone would match the
    # file name shard_rank0.pt.)
    h.dir("bound_rank_0", "dtype 9&not a TensorDataType", "rank 0, dtype tag 9",
          [i32(1) + entry("w", (), 9, data=b"\0" * 4), ok1])
    h.dir("bound_rank_minus_1", "rank (number of dims) -1", "rank -1",
          [i32(1) + entry("w", (), F32, ndim=-1, data=b""), ok1])
    # dtype tags 0-4: tag 4 (Float16) passes (its data_length then is wrong), 5 does not.
    h.dir("bound_dtype_4", "data_length 6&neither", "dtype tag 4, [2] with 6 bytes",
          [i32(1) + entry("w", (2,), 4, data=b"\0" * 6), ok1])
    h.dir("bound_dtype_5", "dtype 5&not a TensorDataType", "dtype tag 5",
          [i32(1) + entry("w", (2,), 5, data=b"\0" * 8), ok1])
    # data_length one byte more than the shard holds.
    h.dir("bound_len_past_end_1", "data_length 24&runs past the end",
          "data_length 24, 23 bytes follow",
          [i32(1) + entry("w", (2, 3), F32, length=24, data=b"\0" * 23), ok1])
    # numel against C#'s array limit (2^31-1): at it, the data_length is what is wrong.
    h.dir("bound_numel_int32_max", "data_length 0&neither", "dims [2^31-1] Float16, no data",
          [i32(1) + entry("w", (0x7FFFFFFF,), 4, length=0, data=b""), ok1])
    h.dir("bound_numel_int32_max_plus_1", "more than a C# array",
          "dims [2^16, 2^15] Float16 (2^31 elements), no data",
          [i32(1) + entry("w", (1 << 16, 1 << 15), 4, length=0, data=b""), ok1])
    # A name of exactly ckptfs's limit (1 MiB) is read (then the rank is missing), one byte
    # more is refused by the limit, both with the bytes present.
    big = 1 << 20
    h.dir("bound_name_1mib", "rank at offset %d&runs past the end" % (4 + 3 + big),
          "name length 1 MiB, then nothing", [i32(1) + enc7(big) + b"n" * big, ok1])
    h.dir("bound_name_1mib_plus_1", "tensor name %d&length runs past" % (big + 1),
          "name length 1 MiB + 1, with the bytes", [i32(1) + enc7(big + 1) + b"n" * (big + 1)
                                                     + b"\0" * 9, ok1])
    # Centralized: one stray byte after the shards where a shard size would follow.
    h.file("bound_central_stray_byte.ckpt", "shard size&runs past the end",
           "shard_count 2, one shard, then one byte", cmeta + i32(2) + i32(len(ok)) + ok + b"\0")
    # Centralized: a shard size one byte more than the file holds; shard_count over 4096.
    h.file("bound_central_blob_past_end_1.ckpt", "shard size %d&runs past the end" % (len(ok) + 1),
           "shard size one byte more than the file holds",
           cmeta + i32(1) + i32(len(ok) + 1) + ok)
    h.file("bound_central_count_4097.ckpt", "shard_count 4097&over 4096", "shard_count 4097",
           cmeta + i32(4097) + i32(len(ok)) + ok)


def main(argv):
    return generate(argv, CASES, gen_dir2, gen_dir4_override, gen_dtype_quirk, gen_reader_order,
                    gen_trailing, gen_stray_files, gen_saved_at_default, gen_centralized,
                    gen_hostile, self_test=self_test)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
