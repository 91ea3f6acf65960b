#!/usr/bin/python3
"""Write GGUF test fixtures for ckptfs.

usage: gguf_fixtures.py OUTDIR

A small GGUF writer of its own (struct + numpy), written from the GGUF spec and
ggml's type table, so the tests compare the C decoder with an independent
reading of the format.  Deterministic: the same bytes on every run.

Layout of OUTDIR (each good case has a manifest.json):
  v3/                   every ggml plain type, four block types, 0-D..4-D shapes,
                        every KV type incl. nested arrays, NaN/Inf, odd strings,
                        an elided 1.5 MiB string
  v2/                   a version 2 file, tensors stored out of order with gaps
  align64/              general.alignment = 64
  split/                model-0000{1,2,3}-of-00003.gguf (mounted through each part)
  split-empty-first/    2 parts, the first one holding metadata only
  hostile/              broken or nasty inputs, listed in cases.tsv

manifest.json:
  sources   files to mount (relative to the case directory); each must show
            the same tree
  tensors   name, dtype, shape, nbytes, sha256, numpy_dtype, path, file,
            offset, ggml_type, ggml_type_id, block_size, type_size
  kv        [{key, type, value}] in file order: the JSON value metadata.json
            must show under "gguf"; type describes it for exact comparison
            ("FLOAT32" values compare as float32 bits)
  files     the expected "gguf_files" entries (file, version, tensor_count,
            kv_count, alignment)
"""

import hashlib
import math
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import fixture_lib  # noqa: E402
from fixture_lib import generate, numel, tree_paths, u32, u64, write_json  # noqa: E402

# ---------------------------------------------------------------------------
# Format constants

U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
VALUE_NAME = ["UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "FLOAT32",
              "BOOL", "STRING", "ARRAY", "UINT64", "INT64", "FLOAT64"]
VALUE_FMT = {U8: "B", I8: "b", U16: "H", I16: "h", U32: "I", I32: "i",
             F32: "f", BOOL: "B", U64: "Q", I64: "q", F64: "d"}

# ggml_type id -> (name, elements per block, bytes per block)
GGML = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1),
    25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54),
    35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17), 40: ("NVFP4", 64, 36),
    41: ("Q1_0", 128, 18), 42: ("Q2_0", 64, 18),
}
GGML_ID = {v[0]: k for k, v in GGML.items()}
NUMPY = {"F32": "<f4", "F16": "<f2", "F64": "<f8", "I8": "|i1", "I16": "<i2",
         "I32": "<i4", "I64": "<i8"}

STRING_SHOW_LIMIT = 1 << 20   # longer strings are elided in metadata.json


# ---------------------------------------------------------------------------
# Encoding.  Every encoder returns a list of fields (bytes), so hostile cases
# can cut a file at every field boundary.

def as_bytes(s):
    return s.encode("utf-8") if isinstance(s, str) else bytes(s)


def enc_str(s):
    b = as_bytes(s)
    return [u64(len(b)), b]


def enc_payload(vt, payload):
    """Fields of a value of type vt (without the type field).  An ARRAY payload
    is (element type, [element payloads])."""
    if vt == STRING:
        return enc_str(payload)
    if vt == ARRAY:
        et, items = payload
        fields = [u32(et), u64(len(items))]
        if et in VALUE_FMT and items:
            fields.append(struct.pack("<%d%s" % (len(items), VALUE_FMT[et]), *items))
        else:
            for it in items:
                fields += enc_payload(et, it)
        return fields
    return [struct.pack("<" + VALUE_FMT[vt], payload)]


def enc_kv(key, vt, payload):
    return enc_str(key) + [u32(vt)] + enc_payload(vt, payload)


def enc_info(name, ne, type_id, offset):
    return enc_str(name) + [u32(len(ne))] + [u64(d) for d in ne] + [u32(type_id), u64(offset)]


def align_up(n, a):
    return (n + a - 1) // a * a


class Tensor:
    def __init__(self, name, ggml_type, ne, data):
        self.name, self.type, self.ne, self.data = name, ggml_type, list(ne), data

    @property
    def type_id(self):
        return GGML_ID[self.type] if isinstance(self.type, str) else self.type


def nbytes_of(type_name, ne):
    _, block, size = GGML[GGML_ID[type_name]]
    n = numel(ne)
    assert (ne[0] if ne else 1) % block == 0, (type_name, ne)
    return n // block * size


def rand_data(rng, type_name, ne):
    n = numel(ne)
    if type_name in ("F32", "F16", "F64"):
        return rng.standard_normal(n).astype(NUMPY[type_name]).tobytes()
    if type_name == "BF16":
        return (rng.standard_normal(n).astype("<f4").view("<u4") >> 16).astype("<u2").tobytes()
    if type_name in NUMPY:
        info = np.iinfo(np.dtype(NUMPY[type_name]))
        return rng.integers(info.min, info.max, n, dtype=NUMPY[type_name],
                            endpoint=True).tobytes()
    return rng.bytes(nbytes_of(type_name, ne))  # opaque blocks


