#!/usr/bin/python3
"""PyTorch Distributed Checkpoint (native DCP: .metadata + __R_N.distcp) fixtures for ckptfs.

usage: dcp_fixtures.py            regenerate tests/fixtures/dcp/ (committed) with REAL torch
                                  (Debian's python3-torch 1.13 via /usr/bin/python3)
       dcp_fixtures.py --out DIR  write them somewhere else
       dcp_fixtures.py OUTDIR     what the Makefile runs: the good fixtures are committed (so
                                  `make check` needs no torch); this writes OUTDIR/hostile/ —
                                  damaged and malicious checkpoints derived from the committed
                                  v2x_layout case — with the Python standard library only

Good cases (each a directory with its own manifest.json), all written with torch 1.13:
  v113_per_item   torch.distributed._shard.checkpoint.save_state_dict(no_dist=True),
                  single_file_per_rank=False (1.13's default: one file per item): every dtype,
                  a transposed and a permuted tensor (strided chunks), 0-dim and empty tensors,
                  scalars, strings, lists, a nested dict, and a nested optimizer state dict
                  (1.13 saves it as ONE BYTE_IO blob holding tensors)
  v113_per_rank   the same API with single_file_per_rank=True
  v113_sharded    two ranks over loopback gloo: ShardedTensors split on dim 0 (uneven), dim 1,
                  a 2x2 grid over 2 ranks, a 3-D tensor on dim 2, an optimizer-state tensor
                  under a flat "optim." key, a replicated plain tensor, a BYTE_IO int
  v2x_layout      a torch 2.x .metadata (torch.distributed.checkpoint.*) pickled here from
                  stand-in classes whose __module__/__qualname__ are torch's, over items written
                  by torch.save exactly as DCP writes them: chunks on dim 0, dim 1 (one of them
                  strided), a 2x2 grid, a box listed twice (replica), 0-dim tensors, flattened
                  optimizer keys ("optim.state.<fqn>.exp_avg", "optim.param_groups.0.lr"),
                  TensorProperties with 5 and with 6 state items, StorageMeta with a
                  pathlib.PosixPath checkpoint_id, version "1.0.0", planner_data, and an
                  attribute DCP does not have (mcore_data, as Megatron adds)
  v2x_flat_optim  2.x flatten_optimizer_state_dict keys ("state.<fqn>.exp_avg",
                  "param_groups.<fqn>.lr"), newest _MEM_FORMAT_ENCODING, one file per item
  v2x_hole        a tensor whose chunks leave a hole and one whose chunk is stored through
                  transform_descriptors: both incomplete, with warnings
  nemo_model_dcp  a NeMo Automodel model/ saved as DCP (model_save_format torch_save)
  nemo_optim      a NeMo Automodel optim/ directory (tests/gen/nemo_fixtures.py copies both)

manifest.json (per case):
  {"source": ".", "format": "dcp", "layout": module of the Metadata class, "version",
   "checkpoint_id", "other_attributes", "incomplete_tensors", "replicated_chunks",
   "warnings": [substrings the summary's warnings must contain],
   "values": {fqn: JSON value metadata.json's dcp.values must hold},
   "tensors": [{"name" (sidecar name), "fqn", "prefix" (null or "optim/"), "aside", "path"
                (in the mount), "dtype", "shape", "nbytes", "sha256" (torch's row-major bytes,
                computed before saving; null when incomplete), "incomplete", "requires_grad",
                for incomplete ones "covered_prefix_bytes" (the leading run of bytes some
                chunk covers) and "head_sha256" (of its first min(that, 4096) bytes: reads go
                through the page cache, so only whole covered pages can be read),
                "chunks": [{"file", "offset", "length", "offsets", "sizes"}] (distinct boxes;
                empty for tensors inside a BYTE_IO blob), "byte_io_item" (or null),
                "strided": whether some chunk is stored with non-row-major strides}],
   "rebuild": what the hostile generator needs to write this case's .metadata again (2.x)}
"""

import copy
import hashlib
import io
import json
import os
import pickle
import shutil
import struct
import sys
import types

HERE = os.path.dirname(os.path.realpath(__file__))
COMMITTED = os.path.normpath(os.path.join(HERE, "..", "fixtures", "dcp"))
sys.path.insert(0, HERE)
from fixture_lib import (committed_out, fresh_dir, torch_save_zip, write_cases,  # noqa: E402
                         write_json)
# Where a payload that ran would leave its file: inside the output (set by build_hostile), so
# that suites running at once on one machine never see each other's.
CANARY_DIR = None
PAGE = 4096

NEW = "torch.distributed.checkpoint.metadata"
NEW_FS = "torch.distributed.checkpoint.filesystem"

SAFETENSORS_DTYPE = {
    "float32": "F32", "float64": "F64", "float16": "F16", "bfloat16": "BF16", "int8": "I8",
    "int16": "I16", "int32": "I32", "int64": "I64", "uint8": "U8", "bool": "BOOL",
    "complex64": "C64",
}


# ---------------------------------------------------------------------------
# Stand-ins for the torch 2.x DCP classes (and, without torch, for torch itself)

