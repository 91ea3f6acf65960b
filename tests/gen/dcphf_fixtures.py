#!/usr/bin/python3
"""Write PyTorch DCP "HuggingFace storage" test fixtures for ckptfs.

usage: dcphf_fixtures.py OUTDIR

A DCP-HF checkpoint is a directory of ordinary safetensors files named
shard-0000R-model-0000i-of-0000N.safetensors (R = rank + 1) whose
__metadata__ carries DCP_SHARDING_INFO: a JSON string mapping every tensor of
the file to {"saved_offsets": [...]}, the global origin of the chunk the file
holds.  The full shape is, per dim, the max over chunks of offset + size.

This generator has its own safetensors writer and its own idea of how chunks
assemble (numpy slicing of the full array), independent of core/.  It is
deterministic: the same OUTDIR contents come out on every run.

Layout of OUTDIR (every good case has a manifest.json):
  dim1x4/        4 ranks, 2-D tensors split on dim 1 (one uneven), replicated
                 1-D and 0-dim tensors, a 3-D tensor split on dim 2, one split on
                 dim 0 with an empty last chunk
  grid/          6 ranks: 2x2 grids, an uneven 3x2 grid, a 3-D grid, and a
                 tensor sharded on one mesh dim and replicated on the other
  mixed/         2 DCP ranks + plain safetensors files without DCP_SHARDING_INFO
                 (one of them holds the origin chunk of a DCP-split tensor)
  hole/          rank 3 of 4 is missing: tensors with an uncovered region
  nemo/          NeMo-Automodel-like step dir; the mount source is .../model
  sharded_sub/   only sharded/shard-*.safetensors below the mounted directory
  sharded_with_consolidated/  sharded/ + top-level model.safetensors (wins)
  sharded_with_index/         sharded/ + top-level HF shards + index (wins)
  big_dim1/      [256, 4096] F32 split on dim 1 over 4 ranks (4 MiB)
  hostile/       one directory per refused input, listed in cases.tsv as
                 path<TAB>needle<TAB>description; the needle is a list of
                 words joined by '&' (all required, case-insensitive), each
                 of which may be alternatives joined by '|'.

manifest.json:
  {"source": dir to mount (relative to the case dir),
   "format": summary format expected ("dcp-hf", or "hf" for "an HF directory
             won, not dcp-hf"),
   "incomplete_tensors": count,
   "tensors": [{"name", "dtype", "shape" (full), "nbytes", "sha256" (of the
                full row-major bytes; null when incomplete), "path" (in the
                mount), "incomplete", "numpy_dtype",
                "chunks": [{"file" (relative to source), "data_offset" (byte
                offset in that file), "offsets", "sizes"}]}]}
"""

import hashlib
import json
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
from fixture_lib import fresh_out, write_cases  # noqa: E402

ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2,
            "I8": 1, "U8": 1, "BOOL": 1}
NUMPY_DTYPE = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4",
               "I16": "<i2", "I8": "|i1", "U8": "|u1", "BOOL": "|b1", "BF16": None}
# Layout order of the safetensors library writer: widest dtype first, then name.
WRITER_ORDER = ["I64", "F64", "F32", "I32", "BF16", "F16", "I16", "I8", "U8", "BOOL"]

SEED = 20240607
MANY_TENSORS = 100000


# ---------------------------------------------------------------------------
# Payloads

def full_array(rng, dtype, shape):
    """Reproducible values for a full tensor, as a numpy array with the stored
    element layout (BF16 as the top halves of float32, stored as uint16)."""
    shape = tuple(shape)
    if dtype == "BF16":
        f = rng.standard_normal(shape).astype("<f4")
        return (f.view("<u4") >> 16).astype("<u2")
    if dtype in ("F32", "F16", "F64"):
        return rng.standard_normal(shape).astype(NUMPY_DTYPE[dtype])
    if dtype == "BOOL":
        return rng.integers(0, 2, shape).astype("|b1")
    info = np.iinfo(np.dtype(NUMPY_DTYPE[dtype]))
    return rng.integers(info.min, info.max, shape, dtype=np.dtype(NUMPY_DTYPE[dtype]),
                        endpoint=True)


