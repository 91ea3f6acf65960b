#!/usr/bin/python3
"""Write gpt-rs GPTRSCHK / GPTRSTEN test fixtures for ckptfs.

usage: gptrs_fixtures.py OUTDIR

Independent of core/: its own writer (struct) from the format notes
(shared/formats/gptrs-burnpack-lwt-tp.md section 1), its own BLAKE3 (Python's
hashlib has none; hashlib.blake2b is a different function) checked at start-up
against the notes' base-id table and official BLAKE3 vectors, and its own
restatement of the ckptfs tree rules.  Deterministic: same bytes every run.

Layout of OUTDIR (each good case directory holds model.bin + manifest.json):
  chk-dtypes/        every dtype tag, real base ids, nested config
  chk-odd/           0-d and empty tensors, dotted/prefix/odd names, mixed ids
  chk-python/        what the Python exporter writes: ids 0, reserved 0/1
  chk-layout/        payloads out of index order, with gaps, aligned, trailing bytes
  chk-legacy-config/ untagged (pre-"kind") GPT config
  chk-v1/ ten-v1/    the original inline layout (version 1)
  ten-v2/            GPTRSTEN archive with UTF-8 names, every dtype tag
  chk-doc-example/ ten-doc-example/   the worked examples of the notes, byte for byte
  hostile/           damaged files, listed in cases.tsv (+ mount-names.json)
"""

import hashlib
import json
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
from fixture_lib import (FileHostile, Out, field_at, generate, numel, patched,  # noqa: E402
                         tree_paths, u32, u64, write_json)

# ---------------------------------------------------------------------------
# BLAKE3, default hash mode, written from the specification.  Only short names
# are hashed here, so it favours brevity over speed.

B3_IV = [0x6A09E667, 0xBB67AE85, 0x3C6EF372, 0xA54FF53A,
         0x510E527F, 0x9B05688C, 0x1F83D9AB, 0x5BE0CD19]
B3_PERM = [2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8]
CHUNK_START, CHUNK_END, PARENT, ROOT = 1, 2, 4, 8
M32 = 0xFFFFFFFF


def _rotr(x, n):
    return ((x >> n) | (x << (32 - n))) & M32


def _g(s, a, b, c, d, x, y):
    s[a] = (s[a] + s[b] + x) & M32
    s[d] = _rotr(s[d] ^ s[a], 16)
    s[c] = (s[c] + s[d]) & M32
    s[b] = _rotr(s[b] ^ s[c], 12)
    s[a] = (s[a] + s[b] + y) & M32
    s[d] = _rotr(s[d] ^ s[a], 8)
    s[c] = (s[c] + s[d]) & M32
    s[b] = _rotr(s[b] ^ s[c], 7)


def _compress(cv, block, block_len, counter, flags):
    m = list(struct.unpack("<16I", block))
    s = list(cv) + B3_IV[:4] + [counter & M32, counter >> 32, block_len, flags]
    for _ in range(7):
        for i in range(4):                      # columns
            _g(s, i, i + 4, i + 8, i + 12, m[2 * i], m[2 * i + 1])
        _g(s, 0, 5, 10, 15, m[8], m[9])         # diagonals
        _g(s, 1, 6, 11, 12, m[10], m[11])
        _g(s, 2, 7, 8, 13, m[12], m[13])
        _g(s, 3, 4, 9, 14, m[14], m[15])
        m = [m[i] for i in B3_PERM]
    return [s[i] ^ s[i + 8] for i in range(8)] + [s[i + 8] ^ cv[i] for i in range(8)]