class Standins:
    """Fake modules whose classes pickle exactly as torch 2.x's do: the same module and class
    names, the same state (dataclass __dict__, TensorProperties' tuple), enum members through
    getattr.  With fake_torch, torch.Size / torch.<dtype> / torch.strided are stand-ins too,
    so the hostile cases can be written without torch installed."""

    def __init__(self, torch=None, mem_enum="MEM_FORMAT_ENCODING"):
        import enum
        import pathlib
        self.pathlib = pathlib
        if torch is None:
            torch = self._fake_torch()
        self.torch = torch
        meta = types.ModuleType(NEW)
        fs = types.ModuleType(NEW_FS)
        for name in ("torch.distributed", "torch.distributed.checkpoint"):
            if name not in sys.modules:
                sys.modules[name] = types.ModuleType(name)
        sys.modules[NEW] = meta
        sys.modules[NEW_FS] = fs

        def place(mod, cls, name):
            cls.__module__ = mod.__name__
            cls.__qualname__ = name
            cls.__name__ = name
            setattr(mod, name, cls)
            return cls

        class Metadata:
            def __init__(self, state_dict_metadata, planner_data=None, storage_data=None,
                         storage_meta=None, version=None, **extra):
                self.state_dict_metadata = state_dict_metadata
                self.planner_data = planner_data
                self.storage_data = storage_data
                self.storage_meta = storage_meta
                self.version = version
                for k, v in extra.items():
                    setattr(self, k, v)

        class TensorStorageMetadata:
            def __init__(self, properties, size, chunks):
                self.properties, self.size, self.chunks = properties, size, chunks

        class ChunkStorageMetadata:
            def __init__(self, offsets, sizes):
                self.offsets, self.sizes = offsets, sizes

        class BytesStorageMetadata:
            pass

        class MetadataIndex:
            # As torch's: an offset of None is not set at all.
            def __init__(self, fqn, offset=None, index=None):
                self.fqn = fqn
                if offset is not None:
                    self.offset = offset
                self.index = index

        Mem = enum.Enum(mem_enum, [("TORCH_CONTIGUOUS_FORMAT", 0),
                                   ("TORCH_CHANNELS_LAST", 1), ("TORCH_PRESERVE_FORMAT", 2)])

        class TensorProperties:
            def __init__(self, dtype, requires_grad=False, strides=None, six=False, state=None):
                self.dtype, self.requires_grad = dtype, requires_grad
                self.strides, self.six, self.state = strides, six, state

            def __getstate__(self):
                if self.state is not None:
                    return self.state
                st = (self.dtype, torch.strided, self.requires_grad,
                      Mem.TORCH_CONTIGUOUS_FORMAT, False)
                return st + (self.strides,) if self.six else st

            def __setstate__(self, state):
                self.state = state

        class _StorageInfo:
            def __init__(self, relative_path, offset, length, transform_descriptors=None):
                self.relative_path, self.offset, self.length = relative_path, offset, length
                if transform_descriptors is not None:
                    self.transform_descriptors = transform_descriptors

        class StorageMeta:
            def __init__(self, checkpoint_id, save_id, load_id=None, modules=()):
                self.checkpoint_id, self.save_id = checkpoint_id, save_id
                self.load_id, self.modules = load_id, list(modules)

        for cls in (Metadata, TensorStorageMetadata, ChunkStorageMetadata, BytesStorageMetadata,
                    MetadataIndex, TensorProperties, StorageMeta):
            place(meta, cls, cls.__name__)
        place(meta, Mem, mem_enum)
        place(fs, _StorageInfo, "_StorageInfo")
        self.Metadata, self.TSM, self.Chunk = Metadata, TensorStorageMetadata, ChunkStorageMetadata
        self.Bytes, self.Index, self.Props = BytesStorageMetadata, MetadataIndex, TensorProperties
        self.StorageInfo, self.StorageMeta, self.Mem = _StorageInfo, StorageMeta, Mem

    @staticmethod
    def _fake_torch():
        if "torch" in sys.modules and not getattr(sys.modules["torch"], "_ckptfs_fake", False):
            return sys.modules["torch"]
        torch = types.ModuleType("torch")
        torch._ckptfs_fake = True
        serialization = types.ModuleType("torch.serialization")

        class Size(tuple):
            def __reduce__(self):
                return (Size, (tuple(self),))

        Size.__module__, Size.__qualname__ = "torch", "Size"

        class DType:
            def __init__(self, name):
                self.name = name

            def __reduce__(self):
                return self.name

        DType.__module__ = "torch"
        for n in list(SAFETENSORS_DTYPE) + ["qint8"]:
            setattr(torch, n, DType(n))

        def _get_layout(name):
            return name

        _get_layout.__module__ = "torch.serialization"
        _get_layout.__qualname__ = "_get_layout"
        serialization._get_layout = _get_layout

        class Layout:
            def __reduce__(self):
                return (_get_layout, ("torch.strided",))

        torch.Size = Size
        torch.strided = Layout()
        torch.serialization = serialization
        sys.modules["torch"] = torch
        sys.modules["torch.serialization"] = serialization
        return torch

    def dtype(self, name):
        return getattr(self.torch, name)

    def size(self, dims):
        return self.torch.Size(tuple(dims))


def build_metadata(S, spec):
    """A Metadata object from a rebuild spec (see the module docstring)."""
    sdm, storage, planner = {}, {}, {}
    for e in spec["entries"]:
        fqn = e["fqn"]
        planner[fqn] = tuple(e.get("path") or fqn.split("."))
        if e["kind"] == "bytes":
            sdm[fqn] = S.Bytes()
            storage[S.Index(fqn, None, None)] = S.StorageInfo(e["file"], e["offset"],
                                                              e["length"], e.get("transforms"))
            continue
        props = S.Props(S.dtype(e["dtype"]), e.get("requires_grad", False), None,
                        six=e.get("six", False))
        chunks = []
        for k, c in enumerate(e["chunks"]):
            chunks.append(S.Chunk(S.size(c["offsets"]), S.size(c["sizes"])))
            if c.get("replica"):
                continue
            storage[S.Index(fqn, S.size(c["offsets"]), k)] = S.StorageInfo(
                c["file"], c["offset"], c["length"], c.get("transforms"))
        sdm[fqn] = S.TSM(props, S.size(e["size"]), chunks)
    extra = dict(spec.get("extra_attributes", {}))
    sm = spec.get("storage_meta")
    storage_meta = None
    if sm:
        storage_meta = S.StorageMeta(S.pathlib.PosixPath(sm["checkpoint_id"]), sm["save_id"],
                                     None, sm.get("modules", []))
    return S.Metadata(sdm, planner if spec.get("planner_data", True) else None, storage,
                      storage_meta, spec.get("version"), **extra)


# ---------------------------------------------------------------------------
# Expected values: what ckptfs shows for a value saved with torch.save (as torch_zip walks it)

def jsonable(v):
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    return v