def chunk_ranges(n, parts):
    """torch's Shard placement: ceil-sized chunks; trailing ranks may get an
    empty chunk whose origin is n."""
    size = -(-n // parts) if parts else n
    out = []
    for r in range(parts):
        start = size * r
        if start >= n:
            out.append((n, 0))
        else:
            out.append((start, min(n, start + size) - start))
    return out


def tree_path(name):
    # Fixture names are plain identifiers joined by '.', no prefix clashes.
    return name.replace(".", "/")


# ---------------------------------------------------------------------------
# safetensors writer

def write_safetensors(path, entries, metadata, style):
    """entries: list of (name, dtype, shape, bytes).  Returns {name: absolute
    byte offset of its data}.

    style "automodel": compact JSON, tensors in given order, __metadata__ last,
                       padded with spaces to a multiple of 8 (NeMo Automodel).
    style "library":   compact JSON, __metadata__ first, tensors ordered by
                       dtype width then name, padded (safetensors library).
    style "consolidated": json.dumps defaults, no __metadata__, no padding
                       (torch / Automodel consolidation output).
    metadata: dict (values normally strings) or None.
    """
    if style == "library":
        entries = sorted(entries, key=lambda e: (WRITER_ORDER.index(e[1]), e[0]))
    header, at = {}, 0
    if metadata is not None and style == "library":
        header["__metadata__"] = metadata
    for name, dtype, shape, data in entries:
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [at, at + len(data)]}
        at += len(data)
    if metadata is not None and style != "library":
        header["__metadata__"] = metadata
    if style == "consolidated":
        text = json.dumps(header).encode("utf-8")
    else:
        text = json.dumps(header, separators=(",", ":")).encode("utf-8")
        text += b" " * (-len(text) % 8)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    offsets = {}
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        base = 8 + len(text)
        for name, dtype, shape, data in entries:
            offsets[name] = base + header[name]["data_offsets"][0]
            f.write(data)
    return offsets


def shard_name(rank, idx=1, num=1):
    return "shard-%05d-model-%05d-of-%05d.safetensors" % (rank + 1, idx, num)


def dcp_metadata(info):
    return {"DCP_SHARDING_INFO": json.dumps(info), "DCP_VERSION": "1.0", "format": "pt"}


# ---------------------------------------------------------------------------
# Building a DCP-HF directory from full tensors and a chunk plan

class Tensor:
    def __init__(self, name, dtype, shape, rng):
        self.name, self.dtype, self.shape = name, dtype, list(shape)
        self.array = full_array(rng, dtype, shape)
        self.chunks = []   # manifest chunks (file, data_offset, offsets, sizes)

    def chunk_bytes(self, offsets, sizes):
        sl = tuple(slice(o, o + s) for o, s in zip(offsets, sizes))
        return np.ascontiguousarray(self.array[sl]).tobytes()


def plan_split(t, nranks, dims_parts, replicate=1):
    """Chunks of t over a mesh: dims_parts = [(dim, parts), ...] splits those
    dims in row-major mesh order; the mesh is repeated `replicate` times
    (inner), so rank = cell * replicate + copy.  Returns [(rank, offsets,
    sizes)]."""
    cells = [([0] * len(t.shape), list(t.shape))]
    for dim, parts in dims_parts:
        nxt = []
        for offs, sizes in cells:
            for start, size in chunk_ranges(t.shape[dim], parts):
                o, s = list(offs), list(sizes)
                o[dim], s[dim] = start, size
                nxt.append((o, s))
        cells = nxt
    out = []
    for c, (o, s) in enumerate(cells):
        for k in range(replicate):
            rank = c * replicate + k
            assert rank < nranks, (t.name, rank, nranks)
            out.append((rank, o, s))
    return out


def replicated(t, nranks):
    return [(r, [0] * len(t.shape), list(t.shape)) for r in range(nranks)]


def write_ranks(srcdir, plans, nranks, style="automodel", skip_ranks=(), subdir=""):
    """plans: [(Tensor, [(rank, offsets, sizes)])].  Writes one shard file per
    rank (in subdir of srcdir) and records chunks on the tensors."""
    per_rank = {r: [] for r in range(nranks)}
    for t, chunks in plans:
        for rank, offs, sizes in chunks:
            per_rank[rank].append((t, offs, sizes))
    for rank in range(nranks):
        if rank in skip_ranks or not per_rank[rank]:
            continue
        rel = os.path.join(subdir, shard_name(rank)) if subdir else shard_name(rank)
        entries, info = [], {}
        for t, offs, sizes in per_rank[rank]:
            entries.append((t.name, t.dtype, sizes, t.chunk_bytes(offs, sizes)))
            info[t.name] = {"saved_offsets": offs}
        where = write_safetensors(os.path.join(srcdir, rel), entries, dcp_metadata(info), style)
        for t, offs, sizes in per_rank[rank]:
            t.chunks.append({"file": rel, "data_offset": where[t.name],
                             "offsets": offs, "sizes": sizes})