def _node(data, first_chunk):
    """(cv, block, block_len, counter, flags) of the subtree's root, not yet compressed."""
    nchunks = max(1, -(-len(data) // 1024))
    if nchunks == 1:
        nblocks = max(1, -(-len(data) // 64))
        cv = B3_IV
        for i in range(nblocks - 1):
            cv = _compress(cv, data[64 * i:64 * i + 64], 64, first_chunk,
                           CHUNK_START if i == 0 else 0)[:8]
        last = data[64 * (nblocks - 1):]
        flags = (CHUNK_START if nblocks == 1 else 0) | CHUNK_END
        return cv, last.ljust(64, b"\0"), len(last), first_chunk, flags
    left = 1 << ((nchunks - 1).bit_length() - 1)   # largest power of two below nchunks
    lcv = _compress(*_node(data[:1024 * left], first_chunk))[:8]
    rcv = _compress(*_node(data[1024 * left:], first_chunk + left))[:8]
    return B3_IV, struct.pack("<16I", *(lcv + rcv)), 64, 0, PARENT


def blake3(data, n=32):
    cv, block, block_len, _, flags = _node(bytes(data), 0)
    out = b""
    for counter in range(-(-n // 64)):
        out += struct.pack("<16I", *_compress(cv, block, block_len, counter, flags | ROOT))
    return out[:n]


def base_id(name):
    return blake3(name.encode("utf-8"))[:16]


def blake3_self_test():
    # Base ids from the format notes (section 1.3) and the first 32 bytes of
    # two official vectors (input byte i = i % 251) that cross chunk and tree
    # boundaries.
    for name, want in [("", "af1349b9f5f9a1a6a0404dea36dcc949"),
                       ("lm_head", "585d23eebd91ff137aef590d2ec762a9"),
                       ("blocks.0.ln_1.gamma", "3b001706aa5220c453c6702ba50ad7cd")]:
        assert base_id(name).hex() == want, name
    pattern = bytes(i % 251 for i in range(3073))
    assert blake3(pattern[:1025]).hex() == \
        "d00278ae47eb27b34faecf67b4fe263f82d5412916c1ffd97c8cb7fb814b8444"
    assert blake3(pattern[:3073]).hex() == \
        "7124b49501012f81cc7f11ca069ec9226cecb8a2c850cfe644e327d22d3e1cd3"


# ---------------------------------------------------------------------------
# Tensors

TAGS = {"F32": 0, "F16": 1, "BF16": 2, "I32": 3}
ELEM = {"F32": 4, "F16": 2, "BF16": 2, "I32": 4}
NUMPY_DTYPE = {"F32": "<f4", "F16": "<f2", "BF16": None, "I32": "<i4"}


class T:
    """One tensor: name, dtype, shape, raw bytes, and the entry fields around them."""

    def __init__(self, name, dtype, shape, data, reserved=0, stored_id="real"):
        self.name, self.dtype, self.shape, self.data = name, dtype, list(shape), data
        self.reserved = reserved
        self.stored_id = stored_id       # "real", "zero" or 16 literal bytes

    def id_bytes(self):
        if self.stored_id == "real":
            return base_id(self.name)
        if self.stored_id == "zero":
            return bytes(16)
        return self.stored_id


def payload(rng, dtype, shape):
    n = numel(shape)
    if dtype == "F32":
        return rng.standard_normal(n).astype("<f4").tobytes()
    if dtype == "F16":
        return rng.standard_normal(n).astype("<f2").tobytes()
    if dtype == "BF16":   # the high halves of float32s
        return (rng.standard_normal(n).astype("<f4").view("<u4") >> 16).astype("<u2").tobytes()
    return rng.integers(-2 ** 31, 2 ** 31, n, dtype=np.int64).astype("<i4").tobytes()


def rand_t(rng, name, dtype, shape, **kw):
    return T(name, dtype, shape, payload(rng, dtype, shape), **kw)


# ---------------------------------------------------------------------------
# Writer.  Returns the file bytes, each tensor's payload offset, and the
# fields as (label, offset, size) so hostile cases can patch or cut at them.

def compact(obj, ensure_ascii=False):
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=ensure_ascii).encode("utf-8")


def head_fields(version, checkpoint, config):
    """The start of every gpt-rs file: magic, version, and a checkpoint's config."""
    out = Out()
    out.put("magic", b"GPTRSCHK" if checkpoint else b"GPTRSTEN")
    out.u32("version", version)
    if checkpoint:
        out.u32("config_len", len(config))
        out.put("config_json", config)
    return out


def entry_fields(out, i, t, checkpoint, offset):
    name = t.name.encode("utf-8")
    out.u32("tensor %d name_len" % i, len(name))
    out.put("tensor %d name" % i, name)
    if checkpoint:
        out.put("tensor %d stored_base_id" % i, t.id_bytes())
    out.u32("tensor %d rank" % i, len(t.shape))
    out.put("tensor %d dims" % i, b"".join(struct.pack("<Q", d) for d in t.shape))
    out.u32("tensor %d dtype_tag" % i, TAGS[t.dtype])
    out.put("tensor %d reserved" % i, bytes([t.reserved]))
    out.u64("tensor %d offset" % i, offset)
    out.u64("tensor %d byte_len" % i, len(t.data))


def write_v2(tensors, checkpoint=True, config=b"", sort=True, data_order=None, align=1,
             gap=0, trail=b""):
    """gpt-rs writers sort by name and pack payloads back to back; the other
    options produce layouts the reader must also accept."""
    tensors = sorted(tensors, key=lambda t: t.name.encode("utf-8")) if sort else list(tensors)
    data_order = data_order or list(range(len(tensors)))
    index_len = 4 + sum((45 if checkpoint else 29) + len(t.name.encode("utf-8"))
                        + 8 * len(t.shape) for t in tensors)
    head = 8 + 4 + (4 + len(config) if checkpoint else 0) + 4
    data_start = head + index_len
    offsets, pos = {}, data_start
    for k in data_order:
        pos += -pos % align
        offsets[k] = pos
        pos += len(tensors[k].data) + gap
    out = head_fields(2, checkpoint, config)
    out.u32("index_len", index_len)
    out.u32("tensor_count", len(tensors))
    for i, t in enumerate(tensors):
        entry_fields(out, i, t, checkpoint, offsets[i])
    assert len(out.buf) == data_start
    for k in sorted(data_order, key=lambda k: offsets[k]):
        out.put("padding", bytes(offsets[k] - len(out.buf)))
        out.put("payload %d" % k, tensors[k].data)
    out.put("trailing bytes", bytes(pos - len(out.buf)) + trail)
    return bytes(out.buf), {t.name: offsets[i] for i, t in enumerate(tensors)}, out.fields


def write_v1(tensors, checkpoint=True, config=b""):
    out = head_fields(1, checkpoint, config)
    out.u32("tensor_count", len(tensors))
    offsets = {}
    for i, t in enumerate(tensors):
        name = t.name.encode("utf-8")
        out.u32("tensor %d name_len" % i, len(name))
        out.put("tensor %d name" % i, name)
        out.u32("tensor %d rank" % i, len(t.shape))
        out.put("tensor %d dims" % i, b"".join(struct.pack("<Q", d) for d in t.shape))
        out.u32("tensor %d dtype_tag" % i, TAGS[t.dtype])
        out.put("tensor %d requires_grad" % i, bytes([t.reserved]))
        out.u64("tensor %d byte_len" % i, len(t.data))
        offsets[t.name] = len(out.buf)
        out.put("payload %d" % i, t.data)
    return bytes(out.buf), offsets, out.fields


# ---------------------------------------------------------------------------
# Good cases

GPT_CONFIG = {"vocab_size": 50257, "context_length": 1024, "embed_dim": 768,
              "num_layers": 12, "num_heads": 12, "mlp_ratio": 4, "dropout": 0.0}


def write_case(out, case, data, offsets, tensors, metadata, version=2, checkpoint=True,
               warnings=()):
    d = os.path.join(out, case)
    os.makedirs(d)
    with open(os.path.join(d, "model.bin"), "wb") as f:
        f.write(data)
    paths = tree_paths([t.name for t in tensors])
    recs = []
    for t in tensors:
        extra = {"dtype_tag": TAGS[t.dtype]}
        if version == 2:
            extra["reserved"] = t.reserved
        else:
            extra["requires_grad"] = bool(t.reserved)
        if checkpoint:
            extra["base_id"] = base_id(t.name).hex()
            extra["base_id_stored"] = version == 2 and t.id_bytes() != bytes(16)
        recs.append({"name": t.name, "dtype": t.dtype, "shape": t.shape,
                     "nbytes": len(t.data), "sha256": hashlib.sha256(t.data).hexdigest(),
                     "numpy_dtype": NUMPY_DTYPE[t.dtype], "path": paths[t.name],
                     "file": "model.bin", "offset": offsets[t.name], "extra": extra})
    doc = {"source": "model.bin", "metadata": {"gpt-rs": metadata},
           "warnings": list(warnings), "tensors": recs}
    write_json(os.path.join(d, "manifest.json"), doc, ensure_ascii=False)


def chk_meta(config_obj, tensors, version=2, kind=None, legacy=False):
    m = {"container": "GPTRSCHK", "version": version,
         "kind": kind or config_obj.get("kind", "gpt"), "config": config_obj,
         "tensor_count": len(tensors)}
    if legacy:
        m["legacy_config"] = True
    return m


def gen_bound_good(out):
    """The accepted side of the payload bounds, bytes checked against the manifest: a payload
    that starts exactly where the index ends and one that ends exactly at the end of the file
    (every writer's layout), and a payload one byte inside the index (a warning)."""
    rng = np.random.default_rng(4203)
    ts = [rand_t(rng, "a", "F32", [3]), rand_t(rng, "b", "I32", [2])]
    data, offs, fields = write_v2(ts, checkpoint=False)
    meta = {"container": "GPTRSTEN", "version": 2, "tensor_count": 2}
    write_case(out, "bound-index-end", data, offs, ts, meta, checkpoint=False)
    # Point a's payload one byte into the index: its bytes are the index's last byte (the
    # top byte of b's byte_len, 0) and a's first 11 bytes.
    a_at = offs["a"]
    moved = bytearray(data)
    struct.pack_into("<Q", moved, field_at(fields, "tensor 0 offset")[0], a_at - 1)
    assert moved[a_at - 1] == 0
    offs2 = dict(offs, a=a_at - 1)
    ts2 = [T("a", "F32", [3], bytes(moved[a_at - 1:a_at + 11])), ts[1]]
    write_case(out, "bound-index-overlap-1", bytes(moved), offs2, ts2, meta, checkpoint=False,
               warnings=["overlaps the header and index"])


def gen_good(out):
    rng = np.random.default_rng(4201)

    # Every dtype tag, real ids, a config with nested runtime settings.
    cfg = {"kind": "gpt", "config": GPT_CONFIG,
           "runtime": {"functional_overrides": {"attention": "force=naive",
                                                "matmul": "benchmark(3)"},
                       "weight_streaming": {"enabled": True, "device_budget_bytes": 1 << 33,
                                            "device_weights_percent": 0.5,
                                            "cache_budget_cap_bytes": 123456789012,
                                            "prefetch_layers": 2,
                                            "small_param_persist_threshold": 4096}}}
    ts = [rand_t(rng, "tok_embeddings.weight", "F32", [8, 4]),
          rand_t(rng, "pos_embeddings", "F32", [6, 4]),
          rand_t(rng, "blocks.0.attention.w_qkv", "F16", [4, 12]),
          rand_t(rng, "blocks.0.ln_1.gamma", "BF16", [4]),
          rand_t(rng, "blocks.0.ln_1.beta", "BF16", [2, 2, 1]),
          rand_t(rng, "lm_head", "I32", [4, 8])]
    data, offs, _ = write_v2(ts, config=compact(cfg))
    write_case(out, "chk-dtypes", data, offs, ts, chk_meta(cfg, ts))

    # Shapes and names that stress the tree, ids zero and real, kind ministral.
    cfg = {"kind": "ministral",
           "config": {"vocab_size": 32, "context_length": 16, "embed_dim": 8, "num_layers": 1,
                      "num_heads": 2, "num_kv_heads": 1, "head_dim": None, "mlp_hidden_dim": 24,
                      "rms_norm_eps": 1e-5, "rope_theta": 1000000.0, "rotary_dim": 4,
                      "rope_scaling": {"type": "yarn", "factor": [1, 2.5, {"deep": [None]}]}},
           "runtime": None}
    ts = [rand_t(rng, "scale", "F32", []),
          rand_t(rng, "step", "I32", []),
          rand_t(rng, "empty.rows", "I32", [0, 3]),
          rand_t(rng, "empty.cols", "F16", [3, 0]),
          rand_t(rng, "a.b.c.d.e.f", "F32", [1, 1, 1, 1, 2], stored_id="zero"),
          rand_t(rng, "blocks.0", "F32", [2], reserved=1),
          rand_t(rng, "blocks.0.inner", "BF16", [3], stored_id="zero", reserved=255),
          rand_t(rng, "odd name%with ctrl\x01", "F32", [2]),
          rand_t(rng, "trailing.", "I32", [1]),
          rand_t(rng, "..leading", "I32", [2])]
    data, offs, _ = write_v2(ts, config=compact(cfg))
    write_case(out, "chk-odd", data, offs, ts, chk_meta(cfg, ts))

    # The Python exporter: ensure_ascii config, ids 0, reserved = requires_grad.
    cfg = {"kind": "gpt", "config": dict(GPT_CONFIG, vocab_size=8, context_length=4,
                                         embed_dim=2, num_layers=1, num_heads=1),
           "runtime": {"functional_overrides": {"layer_norm": "force=caf\u00e9"}}}
    ts = [rand_t(rng, "final_ln.gamma", "F32", [2], stored_id="zero", reserved=1),
          rand_t(rng, "final_ln.beta", "F32", [2], stored_id="zero", reserved=0),
          rand_t(rng, "lm_head", "F32", [2, 8], stored_id="zero", reserved=1)]
    data, offs, _ = write_v2(ts, config=compact(cfg, ensure_ascii=True))
    write_case(out, "chk-python", data, offs, ts, chk_meta(cfg, ts))

    # Placement gpt-rs writers never produce but its reader accepts.
    cfg = {"kind": "resnet34", "config": {"num_classes": 10}}
    ts = [rand_t(rng, "conv1.weight", "F32", [3, 3, 2]),
          rand_t(rng, "fc.bias", "F32", [10]),
          rand_t(rng, "fc.weight", "F16", [10, 5]),
          rand_t(rng, "bn.running_mean", "BF16", [7])]
    data, offs, _ = write_v2(ts, config=compact(cfg), data_order=[3, 1, 0, 2], align=64, gap=13,
                             trail=b"not part of any tensor")
    write_case(out, "chk-layout", data, offs, ts, chk_meta(cfg, ts))

    # The untagged config of v1-era files, in a v2 file.
    legacy = dict(GPT_CONFIG, functional_overrides={"gelu": "benchmark"})
    ts = [rand_t(rng, "tok_embeddings.weight", "F32", [3, 2])]
    data, offs, _ = write_v2(ts, config=compact(legacy))
    write_case(out, "chk-legacy-config", data, offs, ts,
               chk_meta(legacy, ts, kind="gpt", legacy=True), warnings=["kind"])

    # Version 1: inline entries, untagged config, requires_grad byte.
    legacy = dict(GPT_CONFIG, vocab_size=5)
    ts = [rand_t(rng, "tok_embeddings.weight", "F32", [5, 2], reserved=1),
          rand_t(rng, "blocks.0.attention.b_qkv", "F32", [6]),
          rand_t(rng, "counts", "I32", []),
          rand_t(rng, "nothing", "F32", [0])]
    data, offs, _ = write_v1(ts, config=compact(legacy))
    write_case(out, "chk-v1", data, offs, ts, chk_meta(legacy, ts, 1, kind="gpt", legacy=True),
               version=1)
    ts = [rand_t(rng, "input", "I32", [3]),
          rand_t(rng, "logits.\u00fcber", "F32", [2, 2], reserved=1)]
    data, offs, _ = write_v1(ts, checkpoint=False)
    write_case(out, "ten-v1", data, offs, ts,
               {"container": "GPTRSTEN", "version": 1, "tensor_count": 2}, version=1,
               checkpoint=False)

    # Archive: no ids, names need only be UTF-8.
    ts = [rand_t(rng, "input", "I32", [2, 3]),
          rand_t(rng, "trace.\u00e9tape.0", "F32", [4]),
          rand_t(rng, "trace.\u6f22\u5b57", "F16", [2, 2]),
          rand_t(rng, "half", "BF16", [5]),
          rand_t(rng, "scalar", "F32", []),
          rand_t(rng, "none", "I32", [2, 0, 2])]
    data, offs, _ = write_v2(ts, checkpoint=False)
    write_case(out, "ten-v2", data, offs, ts,
               {"container": "GPTRSTEN", "version": 2, "tensor_count": len(ts)},
               checkpoint=False)
    gen_doc_examples(out)


def check_dump(data, dump):
    """Compare bytes with hexdump lines "OFFSET: hex hex ...", as printed in the notes."""
    for line in dump.strip().splitlines():
        off, hexes = line.split(":")
        want = bytes.fromhex(hexes)
        off = int(off, 16)
        assert data[off:off + len(want)] == want, "bytes at 0x%x differ from the notes" % off


def gen_doc_examples(out):
    # Section 1.8: config_len 130 (any 130-byte GPT config: the notes elide it),
    # one tensor lm_head F32 [1.0, 2.0] with its real base id; 222 bytes.
    cfg = {"kind": "gpt", "config": dict(GPT_CONFIG, vocab_size=8, context_length=8,
                                         embed_dim=4, num_layers=1, num_heads=1)}
    assert len(compact(cfg)) == 130
    ts = [T("lm_head", "F32", [2], struct.pack("<2f", 1.0, 2.0))]
    data, offs, _ = write_v2(ts, config=compact(cfg))
    assert len(data) == 222
    check_dump(data, """
00000000: 47 50 54 52 53 43 48 4b 02 00 00 00 82 00 00 00
00000010: 7b 22 6b 69 6e 64 22 3a 22 67 70 74 22 2c
00000092: 40 00 00 00
00000096: 01 00 00 00  07 00 00 00  6c 6d 5f 68 65 61 64
000000a5: 58 5d 23 ee bd 91 ff 13 7a ef 59 0d 2e c7 62 a9
000000b5: 01 00 00 00  02 00 00 00 00 00 00 00
000000c1: 00 00 00 00  00
000000c6: d6 00 00 00 00 00 00 00  08 00 00 00 00 00 00 00
000000d6: 00 00 80 3f 00 00 00 40""")
    write_case(out, "chk-doc-example", data, offs, ts, chk_meta(cfg, ts))

    ts = [T("input", "I32", [3], struct.pack("<3i", 7, 8, 9))]
    data, offs, _ = write_v2(ts, checkpoint=False)
    check_dump(data, """
00000000: 47 50 54 52 53 54 45 4e 02 00 00 00 2e 00 00 00
00000010: 01 00 00 00 05 00 00 00 69 6e 70 75 74 01 00 00
00000020: 00 03 00 00 00 00 00 00 00 03 00 00 00 00 3e 00
00000030: 00 00 00 00 00 00 0c 00 00 00 00 00 00 00 07 00
00000040: 00 00 08 00 00 00 09 00 00 00""")
    assert len(data) == 74
    write_case(out, "ten-doc-example", data, offs, ts,
               {"container": "GPTRSTEN", "version": 2, "tensor_count": 1}, checkpoint=False)


# ---------------------------------------------------------------------------
# Hostile cases

U32_MAX, U64_MAX = 2 ** 32 - 1, 2 ** 64 - 1


def region_needle(label):
    """The field word a truncated file's message must name: the length field of
    the region the cut falls in (the region is read as a whole)."""
    if label == "magic":
        return "format|magic"
    if label in ("version", "config_len", "index_len"):
        return label
    if label == "config_json":
        return "config_len"
    if label.startswith("tensor"):
        return "index_len"
    return "past the end"   # a payload: the entry's offset + byte_len pass the end


def gen_truncations(h, prefix, data, fields):
    seen = set()
    for label, off, _ in fields:
        if off >= len(data) or off in seen:
            continue
        seen.add(off)
        if label == "trailing bytes":
            continue
        # The field that starts at the cut is the first one missing.
        h.add("%s-cut-%04d" % (prefix, off), data[:off], region_needle(label),
              "file cut at offset %d, where %s starts" % (off, label))


def gen_index_cuts(h, prefix, tensors, checkpoint, config=b""):
    """index_len shortened so the index ends where each entry field starts:
    the cursor must stop at that field and name it."""
    min_entry = 45 if checkpoint else 29
    data, _, fields = write_v2(tensors, checkpoint=checkpoint, config=config)
    start = field_at(fields, "tensor_count")[0]
    for label, off, _ in fields:
        if not label.startswith("tensor ") or label == "tensor_count":
            continue
        index_len = off - start
        # The count is checked against the room for its smallest entries
        # before any entry is read.
        word = label.split(" ", 2)[2]
        if index_len - 4 < len(tensors) * min_entry:
            word = "tensor_count"
        h.add("%s-index-%04d" % (prefix, index_len),
              patched(data, fields, "index_len", struct.pack("<I", index_len)),
              word, "index_len %d ends the index where %s starts" % (index_len, label))


def gen_v1_cuts(h, tensors, config):
    data, _, fields = write_v1(tensors, config=config)
    count_end = field_at(fields, "tensor_count")[0] + 4
    for label, off, _ in fields:
        if off < 12:
            continue
        if label == "config_json":
            word = "config_len"
        elif label.startswith("payload"):
            word = "byte_len"
        elif label.startswith("tensor "):
            word = label.split(" ", 2)[2]
            if off - count_end < len(tensors) * 21:   # smallest v1 entry: 21 bytes
                word = "tensor_count"
        else:
            word = label
        h.add("v1-cut-%04d" % off, data[:off], word,
              "version-1 file cut at offset %d, where %s starts" % (off, label))


def gen_hostile(out):
    h = FileHostile(os.path.join(out, "hostile"))
    rng = np.random.default_rng(4202)
    cfg = compact({"kind": "gpt", "config": GPT_CONFIG})
    two = [rand_t(rng, "a.weight", "F32", [2, 3]), rand_t(rng, "b", "I32", [4])]
    data, offs, fields = write_v2(two, config=cfg)
    gen_truncations(h, "chk", data, fields)
    gen_index_cuts(h, "chk", two, True, cfg)
    tdata, _, tfields = write_v2(two, checkpoint=False)
    gen_truncations(h, "ten", tdata, tfields)
    gen_index_cuts(h, "ten", two, False)
    gen_v1_cuts(h, two, compact(GPT_CONFIG))

    def p(label, new):
        return patched(data, fields, label, new)

    h.add("bad-magic", b"GPTRSCHX" + data[8:], "format", "magic GPTRSCHX")
    for v in (0, 3, U32_MAX):
        h.add("version-%d" % v, p("version", u32(v)), "version", "version %d" % v)
    h.add("config-len-huge", p("config_len", u32(U32_MAX)), "config_len", "config_len 2^32-1")
    h.add("config-len-short", p("config_len", u32(len(cfg) - 1)), "config_json",
          "config_len one byte short: the JSON is cut")
    bad_cfgs = [
        ("config-not-json", b"{\"kind\":gpt}", "config_json", "config is not JSON"),
        ("config-array", b"[1,2,3]", "config_json", "config is an array"),
        ("config-kind-number", compact({"kind": 7, "config": GPT_CONFIG}), "kind",
         "kind is a number"),
        ("config-no-vocab", compact({"kind": "gpt", "config": dict(
            (k, v) for k, v in GPT_CONFIG.items() if k != "vocab_size")}), "vocab_size",
         "GptConfig without vocab_size"),
        ("config-dropout-string", compact({"kind": "gpt", "config": dict(
            GPT_CONFIG, dropout="0.1")}), "dropout", "dropout is a string"),
        ("config-gpt-no-config", compact({"kind": "gpt"}), "config",
         "kind gpt without config"),
        ("config-runtime-number", compact({"kind": "gpt", "config": GPT_CONFIG,
                                           "runtime": 5}), "runtime", "runtime is a number"),
        ("config-legacy-not-gpt", compact({"vocab": 3}), "vocab_size",
         "untagged config that is no GptConfig"),
        ("config-bad-utf8", b"{\"kind\":\"gpt\xff\"}", "config_json|UTF-8",
         "invalid UTF-8 in the config"),
        ("config-duplicate-key", b"{\"kind\":\"gpt\",\"kind\":\"gpt\"}", "config_json|duplicate",
         "duplicate key in the config"),
        ("config-deep", b"[" * 200 + b"]" * 200, "config_json|deep|depth",
         "config nested 200 deep"),
    ]
    for name, text, needle, desc in bad_cfgs:
        d, _, _ = write_v2(two, config=text)
        h.add(name, d, needle, desc)
    h.add("index-len-huge", p("index_len", u32(U32_MAX)), "index_len", "index_len 2^32-1")
    h.add("count-huge", p("tensor_count", u32(U32_MAX)), "tensor_count", "tensor_count 2^32-1")
    h.add("count-plus-one", p("tensor_count", u32(3)), "tensor_count|index",
          "tensor_count one more than the index holds")
    h.add("name-len-huge", p("tensor 0 name_len", u32(U32_MAX)), "name", "name_len 2^32-1")
    h.add("name-bad-utf8", p("tensor 0 name", b"\xff"), "UTF-8", "name byte 0xff")
    h.add("name-not-ascii", write_v2([rand_t(rng, "caf\u00e9", "F32", [1])], config=cfg)[0],
          "ASCII", "checkpoint name with a non-ASCII letter")
    h.add("rank-huge", p("tensor 0 rank", u32(U32_MAX)), "rank", "rank 2^32-1")
    many = [T("deep", "F32", [1] * 33, b"\0" * 4)]
    h.add("rank-33", write_v2(many, config=cfg)[0], "rank", "rank 33 (more than ckptfs's 32)")
    big = [T("big", "F32", [2 ** 32, 2 ** 32], b"")]
    h.add("dims-overflow", write_v2(big, config=cfg)[0], "dims|overflow",
          "dims 2^32 x 2^32 overflow the byte size")
    big = [T("big", "F32", [U64_MAX], b"")]
    h.add("dims-u64-max", write_v2(big, config=cfg)[0], "dims|overflow", "dims [2^64-1]")
    for tag in (4, U32_MAX):
        h.add("dtype-tag-%d" % tag, p("tensor 0 dtype_tag", u32(tag)), "dtype_tag",
              "dtype_tag %d" % tag)
    h.add("byte-len-short", p("tensor 0 byte_len", u64(20)), "byte_len",
          "byte_len 20 for F32 [2,3]")
    h.add("byte-len-odd", p("tensor 0 byte_len", u64(23)), "byte_len",
          "byte_len 23 (misaligned) for F32 [2,3]")
    h.add("byte-len-huge", p("tensor 0 byte_len", u64(U64_MAX)), "byte_len",
          "byte_len 2^64-1")
    h.add("offset-past-eof", p("tensor 1 offset", u64(len(data))), "past the end",
          "offset at the end of the file, 16 bytes needed")
    h.add("offset-huge", p("tensor 0 offset", u64(U64_MAX - 8)), "past the end",
          "offset 2^64-9: offset + byte_len overflows")
    for n in (0, 3):
        h.add("index-len-%d" % n, p("index_len", u32(n)), "tensor_count",
              "index_len %d: no room for tensor_count" % n)
    bad_id = bytes(range(1, 17))
    h.add("base-id-wrong", p("tensor 1 stored_base_id", bad_id), "base_id",
          "stored_base_id that is not BLAKE3 of the name")
    h.add("base-id-of-other", p("tensor 0 stored_base_id", base_id("b")), "base_id",
          "stored_base_id of another tensor's name")
    # One above and one below the right id in its last byte: both directions of the compare.
    for d, what in ((1, "plus"), (-1, "minus")):
        near = bytearray(base_id("b"))
        near[15] = (near[15] + d) & 0xFF
        h.add("bound-base-id-%s-1" % what, p("tensor 1 stored_base_id", bytes(near)),
              "base_id mismatch", "stored_base_id of \"b\" with its last byte %+d" % d)
    h.add("ten-dtype-tag-9", patched(tdata, tfields, "tensor 1 dtype_tag", u32(9)), "dtype_tag",
          "archive dtype_tag 9")
    h.add("ten-name-bad-utf8", patched(tdata, tfields, "tensor 0 name", b"\xc0\xaf"), "UTF-8",
          "archive name with an overlong encoding")
    h.add("ten-version-1-truncated", tdata[:8] + u32(1) + u32(5), "tensor_count",
          "version-1 archive claiming 5 tensors in 0 bytes")
    h.add("tiny", b"GPTRSTEN", "version", "magic only")

    # Accepted, as gpt-rs accepts them (warnings in summary.json).
    dup = [rand_t(rng, "same", "F32", [1]), rand_t(rng, "same", "I32", [2]),
           rand_t(rng, "other", "F32", [1])]
    h.add("dup-names", write_v2(dup, config=cfg, sort=False)[0], "",
          "a name twice: the later entry is used", ["other", "same"])
    h.add("index-trailing", _index_with_trailing(two, cfg), "",
          "bytes after the last index entry", ["a.weight", "b"])
    over = bytearray(data)
    struct.pack_into("<Q", over, field_at(fields, "tensor 1 offset")[0], 0)
    h.add("payload-in-header", bytes(over), "",
          "a payload that overlaps the magic and header", ["a.weight", "b"])
    struct.pack_into("<Q", over, field_at(fields, "tensor 1 offset")[0],
                     offs["a.weight"])
    h.add("payload-overlap", bytes(over), "", "two payloads that overlap", ["a.weight", "b"])
    h.add("v1-empty", b"GPTRSTEN" + u32(1) + u32(0), "", "version-1 archive without tensors", [])
    gen_bound_hostile(h, rng)
    h.finish()


def gen_bound_hostile(h, rng):
    """Each length/offset/count check at exactly its bound, one under and one over (bound-*).
    Where the accepted side cannot be a small mount, it is refused by a later, different check
    whose needle proves the bound itself was passed."""
    one = [rand_t(rng, "w", "F32", [4])]
    data, _, fields = write_v2(one, checkpoint=False)

    def p(label, new, base=data):
        return patched(base, fields, label, new)

    # The payload against the end of the file (v2: offset + byte_len; v1: byte_len).
    h.add("bound-v2-payload-eof-plus-1", data[:-1], "offset&with byte_len 16&past the end",
          "v2 payload ends one byte past the end of the file")
    empty = [T("e", "F32", [0], b"")]
    edata, _, efields = write_v2(empty, checkpoint=False)
    at = field_at(efields, "tensor 0 offset")[0]
    h.add("bound-v2-offset-at-eof", edata[:at] + u64(len(edata)) + edata[at + 8:], "",
          "v2 empty payload at offset = file size", ["e"])
    h.add("bound-v2-offset-eof-plus-1", edata[:at] + u64(len(edata) + 1) + edata[at + 8:],
          "offset %d&past the end" % (len(edata) + 1), "v2 empty payload one byte past the end")
    v1, _, _ = write_v1(one, checkpoint=False)
    h.add("bound-v1-payload-eof-plus-1", v1[:-1], "byte_len 16 at offset&past the end",
          "v1 payload ends one byte past the end of the file")
    # byte_len against dims x element size.
    for d, what in ((1, "over"), (-1, "under")):
        h.add("bound-byte-len-%s" % what, p("tensor 0 byte_len", u64(16 + d)),
              "byte_len %d&does not match dims [4] of F32 (16 bytes)" % (16 + d),
              "byte_len one byte %s 4 x numel" % what)
    # name_len against ckptfs's limit of 65535: at the limit the name is read (and the entry's
    # bad dtype_tag is the complaint), one over is refused by the limit.
    for n, needle in ((65535, "dtype_tag 9"), (65536, "limit of 65535")):
        t = T("n" * n, "F32", [1], b"\0" * 4)
        raw, _, f2 = write_v2([t], checkpoint=False)
        h.add("bound-name-len-%d" % n, patched(raw, f2, "tensor 0 dtype_tag", u32(9)), needle,
              "name_len %d, dtype_tag 9" % n)
    # rank: 32 dims mount, 33 are refused.
    for rank in (32, 33):
        t = T("r", "F32", [1] * rank, b"\0" * 4)
        raw = write_v2([t], checkpoint=False)[0]
        if rank == 32:
            h.add("bound-rank-32", raw, "", "rank 32, every dim 1", ["r"])
        else:
            h.add("bound-rank-33", raw, "33&exceeds the 32 dims", "rank 33, every dim 1")
    # tensor_count against the index bytes after it: the smallest archive entry is 29 bytes (an
    # empty name, rank 0). Exactly 29 bytes hold one; 28 cannot.
    scalar = [T("", "F32", [], b"\1\2\3\4")]
    sdata, _, sfields = write_v2(scalar, checkpoint=False)
    h.add("bound-count-exact-room", sdata, "", "tensor_count 1, a 29-byte index entry", [""])
    ilen = field_at(sfields, "index_len")[0]
    short = bytearray(sdata)
    struct.pack_into("<I", short, ilen, struct.unpack_from("<I", short, ilen)[0] - 1)
    h.add("bound-count-room-minus-1", bytes(short), "needs at least 29 bytes&has 28",
          "tensor_count 1, index_len one byte short of the 29-byte entry")
    # index_len against the end of the file: an empty index ending at the end of the file.
    h.add("bound-index-to-eof", b"GPTRSTEN" + u32(2) + u32(4) + u32(0), "",
          "index_len 4 (tensor_count 0) ending at the end of the file", [])
    h.add("bound-index-eof-plus-1", b"GPTRSTEN" + u32(2) + u32(5) + u32(0),
          "index_len 5&past the end", "index_len one byte more than the file holds")
    # config_len against the end of the file.
    cfg = compact({"kind": "gpt", "config": GPT_CONFIG})
    head = b"GPTRSCHK" + u32(2)
    h.add("bound-config-to-eof", head + u32(len(cfg)) + cfg, "index_len",
          "config ending at the end of the file: the index_len after it is missing")
    h.add("bound-config-eof-plus-1", head + u32(len(cfg) + 1) + cfg,
          "config_len %d&past the end" % (len(cfg) + 1), "config_len one byte past the end")


def _index_with_trailing(tensors, cfg):
    data, _, fields = write_v2(tensors, config=cfg)
    start, _ = field_at(fields, "tensor_count")
    data_start = field_at(fields, "payload 0")[0]
    # Insert 7 junk bytes at the end of the index and move every payload by 7.
    b = bytearray(data[:data_start] + b"junkjun" + data[data_start:])
    index_len = data_start - start + 7
    struct.pack_into("<I", b, field_at(fields, "index_len")[0], index_len)
    for i in range(len(tensors)):
        off = field_at(fields, "tensor %d offset" % i)[0]
        struct.pack_into("<Q", b, off, struct.unpack_from("<Q", b, off)[0] + 7)
    return bytes(b)


# ---------------------------------------------------------------------------

CASES = ["chk-dtypes", "chk-odd", "chk-python", "chk-layout", "chk-legacy-config", "chk-v1",
         "ten-v1", "ten-v2", "chk-doc-example", "ten-doc-example", "hostile", "bound-index-end",
         "bound-index-overlap-1"]


def main(argv):
    return generate(argv, CASES, gen_good, gen_bound_good, gen_hostile,
                    self_test=blake3_self_test)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