def expected_values(torch, prefix, v, out, blob_tensors):
    """Flatten a BYTE_IO value as ckptfs names it: dicts always walked, lists/tuples walked
    only when something inside is a dict or a tensor; tensors collected separately."""
    def structured(seq):
        for x in seq:
            if isinstance(x, dict) or isinstance(x, torch.Tensor):
                return True
            if isinstance(x, (list, tuple)) and structured(x):
                return True
        return False

    if isinstance(v, torch.Tensor):
        blob_tensors[prefix] = v
    elif isinstance(v, dict):
        for k, x in v.items():
            expected_values(torch, "%s.%s" % (prefix, k), x, out, blob_tensors)
    elif isinstance(v, (list, tuple)) and structured(v):
        for i, x in enumerate(v):
            expected_values(torch, "%s.%d" % (prefix, i), x, out, blob_tensors)
    else:
        out[prefix] = jsonable(v)


# ---------------------------------------------------------------------------
# Tensors as torch sees them

def dtype_name(torch, t):
    return str(t.dtype).replace("torch.", "")


def logical_bytes(torch, t):
    c = t.detach().contiguous()
    if c.dtype == torch.bfloat16:
        c = c.view(torch.int16)
    return c.numpy().tobytes()


def placement(fqn, all_optim=False):
    """(name, prefix, aside) as ckptfs places a key."""
    for p in ("optim.", "optimizer."):
        if fqn.startswith(p) and len(fqn) > len(p):
            return fqn[len(p):], "optim/", True
    if all_optim or fqn.startswith("state.") or fqn.startswith("param_groups."):
        return fqn, "optim/", True
    return fqn, None, False


def tensor_entry(torch, fqn, t, chunks, byte_io=None, incomplete=False, strided=False,
                 requires_grad=False):
    name, prefix, aside = placement(fqn)
    data = logical_bytes(torch, t)
    return {"name": name, "fqn": fqn, "prefix": prefix, "aside": aside,
            "path": (prefix or "") + name.replace(".", "/"),
            "dtype": SAFETENSORS_DTYPE[dtype_name(torch, t)], "shape": list(t.shape),
            "nbytes": len(data),
            "sha256": None if incomplete else hashlib.sha256(data).hexdigest(),
            "incomplete": incomplete, "requires_grad": requires_grad,
            "chunks": chunks, "byte_io_item": byte_io, "strided": strided}


def write_manifest(out, man):
    man["tensors"].sort(key=lambda t: t["path"])
    write_json(os.path.join(out, "manifest.json"), man, sort_keys=True)


# ---------------------------------------------------------------------------
# torch 1.13's own DCP

def import_dcp_113():
    """torch.distributed._shard.checkpoint does not import on Python 3.11 (a dataclass field
    defaults to a TensorProperties instance, which 3.11 rejects as mutable because the class
    is unhashable): give that class a hash while the module is imported."""
    import dataclasses
    orig = dataclasses.dataclass

    def patch(cls):
        if cls.__name__ == "TensorProperties":
            cls.__hash__ = object.__hash__
        return cls

    def wrapped(*args, **kw):
        if args and isinstance(args[0], type):
            return orig(patch(args[0]))
        return lambda cls: orig(**kw)(patch(cls))

    dataclasses.dataclass = wrapped
    try:
        import torch.distributed._shard.checkpoint as dcp
        from torch.distributed._shard import sharded_tensor  # noqa: F401
        from torch.distributed._shard.sharding_spec import (  # noqa: F401
            ChunkShardingSpec, EnumerableShardingSpec, ShardMetadata)
    finally:
        dataclasses.dataclass = orig
    return dcp


def read_113_chunks(out):
    """fqn -> [(offsets, sizes, relative_path, offset, length)] from the .metadata torch wrote,
    read back with torch's own classes."""
    with open(os.path.join(out, ".metadata"), "rb") as f:
        md = pickle.load(f)
    where = {}
    for idx, info in md.storage_data.items():
        off = tuple(idx.offset) if getattr(idx, "offset", None) is not None else None
        where[(idx.fqn, off)] = info
    result = {}
    for fqn, tmd in md.state_dict_metadata.items():
        if not hasattr(tmd, "chunks"):
            continue
        lst = []
        for c in tmd.chunks:
            info = where[(fqn, tuple(c.offsets))]
            lst.append({"file": info.relative_path, "offset": info.offset, "length": info.length,
                        "offsets": list(c.offsets), "sizes": list(c.sizes)})
        result[fqn] = lst
    return result, md


def manifest_113(torch, out, sd, full, warnings=()):
    """full: fqn -> the full tensor (ShardedTensors' global values)."""
    chunks, md = read_113_chunks(out)
    man = {"source": ".", "format": "dcp", "layout": "torch.distributed._shard.checkpoint.metadata",
           "version": None, "checkpoint_id": None, "other_attributes": [],
           "replicated_chunks": 0, "incomplete_tensors": 0, "warnings": list(warnings),
           "values": {}, "tensors": []}
    for fqn, v in sd.items():
        if fqn in full:
            t = full[fqn]
            strided = isinstance(v, torch.Tensor) and not v.is_contiguous()
            man["tensors"].append(tensor_entry(torch, fqn, t, chunks[fqn], strided=strided))
        else:
            blob = {}
            expected_values(torch, fqn, v, man["values"], blob)
            for name, t in blob.items():
                man["tensors"].append(tensor_entry(torch, name, t, [], byte_io=fqn,
                                                   strided=not t.is_contiguous()))
    return man


def state_113(torch, seed):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    sd = {
        "model.embed.weight": r(6, 4),
        "model.layer.weight": r(4, 4).to(torch.bfloat16),
        "model.layer.bias": r(4).to(torch.float16),
        "model.ids": torch.arange(10, dtype=torch.int64).reshape(2, 5),
        "model.mask": r(3, 3) > 0,
        "model.scale": torch.tensor(2.5, dtype=torch.float64),
        "model.proj.weight_t": r(3, 5).t(),
        "model.perm": r(2, 3, 4).permute(2, 0, 1),
        "model.u8": torch.arange(7, dtype=torch.uint8),
        "model.i8": torch.tensor([[-1, 2], [3, -4]], dtype=torch.int8),
        "model.i16": torch.arange(6, dtype=torch.int16).reshape(3, 2),
        "model.i32": torch.arange(4, dtype=torch.int32) * 1000,
        "model.empty": torch.zeros(0, 3),
        "step": 7,
        "name": "ckpt-113",
        "lr": 0.001,
        "flags": [1, 2, 3],
        "cfg": {"depth": 2, "act": "gelu", "dropout": None, "tied": True},
        "optim": {"state": {0: {"step": 3, "exp_avg": r(6, 4), "exp_avg_sq": r(6, 4)}},
                  "param_groups": [{"lr": 0.01, "betas": (0.9, 0.999), "params": [0]}]},
    }
    full = {k: v for k, v in sd.items() if isinstance(v, torch.Tensor)}
    return sd, full