def covered_mask(t):
    mask = np.zeros(t.shape, dtype=bool)
    for c in t.chunks:
        mask[tuple(slice(o, o + s) for o, s in zip(c["offsets"], c["sizes"]))] = True
    return mask


def manifest_entry(t):
    full = [max(c["offsets"][d] + c["sizes"][d] for c in t.chunks)
            for d in range(len(t.shape))]
    # The format has no global shape: a chunk missing at the end of a dim
    # shrinks the tensor rather than leaving a hole.  Fixtures never do that.
    assert full == t.shape, (t.name, full, t.shape)
    incomplete = not bool(covered_mask(t).all())
    data = t.array.tobytes()
    return {"name": t.name, "dtype": t.dtype, "shape": t.shape, "nbytes": len(data),
            "sha256": None if incomplete else hashlib.sha256(data).hexdigest(),
            "path": tree_path(t.name), "incomplete": incomplete,
            "numpy_dtype": NUMPY_DTYPE[t.dtype], "chunks": t.chunks}


def write_manifest(case_dir, source, fmt, tensors):
    ents = [manifest_entry(t) for t in sorted(tensors, key=lambda t: t.name)]
    with open(os.path.join(case_dir, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump({"source": source, "format": fmt,
                   "incomplete_tensors": sum(e["incomplete"] for e in ents),
                   "tensors": ents}, f, indent=1, sort_keys=True)
        f.write("\n")


# ---------------------------------------------------------------------------
# Good cases

def case_dim1x4(out, rng):
    d = os.path.join(out, "dim1x4")
    T = lambda *a: Tensor(*a, rng=rng)  # noqa: E731
    emb = T("model.embed.weight", "F32", [6, 11])          # widths 3,3,3,2
    q = T("model.layers.0.attn.q.weight", "BF16", [8, 16])
    up = T("model.layers.0.mlp.up.weight", "F16", [5, 12])
    idx = T("model.layers.0.router.index", "I64", [3, 8])
    norm = T("model.norm.weight", "F32", [11])
    bias = T("model.norm.bias", "BF16", [7])
    step = T("model.step", "I64", [])
    conv = T("model.layers.0.conv.weight", "F32", [3, 4, 10])  # dim 2: 3,3,3,1
    rows = T("model.layers.0.rows.weight", "F16", [10, 6])     # dim 0: 3,3,3,1
    small = T("model.layers.0.small.weight", "F32", [5, 3])    # dim 0: 2,2,1,0
    plans = [(emb, plan_split(emb, 4, [(1, 4)])), (q, plan_split(q, 4, [(1, 4)])),
             (up, plan_split(up, 4, [(1, 4)])), (idx, plan_split(idx, 4, [(1, 4)])),
             (norm, replicated(norm, 4)), (bias, replicated(bias, 4)),
             (step, replicated(step, 4)), (conv, plan_split(conv, 4, [(2, 4)])),
             (rows, plan_split(rows, 4, [(0, 4)])), (small, plan_split(small, 4, [(0, 4)]))]
    write_ranks(d, plans, 4)
    write_manifest(d, ".", "dcp-hf", [p[0] for p in plans])


def case_grid(out, rng):
    d = os.path.join(out, "grid")
    T = lambda *a: Tensor(*a, rng=rng)  # noqa: E731
    g22 = T("grid.square", "F32", [8, 12])
    g32 = T("grid.uneven", "BF16", [7, 9])        # rows 3,3,1 x cols 5,4
    cube = T("grid.cube", "I32", [4, 6, 10])      # dims 0 and 2, 2x2
    half = T("grid.half_rep", "F16", [6, 5])      # dim 0 in 2, each on 2 ranks
    bias = T("grid.bias", "F32", [12])
    plans = [(g22, plan_split(g22, 6, [(0, 2), (1, 2)])),
             (g32, plan_split(g32, 6, [(0, 3), (1, 2)])),
             (cube, plan_split(cube, 6, [(0, 2), (2, 2)])),
             (half, plan_split(half, 6, [(0, 2)], replicate=2)),
             (bias, replicated(bias, 6))]
    write_ranks(d, plans, 6, style="library")
    write_manifest(d, ".", "dcp-hf", [p[0] for p in plans])


def case_mixed(out, rng):
    d = os.path.join(out, "mixed")
    T = lambda *a: Tensor(*a, rng=rng)  # noqa: E731
    w = T("enc.proj.weight", "F32", [4, 10])
    b = T("enc.proj.bias", "F32", [10])
    split = T("enc.out.weight", "F16", [8, 3])   # rows 0-3 in a plain file, 4-7 on rank 1
    extra1 = T("buffers.position_ids", "I64", [1, 16])
    extra2 = T("buffers.scale", "BF16", [5])
    extra3 = T("head.weight", "F32", [3, 4])
    write_ranks(d, [(w, plan_split(w, 2, [(1, 2)])), (b, replicated(b, 2)),
                    (split, [(1, [4, 0], [4, 3])])], 2)
    # A plain file: no DCP_SHARDING_INFO, so every tensor has origin 0.
    rel = "extra_buffers.safetensors"
    ents = [(extra1.name, extra1.dtype, extra1.shape, extra1.array.tobytes()),
            (extra2.name, extra2.dtype, extra2.shape, extra2.array.tobytes()),
            (split.name, split.dtype, [4, 3], split.chunk_bytes([0, 0], [4, 3]))]
    where = write_safetensors(os.path.join(d, rel), ents, {"format": "pt"}, "library")
    extra1.chunks.append({"file": rel, "data_offset": where[extra1.name],
                          "offsets": [0, 0], "sizes": [1, 16]})
    extra2.chunks.append({"file": rel, "data_offset": where[extra2.name],
                          "offsets": [0], "sizes": [5]})
    split.chunks.append({"file": rel, "data_offset": where[split.name],
                         "offsets": [0, 0], "sizes": [4, 3]})
    # And one without any __metadata__.
    rel = "head.safetensors"
    where = write_safetensors(os.path.join(d, rel), [(extra3.name, "F32", [3, 4],
                                                      extra3.array.tobytes())], None,
                              "consolidated")
    extra3.chunks.append({"file": rel, "data_offset": where[extra3.name],
                          "offsets": [0, 0], "sizes": [3, 4]})
    write_manifest(d, ".", "dcp-hf", [w, b, split, extra1, extra2, extra3])


def case_hole(out, rng):
    """Rank 2 of 4 is missing, so its chunks leave holes.  (A missing LAST
    chunk cannot leave a hole: the format has no global shape, the tensor
    would just be smaller.)"""
    d = os.path.join(out, "hole")
    T = lambda *a: Tensor(*a, rng=rng)  # noqa: E731
    small = T("hole.small", "F32", [4, 8])          # cols 4-5 missing
    big = T("hole.big", "F32", [256, 1024])         # rows 128-191: bytes [512K, 768K)
    ok = T("hole.ok", "F32", [16])                  # replicated: complete
    ok2 = T("hole.ok2", "F16", [2, 6])              # split on ranks 0,1 only
    plans = [(small, plan_split(small, 4, [(1, 4)])), (big, plan_split(big, 4, [(0, 4)])),
             (ok, replicated(ok, 4)), (ok2, plan_split(ok2, 2, [(1, 2)]))]
    write_ranks(d, plans, 4, skip_ranks=(2,))
    write_manifest(d, ".", "dcp-hf", [p[0] for p in plans])


def case_nemo(out, rng):
    d = os.path.join(out, "nemo")
    T = lambda *a: Tensor(*a, rng=rng)  # noqa: E731
    ts = [T("model.embed_tokens.weight", "BF16", [32, 8]),
          T("model.layers.0.self_attn.q_proj.weight", "BF16", [8, 8]),
          T("model.layers.0.mlp.down_proj.weight", "BF16", [8, 12]),
          T("model.norm.weight", "BF16", [8]),
          T("lm_head.weight", "BF16", [32, 8])]
    # FSDP2 shards dim 0.
    plans = [(t, plan_split(t, 2, [(0, 2)])) for t in ts]
    src = os.path.join(d, "epoch_0_step_10", "model")
    write_ranks(src, plans, 2)
    write_manifest(d, "epoch_0_step_10/model", "dcp-hf", ts)


def sharded_tensors(rng):
    T = lambda *a: Tensor(*a, rng=rng)  # noqa: E731
    a = T("backbone.proj.weight", "F32", [6, 9])
    b = T("backbone.proj.bias", "F32", [9])
    c = T("backbone.emb.weight", "BF16", [10, 4])
    return [(a, plan_split(a, 2, [(1, 2)])), (b, replicated(b, 2)),
            (c, plan_split(c, 2, [(0, 2)]))]


def case_sharded_sub(out, rng):
    d = os.path.join(out, "sharded_sub")
    plans = sharded_tensors(rng)
    write_ranks(d, plans, 2, style="library", subdir="sharded")
    write_manifest(d, ".", "dcp-hf", [p[0] for p in plans])


def consolidated_entries(tensors):
    return [(t.name, t.dtype, t.shape, t.array.tobytes()) for t in tensors]


def case_sharded_with_consolidated(out, rng):
    d = os.path.join(out, "sharded_with_consolidated")
    plans = sharded_tensors(rng)
    write_ranks(d, plans, 2, style="library", subdir="sharded")
    tensors = [p[0] for p in plans]
    where = write_safetensors(os.path.join(d, "model.safetensors"),
                              consolidated_entries(tensors), None, "consolidated")
    for t in tensors:   # the manifest describes the winner: the consolidated file
        t.chunks = [{"file": "model.safetensors", "data_offset": where[t.name],
                     "offsets": [0] * len(t.shape), "sizes": t.shape}]
    write_manifest(d, ".", "hf", tensors)


def case_sharded_with_index(out, rng):
    d = os.path.join(out, "sharded_with_index")
    plans = sharded_tensors(rng)
    write_ranks(d, plans, 2, style="library", subdir="sharded")
    tensors = [p[0] for p in plans]
    files = {"model-00001-of-00002.safetensors": tensors[:2],
             "model-00002-of-00002.safetensors": tensors[2:]}
    weight_map = {}
    for fname, ts in files.items():
        where = write_safetensors(os.path.join(d, fname), consolidated_entries(ts), None,
                                  "consolidated")
        for t in ts:
            weight_map[t.name] = fname
            t.chunks = [{"file": fname, "data_offset": where[t.name],
                         "offsets": [0] * len(t.shape), "sizes": t.shape}]
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": sum(t.array.nbytes for t in tensors)},
                   "weight_map": weight_map}, f, indent=2)
    write_manifest(d, ".", "hf", tensors)