def rand_tensor(rng, name, type_name, ne):
    return Tensor(name, type_name, ne, rand_data(rng, type_name, ne))


def build(kvs, tensors, version=3, alignment=32, order=None, gap=0, magic=b"GGUF",
          counts=None):
    """Assemble a GGUF file.

    kvs:     [(key, type, payload)]
    order:   tensor order in the data section (default: info order, as ggml)
    gap:     extra aligned bytes left between tensors
    counts:  (tensor_count, kv_count) to declare instead of the real ones
    Returns (fields, offsets): the file as a list of fields, and each tensor's
    offset relative to the data section.
    """
    order = order if order is not None else list(range(len(tensors)))
    rel, pos = {}, 0
    for i in order:
        rel[i] = pos
        pos = align_up(pos + len(tensors[i].data), alignment) + gap
    nt, nk = counts if counts else (len(tensors), len(kvs))
    fields = [magic, u32(version), u64(nt), u64(nk)]
    for key, vt, payload in kvs:
        fields += enc_kv(key, vt, payload)
    for i, t in enumerate(tensors):
        fields += enc_info(t.name, t.ne, t.type_id, rel[i])
    head = sum(len(f) for f in fields)
    fields.append(b"\0" * (align_up(head, alignment) - head))
    data_pos = 0
    for i in order:
        if rel[i] > data_pos:
            fields.append(b"\0" * (rel[i] - data_pos))
        fields.append(tensors[i].data)
        data_pos = rel[i] + len(tensors[i].data)
    if tensors:
        fields.append(b"\0" * (align_up(data_pos, alignment) - data_pos))
    return fields, [rel[i] for i in range(len(tensors))]


def write_fields(path, fields):
    with open(path, "wb") as f:
        f.write(b"".join(fields))


def write_gguf(path, kvs, tensors, alignment=32, **kw):
    """Write a well-formed file; returns manifest records of its tensors."""
    fields, rel = build(kvs, tensors, alignment=alignment, **kw)
    write_fields(path, fields)
    # The data section starts at the aligned end of the tensor infos.
    head = sum(len(f) for f in fields[:4])
    for key, vt, payload in kvs:
        head += sum(len(f) for f in enc_kv(key, vt, payload))
    for i, t in enumerate(tensors):
        head += sum(len(f) for f in enc_info(t.name, t.ne, t.type_id, rel[i]))
    base = align_up(head, alignment)
    recs = []
    for i, t in enumerate(tensors):
        name, block, size = GGML[t.type_id]
        assert len(t.data) == nbytes_of(name, t.ne)
        recs.append({
            "name": t.name, "dtype": name, "shape": list(reversed(t.ne)),
            "nbytes": len(t.data), "sha256": hashlib.sha256(t.data).hexdigest(),
            "numpy_dtype": NUMPY.get(name), "file": os.path.basename(path),
            "offset": base + rel[i], "ggml_type": name, "ggml_type_id": t.type_id,
            "block_size": block, "type_size": size,
        })
    return recs


# ---------------------------------------------------------------------------
# What metadata.json must show