def case_113(torch, dcp, out, per_rank, seed):
    os.makedirs(out)
    sd, full = state_113(torch, seed)
    dcp.save_state_dict(sd, dcp.FileSystemWriter(out, single_file_per_rank=per_rank),
                        no_dist=True)
    man = manifest_113(torch, out, sd, full, warnings=['"optim" is one BYTE_IO item'])
    write_manifest(out, man)


def sharded_worker(rank, out, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    import torch
    import torch.distributed as dist
    import_dcp_113()
    from torch.distributed._shard import sharded_tensor
    from torch.distributed._shard.sharding_spec import (ChunkShardingSpec,
                                                        EnumerableShardingSpec, ShardMetadata)
    import torch.distributed._shard.checkpoint as dcp
    dist.init_process_group("gloo", rank=rank, world_size=2)
    fulls = sharded_full(torch)
    places = ["rank:0/cpu", "rank:1/cpu"]

    def chunked(fqn, dim):
        t = fulls[fqn]
        st = sharded_tensor.empty(ChunkShardingSpec(dim=dim, placements=places), *t.shape,
                                  dtype=t.dtype)
        fill(st, t)
        return st

    def fill(st, t):
        for sh in st.local_shards():
            sl = tuple(slice(o, o + s) for o, s in zip(sh.metadata.shard_offsets,
                                                        sh.metadata.shard_sizes))
            sh.tensor.copy_(t[sl])

    grid = fulls["model.grid"]
    spec = EnumerableShardingSpec([
        ShardMetadata([0, 0], [2, 3], places[0]), ShardMetadata([0, 3], [2, 3], places[1]),
        ShardMetadata([2, 0], [2, 3], places[1]), ShardMetadata([2, 3], [2, 3], places[0])])
    g = sharded_tensor.empty(spec, *grid.shape, dtype=grid.dtype)
    fill(g, grid)
    sd = {"model.rows": chunked("model.rows", 0), "model.cols": chunked("model.cols", 1),
          "model.grid": g, "model.cube": chunked("model.cube", 2),
          "optim.state.model.rows.exp_avg": chunked("optim.state.model.rows.exp_avg", 0),
          "model.bias": fulls["model.bias"].clone(), "step": 11}
    dcp.save_state_dict(sd, dcp.FileSystemWriter(out, single_file_per_rank=True))
    dist.barrier()
    dist.destroy_process_group()


def sharded_full(torch):
    g = torch.Generator().manual_seed(113)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    return {"model.rows": r(5, 4), "model.cols": r(3, 7).to(torch.bfloat16),
            "model.grid": torch.arange(24, dtype=torch.int32).reshape(4, 6),
            "model.cube": r(2, 3, 5).to(torch.float64),
            "optim.state.model.rows.exp_avg": r(5, 4), "model.bias": r(4)}


def case_113_sharded(torch, out):
    import socket
    import torch.multiprocessing as mp
    os.makedirs(out)
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    mp.spawn(sharded_worker, args=(out, port), nprocs=2)
    fulls = sharded_full(torch)
    sd = dict(fulls)
    sd["step"] = 11
    write_manifest(out, manifest_113(torch, out, sd, fulls))


# ---------------------------------------------------------------------------
# torch 2.x layout: items written by torch.save, .metadata pickled from stand-ins

class Writer2x:
    """Collects items per rank, writes __R_N.distcp files (BYTE_IO items first, then tensors,
    as DCP's writer orders them) and the .metadata."""

    def __init__(self, torch, S, out, per_item=False):
        self.torch, self.S, self.out, self.per_item = torch, S, out, per_item
        self.items = {}      # rank -> [(kind, key, payload bytes)]
        self.entries = []    # rebuild spec entries, in state_dict order
        self.tensors = []
        self.values = {}
        self.replicas = 0

    def _save(self, obj):
        buf = io.BytesIO()
        self.torch.save(obj, buf)
        return buf.getvalue()

    def tensor(self, fqn, full, plan, six=False, requires_grad=False, incomplete=False,
               transform=None):
        """plan: [(rank, offsets, sizes, how)] with how None, "strided" (saved transposed
        twice: the same values, column-major strides) or "replica" (the box of the previous
        chunk again, stored once)."""
        torch = self.torch
        e = {"kind": "tensor", "fqn": fqn, "dtype": dtype_name(torch, full),
             "size": list(full.shape), "six": six, "requires_grad": requires_grad, "chunks": []}
        strided = False
        for k, (rank, offs, sizes, how) in enumerate(plan):
            c = {"offsets": list(offs), "sizes": list(sizes)}
            if how == "replica":
                c["replica"] = True
                self.replicas += 1
                e["chunks"].append(c)
                continue
            sl = tuple(slice(o, o + s) for o, s in zip(offs, sizes))
            chunk = full[sl].clone()
            if how == "strided":
                chunk = chunk.t().contiguous().t()
                strided = True
            if transform and k == transform[0]:
                c["transforms"] = transform[1]
            self.items.setdefault(rank, []).append(("tensor", (fqn, k), self._save(chunk)))
            c["_rank"] = rank
            e["chunks"].append(c)
        self.entries.append(e)
        self.tensors.append((fqn, full, e, strided, requires_grad, incomplete))

    def value(self, fqn, v, rank=0):
        self.items.setdefault(rank, []).append(("bytes", fqn, self._save(v)))
        self.entries.append({"kind": "bytes", "fqn": fqn})
        blob = {}
        expected_values(self.torch, fqn, v, self.values, blob)
        assert not blob

    def write(self, version="1.0.0", storage_meta=None, extra=None, mem=None):
        os.makedirs(self.out)
        where = {}
        for rank in sorted(self.items):
            items = sorted(self.items[rank], key=lambda it: it[0] != "bytes")
            files = {}
            for n, (kind, key, data) in enumerate(items):
                name = "__%d_%d.distcp" % (rank, n if self.per_item else 0)
                f = files.setdefault(name, bytearray())
                where[(kind, key)] = (name, len(f), len(data))
                f += data
            for name, data in files.items():
                with open(os.path.join(self.out, name), "wb") as fh:
                    fh.write(data)
        for e in self.entries:
            if e["kind"] == "bytes":
                e["file"], e["offset"], e["length"] = where[("bytes", e["fqn"])]
                continue
            for k, c in enumerate(e["chunks"]):
                if c.get("replica"):
                    continue
                c["file"], c["offset"], c["length"] = where[("tensor", (e["fqn"], k))]
                del c["_rank"]
        spec = {"entries": self.entries, "version": version, "storage_meta": storage_meta,
                "extra_attributes": extra or {}}
        with open(os.path.join(self.out, ".metadata"), "wb") as f:
            pickle.dump(build_metadata(self.S, spec), f, protocol=4)
        return spec

    def manifest(self, spec, warnings=(), all_optim=False):
        man = {"source": ".", "format": "dcp", "layout": NEW, "version": spec["version"],
               "checkpoint_id": (spec["storage_meta"] or {}).get("checkpoint_id"),
               "other_attributes": sorted(spec["extra_attributes"]),
               "replicated_chunks": self.replicas, "warnings": list(warnings),
               "values": self.values, "tensors": [], "rebuild": spec}
        for fqn, full, e, strided, rg, incomplete in self.tensors:
            boxes = [{k: c[k] for k in ("file", "offset", "length", "offsets", "sizes")}
                     for c in e["chunks"] if not c.get("replica") and not c.get("transforms")]
            t = tensor_entry(self.torch, fqn, full, boxes, incomplete=incomplete,
                             strided=strided, requires_grad=rg)
            if incomplete:
                # The leading run of covered elements: reads there must still work.
                mask = self.torch.zeros(full.shape, dtype=self.torch.bool)
                for c in boxes:
                    mask[tuple(slice(o, o + n) for o, n in zip(c["offsets"], c["sizes"]))] = True
                flat = mask.reshape(-1).tolist() + [False]
                lead = flat.index(False) * full.element_size()
                t["covered_prefix_bytes"] = lead
                t["head_sha256"] = hashlib.sha256(
                    logical_bytes(self.torch, full)[:min(lead, PAGE)]).hexdigest()
            if all_optim and t["prefix"] is None:
                t["prefix"], t["aside"] = "optim/", True
                t["path"] = "optim/" + t["path"]
            man["tensors"].append(t)
        man["incomplete_tensors"] = sum(t["incomplete"] and not t["aside"]
                                        for t in man["tensors"])
        return man


def split(shape, dim, parts, ranks=None):
    """torch's chunking: ceil-sized pieces along dim."""
    n = shape[dim]
    size = -(-n // parts)
    out = []
    for r in range(parts):
        start = min(n, r * size)
        stop = min(n, start + size)
        offs = [0] * len(shape)
        sizes = list(shape)
        offs[dim], sizes[dim] = start, stop - start
        out.append(((ranks or list(range(parts)))[r], offs, sizes, None))
    return out


def case_2x_layout(torch, out):
    S = Standins(torch)
    g = torch.Generator().manual_seed(2)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    w = Writer2x(torch, S, out)
    emb = r(8, 6)
    w.tensor("model.embed.weight", emb, split([8, 6], 0, 2), six=True, requires_grad=True)
    q = r(6, 8).to(torch.bfloat16)
    qp = split([6, 8], 1, 2)
    qp[1] = (qp[1][0], qp[1][1], qp[1][2], "strided")
    w.tensor("model.attn.q.weight", q, qp)
    norm = r(8).to(torch.float16)
    w.tensor("model.norm.weight", norm, [(0, [0], [8], None), (1, [0], [8], "replica")])
    grid = torch.arange(24, dtype=torch.int32).reshape(4, 6)
    w.tensor("model.grid", grid, [(0, [0, 0], [2, 3], None), (1, [0, 3], [2, 3], None),
                                  (1, [2, 0], [2, 3], None), (0, [2, 3], [2, 3], None)], six=True)
    w.tensor("model.step_count", torch.tensor(42, dtype=torch.int64), [(0, [], [], None)])
    w.tensor("model.mask", r(3, 4) > 0, [(1, [0, 0], [3, 4], None)])
    w.tensor("optim.state.model.embed.weight.exp_avg", r(8, 6), split([8, 6], 0, 2))
    w.tensor("optim.state.model.embed.weight.exp_avg_sq", r(8, 6), split([8, 6], 0, 2))
    w.tensor("optim.state.model.embed.weight.step", torch.tensor(10.0), [(0, [], [], None)])
    w.value("optim.param_groups.0.lr", 0.001)
    w.value("optim.param_groups.0.betas", (0.9, 0.999))
    w.value("optim.param_groups.0.params", ["model.embed.weight", "model.attn.q.weight"])
    w.value("epoch", 2)
    w.value("run_name", "dcp-2x", rank=1)
    spec = w.write(storage_meta={"checkpoint_id": "/tmp/ckpt/step_10",
                                 "save_id": "6d0f7a8e-0000-4000-8000-00000000c0de",
                                 "modules": []},
                   extra={"mcore_data": {"sharded_strategy": "torch_dist", "version": 1}})
    write_manifest(out, w.manifest(spec))


def case_2x_flat_optim(torch, out):
    S = Standins(torch, mem_enum="_MEM_FORMAT_ENCODING")
    g = torch.Generator().manual_seed(3)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    w = Writer2x(torch, S, out, per_item=True)
    w.tensor("layer.weight", r(4, 3), split([4, 3], 0, 2))
    w.tensor("layer.bias", r(3), [(0, [0], [3], None)])
    w.tensor("state.layer.weight.exp_avg", r(4, 3), split([4, 3], 0, 2))
    w.tensor("state.layer.weight.step", torch.tensor(5.0), [(0, [], [], None)])
    w.value("param_groups.layer.weight.lr", 0.01)
    w.value("param_groups.layer.weight.weight_decay", 0.0)
    spec = w.write(version="1.0.0")
    write_manifest(out, w.manifest(spec))


def case_2x_hole(torch, out):
    S = Standins(torch)
    g = torch.Generator().manual_seed(4)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    w = Writer2x(torch, S, out)
    w.tensor("model.whole", r(4, 4), split([4, 4], 1, 2))
    # The second half was never saved: only the first half is listed (big enough that whole
    # pages of it can be read).
    w.tensor("model.half", r(32768, 4).to(torch.float16), [(0, [0, 0], [16384, 4], None)],
             incomplete=True)
    w.tensor("model.compressed", r(6), [(0, [0], [3], None), (1, [3], [3], None)],
             incomplete=True, transform=(1, ["zstd"]))
    spec = w.write()
    write_manifest(out, w.manifest(spec, warnings=["model.half", "model.compressed",
                                                   "transform_descriptors"]))


# NeMo Automodel pieces (tests/gen/nemo_fixtures.py builds step directories from them).
NEMO_MODEL = [("model.embed_tokens.weight", (32, 8)),
              ("model.layers.0.self_attn.q_proj.weight", (8, 8)),
              ("model.layers.0.mlp.down_proj.weight", (8, 12)),
              ("model.norm.weight", (8,)),
              ("lm_head.weight", (32, 8))]


def case_nemo_model(torch, out):
    S = Standins(torch)
    g = torch.Generator().manual_seed(5)
    w = Writer2x(torch, S, out)
    for fqn, shape in NEMO_MODEL:
        t = torch.randn(*shape, generator=g).to(torch.bfloat16)
        w.tensor(fqn, t, split(list(shape), 0, 2))
    spec = w.write()
    write_manifest(out, w.manifest(spec))


def case_nemo_optim(torch, out):
    S = Standins(torch)
    g = torch.Generator().manual_seed(6)
    w = Writer2x(torch, S, out)
    for fqn, shape in NEMO_MODEL:
        for k in ("exp_avg", "exp_avg_sq"):
            w.tensor("optim.state.%s.%s" % (fqn, k), torch.randn(*shape, generator=g),
                     split(list(shape), 0, 2))
        w.tensor("optim.state.%s.step" % fqn, torch.tensor(20.0), [(0, [], [], None)])
    w.value("optim.param_groups.0.lr", 1e-5)
    w.value("optim.param_groups.0.params", [f for f, _ in NEMO_MODEL])
    spec = w.write()
    write_manifest(out, w.manifest(spec, all_optim=True))


def build_committed(out):
    import torch
    dcp = import_dcp_113()
    torch.manual_seed(0)
    case_113(torch, dcp, os.path.join(out, "v113_per_item"), False, 1)
    case_113(torch, dcp, os.path.join(out, "v113_per_rank"), True, 2)
    case_113_sharded(torch, os.path.join(out, "v113_sharded"))
    case_2x_layout(torch, os.path.join(out, "v2x_layout"))
    case_2x_flat_optim(torch, os.path.join(out, "v2x_flat_optim"))
    case_2x_hole(torch, os.path.join(out, "v2x_hole"))
    case_nemo_model(torch, os.path.join(out, "nemo_model_dcp"))
    case_nemo_optim(torch, os.path.join(out, "nemo_optim"))


# ---------------------------------------------------------------------------
# Hostile cases (standard library only)

class Asm:
    """A few pickle opcodes, for payloads a stand-in object cannot express."""

    def __init__(self):
        self.b = bytearray(b"\x80\x04")

    def glob(self, module, name):
        self.b += b"c" + module.encode() + b"\n" + name.encode() + b"\n"
        return self

    def str(self, s):
        e = s.encode()
        self.b += b"X" + struct.pack("<I", len(e)) + e
        return self

    def raw(self, data):
        self.b += data
        return self

    def done(self):
        return bytes(self.b + b".")


def evil_call(module, name, arg):
    """REDUCE(module.name, (arg,)): what Python's pickle.loads would run."""
    return Asm().glob(module, name).str(arg).raw(b"\x85R").done()


class Hostile:
    def __init__(self, out):
        self.root = os.path.join(out, "hostile")
        self.base = os.path.join(COMMITTED, "v2x_layout")
        with open(os.path.join(self.base, "manifest.json"), encoding="utf-8") as f:
            self.spec = json.load(f)["rebuild"]
        self.S = Standins(None)
        self.rows = []
        self.canaries = {}

    def case(self, name, expect, needle, desc, spec=None, metadata=None, mutate=None):
        d = os.path.join(self.root, name)
        os.makedirs(d)
        for f in os.listdir(self.base):
            if f.endswith(".distcp"):
                shutil.copyfile(os.path.join(self.base, f), os.path.join(d, f))
        if metadata is None:
            metadata = pickle.dumps(build_metadata(self.S, spec or self.spec), protocol=4)
        with open(os.path.join(d, ".metadata"), "wb") as f:
            f.write(metadata)
        if mutate:
            mutate(d)
        self.rows.append((name, expect, needle, desc))
        return d

    def spec_with(self, fn):
        s = copy.deepcopy(self.spec)
        fn(s)
        return s

    def entry(self, spec, fqn):
        return next(e for e in spec["entries"] if e["fqn"] == fqn)

    def canary(self, name):
        path = os.path.join(CANARY_DIR, "ckptfs-dcp-canary-" + name)
        return path, "touch " + path

    def write(self):
        write_cases(self.root, self.rows)
        write_json(os.path.join(self.root, "canaries.json"), self.canaries, sort_keys=True)


def build_hostile(out):
    h = Hostile(out)
    fresh_dir(h.root)
    global CANARY_DIR
    CANARY_DIR = os.path.join(os.path.abspath(h.root), ".canaries")
    os.makedirs(CANARY_DIR)
    good = pickle.dumps(build_metadata(h.S, h.spec), protocol=4)
    W = "model.embed.weight"

    # The .metadata pickle itself.
    h.case("metadata_empty", "refuse", "truncated", "empty .metadata", metadata=b"")
    for cut in (1, 2, 40, len(good) // 2, len(good) - 1):
        h.case("metadata_cut_%d" % cut, "refuse", "truncated",
               ".metadata cut to %d of %d bytes" % (cut, len(good)), metadata=good[:cut])
    h.case("metadata_not_pickle", "refuse", "opcode|pickle", ".metadata is text",
           metadata=b"{\"state_dict_metadata\": {}}\n")
    h.case("metadata_dict", "refuse", "Metadata", "the pickle is a plain dict",
           metadata=pickle.dumps({"state_dict_metadata": {}}, protocol=4))
    for name, (mod, fn) in {"global_os_system": ("os", "system"),
                            "global_posix_system": ("posix", "system"),
                            "global_subprocess": ("subprocess", "getoutput")}.items():
        path, cmd = h.canary(name)
        h.case(name, "refuse", "%s.%s" % (mod, fn), "%s.%s(%r) as the whole pickle"
               % (mod, fn, cmd), metadata=evil_call(mod, fn, cmd))
        h.canaries[name] = {"canary": path, "pickle": ".metadata"}
    h.case("global_eval", "refuse", "builtins.eval", "builtins.eval as the whole pickle",
           metadata=evil_call("builtins", "eval", "1+1"))
    # A hostile global deep inside an otherwise good graph: nothing before it may run either.
    inner = pickle.dumps(build_metadata(h.S, h.spec), protocol=4)
    value = b"\x8c\x051.0.0"
    at = inner.index(value)
    path, cmd = h.canary("global_nested")
    evil = Asm().glob("os", "system").str(cmd).raw(b"\x85R").b[2:]
    h.case("global_nested", "refuse", "os.system",
           "os.system call in place of the version string, after the whole graph",
           metadata=inner[:at] + bytes(evil) + inner[at + len(value):])
    # Python's pickle would stop at the first stand-in class: no liveness control here.
    h.canaries["global_nested"] = {"canary": path, "live": False}
    h.case("global_unknown_dcp_class", "refuse", "EvilMetadata",
           "a class path inside torch.distributed.checkpoint that is not DCP's",
           metadata=Asm().glob(NEW, "EvilMetadata").raw(b")\x81").done())

    # Storage entries.
    def set_chunk(fqn, k, **kw):
        def fn(s):
            h.entry(s, fqn)["chunks"][k].update(kw)
        return h.spec_with(fn)

    h.case("offset_past_eof", "refuse", "runs past&offset", "item offset beyond its file",
           spec=set_chunk(W, 1, offset=10 ** 6))
    h.case("length_past_eof", "refuse", "runs past&length", "item length beyond its file",
           spec=set_chunk(W, 0, length=10 ** 6))
    h.case("length_2p63", "refuse", "runs past", "offset and length 2^63-1",
           spec=set_chunk(W, 1, offset=2 ** 63 - 1, length=2 ** 63 - 1))
    h.case("offset_bigint", "refuse", "non-negative&offset", "item offset 2^64 (LONG1)",
           spec=set_chunk(W, 1, offset=2 ** 64))
    h.case("offset_negative", "refuse", "non-negative&offset", "item offset -1",
           spec=set_chunk(W, 0, offset=-1))
    h.case("offset_string", "refuse", "non-negative&offset", "item offset '0'",
           spec=set_chunk(W, 0, offset="0"))
    h.case("path_parent", "refuse", "relative_path&../", "relative_path ../__0_0.distcp",
           spec=set_chunk(W, 0, file="../__0_0.distcp"))
    h.case("path_absolute", "refuse", "relative_path&/etc/passwd", "relative_path /etc/passwd",
           spec=set_chunk(W, 0, file="/etc/passwd"))
    h.case("path_empty", "refuse", "relative_path", "relative_path ''",
           spec=set_chunk(W, 0, file=""))
    h.case("path_not_string", "refuse", "relative_path", "relative_path 0",
           spec=set_chunk(W, 0, file=0))
    h.case("path_symlink_out", "refuse", "outside", "relative_path is a symlink to ../outside",
           spec=set_chunk(W, 0, file="link.distcp"),
           mutate=lambda d: os.symlink(os.path.join("..", "outside.distcp"),
                                       os.path.join(d, "link.distcp")))
    with open(os.path.join(h.root, "outside.distcp"), "wb") as f:
        f.write(open(os.path.join(h.base, "__0_0.distcp"), "rb").read())
    h.case("path_directory", "refuse", "regular file", "relative_path names a directory",
           spec=set_chunk(W, 0, file="sub"), mutate=lambda d: os.mkdir(os.path.join(d, "sub")))
    h.case("missing_file", "refuse", "__1_0.distcp", "__1_0.distcp was deleted",
           mutate=lambda d: os.unlink(os.path.join(d, "__1_0.distcp")))
    h.case("distcp_truncated", "refuse", "runs past&__1_0.distcp",
           "__1_0.distcp cut short: its last items run past the end",
           mutate=lambda d: os.truncate(os.path.join(d, "__1_0.distcp"), 100))
    h.case("item_not_zip", "refuse", "zip", "an item range that starts 1 byte into an archive",
           spec=set_chunk(W, 0, offset=h.entry(h.spec, W)["chunks"][0]["offset"] + 1,
                          length=h.entry(h.spec, W)["chunks"][0]["length"] - 1))
    h.case("item_cut_short", "refuse", "zip|central|end", "an item range 100 bytes too short",
           spec=set_chunk(W, 0, length=h.entry(h.spec, W)["chunks"][0]["length"] - 100))

    def dup_storage(s):
        e = h.entry(s, W)
        e["chunks"].append(dict(e["chunks"][0]))
    h.case("storage_twice", "refuse", "twice", "two storage entries with one (fqn, offsets)",
           spec=h.spec_with(dup_storage))

    # Chunks against their tensor.
    h.case("chunk_outside", "refuse", "outside&" + W, "chunk rows 4..12 of an 8-row tensor",
           spec=set_chunk(W, 1, sizes=[8, 6]))
    h.case("chunk_offset_2p63", "refuse", "outside", "chunk offset 2^63-1 on dim 0",
           spec=set_chunk(W, 1, offsets=[2 ** 63 - 1, 0]))
    h.case("chunk_offset_bigint", "refuse", "non-negative", "chunk offset 2^64-2 (LONG1)",
           spec=set_chunk(W, 1, offsets=[2 ** 64 - 2, 0]))
    h.case("chunk_overlap", "refuse", "overlap&" + W, "chunks [0:4] and [3:8] on dim 0",
           spec=set_chunk(W, 1, offsets=[3, 0], sizes=[5, 6]))
    h.case("chunk_ndim", "refuse", "dimensions&" + W, "3 chunk offsets for a 2-D tensor",
           spec=set_chunk(W, 1, offsets=[4, 0, 0], sizes=[4, 6, 1]))
    h.case("chunk_no_storage", "refuse", "storage_data&" + W,
           "a chunk whose (fqn, offsets) has no storage entry",
           spec=set_chunk(W, 1, offsets=[4, 1], sizes=[4, 5], replica=True))
    h.case("chunk_shape_mismatch", "refuse", "shape&" + W,
           "chunk sizes [4, 3] but the archive holds [4, 6]",
           spec=set_chunk(W, 0, sizes=[4, 3]))
    h.case("dtype_mismatch", "refuse", "F16&F32",
           ".metadata says float16, the archive holds float32",
           spec=h.spec_with(lambda s: h.entry(s, W).update(dtype="float16")))
    h.case("dtype_quantized", "refuse", "qint8", "dtype torch.qint8",
           spec=h.spec_with(lambda s: h.entry(s, W).update(dtype="qint8")))
    h.case("size_33_dims", "refuse", "dimensions", "a tensor size of 33 dimensions",
           spec=h.spec_with(lambda s: h.entry(s, W).update(size=[1] * 33)))
    h.case("size_negative", "refuse", "negative", "size [-8, 6]",
           spec=h.spec_with(lambda s: h.entry(s, W).update(size=[-8, 6])))

    # Mounted safely: a BYTE_IO archive whose pickle would run a command.
    path, cmd = h.canary("byteio_os_system")
    blob = torch_save_zip(evil_call("os", "system", cmd))

    def add_evil(s):
        s["entries"].append({"kind": "bytes", "fqn": "evil", "file": "__2_0.distcp",
                             "offset": 0, "length": len(blob)})
    h.case("byteio_os_system", "mount", "os.system",
           "a BYTE_IO item whose torch.save pickle calls os.system: shown as unreadable",
           spec=h.spec_with(add_evil),
           mutate=lambda d: open(os.path.join(d, "__2_0.distcp"), "wb").write(blob))
    h.canaries["byteio_os_system"] = {"canary": path, "zip": "__2_0.distcp",
                                      "record": "archive/data.pkl"}

    def add_unused(s):
        s["entries"].append({"kind": "bytes", "fqn": "ghost", "file": "__0_0.distcp",
                             "offset": 0, "length": 16})
        s["entries"][-1]["_unlisted"] = True
    unused = h.spec_with(add_unused)
    meta = build_metadata(h.S, unused)
    del meta.state_dict_metadata["ghost"]
    h.case("storage_unused", "mount", "belong to no",
           "a storage entry no state_dict_metadata item uses",
           metadata=pickle.dumps(meta, protocol=4))
    bound_cases(h, set_chunk)
    h.write()
    return len(h.rows)


def bound_cases(h, set_chunk):
    """The storage and chunk bounds one over (the committed v2x_layout case, mounted and
    compared with torch's figures by 360-dcp.t, is each at exactly its bound: every .distcp
    file ends with its last item, and chunks tile their tensors exactly), and the dims limit at
    and over it. bound_*"""
    step = "optim.state.model.embed.weight.step"
    last = h.entry(h.spec, step)["chunks"][0]
    size = os.path.getsize(os.path.join(h.base, last["file"]))
    assert last["offset"] + last["length"] == size, "the last item ends the file"
    h.case("bound_item_eof_plus_1", "refuse",
           "offset %d + length %d&runs past the end of __0_0.distcp (size %d)"
           % (last["offset"], last["length"] + 1, size),
           "the last item of __0_0.distcp one byte longer than the file",
           spec=set_chunk(step, 0, length=last["length"] + 1))
    W = "model.embed.weight"
    h.case("bound_chunk_outside_by_1", "refuse", "lie outside the tensor's size [8, 6] on dim 0",
           "chunk rows 4..9 of an 8-row tensor", spec=set_chunk(W, 1, sizes=[5, 6]))
    h.case("bound_chunk_outside_by_1_dim1", "refuse",
           "lie outside the tensor's size [8, 6] on dim 1", "chunk columns 1..7 of 6",
           spec=set_chunk(W, 1, offsets=[4, 1]))
    # An item of 3 bytes cannot hold the 4-byte zip signature (though the file has it there).
    h.case("bound_item_3_bytes", "refuse", "the 3 bytes at offset&do not start with a zip",
           "an item range of 3 bytes at the start of a torch.save archive",
           spec=set_chunk(W, 0, length=3))
    # The ".." test reaches the last component (the end of the string is a separator too).
    h.case("bound_path_last_dotdot", "refuse", "is not a file name inside",
           "relative_path sub/.. (the checkpoint directory itself)",
           spec=set_chunk(W, 0, file="sub/.."), mutate=lambda d: os.mkdir(os.path.join(d, "sub")))
    # A chunk needs as many offsets and sizes as its tensor has dims: one offset too many.
    h.case("bound_chunk_offsets_plus_1", "refuse", "has 3 offsets and 2 sizes",
           "3 chunk offsets, 2 sizes for a 2-D tensor", spec=set_chunk(W, 1, offsets=[4, 0, 0]))
    S = "model.step_count"
    for nd, needle in ((32, "0 offsets and 0 sizes for a tensor of 32 dimensions"),
                       (33, "33 dimensions (at most 32)")):
        h.case("bound_size_%d_dims" % nd, "refuse", needle,
               "a size of %d dims of 1 for a tensor whose chunk has none" % nd,
               spec=h.spec_with(lambda s, nd=nd: h.entry(s, S).update(size=[1] * nd)))


def main(argv):
    if len(argv) == 2 and argv[1] != "--out":
        n = build_hostile(argv[1])
        print("dcp fixtures are committed in %s (regenerate them with %s, which needs "
              "python3-torch); wrote %d hostile cases into %s/hostile"
              % (COMMITTED, argv[0], n, argv[1]))
        return 0
    out = committed_out(argv, COMMITTED, __doc__)
    if out is None:
        return 2
    fresh_dir(out)
    build_committed(out)
    total = sum(os.path.getsize(os.path.join(dp, f))
                for dp, _, fs in os.walk(out) for f in fs)
    print("wrote %s (%d bytes)" % (out, total))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