def case_big_dim1(out, rng):
    d = os.path.join(out, "big_dim1")
    t = Tensor("big.weight", "F32", [256, 4096], rng)
    write_ranks(d, [(t, plan_split(t, 4, [(1, 4)]))], 4)
    write_manifest(d, ".", "dcp-hf", [t])


# ---------------------------------------------------------------------------
# Hostile cases

def f32(shape, fill=1.0):
    return np.full(shape, fill, dtype="<f4").tobytes()


def hostile_dir(root, name, files):
    """files: [(filename, entries, metadata)] written in automodel style."""
    d = os.path.join(root, name)
    for fname, entries, meta in files:
        write_safetensors(os.path.join(d, fname), entries, meta, "automodel")
    return name


def raw_info(text):
    return {"DCP_SHARDING_INFO": text, "DCP_VERSION": "1.0", "format": "pt"}


def write_hostile(out):
    root = os.path.join(out, "hostile")
    rows = []

    def add(name, needle, desc, files):
        rows.append((hostile_dir(root, name, files), needle, desc))

    w = "bad.weight"
    add("overlap", w + "&overlap", "chunks [0:4,0:5] and [0:4,4:8] partially overlap",
        [(shard_name(0), [(w, "F32", [4, 5], f32([4, 5]))],
          dcp_metadata({w: {"saved_offsets": [0, 0]}})),
         (shard_name(1), [(w, "F32", [4, 4], f32([4, 4]))],
          dcp_metadata({w: {"saved_offsets": [0, 4]}}))])
    add("overlap_3d", w + "&overlap", "3-D chunks overlapping in one corner only",
        [(shard_name(0), [(w, "F32", [2, 3, 3], f32([2, 3, 3]))],
          dcp_metadata({w: {"saved_offsets": [0, 0, 0]}})),
         (shard_name(1), [(w, "F32", [2, 3, 3], f32([2, 3, 3]))],
          dcp_metadata({w: {"saved_offsets": [1, 2, 2]}}))])
    add("dtype_mismatch", w + "&dtype", "F32 chunk and F16 chunk of one tensor",
        [(shard_name(0), [(w, "F32", [4, 4], f32([4, 4]))],
          dcp_metadata({w: {"saved_offsets": [0, 0]}})),
         (shard_name(1), [(w, "F16", [4, 4], bytes(32))],
          dcp_metadata({w: {"saved_offsets": [0, 4]}}))])
    add("ndim_mismatch", w + "&dims|dim|ndim|rank", "a 2-D chunk and a 1-D chunk of one tensor",
        [(shard_name(0), [(w, "F32", [4, 4], f32([4, 4]))],
          dcp_metadata({w: {"saved_offsets": [0, 0]}})),
         (shard_name(1), [(w, "F32", [4], f32([4]))],
          dcp_metadata({w: {"saved_offsets": [4]}}))])
    add("offsets_short", "DCP_SHARDING_INFO", "saved_offsets has 1 entry for a 2-D chunk",
        [(shard_name(0), [(w, "F32", [4, 4], f32([4, 4]))],
          dcp_metadata({w: {"saved_offsets": [0]}}))])
    add("offsets_long", "DCP_SHARDING_INFO", "saved_offsets has 3 entries for a 2-D chunk",
        [(shard_name(0), [(w, "F32", [4, 4], f32([4, 4]))],
          dcp_metadata({w: {"saved_offsets": [0, 0, 0]}}))])
    add("offsets_negative", "DCP_SHARDING_INFO", "saved_offsets entry -4",
        [(shard_name(0), [(w, "F32", [4, 4], f32([4, 4]))],
          dcp_metadata({w: {"saved_offsets": [0, 0]}})),
         (shard_name(1), [(w, "F32", [4, 4], f32([4, 4]))],
          dcp_metadata({w: {"saved_offsets": [-4, 4]}}))])
    add("offsets_float", "DCP_SHARDING_INFO", "saved_offsets entry 4.0",
        [(shard_name(0), [(w, "F32", [4, 4], f32([4, 4]))],
          dcp_metadata({w: {"saved_offsets": [0, 4.0]}}))])
    add("offsets_string", "DCP_SHARDING_INFO", "saved_offsets entry \"4\"",
        [(shard_name(0), [(w, "F32", [4, 4], f32([4, 4]))],
          dcp_metadata({w: {"saved_offsets": [0, "4"]}}))])
    add("offsets_not_list", "DCP_SHARDING_INFO", "saved_offsets is an integer",
        [(shard_name(0), [(w, "F32", [4], f32([4]))],
          dcp_metadata({w: {"saved_offsets": 0}}))])
    add("offsets_missing_key", "DCP_SHARDING_INFO", "tensor entry lacks saved_offsets",
        [(shard_name(0), [(w, "F32", [4], f32([4]))],
          dcp_metadata({w: {"offsets": [0]}}))])
    add("entry_not_object", "DCP_SHARDING_INFO", "tensor entry is a bare list",
        [(shard_name(0), [(w, "F32", [4], f32([4]))], dcp_metadata({w: [0]}))])
    add("offsets_2p64", "DCP_SHARDING_INFO", "saved_offsets entry 2^64 (not a u64)",
        [(shard_name(0), [(w, "F32", [4], f32([4]))],
          dcp_metadata({w: {"saved_offsets": [2 ** 64]}}))])
    add("info_not_json", "DCP_SHARDING_INFO", "DCP_SHARDING_INFO is not JSON",
        [(shard_name(0), [(w, "F32", [4], f32([4]))],
          raw_info('{"bad.weight": {"saved_offsets": [0]'))])
    add("info_not_object", "DCP_SHARDING_INFO", "DCP_SHARDING_INFO is a JSON list",
        [(shard_name(0), [(w, "F32", [4], f32([4]))], raw_info("[0]"))])
    add("info_empty_string", "DCP_SHARDING_INFO", "DCP_SHARDING_INFO is an empty string",
        [(shard_name(0), [(w, "F32", [4], f32([4]))], raw_info(""))])
    add("info_duplicate_key", "DCP_SHARDING_INFO|duplicate",
        "DCP_SHARDING_INFO names one tensor twice with different offsets",
        [(shard_name(0), [(w, "F32", [4], f32([4]))],
          raw_info('{"bad.weight": {"saved_offsets": [0]}, '
                   '"bad.weight": {"saved_offsets": [4]}}'))])
    add("info_missing_tensor", "DCP_SHARDING_INFO&other.weight",
        "DCP_SHARDING_INFO lacks a tensor the file holds",
        [(shard_name(0), [(w, "F32", [4], f32([4])), ("other.weight", "F32", [2], f32([2]))],
          dcp_metadata({w: {"saved_offsets": [0]}}))])
    add("offset_2p63", w + "&overflow|too large|too big|exceeds|shape|saved_offsets",
        "saved_offsets 2^63 makes the full shape 2^63+4 elements of 4 bytes",
        [(shard_name(0), [(w, "F32", [4], f32([4]))],
          dcp_metadata({w: {"saved_offsets": [0]}})),
         (shard_name(1), [(w, "F32", [4], f32([4]))],
          dcp_metadata({w: {"saved_offsets": [2 ** 63]}}))])
    add("offset_sum_wraps", w + "&overflow|too large|too big|exceeds|shape|saved_offsets",
        "saved_offsets 2^64-2 plus chunk size 4 wraps around 2^64",
        [(shard_name(0), [(w, "U8", [4], bytes(4))],
          dcp_metadata({w: {"saved_offsets": [2 ** 64 - 2]}}))])
    add("numel_overflow", w + "&overflow|too large|too big|exceeds|shape|saved_offsets",
        "two dims of 2^33 each: numel overflows 64 bits",
        [(shard_name(0), [(w, "U8", [1, 1], bytes(1))],
          dcp_metadata({w: {"saved_offsets": [2 ** 33, 2 ** 33]}}))])
    add("info_not_string", "DCP_SHARDING_INFO|__metadata__",
        "DCP_SHARDING_INFO is a JSON object, not a string",
        [(shard_name(0), [(w, "F32", [4], f32([4]))],
          {"DCP_SHARDING_INFO": {w: {"saved_offsets": [0]}}, "format": "pt"})])

    # Truncated rank files: the safetensors layer of the shards is checked too.
    for name, cut, needle, desc in (
            ("truncated_data", -5, "shard-00002&data_offsets|past the end",
             "rank 2 file lacks its last 5 data bytes"),
            ("truncated_header", 40, "shard-00002&header",
             "rank 2 file cut to 40 bytes, inside its header")):
        add(name, needle, desc,
                  [(shard_name(0), [(w, "F32", [4, 4], f32([4, 4]))],
                    dcp_metadata({w: {"saved_offsets": [0, 0]}})),
                   (shard_name(1), [(w, "F32", [4, 4], f32([4, 4]))],
                    dcp_metadata({w: {"saved_offsets": [0, 4]}}))])
        victim = os.path.join(root, name, shard_name(1))
        size = os.path.getsize(victim)
        os.truncate(victim, size + cut if cut < 0 else cut)

    # Real rank files of MoE models hold ~10^5 tensors; looking each one up
    # in DCP_SHARDING_INFO must not be quadratic.  The bad entry is the last
    # in data order, so every other tensor is processed before the refusal.
    many = MANY_TENSORS
    ents = [("layers.%d.w" % i, "U8", [1], b"\x01") for i in range(many)]
    info = {name: {"saved_offsets": [0]} for name, _, _, _ in ents}
    info[ents[-1][0]] = {"saved_offsets": [-1]}
    add("many_tensors_last_bad", "DCP_SHARDING_INFO&" + ents[-1][0],
        "%d tensors in one file, the last with a negative offset (refused in time)" % many,
        [(shard_name(0), ents, dcp_metadata(info))])

    write_cases(root, rows, ("path", "needle", "description"))


# ---------------------------------------------------------------------------

def main(argv):
    out = fresh_out(argv, "usage: dcphf_fixtures.py OUTDIR")
    if out is None:
        return 2
    rng = np.random.default_rng(SEED)
    for case in (case_dim1x4, case_grid, case_mixed, case_hole, case_nemo, case_sharded_sub,
                 case_sharded_with_consolidated, case_sharded_with_index, case_big_dim1):
        case(out, rng)
    write_hostile(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
