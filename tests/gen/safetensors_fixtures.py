#!/usr/bin/python3
"""Write safetensors test fixtures for ckptfs.

usage: safetensors_fixtures.py OUTDIR

This generator deliberately has its own tiny safetensors writer (struct + json)
and its own implementation of the ckptfs tree rules (in fixture_lib.py, which
the generators share), so that the integration
tests compare the C code against an independent reading of the specs rather
than against itself.  Everything is deterministic: the same OUTDIR contents
come out on every run.

Layout of OUTDIR:
  dtypes/   one tensor of every safetensors dtype        (+ manifest.json)
  odd/      scalars, empty tensors, odd names, odd header (+ manifest.json)
  sharded/  transformers-style sharded directory          (+ manifest.json)
  both/     model.safetensors and an index side by side   (+ manifest.json)
  hostile/  broken or nasty inputs, listed in cases.tsv
"""

import hashlib
import json
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import fixture_lib  # noqa: E402
from fixture_lib import generate, numel, tree_paths, write_json  # noqa: E402

# Bits per element.  F4/F6 are packed sub-byte types; their byte size is only
# defined when numel * bits is a whole number of bytes.
DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "U16": 16, "I16": 16, "F16": 16, "BF16": 16,
    "U32": 32, "I32": 32, "F32": 32, "F64": 64, "U64": 64, "I64": 64, "C64": 64,
    "F8_E4M3": 8, "F8_E5M2": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8,
    "F8_E5M2FNUZ": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}

# Order in which the modern Rust writer (safetensors >= 0.6) lays tensors out:
# this dtype list first-to-last, ties broken by name.  Mirroring it makes our
# "well-formed" fixtures look like what real tools produce.
WRITER_DTYPE_ORDER = [
    "U64", "I64", "F64", "C64", "F32", "U32", "I32", "BF16", "F16", "U16",
    "I16", "F8_E5M2FNUZ", "F8_E4M3FNUZ", "F8_E8M0", "F8_E4M3", "F8_E5M2",
    "I8", "U8", "F6_E3M2", "F6_E2M3", "F4", "BOOL",
]

# What numpy calls each dtype, for the sidecar's numpy_dtype.  Types numpy has
# no native spelling for (bfloat16, float8, packed fp4/fp6) map to None.
NUMPY_DTYPE = {
    "BOOL": "|b1", "U8": "|u1", "I8": "|i1", "U16": "<u2", "I16": "<i2",
    "F16": "<f2", "U32": "<u4", "I32": "<i4", "F32": "<f4", "U64": "<u8",
    "I64": "<i8", "F64": "<f8", "C64": "<c8",
}


# ---------------------------------------------------------------------------
# Tensor payloads

def nbytes_of(dtype, shape):
    bits = numel(shape) * DTYPE_BITS[dtype]
    assert bits % 8 == 0, (dtype, shape)
    return bits // 8