def f32_value(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def json_value(vt, payload):
    if vt in (F32, F64):
        x = f32_value(payload) if vt == F32 else float(payload)
        if math.isnan(x):
            return "NaN"
        if math.isinf(x):
            return "Infinity" if x > 0 else "-Infinity"
        return x
    if vt == BOOL:
        return payload != 0
    if vt == STRING:
        return as_bytes(payload).decode("utf-8", "replace")
    if vt == ARRAY:
        et, items = payload
        return [json_value(et, it) for it in items]
    return payload


def type_spec(vt, payload):
    if vt != ARRAY:
        return VALUE_NAME[vt]
    et, items = payload
    spec = {"array": VALUE_NAME[et]}
    if et == ARRAY:
        spec["items"] = [type_spec(et, it) for it in items]
    return spec


def too_long(vt, payload):
    if vt == STRING:
        return len(as_bytes(payload)) > STRING_SHOW_LIMIT
    if vt == ARRAY:
        return any(too_long(payload[0], it) for it in payload[1])
    return False


def kv_records(kvs):
    out = []
    for key, vt, payload in kvs:
        if too_long(vt, payload):
            value = {"elided": True, "type": VALUE_NAME[vt]}
            if vt == ARRAY:
                value.update(element_type=VALUE_NAME[payload[0]], count=len(payload[1]))
            else:
                value["length"] = len(as_bytes(payload))
            out.append({"key": key, "type": "ELIDED", "value": value})
        else:
            out.append({"key": key, "type": type_spec(vt, payload),
                        "value": json_value(vt, payload)})
    return out


def write_manifest(case_dir, sources, records, kvs, files):
    paths = tree_paths([r["name"] for r in records])
    for r in records:
        r["path"] = paths[r["name"]]
    doc = {"sources": sources, "tensors": records, "kv": kv_records(kvs), "files": files}
    write_json(os.path.join(case_dir, "manifest.json"), doc)


def file_entry(name, version, kvs, tensors, alignment=32):
    return {"file": name, "version": version, "tensor_count": len(tensors),
            "kv_count": len(kvs), "alignment": alignment}


# ---------------------------------------------------------------------------
# Good cases

def every_kv_type(rng):
    tokens = ["<unk>", "<s>", "</s>", "", " ", "\u2581the", "\"quoted\"", "back\\slash",
              "tab\there", "nl\nhere", "\u00e9\u4e2d\U0001F600"]
    tokens += ["tok%d" % i for i in range(300)]
    f32s = [0.1, -1.5, 3.4028234663852886e38, 1e-45, -0.0, 123456.789, float("nan"),
            float("inf"), float("-inf")] + [float(x) for x in rng.standard_normal(20)]
    f64s = [1.0 / 3.0, -2.5e-300, 5e-324, 1.7976931348623157e308, -0.0,
            float("nan"), float("inf")] + [float(x) for x in rng.standard_normal(20)]
    return [
        ("general.architecture", STRING, "llama"),
        ("general.name", STRING, "ckptfs \"test\" model\n\u00fcnicode \u2603"),
        ("general.quantization_version", U32, 2),
        ("general.file_type", U32, 7),
        ("test.u8", U8, 255),
        ("test.i8", I8, -128),
        ("test.u16", U16, 65535),
        ("test.i16", I16, -32768),
        ("test.u32", U32, 4294967295),
        ("test.i32", I32, -2147483648),
        ("test.u64", U64, 18446744073709551615),
        ("test.i64", I64, -9223372036854775808),
        ("test.f32", F32, 0.1),
        ("test.f32_nan", F32, float("nan")),
        ("test.f32_inf", F32, float("inf")),
        ("test.f64", F64, 1.0 / 3.0),
        ("test.f64_neg_inf", F64, float("-inf")),
        ("test.bool_true", BOOL, 1),
        ("test.bool_false", BOOL, 0),
        ("test.string_empty", STRING, ""),
        ("test.string_control", STRING, "a\x00b\x01c\x1fd\x7f"),
        ("test.string_bad_utf8", STRING, b"bad\xffbyte"),
        ("test.string_\u00fcnicode_key", STRING, "key with non-ASCII bytes"),
        ("test.array_u8", ARRAY, (U8, [0, 1, 255])),
        ("test.array_i8", ARRAY, (I8, [-128, 0, 127])),
        ("test.array_u16", ARRAY, (U16, [0, 65535])),
        ("test.array_i16", ARRAY, (I16, [-32768, 32767])),
        ("test.array_u32", ARRAY, (U32, [0, 4294967295])),
        ("test.array_i32", ARRAY, (I32, [-2147483648, 2147483647])),
        ("test.array_u64", ARRAY, (U64, [0, 18446744073709551615])),
        ("test.array_i64", ARRAY, (I64, [-9223372036854775808, 9223372036854775807])),
        ("test.array_f32", ARRAY, (F32, f32s)),
        ("test.array_f64", ARRAY, (F64, f64s)),
        ("test.array_bool", ARRAY, (BOOL, [1, 0, 1])),
        ("test.array_empty", ARRAY, (U32, [])),
        ("test.array_empty_strings", ARRAY, (STRING, [])),
        ("tokenizer.ggml.tokens", ARRAY, (STRING, tokens)),
        ("tokenizer.ggml.scores", ARRAY, (F32, [float(-i) * 0.25 for i in range(len(tokens))])),
        ("tokenizer.ggml.token_type", ARRAY, (I32, [1 + i % 6 for i in range(len(tokens))])),
        ("test.nested", ARRAY, (ARRAY, [(U32, [1, 2, 3]), (STRING, ["a", "b"]), (F32, [0.5]),
                                        (ARRAY, [(I8, [-1]), (ARRAY, [])]), (BOOL, [])])),
        ("test.nested_empty", ARRAY, (ARRAY, [])),
        ("test.huge_string", STRING, "x" * (STRING_SHOW_LIMIT + STRING_SHOW_LIMIT // 2)),
        ("test.array_with_huge_string", ARRAY, (STRING, ["ok", "y" * (STRING_SHOW_LIMIT + 1)])),
        ("test.after_elided", STRING, "still shown"),
    ]


def gen_v3(out):
    d = os.path.join(out, "v3")
    os.makedirs(d)
    rng = np.random.default_rng(4101)
    kvs = every_kv_type(rng)
    tensors = [
        rand_tensor(rng, "token_embd.weight", "F32", [3, 2]),
        rand_tensor(rng, "blk.0.attn_norm.weight", "F16", [5]),
        rand_tensor(rng, "blk.0.attn_q.weight", "BF16", [4, 2, 2]),
        rand_tensor(rng, "blk.0.attn_k.weight", "I8", [2, 2, 1, 3]),
        rand_tensor(rng, "blk.0.attn_v.weight", "I16", [6, 2]),
        rand_tensor(rng, "blk.0.ffn_up.weight", "I32", [7]),
        rand_tensor(rng, "blk.0.ffn_down.weight", "I64", [2, 3]),
        rand_tensor(rng, "blk.0.ffn_gate.weight", "F64", [3, 2]),
        rand_tensor(rng, "blk.1.attn_q.weight", "Q8_0", [64, 2]),
        rand_tensor(rng, "blk.1.attn_k.weight", "Q4_0", [32, 3]),
        rand_tensor(rng, "blk.1.attn_v.weight", "Q4_K", [256, 2]),
        rand_tensor(rng, "blk.1.ffn_down.weight", "Q6_K", [512, 1, 2]),
        rand_tensor(rng, "blk.1.ffn_up.weight", "Q5_1", [32, 2, 1, 2]),
        rand_tensor(rng, "blk.1.ffn_gate.weight", "MXFP4", [64]),
        rand_tensor(rng, "blk.1.empty", "F32", [4, 0]),
        rand_tensor(rng, "output.weight", "Q2_K", [256, 3]),
        # The rest of the types -o as_dtype=f32 converts (last, so the tensors above keep
        # their bytes).
        rand_tensor(rng, "blk.2.attn_q.weight", "Q4_1", [64]),
        rand_tensor(rng, "blk.2.attn_k.weight", "Q5_0", [32, 2]),
        rand_tensor(rng, "blk.2.attn_v.weight", "TQ1_0", [256]),
        rand_tensor(rng, "blk.2.ffn_up.weight", "TQ2_0", [256, 1]),
    ]
    recs = write_gguf(os.path.join(d, "model.gguf"), kvs, tensors)
    write_manifest(d, ["model.gguf"], recs, kvs, [file_entry("model.gguf", 3, kvs, tensors)])


def gen_v2(out):
    d = os.path.join(out, "v2")
    os.makedirs(d)
    rng = np.random.default_rng(4102)
    kvs = [("general.architecture", STRING, "gpt2"), ("gpt2.context_length", U32, 1024),
           ("test.bool_two", BOOL, 2)]
    tensors = [
        rand_tensor(rng, "scalar", "F32", []),
        rand_tensor(rng, "a.weight", "F32", [8, 3]),
        rand_tensor(rng, "b.weight", "Q8_0", [32]),
        rand_tensor(rng, "c", "I32", [5]),
    ]
    # gguf-py readers accept any layout: data stored in reverse order with gaps.
    recs = write_gguf(os.path.join(d, "model.gguf"), kvs, tensors, version=2,
                      order=[3, 1, 2, 0], gap=64)
    write_manifest(d, ["model.gguf"], recs, kvs, [file_entry("model.gguf", 2, kvs, tensors)])


def gen_align64(out):
    d = os.path.join(out, "align64")
    os.makedirs(d)
    rng = np.random.default_rng(4103)
    kvs = [("general.architecture", STRING, "llama"), ("general.alignment", U32, 64)]
    tensors = [rand_tensor(rng, "t%d" % i, t, ne) for i, (t, ne) in enumerate(
        [("F32", [3]), ("F16", [5, 3]), ("Q4_0", [32]), ("BF16", [1]), ("F32", [17])])]
    recs = write_gguf(os.path.join(d, "model.gguf"), kvs, tensors, alignment=64)
    for r in recs:
        assert r["offset"] % 64 == 0
    write_manifest(d, ["model.gguf"], recs, kvs,
                   [file_entry("model.gguf", 3, kvs, tensors, alignment=64)])


def split_name(i, n, prefix="model"):
    return "%s-%05d-of-%05d.gguf" % (prefix, i, n)


def write_split(d, parts, model_kvs, versions=None, tensors_count=None, split_kvs=None):
    """parts: [[Tensor]] per part.  Returns (records, first part's KVs, files)."""
    n = len(parts)
    total = sum(len(p) for p in parts) if tensors_count is None else tensors_count
    recs, files, first_kvs = [], [], None
    for i, tensors in enumerate(parts):
        kvs = split_kvs(i, n, total) if split_kvs else \
            [("split.no", U16, i), ("split.count", U16, n), ("split.tensors.count", I32, total)]
        if i == 0:
            kvs = model_kvs + kvs
            first_kvs = kvs
        name = split_name(i + 1, n)
        version = versions[i] if versions else 3
        recs += write_gguf(os.path.join(d, name), kvs, tensors, version=version)
        files.append(file_entry(name, version, kvs, tensors))
    return recs, first_kvs, files


def gen_split(out):
    d = os.path.join(out, "split")
    os.makedirs(d)
    rng = np.random.default_rng(4104)
    model_kvs = [("general.architecture", STRING, "llama"), ("llama.block_count", U32, 3),
                 ("tokenizer.ggml.tokens", ARRAY, (STRING, ["a", "b", "c"]))]
    parts = [[rand_tensor(rng, "token_embd.weight", "F16", [8, 4]),
              rand_tensor(rng, "blk.0.attn_q.weight", "Q8_0", [32, 2])],
             [rand_tensor(rng, "blk.1.attn_q.weight", "Q4_K", [256]),
              rand_tensor(rng, "blk.1.ffn.weight", "F32", [3, 3]),
              rand_tensor(rng, "blk.1.norm", "F32", [3])],
             [rand_tensor(rng, "output.weight", "Q6_K", [256, 2])]]
    recs, kvs, files = write_split(d, parts, model_kvs, versions=[3, 3, 2])
    write_manifest(d, [split_name(i, 3) for i in (1, 2, 3)], recs, kvs, files)


def gen_split_empty_first(out):
    d = os.path.join(out, "split-empty-first")
    os.makedirs(d)
    rng = np.random.default_rng(4105)
    parts = [[], [rand_tensor(rng, "w", "F32", [4, 4]), rand_tensor(rng, "b", "F32", [4])]]
    recs, kvs, files = write_split(d, parts, [("general.architecture", STRING, "llama")])
    write_manifest(d, [split_name(1, 2), split_name(2, 2)], recs, kvs, files)


# ---------------------------------------------------------------------------
# Hostile cases

class Hostile(fixture_lib.Hostile):
    def add(self, path, expect, needle, desc):
        assert (expect == "mount") == (needle == "")
        self.row(path, expect, needle, desc)

    def fields(self, name, fields, needle, desc, expect="refuse"):
        path = os.path.join(self.root, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_fields(path, fields)
        self.add(name, expect, needle, desc)


def small_file(rng):
    """A small valid file: two KVs, two tensors."""
    kvs = [("general.architecture", STRING, "llama"), ("test.ids", ARRAY, (U32, [1, 2, 3]))]
    tensors = [rand_tensor(rng, "a.weight", "F32", [4]), rand_tensor(rng, "b.weight", "Q8_0", [32])]
    return kvs, tensors


def one_info(name="t", ne=(4,), type_id=0, offset=0, data=b"\0" * 16, kvs=(), version=3,
             alignment=32, extra_infos=()):
    """A file with literal tensor infos (no checks): for bad shapes, types, offsets."""
    infos = [(name, list(ne), type_id, offset)] + list(extra_infos)
    fields = [b"GGUF", u32(version), u64(len(infos)), u64(len(kvs))]
    for key, vt, payload in kvs:
        fields += enc_kv(key, vt, payload)
    for n, e, t, o in infos:
        fields += enc_info(n, e, t, o)
    head = sum(len(f) for f in fields)
    fields.append(b"\0" * (align_up(head, alignment) - head))
    fields.append(data)
    return fields


def header_only(tensor_count, kv_count, rest=b"", version=3, magic=b"GGUF"):
    return [magic, u32(version), u64(tensor_count), u64(kv_count), rest]


def raw_kv_file(kv_fields, tensor_count=0, kv_count=1, tail=b"\0" * 64):
    return [b"GGUF", u32(3), u64(tensor_count), u64(kv_count)] + kv_fields + [tail]


def gen_hostile(out):
    h = Hostile(os.path.join(out, "hostile"))
    rng = np.random.default_rng(4199)

    # Truncation at every field boundary of a small valid file.
    kvs, tensors = small_file(rng)
    fields, _ = build(kvs, tensors)
    whole = b"".join(fields)
    cuts, pos = set(), 0
    for f in fields:
        pos += len(f)
        cuts.add(pos)
        if len(f) > 2:
            cuts.add(pos - len(f) // 2)   # and in the middle of each field
    cuts = sorted(c for c in cuts | {0, 1, 2, 3} if c < len(whole))
    data_end = len(whole) - len(fields[-1])   # the padding after the last tensor is optional
    for c in cuts:
        name = "trunc/at-%04d.gguf" % c
        path = os.path.join(h.root, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(whole[:c])
        desc = "file cut at byte %d of %d" % (c, len(whole))
        if c >= data_end:
            h.names[name] = ["a.weight", "b.weight"]
            h.add(name, "mount", "", desc + " (only trailing padding lost)")
        else:
            # Fewer than 4 bytes cannot be recognized as GGUF at all.
            h.add(name, "refuse", "knows|magic" if c < 4 else "end of the file", desc)
    write_fields(os.path.join(h.root, "small-valid.gguf"), fields)
    h.names["small-valid.gguf"] = ["a.weight", "b.weight"]
    h.add("small-valid.gguf", "mount", "", "the file the truncation cases are cut from")

    # Header
    h.fields("bad-magic.gguf", [b"GGUX", whole[4:]], "knows|magic", "magic GGUX")
    h.fields("v1.gguf", [b"GGUF", u32(1), whole[8:]], "version 1", "GGUF version 1")
    h.fields("v0.gguf", [b"GGUF", u32(0), whole[8:]], "version", "GGUF version 0")
    h.fields("v4.gguf", [b"GGUF", u32(4), whole[8:]], "version", "GGUF version 4")
    h.fields("big-endian-version.gguf", [b"GGUF", struct.pack(">I", 3), whole[8:]],
             "big-endian", "version 3 stored big-endian")
    h.fields("big-endian-magic.gguf", [b"FUGG", struct.pack(">I", 3), whole[8:]],
             "big-endian", "gguf-py's big-endian magic FUGG")
    h.fields("tensor-count-max.gguf", header_only(2**64 - 1, 0, b"\0" * 64), "tensor_count",
             "tensor_count 2^64-1")
    h.fields("tensor-count-2e63.gguf", header_only(2**63, 0, b"\0" * 64), "tensor_count",
             "tensor_count 2^63 (negative as int64)")
    h.fields("tensor-count-1000.gguf", header_only(1000, 0, b"\0" * 200), "tensor_count",
             "tensor_count 1000 in a 224-byte file")
    h.fields("kv-count-max.gguf", header_only(0, 2**64 - 1, b"\0" * 64), "kv_count",
             "kv_count 2^64-1")
    h.fields("kv-count-1000.gguf", header_only(0, 1000, b"\0" * 200), "kv_count",
             "kv_count 1000 in a 224-byte file")

    # KVs
    h.fields("key-length-max.gguf", raw_kv_file([u64(2**64 - 1), b"k"]), "key length",
             "key length 2^64-1")
    h.fields("key-length-70000.gguf",
             raw_kv_file(enc_str("k" * 70000) + [u32(U8), b"\1"]), "key length",
             "key of 70000 bytes (limit 64 KiB)")
    h.fields("string-length-max.gguf",
             raw_kv_file(enc_str("s") + [u32(STRING), u64(2**64 - 1), b"abc"]),
             "string length", "string value length 2^64-1")
    h.fields("string-length-past-eof.gguf",
             raw_kv_file(enc_str("s") + [u32(STRING), u64(1000), b"abc"]),
             "string length", "string value length 1000 with 67 bytes left")
    h.fields("array-length-max.gguf",
             raw_kv_file(enc_str("a") + [u32(ARRAY), u32(U32), u64(2**64 - 1)]),
             "array length", "u32 array of 2^64-1 elements")
    h.fields("array-length-strings.gguf",
             raw_kv_file(enc_str("a") + [u32(ARRAY), u32(STRING), u64(2**40)]),
             "array length", "string array of 2^40 elements")
    h.fields("array-length-nested.gguf",
             raw_kv_file(enc_str("a") + [u32(ARRAY), u32(ARRAY), u64(3), u32(U8), u64(2**50)]),
             "array length", "inner array of 2^50 bytes")
    h.fields("array-string-element-length.gguf",
             raw_kv_file(enc_str("a") + [u32(ARRAY), u32(STRING), u64(2), u64(1), b"x",
                                         u64(2**63)]),
             "string length", "string array element of length 2^63")
    h.fields("array-element-type-99.gguf",
             raw_kv_file(enc_str("a") + [u32(ARRAY), u32(99), u64(1)]), "element type",
             "array element type 99")
    h.fields("value-type-13.gguf", raw_kv_file(enc_str("v") + [u32(13), b"\0" * 8]),
             "value type", "KV value type 13")
    h.fields("value-type-max.gguf", raw_kv_file(enc_str("v") + [u32(2**32 - 1)]),
             "value type", "KV value type 2^32-1")
    deep = []
    for _ in range(100):
        deep += [u32(ARRAY), u64(1)]
    h.fields("nested-100.gguf", raw_kv_file(enc_str("deep") + [u32(ARRAY)] + deep),
             "nested", "arrays nested 100 deep")
    h.fields("duplicate-key.gguf",
             raw_kv_file(enc_kv("k", U8, 1) + enc_kv("k", U8, 2), kv_count=2), "twice",
             "the same key twice")
    for tag, vt, val in [("0", U32, 0), ("3", U32, 3), ("2p31p1", U32, 2**31 + 1),
                         ("u64", U64, 32), ("string", STRING, "32"), ("i32", I32, 32)]:
        h.fields("alignment-%s.gguf" % tag, one_info(kvs=[("general.alignment", vt, val)]),
                 "alignment", "general.alignment %s %r" % (VALUE_NAME[vt], val))

    # Tensor infos
    h.fields("name-length-max.gguf", header_only(1, 0, u64(2**64 - 1) + b"\0" * 64),
             "name length", "tensor name length 2^64-1")
    h.fields("name-length-70000.gguf", one_info(name="n" * 70000), "name length",
             "tensor name of 70000 bytes (limit 64 KiB)")
    h.fields("n-dims-100.gguf", one_info(ne=[1] * 100), "n_dims", "n_dims 100")
    h.fields("n-dims-33.gguf", one_info(ne=[1] * 33), "n_dims", "n_dims 33")
    h.fields("ne-overflow.gguf", one_info(ne=[2**32, 2**32, 4]), "overflows",
             "ne [2^32, 2^32, 4]: element count past 2^64")
    h.fields("ne-int64-overflow.gguf", one_info(ne=[2**32, 2**31]), "overflows",
             "ne [2^32, 2^31]: element count 2^63")
    h.fields("ne-bytes-overflow.gguf", one_info(ne=[2**62], type_id=0), "overflows",
             "2^62 F32 elements: byte size past 2^64")
    h.fields("ne-negative.gguf", one_info(ne=[2**63]), "negative", "ne[0] 2^63")
    for tid, needle in [(4, "removed"), (31, "removed"), (38, "removed"), (43, "unknown"),
                        (99, "unknown"), (2**32 - 1, "unknown")]:
        h.fields("type-%d.gguf" % tid, one_info(type_id=tid), needle, "ggml type id %d" % tid)
    h.fields("block-partial.gguf", one_info(ne=[48], type_id=2, data=b"\0" * 64), "block size",
             "Q4_0 with ne[0] 48, not a multiple of 32")
    h.fields("block-partial-dim1.gguf", one_info(ne=[16, 2], type_id=8, data=b"\0" * 64),
             "block size", "Q8_0 [16, 2]: 32 elements but rows of 16")
    h.fields("offset-unaligned.gguf", one_info(offset=4, data=b"\0" * 32), "alignment",
             "offset 4 with alignment 32")
    h.fields("offset-past-eof.gguf", one_info(offset=4096), "end of the file",
             "offset 4096 in a small file")
    h.fields("offset-max.gguf", one_info(offset=2**64 - 32), "end of the file",
             "offset 2^64-32")
    h.fields("data-past-eof.gguf", one_info(ne=[1000], data=b"\0" * 64), "end of the file",
             "4000-byte tensor in 64 bytes of data")
    h.fields("overlap.gguf",
             one_info(ne=[8], data=b"\0" * 64, extra_infos=[("u", [8], 0, 0)]), "overlaps",
             "two tensors sharing bytes")
    h.fields("overlap-partial.gguf",
             one_info(ne=[16], data=b"\0" * 128, extra_infos=[("u", [16], 0, 32)]), "overlaps",
             "second tensor starts inside the first")
    h.fields("duplicate-tensor.gguf",
             one_info(name="w", ne=[4], data=b"\0" * 64, extra_infos=[("w", [4], 0, 32)]),
             "duplicate", "tensor name w twice")

    # Files that must mount
    h.fields("bool-two.gguf", raw_kv_file(enc_kv("b", BOOL, 2)), "",
             "BOOL value 2 reads as true", expect="mount")
    h.names["bool-two.gguf"] = []
    h.fields("empty-model.gguf", header_only(0, 0), "", "no tensors, no KVs", expect="mount")
    h.names["empty-model.gguf"] = []
    h.fields("zero-size-at-eof.gguf", one_info(ne=[0], data=b""), "",
             "zero-size tensor at the end of the file", expect="mount")
    h.names["zero-size-at-eof.gguf"] = ["t"]
    odd = ["..", ".", "", "a/b", "a.b.", "%", "ctl\x01\x1f", "/lead", "x" * 300,
           "\u00fc\u2603"]
    recs_t = [rand_tensor(rng, n, "I8", [1 + i % 3]) for i, n in enumerate(odd)]
    write_gguf(os.path.join(h.root, "odd-names.gguf"), [], recs_t)
    h.names["odd-names.gguf"] = odd
    h.add("odd-names.gguf", "mount", "", "names with '..', '/', control bytes, empty parts")

    gen_bounds(h)
    gen_hostile_split(h, rng)


def gen_bounds(h):
    """The data-section, overlap and n_dims checks at exactly the bound, one over and (where
    a case can be one under) one under: bound-*.gguf."""
    def mount(name, fields, names, desc):
        h.fields(name, fields, "", desc, expect="mount")
        h.names[name] = names

    # A 64-byte F32 tensor whose data ends exactly at the end of the file, one byte past it.
    mount("bound-data-to-eof.gguf", one_info(ne=[16], data=b"\0" * 64), ["t"],
          "64-byte tensor ending at the end of the file")
    h.fields("bound-data-eof-plus-1.gguf", one_info(ne=[16], data=b"\0" * 63),
             "end of the file", "64-byte tensor, 63 bytes of data")
    mount("bound-data-eof-minus-1.gguf", one_info(ne=[16], data=b"\0" * 65), ["t"],
          "64-byte tensor, one trailing byte after it")
    # With general.alignment 1, a second tensor may start exactly where the first ends,
    # not one byte sooner.
    one = [("general.alignment", U32, 1)]
    mount("bound-adjacent.gguf",
          one_info(ne=[8], data=b"\0" * 64, kvs=one, extra_infos=[("u", [8], 0, 32)]),
          ["t", "u"], "alignment 1: u starts where t ends")
    h.fields("bound-overlap-1.gguf",
             one_info(ne=[8], data=b"\0" * 64, kvs=one, extra_infos=[("u", [8], 0, 31)]),
             "overlaps", "alignment 1: u starts one byte before t ends")
    mount("bound-gap-1.gguf",
          one_info(ne=[8], data=b"\0" * 64, kvs=one, extra_infos=[("u", [8], 0, 33)]),
          ["t", "u"], "alignment 1: u starts one byte after t ends")
    # n_dims: 32 is the most a tensor may have (n-dims-33 is refused).
    mount("bound-n-dims-32.gguf", one_info(ne=[1] * 32, data=b"\0" * 32), ["t"],
          "n_dims 32, every ne 1")
    h.finish()


def gen_hostile_split(h, rng):
    def parts3():
        return [[rand_tensor(rng, "p1", "F32", [2])], [rand_tensor(rng, "p2", "F32", [2])],
                [rand_tensor(rng, "p3", "F32", [2])]]

    def case(name, parts, needle, desc, mount=1, **kw):
        d = os.path.join(h.root, name)
        os.makedirs(d)
        write_split(d, parts, [("general.architecture", STRING, "llama")], **kw)
        h.add("%s/%s" % (name, split_name(mount, len(parts))), "refuse", needle, desc)

    d = os.path.join(h.root, "split-missing")
    os.makedirs(d)
    write_split(d, parts3(), [])
    os.remove(os.path.join(d, split_name(2, 3)))
    h.add("split-missing/" + split_name(1, 3), "refuse", "missing", "part 2 of 3 is missing")
    h.add("split-missing/" + split_name(3, 3), "refuse", "missing",
          "part 2 of 3 is missing (mounting part 3)")

    def kvs_with(count=None, no=None, total=None, skip=()):
        def f(i, n, t):
            out = []
            if "no" not in skip:
                out.append(("split.no", U16, i if no is None else no(i)))
            if "count" not in skip:
                out.append(("split.count", U16, n if count is None else count(i)))
            if "total" not in skip:
                out.append(("split.tensors.count", I32, t if total is None else total(i)))
            return out
        return f

    case("split-count-mismatch", parts3(), "split.count", "part 2 says split.count 4",
         split_kvs=kvs_with(count=lambda i: 4 if i == 1 else 3))
    case("split-no-mismatch", parts3(), "split.no", "part 3 says split.no 1",
         split_kvs=kvs_with(no=lambda i: 1 if i == 2 else i))
    case("split-no-missing", parts3(), "split.no", "part 2 has no split.no",
         split_kvs=lambda i, n, t: ([("split.count", U16, n)] if i == 1 else
                                   [("split.no", U16, i), ("split.count", U16, n)]))
    case("split-tensors-count", parts3(), "split.tensors.count",
         "split.tensors.count 4 for 3 tensors", tensors_count=4)
    case("split-count-zero", parts3(), "split.count", "split.count 0 in every part",
         split_kvs=kvs_with(count=lambda i: 0))
    case("split-count-string", parts3(), "split.count", "split.count is a STRING",
         split_kvs=lambda i, n, t: [("split.no", U16, i), ("split.count", STRING, "3")])
    case("split-no-too-big", parts3(), "split.no", "split.no 7 of 3",
         split_kvs=kvs_with(no=lambda i: 7))
    case("split-duplicate-tensor", [[rand_tensor(rng, "w", "F32", [2])],
                                    [rand_tensor(rng, "w", "F32", [2])]],
         "duplicate", "tensor w in both parts")

    d = os.path.join(h.root, "split-name-count")
    os.makedirs(d)
    parts = parts3()
    for i in range(3):
        write_gguf(os.path.join(d, split_name(i + 1, 3)), kvs_with(count=lambda i: 2)(i, 3, 3),
                   parts[i])
    h.add("split-name-count/" + split_name(1, 3), "refuse", "split.count",
          "split.count 2 in files named -of-00003")

    d = os.path.join(h.root, "split-bad-name")
    os.makedirs(d)
    write_gguf(os.path.join(d, "model.gguf"), kvs_with()(0, 3, 3), parts3()[0])
    h.add("split-bad-name/model.gguf", "refuse", "file name",
          "split.count 3 in a file not named PREFIX-0000i-of-0000N.gguf")

    d = os.path.join(h.root, "split-bad-magic")
    os.makedirs(d)
    write_split(d, parts3(), [])
    with open(os.path.join(d, split_name(3, 3)), "r+b") as f:
        f.write(b"GGUX")
    h.add("split-bad-magic/" + split_name(1, 3), "refuse", "magic",
          "part 3 does not start with GGUF")


# ---------------------------------------------------------------------------

CASES = ["v3", "v2", "align64", "split", "split-empty-first", "hostile"]


def main(argv):
    return generate(argv, CASES, gen_v3, gen_v2, gen_align64, gen_split, gen_split_empty_first,
                    gen_hostile)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