def make_payload(rng, dtype, shape):
    """Random but reproducible little-endian bytes for one tensor.

    Numeric types get values numpy can round-trip (finite floats, full-range
    ints) so the numpy comparison in the tests is meaningful; types numpy
    cannot represent are opaque bytes anyway, so random bytes are fine.
    """
    n = numel(shape)
    npd = NUMPY_DTYPE.get(dtype)
    if dtype == "BOOL":
        arr = rng.integers(0, 2, size=n).astype("|b1")
    elif npd is not None and npd[1] in "iu":
        info = np.iinfo(np.dtype(npd))
        arr = rng.integers(info.min, info.max, size=n, dtype=np.dtype(npd),
                           endpoint=True)
    elif npd is not None and npd[1] == "f":
        arr = (rng.standard_normal(n) * 3.0).astype(npd)
    elif dtype == "C64":
        arr = (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype("<c8")
    elif dtype == "BF16":
        # bfloat16 is the top half of a float32; truncating keeps values finite.
        f = (rng.standard_normal(n) * 3.0).astype("<f4")
        arr = (f.view("<u4") >> 16).astype("<u2")
    else:
        arr = rng.integers(0, 256, size=nbytes_of(dtype, shape), dtype=np.uint8)
    data = arr.tobytes()
    assert len(data) == nbytes_of(dtype, shape), (dtype, shape, len(data))
    return data


class T:
    """One tensor to be written: name, dtype, shape and its raw bytes."""

    def __init__(self, name, dtype, shape, data):
        self.name, self.dtype, self.shape, self.data = name, dtype, list(shape), data


def rand_tensor(rng, name, dtype, shape):
    return T(name, dtype, shape, make_payload(rng, dtype, shape))


# ---------------------------------------------------------------------------
# safetensors writer

def compact_json(obj):
    # Compact separators and raw UTF-8 match serde_json's output; control
    # characters are still \u-escaped by both.
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def writer_order(tensors):
    rank = {d: i for i, d in enumerate(WRITER_DTYPE_ORDER)}
    return sorted(tensors, key=lambda t: (rank[t.dtype], t.name.encode("utf-8")))


def write_safetensors(path, tensors, metadata=None, buffer_order=None,
                      key_order=None, lead=b"", trail=b"", align=8):
    """Write a safetensors file and return manifest records for its tensors.

    buffer_order: order of tensors in the data section (default: Rust writer).
    key_order:    order of tensor keys in the JSON (default: buffer order).
    lead/trail:   JSON whitespace around the object.
    align:        pad the header with spaces to a multiple of this (0 = none).
    """
    buffer_order = buffer_order or writer_order(tensors)
    key_order = key_order or buffer_order
    assert sorted(t.name for t in buffer_order) == sorted(t.name for t in tensors)

    offsets, pos = {}, 0
    for t in buffer_order:
        offsets[t.name] = (pos, pos + len(t.data))
        pos += len(t.data)

    header = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    for t in key_order:
        header[t.name] = {"dtype": t.dtype, "shape": t.shape,
                          "data_offsets": list(offsets[t.name])}
    text = lead + compact_json(header) + trail
    if align:
        text += b" " * (-len(text) % align)

    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for t in buffer_order:
            f.write(t.data)

    base = 8 + len(text)
    return [{
        "name": t.name, "dtype": t.dtype, "shape": t.shape,
        "nbytes": len(t.data),
        "sha256": hashlib.sha256(t.data).hexdigest(),
        "numpy_dtype": NUMPY_DTYPE.get(t.dtype),
        "file": os.path.basename(path),
        "offset": base + offsets[t.name][0],
    } for t in tensors]


def raw_safetensors(path, header_bytes, data=b"", declared_len=None):
    """Write a file from a literal header; for hostile cases only."""
    n = len(header_bytes) if declared_len is None else declared_len
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", n) + header_bytes + data)


# ---------------------------------------------------------------------------
# Manifests (paths by the ckptfs tree rules, restated in fixture_lib.py)

def write_manifest(case_dir, source, records):
    paths = tree_paths([r["name"] for r in records])
    for r in records:
        r["path"] = paths[r["name"]]
    keys = ["name", "dtype", "shape", "nbytes", "sha256", "numpy_dtype",
            "path", "file", "offset"]
    doc = {"source": source,
           "tensors": [{k: r[k] for k in keys} for r in records]}
    write_json(os.path.join(case_dir, "manifest.json"), doc, ensure_ascii=False)


def write_hf_index(dirpath, shards):
    """shards: list of (filename, [T]).  Writes shards + index, returns records."""
    records, weight_map = [], {}
    for fname, tensors in shards:
        records += write_safetensors(os.path.join(dirpath, fname), tensors,
                                     metadata={"format": "pt"})
        for t in tensors:
            weight_map[t.name] = fname
    index = {"metadata": {"total_size": sum(r["nbytes"] for r in records)},
             "weight_map": weight_map}
    # Byte-for-byte what transformers' save_pretrained writes.
    write_json(os.path.join(dirpath, "model.safetensors.index.json"), index,
               indent=2, sort_keys=True)
    return records


def shard_name(i, n):
    return "model-%05d-of-%05d.safetensors" % (i, n)


# ---------------------------------------------------------------------------
# Well-formed cases

DTYPE_SHAPES = {
    # Varied ranks so shape handling is exercised; sub-byte shapes are chosen
    # so numel*bits is a whole number of bytes.
    "BOOL": [3, 5], "U8": [7], "I8": [2, 2, 3], "U16": [4, 3], "I16": [5],
    "F16": [3, 4], "BF16": [2, 6], "U32": [6], "I32": [2, 3], "F32": [4, 4],
    "F64": [3], "U64": [2, 2], "I64": [5], "C64": [2, 3],
    "F8_E4M3": [4, 8], "F8_E5M2": [16], "F8_E8M0": [2, 4],
    "F8_E4M3FNUZ": [3, 3], "F8_E5M2FNUZ": [1, 9], "F4": [4, 6],
    "F6_E2M3": [2, 8], "F6_E3M2": [4, 4],
}


def gen_dtypes(out):
    d = os.path.join(out, "dtypes")
    os.makedirs(d)
    rng = np.random.default_rng(1001)
    # Listed in the dtype enum's declaration order; write_safetensors must
    # reorder them into the writer's layout order.
    tensors = [rand_tensor(rng, "model.layers.0.mlp." + dt.lower(), dt, DTYPE_SHAPES[dt])
               for dt in ["BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2",
                          "F8_E4M3", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "I16",
                          "U16", "F16", "BF16", "I32", "U32", "F32", "C64", "F64",
                          "I64", "U64"]]
    assert set(t.dtype for t in tensors) == set(DTYPE_BITS)
    recs = write_safetensors(os.path.join(d, "model.safetensors"), tensors,
                             metadata={"format": "pt"})
    write_manifest(d, "model.safetensors", recs)


def gen_odd(out):
    d = os.path.join(out, "odd")
    os.makedirs(d)
    rng = np.random.default_rng(1002)
    spec = [
        ("scalar", "F32", []),
        ("empty.vec", "F32", [0]),
        ("empty.mat", "I64", [0, 4]),
        ("a.b", "F16", [3]),
        ("a.b.c", "F32", [2, 2]),
        ("x..y", "I32", [3]),
        ("p%q", "U8", [5]),
        ("ctl\u0001z", "I16", [2]),
        ("dup.n", "F32", [2]),
        ("dup/n", "F64", [2]),
        (".hidden", "BF16", [4]),
        ("ünï.cödé", "F32", [3]),
        ("ünïcödé_ñåmé_wïth_sëvëràl_àccéntëd_lëttërs.wéïght_ΑΒΓΔ_日本語", "U16", [3]),
    ]
    tensors = [rand_tensor(rng, n, dt, sh) for n, dt, sh in spec]
    # Buffer order differs from both the writer rule and the key order, so a
    # reader that trusts either ordering gets the wrong bytes.
    buffer_order = [tensors[i] for i in (6, 0, 9, 3, 12, 1, 7, 4, 10, 2, 5, 8, 11)]
    key_order = list(reversed(tensors))
    lead, trail = b" \n\t", b"\r\n  "
    # Grow the trailing whitespace until N is not a multiple of 8: a
    # misaligned data section is the point of this case.
    path = os.path.join(d, "model.safetensors")
    for extra in range(8):
        recs = write_safetensors(path, tensors, metadata=None,
                                 buffer_order=buffer_order, key_order=key_order,
                                 lead=lead, trail=trail + b" " * extra, align=0)
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
        if n % 8:
            break
    assert n % 8
    write_manifest(d, "model.safetensors", recs)


def llama_tensors(rng, layers, hidden=16, inter=24, vocab=32):
    """A tiny llama-shaped state dict, in state-dict order."""
    ts = [rand_tensor(rng, "model.embed_tokens.weight", "BF16", [vocab, hidden])]
    for i in layers:
        p = "model.layers.%d." % i
        ts += [
            rand_tensor(rng, p + "self_attn.q_proj.weight", "BF16", [hidden, hidden]),
            rand_tensor(rng, p + "self_attn.k_proj.weight", "F16", [hidden // 2, hidden]),
            rand_tensor(rng, p + "self_attn.v_proj.weight", "F16", [hidden // 2, hidden]),
            rand_tensor(rng, p + "self_attn.o_proj.weight", "F32", [hidden, hidden]),
            rand_tensor(rng, p + "mlp.down_proj.weight", "F32", [hidden, inter]),
            rand_tensor(rng, p + "input_layernorm.weight", "F32", [hidden]),
        ]
    ts += [rand_tensor(rng, "model.norm.weight", "F32", [hidden]),
           rand_tensor(rng, "model.rotary.position_ids", "I64", [1, 8])]
    return ts


def write_hf_side_files(d, hidden=16, inter=24, vocab=32, layers=2):
    write_json(os.path.join(d, "config.json"), {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": hidden, "intermediate_size": inter,
        "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": layers, "vocab_size": vocab,
        "max_position_embeddings": 8, "rms_norm_eps": 1e-06,
        "torch_dtype": "bfloat16", "tie_word_embeddings": True,
        "bos_token_id": 1, "eos_token_id": 2, "transformers_version": "4.44.2",
    }, indent=2, sort_keys=True)
    write_json(os.path.join(d, "generation_config.json"), {
        "_from_model_config": True, "bos_token_id": 1, "eos_token_id": 2,
        "transformers_version": "4.44.2"}, indent=2, sort_keys=True)
    vocab_map = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for i, piece in enumerate("abcdefghijklmnopqrstuvwxyz▁.,", start=3):
        vocab_map[piece] = i
    write_json(os.path.join(d, "tokenizer.json"), {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": t, "single_word": False,
                          "lstrip": False, "rstrip": False, "normalized": False,
                          "special": True}
                         for t, i in list(vocab_map.items())[:3]],
        "normalizer": None, "pre_tokenizer": None, "post_processor": None,
        "decoder": None,
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>",
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": True, "byte_fallback": False,
                  "vocab": vocab_map, "merges": []},
    }, indent=2, ensure_ascii=False)
    write_json(os.path.join(d, "tokenizer_config.json"), {
        "add_bos_token": True, "add_eos_token": False, "bos_token": "<s>",
        "eos_token": "</s>", "unk_token": "<unk>", "model_max_length": 8,
        "tokenizer_class": "LlamaTokenizerFast", "clean_up_tokenization_spaces": False,
    }, indent=2, sort_keys=True)
    write_json(os.path.join(d, "special_tokens_map.json"), {
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}, indent=2)


def gen_sharded(out):
    d = os.path.join(out, "sharded")
    os.makedirs(d)
    rng = np.random.default_rng(1003)
    ts = llama_tensors(rng, [0, 1])
    assert len(ts) == 15
    # Contiguous runs in state-dict order, as huggingface_hub's greedy packing
    # would produce with a small max_shard_size.
    shards = [(shard_name(1, 3), ts[0:5]), (shard_name(2, 3), ts[5:10]),
              (shard_name(3, 3), ts[10:])]
    recs = write_hf_index(d, shards)
    write_hf_side_files(d)
    write_manifest(d, ".", recs)


def gen_both(out):
    d = os.path.join(out, "both")
    os.makedirs(d)
    rng = np.random.default_rng(1004)
    single = [rand_tensor(rng, "model.single.weight", "F32", [4, 4]),
              rand_tensor(rng, "model.single.bias", "F32", [4]),
              rand_tensor(rng, "model.single.steps", "I64", [])]
    recs = write_safetensors(os.path.join(d, "model.safetensors"), single,
                             metadata={"format": "pt"})
    # A stale sharded copy with different names: transformers ignores it when
    # model.safetensors exists, and so must the mount.
    stale = [rand_tensor(rng, "model.sharded.weight", "F16", [4, 4]),
             rand_tensor(rng, "model.sharded.bias", "F16", [4])]
    write_hf_index(d, [(shard_name(1, 2), stale[:1]), (shard_name(2, 2), stale[1:])])
    write_manifest(d, ".", recs)


# ---------------------------------------------------------------------------
# Hostile cases

U64_MAX = 2 ** 64 - 1


def hdr(obj):
    return compact_json(obj)


def f32_entry(begin=0, end=4, shape=(1,)):
    return {"dtype": "F32", "shape": list(shape), "data_offsets": [begin, end]}


class Hostile(fixture_lib.Hostile):
    def add(self, path, expect, needle, desc):
        assert (expect == "mount") == (needle == "")
        self.row(path, expect, needle, desc)

    def file(self, name, header, data=b"", declared_len=None, expect="refuse",
             needle="", desc=""):
        raw_safetensors(os.path.join(self.root, name), header, data, declared_len)
        self.add(name, expect, needle, desc)

    def text(self, name, header_text, data=b"", **kw):
        self.file(name, header_text.encode("utf-8"), data, **kw)

    def names_case(self, name, names, desc, rng):
        """A valid file whose only hostility is its tensor names."""
        tensors = [rand_tensor(rng, n, "U8", [1 + i % 3]) for i, n in enumerate(names)]
        write_safetensors(os.path.join(self.root, name), tensors,
                          metadata={"format": "pt"})
        self.names[name] = list(names)
        self.add(name, "mount", "", desc)


def gen_hostile(out):
    h = Hostile(os.path.join(out, "hostile"))
    rng = np.random.default_rng(1005)
    four = b"\0\0\x80\x3f"  # 1.0f

    def w(name, needle, desc, data=four, dtype='"F32"', shape="[1]", offsets="[0,4]"):
        """NAME.safetensors whose one tensor, w, has these JSON texts (None: left out) as its
        dtype, shape and data_offsets."""
        fields = [(k, v) for k, v in (("dtype", dtype), ("shape", shape),
                                      ("data_offsets", offsets)) if v is not None]
        h.text(name + ".safetensors",
               '{"w":{%s}}' % ",".join('"%s":%s' % f for f in fields), data,
               needle=needle, desc=desc)

    # --- header length -----------------------------------------------------
    with open(os.path.join(h.root, "empty.safetensors"), "wb"):
        pass
    h.add("empty.safetensors", "refuse", "header length", "zero-byte file")
    with open(os.path.join(h.root, "tiny.safetensors"), "wb") as f:
        f.write(b"\x02\0\0\0\0")
    h.add("tiny.safetensors", "refuse", "header length", "5-byte file, shorter than the length prefix")
    h.file("hdrlen-beyond-eof.safetensors", hdr({"w": f32_entry()}), four,
           declared_len=4096, needle="header length",
           desc="header length points past end of file")
    h.file("hdrlen-over-100M.safetensors", hdr({"w": f32_entry()}), four,
           declared_len=100_000_001, needle="header length&limit",
           desc="header length 100000001 exceeds the 100 MB limit")
    h.file("hdrlen-u64max.safetensors", hdr({"w": f32_entry()}), four,
           declared_len=U64_MAX, needle="header length",
           desc="header length 2^64-1 (overflows 8+N)")
    h.file("hdrlen-zero.safetensors", b"", four, needle="JSON|header length",
           desc="header length 0: empty header is not a JSON object")

    # --- data_offsets tiling --------------------------------------------------
    h.file("offsets-past-eof.safetensors", hdr({"w": f32_entry(0, 64, [16])}), four * 4,
           needle="data_offsets", desc="data_offsets end past end of file")
    h.file("offsets-gap.safetensors",
           hdr({"a": f32_entry(0, 16, [4]), "b": f32_entry(20, 36, [4])}), b"\1" * 36,
           needle="data_offsets", desc="4-byte hole between two tensors")
    h.file("offsets-overlap.safetensors",
           hdr({"a": f32_entry(0, 16, [4]), "b": f32_entry(8, 24, [4])}), b"\1" * 24,
           needle="data_offsets", desc="two tensors overlap by 8 bytes")
    h.file("offsets-same-range.safetensors",
           hdr({"a": f32_entry(0, 16, [4]), "b": f32_entry(0, 16, [4])}), b"\1" * 16,
           needle="data_offsets", desc="two tensors alias the same non-empty range")
    h.file("offsets-trailing-bytes.safetensors", hdr({"w": f32_entry(0, 16, [4])}),
           b"\1" * 24, needle="data_offsets",
           desc="8 bytes after the last tensor are covered by no tensor")
    h.file("offsets-not-from-zero.safetensors", hdr({"w": f32_entry(4, 8)}), b"\1" * 8,
           needle="data_offsets", desc="first tensor starts at 4, bytes 0-3 uncovered")
    h.file("offsets-end-before-begin.safetensors", hdr({"w": f32_entry(16, 0, [4])}),
           b"\1" * 16, needle="data_offsets", desc="data_offsets [16,0]: end < begin")
    # "array of 2": the count check's own complaint, not a later one about the offsets.
    w("offsets-three", "data_offsets&array of 2", "data_offsets with 3 entries", four * 2,
      offsets="[0,4,8]")
    w("offsets-one", "data_offsets&array of 2", "data_offsets with 1 entry", offsets="[4]")
    w("offsets-negative", "data_offsets", "negative data_offsets", offsets="[-4,0]")
    w("offsets-missing", "data_offsets", "tensor entry without data_offsets", offsets=None)
    w("offsets-string", "data_offsets", "data_offsets given as strings", offsets='["0","4"]')

    # --- number syntax: only exact non-negative integers are sizes -------------
    w("float-offset", "integer", "data_offsets end written as 4.0", offsets="[0,4.0]")
    w("float-shape", "integer", "shape dim written as 1.0", shape="[1.0]")
    w("exponent-shape", "integer", "shape dim written as 1e2", b"\1" * 100, dtype='"U8"',
      shape="[1e2]", offsets="[0,100]")
    w("bigint-offset", "integer", "data_offsets end 2^64+4 does not fit u64",
      offsets="[0,18446744073709551620]")
    w("bigint-shape", "integer", "shape dim 2^65 does not fit u64", dtype='"U8"',
      shape="[36893488147419103232]")
    # Through a double, 2^53+1 rounds to 2^53, which would make shape and
    # data_offsets agree; an exact reader sees the end run past EOF (or
    # rejects integers beyond 2^53 outright).
    w("int-2p53plus1", "integer|data_offsets",
      "2^53+1 as shape and size: must not be rounded through a double", dtype='"U8"',
      shape="[9007199254740993]", offsets="[0,9007199254740993]")

    # --- shape ---------------------------------------------------------------
    w("shape-overflow", "shape", "shape product 2^65 overflows u64",
      shape="[4294967296,4294967296,2]")
    w("shape-bits-overflow", "shape", "numel 2^62 fits u64 but numel*64 bits does not", four * 2,
      dtype='"F64"', shape="[4611686018427387904]", offsets="[0,8]")
    w("shape-negative", "shape", "negative shape dim", shape="[-1]")
    w("shape-not-array", "shape", "shape is a number, not an array", shape="1")
    w("shape-missing", "shape", "tensor entry without shape", shape=None)
    h.file("nbytes-mismatch.safetensors", hdr({"w": f32_entry(0, 16, [2, 3])}),
           b"\1" * 16, needle="shape|data_offsets",
           desc="shape [2,3] F32 needs 24 bytes, data_offsets span 16")
    w("f4-odd-numel", "shape|dtype", "F4 with 3 elements is 12 bits, not whole bytes", b"\1\1",
      dtype='"F4"', shape="[3]", offsets="[0,2]")
    w("f6-partial-byte", "shape|dtype", "F6 with 5 elements is 30 bits, not whole bytes",
      b"\1" * 4, dtype='"F6_E2M3"', shape="[5]")

    # --- dtype ---------------------------------------------------------------
    w("dtype-unknown", "dtype", "unknown dtype string F128", b"\1" * 16, dtype='"F128"',
      offsets="[0,16]")
    w("dtype-lowercase", "dtype", "dtype spelled lowercase f32", dtype='"f32"')
    w("dtype-not-string", "dtype", "dtype is a number", dtype="7")
    w("dtype-missing", "dtype", "tensor entry without dtype", dtype=None)

    # --- encoding and JSON syntax ---------------------------------------------
    h.file("utf8-invalid.safetensors",
           b'{"w\xff":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', four,
           needle="UTF-8", desc="0xFF byte inside a tensor name")
    h.file("utf8-overlong.safetensors",
           b'{"w\xc0\xaf":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', four,
           needle="UTF-8", desc="overlong encoding of '/' (C0 AF) in a name")
    h.file("utf8-surrogate.safetensors",
           b'{"w\xed\xa0\x80":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', four,
           needle="UTF-8", desc="UTF-8-encoded surrogate U+D800 in a name")
    h.text("json-lone-surrogate-escape.safetensors",
           '{"w\\ud800":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', four,
           needle="UTF-8|JSON", desc="\\ud800 escape without its low surrogate")
    h.file("nul-padding.safetensors",
           hdr({"w": f32_entry()}) + b"\0" * 6, four,
           needle="JSON", desc="header padded with NUL bytes instead of spaces")
    h.file("nul-in-string.safetensors",
           b'{"w\0x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', four,
           needle="JSON", desc="raw NUL byte inside a JSON string")
    h.file("bom.safetensors", b"\xef\xbb\xbf" + hdr({"w": f32_entry()}), four,
           needle="JSON", desc="UTF-8 byte-order mark before the object")
    h.file("not-object.safetensors", b'[{"dtype":"F32","shape":[1],"data_offsets":[0,4]}]',
           four, needle="JSON", desc="header is a JSON array, not an object")
    h.file("truncated-json.safetensors", b'{"w":{"dtype":"F32","shape":[1],"data_of',
           b"", needle="JSON", desc="header JSON cut off mid-key")
    h.file("trailing-garbage.safetensors", hdr({"w": f32_entry()}) + b"x", four,
           needle="JSON", desc="non-whitespace after the JSON object")
    h.file("entry-not-object.safetensors", b'{"w":"F32"}', b"",
           needle="JSON", desc="tensor entry is a string, not an object")
    depth = 100_000
    h.file("deep-nesting.safetensors",
           b'{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":'
           + b"[" * depth + b"]" * depth + b"}}", four,
           needle="depth", desc="100000-deep array nesting in an ignored field")
    w("duplicate-tensor", "duplicate", "same tensor key twice (identical entries)",
      offsets='[0,4]},"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]')
    w("duplicate-field", "duplicate", "dtype key twice inside one tensor entry",
      dtype='"F32","dtype":"I32"')
    h.text("duplicate-metadata-key.safetensors",
           '{"__metadata__":{"format":"pt","format":"np"},'
           '"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', four,
           needle="duplicate", desc="same key twice inside __metadata__")
    h.text("metadata-non-string.safetensors",
           '{"__metadata__":{"format":"pt","epoch":3},'
           '"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', four,
           needle="__metadata__", desc="__metadata__ value is a number")
    h.text("metadata-array.safetensors",
           '{"__metadata__":["format","pt"],'
           '"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', four,
           needle="__metadata__", desc="__metadata__ is an array")

    # --- valid files that must mount safely -------------------------------------
    h.names_case("names-dotdot.safetensors",
                 ["..", ".", "...", "a..b", "../../etc/passwd", "..a", "b..", "...x..."],
                 "names made of dots and '..' traversals", rng)
    h.names_case("names-slash.safetensors",
                 ["/", "//", "/abs/path", "a//b", "a/", "a/./b", "c/../../../d"],
                 "names with '/' (absolute, doubled, trailing, traversal)", rng)
    h.names_case("names-control.safetensors",
                 ["".join(map(chr, range(1, 32))) + "\x7f", "tab\tname",
                  "new\nline", "esc\x1b[31mred\x1b[0m", "cr\rret", "del\x7f"],
                 "names with every control byte, ANSI escapes and newlines", rng)
    h.names_case("names-nul.safetensors",
                 ["a\0b", "\0", "nul.\0.x", "trail\0"],
                 "names containing \\u0000", rng)
    h.names_case("names-empty.safetensors", ["", "x", ".x", "x."],
                 "empty name and names with empty components", rng)
    h.names_case("names-collide.safetensors",
                 ["c.d", "c/d", "c.d.e", "c",
                  "m.n.o", "m/n.o", "m.n/o", "m/n/o", "m.n"],
                 "names that map to the same path, some also prefixes", rng)
    h.names_case("names-escape-lookalike.safetensors",
                 ["%_", "%~2", "%25", "%", "k.%~2", "k.v", "k/v", "q", "q.raw",
                  "q.json", "r.json", "r"],
                 "names that look like the escape rule's own output", rng)
    h.names_case("names-unicode.safetensors",
                 ["rtl\u202eexe.txt", "zw\u200bj", "e\u0301", "\u00e9",
                  "full\uff0fwidth", "one\u2024dot", "emoji\U0001f600",
                  "\ufeffbom", "nbsp\u00a0x"],
                 "RTL override, zero-width, NFC/NFD twins, lookalike slash/dot", rng)
    h.names_case("names-deep.safetensors", [".".join(["d"] * 400), "d"],
                 "one name with 400 components (and a tensor at the top)", rng)
    h.names_case("names-long-component.safetensors", ["long." + "L" * 300, "short"],
                 "one 300-byte component, longer than NAME_MAX", rng)
    h.names_case("names-many.safetensors", ["t.%d" % i for i in range(3000)],
                 "3000 tensors in one directory", rng)

    raw_safetensors(os.path.join(h.root, "empty-header.safetensors"), b"{}      ")
    h.names["empty-header.safetensors"] = []
    h.add("empty-header.safetensors", "mount", "", "no tensors at all ({} padded)")
    h.file("metadata-null.safetensors",
           b'{"__metadata__":null,"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}',
           four, expect="mount", desc="__metadata__ null counts as absent")
    h.names["metadata-null.safetensors"] = ["w"]
    h.file("extra-fields.safetensors",
           b'{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4],'
           b'"x":{"y":[1,2,{"z":null}]},"requires_grad":true}}',
           four, expect="mount", desc="unknown fields in a tensor entry are ignored")
    h.names["extra-fields.safetensors"] = ["w"]
    h.text("zero-size-shared-offset.safetensors",
           '{"a":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},'
           '"b":{"dtype":"I64","shape":[0,3],"data_offsets":[4,4]},'
           '"c":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
           '"d":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}}', four,
           expect="mount", desc="several empty tensors at the same offset")
    h.names["zero-size-shared-offset.safetensors"] = ["a", "b", "c", "d"]
    h.text("zero-dim-huge.safetensors",
           '{"w":{"dtype":"F64","shape":[1099511627776,0],"data_offsets":[0,0]}}', b"",
           expect="mount", desc="shape [2^40,0]: zero bytes despite a huge dim")
    h.names["zero-dim-huge.safetensors"] = ["w"]
    h.file("whitespace-padding.safetensors",
           b"\n\t \r" + hdr({"w": f32_entry()}) + b"\r\n\t ", four, expect="mount",
           desc="all four JSON whitespace bytes before and after the object")
    h.names["whitespace-padding.safetensors"] = ["w"]

    gen_bounds(h, four)

    # --- Hugging Face directories ---------------------------------------------
    gen_hostile_hf(h, rng)
    h.finish()


def gen_bounds(h, four):
    """Every length/offset/count check of the reader at exactly its bound, one under and
    one over (bound-*): a check that moves by one byte, element or dim fails one of them.
    Needles name the specific complaint, so a neighbouring check cannot stand in."""
    def mount(name, header, data, names, desc):
        h.file(name, header, data, expect="mount", desc=desc)
        h.names[name] = names

    def entry(dtype, shape, begin, end):
        return {"dtype": dtype, "shape": list(shape), "data_offsets": [begin, end]}

    # File size against the 8-byte length prefix (the name says safetensors, so the reader
    # runs whatever the first bytes say).
    for size, needle in ((7, "too short"), (8, "JSON")):
        with open(os.path.join(h.root, "bound-file-%d-bytes.safetensors" % size), "wb") as f:
            f.write(b"\0" * size)
        h.add("bound-file-%d-bytes.safetensors" % size, "refuse", needle,
              "%d-byte file (the length prefix needs 8; an 8-byte one has an empty header)"
              % size)
    # Header length against the 100,000,000-byte limit: at or under the limit, the next
    # complaint is that the header runs past the end of this small file.
    # "header length&past the end": the length check's complaint, not the reader's (which
    # says "header at offset 8 ... runs past the end").
    for n, needle in ((99_999_999, "header length&past the end"),
                      (100_000_000, "header length&past the end"),
                      (100_000_001, "limit")):
        h.file("bound-hdrlen-%d.safetensors" % n, hdr({"w": f32_entry()}), four,
               declared_len=n, needle=needle,
               desc="header length %d against the limit of 100000000" % n)
    # Header length against the file: the header may end exactly at the end of the file
    # (every tensor empty), not one byte later.
    empty = hdr({"w": entry("F32", [0], 0, 0)})
    mount("bound-header-to-eof.safetensors", empty, b"", ["w"],
          "header ends at the end of the file, one empty tensor")
    h.file("bound-hdrlen-eof-plus-1.safetensors", empty, b"", declared_len=len(empty) + 1,
           needle="header length&past the end", desc="header length one byte past the end of the file")
    mount("bound-hdrlen-eof-minus-1.safetensors", empty + b" ", b"", ["w"],
          "header with one trailing space, ending at the end of the file")
    # The data section against the tensors: covered exactly, one byte over, one short.
    one = hdr({"w": entry("U8", [5], 0, 5)})
    mount("bound-data-exact.safetensors", one, b"\1" * 5, ["w"],
          "5-byte tensor, 5-byte data section")
    h.file("bound-data-trailing-1.safetensors", one, b"\1" * 6, needle="trailing",
           desc="one byte after the last tensor")
    h.file("bound-data-short-1.safetensors", one, b"\1" * 4, needle="past the end",
           desc="last tensor ends one byte past the end of the file")
    # Tiling: a tensor begins exactly where the previous ends, not one byte later or sooner.
    for b, needle, what in ((3, "", "adjacent"), (4, "gap", "one-byte gap"),
                            (2, "overlap", "one-byte overlap")):
        name = "bound-tile-%s.safetensors" % what.replace(" ", "-")
        header = hdr({"a": entry("U8", [3], 0, 3), "b": entry("U8", [2], b, b + 2)})
        data = b"\1" * (b + 2)
        if needle:
            h.file(name, header, data, needle=needle, desc="tensors a [0,3) and b [%d,%d): %s"
                   % (b, b + 2, what))
        else:
            mount(name, header, data, ["a", "b"], "tensors a [0,3) and b [3,5): adjacent")
    # data_offsets order: end == begin is an empty tensor, end one below begin is refused.
    mount("bound-offsets-empty.safetensors",
          hdr({"a": entry("U8", [2], 0, 2), "e": entry("U8", [0], 2, 2)}), b"\1\1",
          ["a", "e"], "data_offsets [2,2]: an empty tensor")
    h.file("bound-offsets-end-minus-1.safetensors",
           hdr({"a": entry("U8", [2], 0, 2), "e": entry("U8", [0], 2, 1)}), b"\1\1",
           needle="before begin", desc="data_offsets [2,1]: end one below begin")
    # The byte span against shape x dtype: equal, one over, one under.
    for span, needle in ((8, ""), (9, "span"), (7, "span")):
        name = "bound-span-%d.safetensors" % span
        header = hdr({"w": entry("F32", [2], 0, span)})
        if needle:
            h.file(name, header, b"\1" * span, needle=needle,
                   desc="F32 [2] needs 8 bytes, data_offsets span %d" % span)
        else:
            mount(name, header, b"\1" * 8, ["w"], "F32 [2] in exactly 8 bytes")
    # Dims: 32 is the most a shape may have.
    for nd in (31, 32, 33):
        name = "bound-ndim-%d.safetensors" % nd
        header = hdr({"w": entry("U8", [1] * nd, 0, 1)})
        if nd <= 32:
            mount(name, header, b"\1", ["w"], "shape of %d dims of 1" % nd)
        else:
            h.file(name, header, b"\1", needle="32 dims", desc="shape of 33 dims of 1")
    # The format probe (a file not named .safetensors is recognised by its first bytes
    # only): at least 10 bytes, a header length of 2 to 100,000,000, then a '{'.
    probe_cases = (
        ("bound-probe-10-bytes.st", struct.pack("<Q", 2) + b"{}", []),
        ("bound-probe-9-bytes.st", struct.pack("<Q", 2) + b"{", "knows"),
        ("bound-probe-hdrlen-1.st", struct.pack("<Q", 1) + b"{  ", "knows"),
        ("bound-probe-hdrlen-limit.st", struct.pack("<Q", 100_000_000) + b"{}",
         "header length&past the end"),
        ("bound-probe-hdrlen-over.st", struct.pack("<Q", 100_000_001) + b"{}", "knows"),
    )
    for name, data, want in probe_cases:
        with open(os.path.join(h.root, name), "wb") as f:
            f.write(data)
        if isinstance(want, list):
            h.names[name] = want
            h.add(name, "mount", "", "recognised by its first bytes: %d bytes" % len(data))
        else:
            h.add(name, "refuse", want, "first bytes %s, %d bytes, not named .safetensors"
                  % (data[:8].hex(), len(data)))


def hf_dir(h, case, index, shards=(), index_text=None):
    """Create hostile/<case>/ with the given index and valid shard files."""
    d = os.path.join(h.root, case)
    os.makedirs(d)
    for fname, tensors in shards:
        write_safetensors(os.path.join(d, fname), tensors, metadata={"format": "pt"})
    with open(os.path.join(d, "model.safetensors.index.json"), "w", encoding="utf-8") as f:
        f.write(index_text if index_text is not None
                else json.dumps(index, indent=2, sort_keys=True) + "\n")
    return d


def gen_hostile_hf(h, rng):
    def t(name):
        return rand_tensor(rng, name, "F32", [2])

    s1, s2 = shard_name(1, 2), shard_name(2, 2)

    # The escaping target is a perfectly valid file, so only the path check
    # can refuse it.
    os.makedirs(os.path.join(h.root, "hf-escape"))
    write_safetensors(os.path.join(h.root, "hf-escape", "outside.safetensors"),
                      [t("secret")], metadata={"format": "pt"})
    hf_dir(h, "hf-escape/inner",
           {"metadata": {"total_size": 16},
            "weight_map": {"a": s1, "secret": "../outside.safetensors"}},
           [(s1, [t("a")])])
    h.add("hf-escape/inner", "refuse", "weight_map",
          "index maps a tensor to ../outside.safetensors (exists, valid)")

    hf_dir(h, "hf-absolute",
           {"metadata": {"total_size": 16},
            "weight_map": {"a": s1, "b": "/etc/passwd"}},
           [(s1, [t("a")])])
    h.add("hf-absolute", "refuse", "weight_map", "index maps a tensor to /etc/passwd")

    hf_dir(h, "hf-missing-shard",
           {"metadata": {"total_size": 16}, "weight_map": {"a": s1, "b": s2}},
           [(s1, [t("a")])])
    h.add("hf-missing-shard", "refuse", "shard", "index names a shard that does not exist")

    d = hf_dir(h, "hf-shard-is-dir",
               {"metadata": {"total_size": 16}, "weight_map": {"a": s1, "b": s2}},
               [(s1, [t("a")])])
    os.makedirs(os.path.join(d, s2))
    h.add("hf-shard-is-dir", "refuse", "shard", "a shard named in the index is a directory")

    hf_dir(h, "hf-weight-map-array",
           {"metadata": {"total_size": 8}, "weight_map": [["a", s1]]},
           [(s1, [t("a")])])
    h.add("hf-weight-map-array", "refuse", "weight_map", "weight_map is an array")

    hf_dir(h, "hf-weight-map-nonstring",
           {"metadata": {"total_size": 8}, "weight_map": {"a": 1}},
           [(s1, [t("a")])])
    h.add("hf-weight-map-nonstring", "refuse", "weight_map",
          "weight_map value is a number, not a file name")

    hf_dir(h, "hf-no-weight-map", {"metadata": {"total_size": 8}}, [(s1, [t("a")])])
    h.add("hf-no-weight-map", "refuse", "weight_map", "index without weight_map")

    hf_dir(h, "hf-index-not-json", None, [(s1, [t("a")])],
           index_text='{"metadata": {"total_size": 8}, "weight_map": {"a": "%s"' % s1)
    h.add("hf-index-not-json", "refuse", "JSON", "index file is truncated JSON")

    d = hf_dir(h, "hf-bad-shard",
               {"metadata": {"total_size": 16}, "weight_map": {"a": s1, "b": s2}},
               [(s1, [t("a")])])
    raw_safetensors(os.path.join(d, s2), hdr({"b": f32_entry(0, 8, [2])}), b"\1" * 8,
                    declared_len=1 << 20)
    h.add("hf-bad-shard", "refuse", "header length",
          "second shard's header length runs past its end")

    # Both shards are referenced (via a and b), so a loader reads both and
    # meets 'a' twice.
    hf_dir(h, "hf-dup-across-shards",
           {"metadata": {"total_size": 24}, "weight_map": {"a": s1, "b": s2}},
           [(s1, [t("a")]), (s2, [t("a"), t("b")])])
    h.add("hf-dup-across-shards", "refuse", "duplicate",
          "tensor 'a' stored in both shards")


# ---------------------------------------------------------------------------

CASES = ["dtypes", "odd", "sharded", "both", "hostile"]


def main(argv):
    return generate(argv, CASES, gen_dtypes, gen_odd, gen_sharded, gen_both, gen_hostile)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
