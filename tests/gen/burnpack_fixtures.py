#!/usr/bin/python3
"""Write Burnpack (.bpk, Burn's checkpoint container) test fixtures for ckptfs.

usage: burnpack_fixtures.py OUTDIR

Independent of core/: this file has its own small CBOR encoder and its own
Burnpack writer, built from the format notes (shared/formats/
gptrs-burnpack-lwt-tp.md, section 2), so the tests compare the C decoder with
a second reading of the spec.  Output is deterministic.

Layout of OUTDIR:
  good/CASE/model.bpk + manifest.json   files that must mount; the manifest
        lists every tensor (name, dtype, shape, nbytes, sha256, path, offset,
        burn_dtype, param_id, quantized, burn_shape) and the expected
        "burnpack" member of .ckptfs/metadata.json ("doc").
  good/mnist/manifest.json   the real Burn sample tests/fixtures/burnpack/
        burn-mnist.bpk (committed: Burn's examples/mnist-inference-web), decoded
        here with a minimal CBOR reader; "skip" says why when it is missing.
  hostile/   damaged files and cases.tsv (path, expect, needle, description),
        the format of tests/t/310-hostile.t; mount-names.json lists the names
        each "mount" case must show.
"""

import hashlib
import json
import math
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
from fixture_lib import fresh_dir, write_cases, write_json  # noqa: E402

ALIGN = 256
METADATA_LIMIT = 100 * 1024 * 1024  # Burn's MAX_METADATA_SIZE

# ---------------------------------------------------------------------------
# A small CBOR encoder (RFC 8949), enough for Burn's metadata and for damage.


class Tag:
    def __init__(self, tag, value):
        self.tag, self.value = tag, value


class Indef:
    """Encode a list, dict, str or bytes with indefinite length (chunks for strings)."""

    def __init__(self, value, chunk=3):
        self.value, self.chunk = value, chunk


class Width:
    """An unsigned integer with a forced argument width (1, 2, 4 or 8 bytes)."""

    def __init__(self, value, width):
        self.value, self.width = value, width


class Float:
    """A float with a forced width in bits (16, 32 or 64)."""

    def __init__(self, value, bits):
        self.value, self.bits = value, bits


class Raw:
    """Bytes inserted as they are (for damaged items)."""

    def __init__(self, data):
        self.data = data


UNDEFINED = object()


def cbor_head(major, n, width=None):
    if width is None:
        width = 0 if n < 24 else 1 if n < 0x100 else 2 if n < 0x10000 else 4 if n < 1 << 32 else 8
    if width == 0:
        return bytes([major << 5 | n])
    ai = {1: 24, 2: 25, 4: 26, 8: 27}[width]
    return bytes([major << 5 | ai]) + n.to_bytes(width, "big")


def shortest_float(x):
    """ciborium writes the narrowest IEEE width that round-trips."""
    if math.isnan(x) or math.isinf(x):
        return 16
    try:
        if struct.unpack(">e", struct.pack(">e", x))[0] == x:
            return 16
    except OverflowError:
        pass
    try:
        if struct.unpack(">f", struct.pack(">f", x))[0] == x:
            return 32
    except OverflowError:
        pass
    return 64


def cbor(v, out=None, starts=None):
    """Encode v; when starts is a list, the offset of every item is appended to it."""
    out = bytearray() if out is None else out
    if starts is not None:
        starts.append(len(out))
    if isinstance(v, Raw):
        out += v.data
    elif isinstance(v, Tag):
        out += cbor_head(6, v.tag)
        cbor(v.value, out, starts)
    elif isinstance(v, Width):
        out += cbor_head(0, v.value, v.width)
    elif isinstance(v, Float) or isinstance(v, float):
        x, bits = (v.value, v.bits) if isinstance(v, Float) else (v, shortest_float(v))
        out += {16: b"\xf9" + struct.pack(">e", x), 32: b"\xfa" + struct.pack(">f", x),
                64: b"\xfb" + struct.pack(">d", x)}[bits]
    elif v is UNDEFINED:
        out += b"\xf7"
    elif v is None:
        out += b"\xf6"
    elif v is True or v is False:
        out += b"\xf5" if v else b"\xf4"
    elif isinstance(v, int):
        out += cbor_head(0, v) if v >= 0 else cbor_head(1, -1 - v)
    elif isinstance(v, bytes):
        out += cbor_head(2, len(v)) + v
    elif isinstance(v, str):
        b = v.encode("utf-8")
        out += cbor_head(3, len(b)) + b
    elif isinstance(v, Indef):
        x = v.value
        if isinstance(x, (str, bytes)):
            major = 3 if isinstance(x, str) else 2
            out.append(major << 5 | 31)
            for i in range(0, len(x), v.chunk):
                cbor(x[i:i + v.chunk], out)
        elif isinstance(x, list):
            out.append(0x9F)
            for item in x:
                cbor(item, out, starts)
        else:
            out.append(0xBF)
            for k, item in x.items():
                cbor(k, out, starts)
                cbor(item, out, starts)
        out.append(0xFF)
    elif isinstance(v, (list, tuple)):
        out += cbor_head(4, len(v))
        for item in v:
            cbor(item, out, starts)
    elif isinstance(v, dict):
        out += cbor_head(5, len(v))
        for k, item in v.items():
            cbor(k, out, starts)
            cbor(item, out, starts)
    else:
        raise TypeError(type(v))
    return out


def as_json(v):
    """What ckptfs shows for a CBOR value in JSON (man ckptfs(5), Burnpack): byte strings as
    lowercase hex, tags dropped, undefined as null, NaN/infinities as strings, non-text map
    keys as their own JSON text."""
    if isinstance(v, Tag):
        return as_json(v.value)
    if isinstance(v, Indef):
        return as_json(v.value)
    if isinstance(v, Width):
        return v.value
    if isinstance(v, Float):
        v = v.value
    if isinstance(v, float):
        if math.isnan(v):
            return "NaN"
        if math.isinf(v):
            return "Infinity" if v > 0 else "-Infinity"
        return v
    if v is UNDEFINED or v is None:
        return None
    if isinstance(v, bytes):
        return v.hex()
    if isinstance(v, (list, tuple)):
        return [as_json(x) for x in v]
    if isinstance(v, dict):
        out = {}
        for k, x in v.items():
            kj = as_json(k)
            out[kj if isinstance(kj, str) and isinstance(unwrap(k), str)
                else json.dumps(kj, separators=(", ", ": "))] = as_json(x)
        return out
    return v


def unwrap(v):
    while isinstance(v, (Tag, Indef)):
        v = v.value
    return v


# ---------------------------------------------------------------------------
# Burn dtypes: CBOR value -> (ckptfs dtype, bytes per element, numpy dtype of the payload)

UNIT_DTYPES = {
    "F64": ("F64", "<f8"), "F32": ("F32", "<f4"), "Flex32": ("F32", "<f4"),
    "F16": ("F16", "<f2"), "BF16": ("BF16", "<u2"), "I64": ("I64", "<i8"),
    "I32": ("I32", "<i4"), "I16": ("I16", "<i2"), "I8": ("I8", "|i1"),
    "U64": ("U64", "<u8"), "U32": ("U32", "<u4"), "U16": ("U16", "<u2"),
    "U8": ("U8", "|u1"), "Bool": ("BOOL", "|u1"),
}
BOOL_STORES = {"Native": ("BOOL", "|u1"), "U8": ("BOOL", "|u1"), "U32": ("U32", "<u4")}

# numpy_dtype the sidecar must show for a ckptfs dtype (None: numpy has none).
NUMPY_DTYPE = {"BOOL": "|b1", "U8": "|u1", "I8": "|i1", "U16": "<u2", "I16": "<i2",
               "F16": "<f2", "BF16": None, "U32": "<u4", "I32": "<i4", "F32": "<f4",
               "U64": "<u8", "I64": "<i8", "F64": "<f8"}

QFLOAT_SCHEME = {"QFloat": {"level": {"Block": [32]}, "mode": "Symmetric", "value": "Q4S",
                            "store": "U32", "param": "F32"}}


def ckptfs_dtype(burn_dtype):
    d = unwrap(burn_dtype)
    if isinstance(d, str):
        return UNIT_DTYPES[d]
    (k, v), = d.items()
    if unwrap(k) == "Bool":
        return BOOL_STORES[unwrap(v)]
    assert unwrap(k) == "QFloat"
    return ("U8", "|u1")


def payload(rng, burn_dtype, shape):
    """Deterministic raw little-endian bytes for a tensor."""
    n = int(np.prod(shape, dtype=np.int64)) if shape else 1
    d = unwrap(burn_dtype)
    if isinstance(d, dict) and "QFloat" in [unwrap(k) for k in d]:
        # 4-bit values packed 8 per u32 plus one f32 scale per block of 32: not numel x size.
        words = (n + 7) // 8
        blocks = (n + 31) // 32
        return rng.randint(0, 256, size=words * 4, dtype=np.uint8).tobytes() + \
            np.linspace(0.5, 1.5, blocks, dtype="<f4").tobytes()
    _, npd = ckptfs_dtype(burn_dtype)
    name = d if isinstance(d, str) else "Bool"
    if name in ("Bool",):
        return rng.randint(0, 2, size=n).astype(npd).tobytes()
    if npd[1] == "f":
        return rng.standard_normal(n).astype(npd).tobytes()
    if name == "BF16":
        return (rng.standard_normal(n).astype("<f4").view("<u4") >> 16).astype("<u2").tobytes()
    info = np.iinfo(np.dtype(npd))
    return rng.randint(max(info.min, -1000), min(info.max, 1000) + 1, size=n).astype(npd).tobytes()


# ---------------------------------------------------------------------------
# A Burnpack writer (format notes 2.1-2.7)


def align(v):
    return (v + ALIGN - 1) // ALIGN * ALIGN


class T:
    """A tensor in data (writer) order."""

    def __init__(self, name, burn_dtype, shape, data, param_id=None, descriptor=None):
        self.name, self.burn_dtype, self.shape, self.data = name, burn_dtype, list(shape), data
        self.param_id = param_id
        self.descriptor = descriptor  # replaces the generated descriptor when given


def descriptor_of(t, start, end):
    d = {"dtype": t.burn_dtype, "shape": t.shape, "data_offsets": [start, end]}
    if t.param_id is not None:
        d["param_id"] = t.param_id
    return d


def build(tensors, metadata=None, scalars=None, aligned=True, version=1, top=None,
          tensors_map=None, trailing=b"", pad_byte=0):
    """Returns (file bytes, data_start, {name: start}, cbor bytes)."""
    starts, end = {}, 0
    for t in tensors:
        start = align(end) if aligned else end
        starts[t.name] = start
        end = start + len(t.data)
    if tensors_map is None:
        tensors_map = {}
        for t in sorted(tensors, key=lambda t: t.name.encode("utf-8")):
            s = starts[t.name]
            tensors_map[t.name] = t.descriptor or descriptor_of(t, s, s + len(t.data))
    if top is None:
        top = {"tensors": tensors_map}
        if metadata:
            top["metadata"] = metadata
        if scalars:
            top["scalars"] = scalars
    blob = bytes(cbor(top))
    u = 10 + len(blob)
    data_start = align(u) if aligned else u
    out = bytearray(b"NRUB" + struct.pack("<HI", version, len(blob)) + blob)
    out += bytes([pad_byte]) * (data_start - u)
    for t in tensors:
        at = data_start + starts[t.name]
        out += b"\0" * (at - len(out))
        out += t.data
    return bytes(out) + trailing, data_start, starts, blob


# ---------------------------------------------------------------------------
# Manifests


def tree_path(name):
    # The good cases use ordinary names only: components are non-empty and have no
    # '%' or control bytes, so the tree path is the name with '.' as '/'.
    comps = name.replace("/", ".").split(".")
    assert all(c and "%" not in c and all(ord(ch) >= 0x20 and ch != "\x7f" for ch in c)
               for c in comps), name
    return "/".join(comps)


def write_case(outdir, case, tensors, file_bytes, data_start, starts, doc, note, warnings=()):
    d = os.path.join(outdir, "good", case)
    os.makedirs(d)
    with open(os.path.join(d, "model.bpk"), "wb") as f:
        f.write(file_bytes)
    paths = [tree_path(t.name) for t in tensors]
    assert len(set(paths)) == len(paths)
    for p in paths:  # no tensor may also be a directory (that would add ".raw")
        assert not any(q.startswith(p + "/") for q in paths), p
    rows = []
    for t in sorted(tensors, key=lambda t: t.name.encode("utf-8")):
        dtype, _ = ckptfs_dtype(t.burn_dtype)
        quantized = isinstance(unwrap(t.burn_dtype), dict) and \
            "QFloat" in [unwrap(k) for k in unwrap(t.burn_dtype)]
        shape = [len(t.data)] if quantized else t.shape
        row = {"name": t.name, "dtype": dtype, "shape": shape, "nbytes": len(t.data),
               "sha256": hashlib.sha256(t.data).hexdigest(), "path": tree_path(t.name),
               "offset": data_start + starts[t.name], "numpy_dtype": NUMPY_DTYPE[dtype],
               "burn_dtype": as_json(t.burn_dtype), "quantized": quantized}
        pid = unwrap(t.param_id)
        row["param_id"] = pid.value if isinstance(pid, Width) else pid
        if quantized:
            row["burn_shape"] = t.shape
        rows.append(row)
    # warnings: a needle for each warning summary.json must hold, and no other warning.
    manifest = {"source": "model.bpk", "note": note, "tensors": rows, "doc": doc,
                "warnings": list(warnings)}
    write_json(os.path.join(d, "manifest.json"), manifest, ensure_ascii=False)


def doc_of(blob, data_start, layout, ntensors, metadata=None, scalars=None, unknown=None,
           version=1):
    doc = {"version": version, "metadata_size": len(blob), "layout": layout,
           "data_start": data_start, "tensor_count": ntensors}
    if metadata is not None:
        doc["metadata"] = as_json(metadata)
    if scalars is not None:
        doc["scalars"] = as_json(scalars)
    if unknown is not None:
        doc["unknown_keys"] = as_json(unknown)
    return doc


def simple_case(outdir, case, tensors, note, metadata=None, scalars=None, aligned=True,
                version=1, trailing=b"", layout=None):
    fb, ds, starts, blob = build(tensors, metadata, scalars, aligned, version, trailing=trailing)
    doc = doc_of(blob, ds, layout or ("aligned" if aligned else "unaligned"), len(tensors),
                 metadata, scalars, version=version)
    warnings = ["%d bytes after the last tensor" % len(trailing)] if trailing else []
    write_case(outdir, case, tensors, fb, ds, starts, doc, note, warnings)
    return fb, ds, blob


BURN_STORE_METADATA = {"format": "burnpack", "producer": "burn", "version": "0.20.0"}


def good_cases(outdir, rng):
    unit = ["F64", "F32", "Flex32", "F16", "BF16", "I64", "I32", "I16", "I8",
            "U64", "U32", "U16", "U8", "Bool"]
    # burn 0.20.0-pre.5 .. 0.21.0-pre.2: aligned, Bool as text, BurnpackStore metadata.
    # Data order differs from key order, and sizes are odd so the 256-byte gaps show.
    shapes = [[3, 5], [7], [2, 3, 3], [11], [4, 4], [5], [3, 3], [9], [13], [2, 2], [6], [7], [17],
              [3, 7]]
    ts = []
    for i, (dt, shape) in enumerate(zip(unit, shapes)):
        name = "model.block%d.%s" % (i % 3, dt.lower())
        ts.append(T(name, dt, shape, payload(rng, dt, shape), param_id=0x83EB859ADFFB2071 + i))
    ts.reverse()
    simple_case(outdir, "aligned-all-dtypes", ts,
                "every unit dtype, text Bool, aligned layout (burn 0.20.0-pre.5..0.21.0-pre.2)",
                metadata=BURN_STORE_METADATA)

    # burn >= 0.21.0-pre.3 / burn-pack 0.22: {"Bool": store}, scalars, raw writer (no metadata).
    ts = [T("mask.native", {"Bool": "Native"}, [4, 3], b""),
          T("mask.u8", {"Bool": "U8"}, [5], b""),
          T("mask.u32", {"Bool": "U32"}, [2, 3], b"", param_id=7),
          T("proj.weight", "F32", [8, 4], b"", param_id=2 ** 64 - 1),
          T("proj.bias", "F32", [4], b"")]
    for t in ts:
        t.data = payload(rng, t.burn_dtype, t.shape)
    scalars = {"delta": {"Int": -3}, "done": {"Bool": True}, "epoch": {"UInt": 12},
               "loss": {"Float": 1.5}, "lr": {"Float": 0.001}, "scale": {"Float": 3.140625}}
    simple_case(outdir, "bool-map-scalars", ts,
                "Bool as {\"Bool\": store} in all three stores, scalars, no metadata key",
                scalars=scalars)

    # burn 0.19 .. 0.20.0-pre.4: unaligned, packed tensors.
    ts = [T("enc.w", "F32", [3, 5], b"", param_id=1), T("enc.b", "F32", [5], b"", param_id=2),
          T("enc.flag", "Bool", [3], b""), T("dec.w", "F16", [5, 3], b"", param_id=3),
          T("dec.idx", "I64", [4], b"")]
    for t in ts:
        t.data = payload(rng, t.burn_dtype, t.shape)
    simple_case(outdir, "unaligned", ts, "older layout: data right after the CBOR, packed",
                metadata=dict(BURN_STORE_METADATA, version="0.19.1"), aligned=False)

    # Unaligned with a single tensor at start 0: only the file size tells the layouts apart.
    ts = [T("only.weight", "F32", [6, 6], b"", param_id=99)]
    ts[0].data = payload(rng, "F32", [6, 6])
    simple_case(outdir, "unaligned-one-tensor", ts,
                "unaligned, every start a multiple of 256: decided by file size", aligned=False)

    # Quantized tensors: opaque bytes.
    ts = [T("q.weight", QFLOAT_SCHEME, [4, 64], b"", param_id=11),
          T("q.bias", "F32", [4], b"", param_id=12),
          T("q.odd", {"QFloat": {"value": "Q8S", "level": "Tensor", "mode": "Symmetric",
                                 "store": "Native", "param": "F16"}}, [3, 5], b"")]
    for t in ts:
        t.data = payload(rng, t.burn_dtype, t.shape)
    simple_case(outdir, "quantized", ts, "QFloat tensors shown as U8 [nbytes]",
                metadata=BURN_STORE_METADATA)

    # Edges: 0-d and empty tensors, deep dotted names, nested metadata, and CBOR that Burn
    # does not write but a tolerant reader accepts (indefinite lengths, tags, wide integers,
    # null param_id, unknown keys).
    ts = [T("scalar", "F64", [], b"", param_id=Width(5, 8)),
          T("empty.vec", "F32", [0], b""),
          T("empty.mat", "I32", [3, 0, 2], b"", param_id=None),
          T("encoder.layers.0.attention.query.weight", "BF16", [4, 8], b"", param_id=Width(42, 4)),
          T("encoder.layers.0.attention.query.bias", "BF16", [8], b""),
          T("encoder.layers.1.mlp.fc1.weight", "F16", [8, 3], b""),
          T("décodeur.poids", "U16", [3], b""),
          T("tags.everywhere", Tag(24, "I8"), [5], b"")]
    for t in ts:
        t.data = payload(rng, t.burn_dtype, t.shape)
    starts, end = {}, 0
    for t in ts:
        starts[t.name] = align(end)
        end = starts[t.name] + len(t.data)
    tmap = {}
    for t in sorted(ts, key=lambda t: t.name.encode("utf-8")):
        s = starts[t.name]
        d = descriptor_of(t, s, s + len(t.data))
        if t.name == "empty.mat":
            d["param_id"] = None
        if t.name == "encoder.layers.0.attention.query.weight":
            d = Indef({"unknown_field": {"nested": [1, 2, {"x": b"\x00\xff"}]},
                       Indef("dtype"): d["dtype"], "shape": Indef(d["shape"]),
                       "data_offsets": [Width(s, 8), Width(s + len(t.data), 4)],
                       "param_id": d["param_id"]})
        if t.name == "tags.everywhere":
            d = {"dtype": d["dtype"], "shape": Tag(55799, [Tag(1000, 5)]),
                 "data_offsets": Tag(1, [s, s + len(t.data)]), "param_id": Tag(100, 77)}
            t.param_id = 77
        tmap[Indef(t.name, 4) if t.name == "scalar" else t.name] = d
    metadata = {"format": "burnpack", "producer": "burn", "version": "0.21.0",
                "nested": {"list": [1, -2, -(2 ** 64), 2 ** 64 - 1, 1.5, 0.1, True, False, None],
                           "map": {"a": {"b": {"c": "deep"}}}, "bytes": b"\x01\xab",
                           "indef": Indef([Indef("chunked text", 5), Indef(b"\x00\x01\x02", 2)]),
                           "undefined": UNDEFINED, "nan": float("nan"),
                           "inf": Float(float("-inf"), 32), "half": Float(0.5, 16)},
                "unicode": "naïve ☃", 7: "int key", "tagged": Tag(0, "2026-01-01T00:00:00Z")}
    unknown = {"future_key": [1, {"two": 2}]}
    top = Tag(55799, Indef({"tensors": Indef(tmap), "metadata": metadata, "future_key":
                            unknown["future_key"]}))
    fb, ds, st, blob = build(ts, top=top)
    assert st == starts
    doc = doc_of(blob, ds, "aligned", len(ts), metadata, None, unknown)
    write_case(outdir, "edge", ts, fb, ds, starts, doc,
               "0-d/empty tensors, nested metadata, indefinite lengths, tags, wide integers")

    # 10 + M a multiple of 256: both layouts agree.
    ts = [T("w", "F32", [2], struct.pack("<2f", 1.0, 2.0))]
    meta = next({"pad": "x" * n} for n in range(600)
                if (10 + len(build(ts, metadata={"pad": "x" * n})[3])) % ALIGN == 0)
    fb, ds, blob = simple_case(outdir, "metadata-ends-on-256", ts,
                               "10 + metadata_size is a multiple of 256", metadata=meta)
    assert ds == 10 + len(blob)

    # The hand-built example of the notes (2.8): one tensor w = [1.0, 2.0].
    ts = [T("w", "F32", [2], struct.pack("<2f", 1.0, 2.0))]
    fb, ds, blob = simple_case(outdir, "notes-example", ts, "format notes 2.8 minimal example")
    assert len(blob) == 47 and ds == 256 and len(fb) == 264

    # No tensors at all; version 0 (Burn refuses only versions above 1).
    fb, ds, blob = simple_case(outdir, "no-tensors", [], "an empty tensors map",
                               metadata=BURN_STORE_METADATA)
    assert len(fb) == ds
    ts = [T("v0.weight", "U8", [10], bytes(range(10)))]
    simple_case(outdir, "version-0", ts, "version 0 is accepted", version=0)

    # Trailing bytes after the last tensor: zero padding decides "aligned".
    ts = [T("t.a", "F32", [3], payload(rng, "F32", [3])), T("t.b", "I16", [5], b"")]
    ts[1].data = payload(rng, "I16", [5])
    simple_case(outdir, "aligned-trailing-bytes", ts, "100 junk bytes after the data",
                trailing=b"\xee" * 100)


# ---------------------------------------------------------------------------
# The real sample, read here with a minimal CBOR decoder (no libcbor, no core/).


def cbor_decode(buf, pos=0):
    ib = buf[pos]
    major, ai = ib >> 5, ib & 31
    pos += 1
    if ai < 24:
        arg = ai
    elif ai in (24, 25, 26, 27):
        w = 1 << (ai - 24)
        arg = int.from_bytes(buf[pos:pos + w], "big")
        pos += w
    else:
        raise ValueError("unsupported CBOR item 0x%02x" % ib)
    if major == 0:
        return arg, pos
    if major == 1:
        return -1 - arg, pos
    if major in (2, 3):
        s = buf[pos:pos + arg]
        return (s if major == 2 else s.decode("utf-8")), pos + arg
    if major == 4:
        out = []
        for _ in range(arg):
            v, pos = cbor_decode(buf, pos)
            out.append(v)
        return out, pos
    if major == 5:
        out = {}
        for _ in range(arg):
            k, pos = cbor_decode(buf, pos)
            out[k], pos = cbor_decode(buf, pos)
        return out, pos
    if major == 6:
        return cbor_decode(buf, pos)
    if major == 7 and ai == 27:
        return struct.unpack(">d", buf[pos - 8:pos])[0], pos
    raise ValueError("unsupported CBOR item 0x%02x" % ib)


def mnist_case(outdir, repo_root):
    d = os.path.join(outdir, "good", "mnist")
    os.makedirs(d)
    src = os.path.join(repo_root, "tests", "fixtures", "burnpack", "burn-mnist.bpk")
    manifest = {"source": src, "note": "real Burn file: tracel-ai/burn examples/mnist-inference-web"}
    if not os.path.isfile(src):
        manifest["skip"] = "sample %s is missing" % src
    else:
        with open(src, "rb") as f:
            data = f.read()
        assert data[:4] == b"NRUB"
        version, msize = struct.unpack("<HI", data[4:10])
        meta, end = cbor_decode(data, 10)
        assert end == 10 + msize
        data_start = align(10 + msize)
        rows = []
        for name, desc in sorted(meta["tensors"].items(), key=lambda kv: kv[0].encode()):
            s, e = desc["data_offsets"]
            raw = data[data_start + s:data_start + e]
            dtype, _ = UNIT_DTYPES[desc["dtype"]]
            rows.append({"name": name, "dtype": dtype, "shape": desc["shape"], "nbytes": e - s,
                         "sha256": hashlib.sha256(raw).hexdigest(), "path": tree_path(name),
                         "offset": data_start + s, "numpy_dtype": NUMPY_DTYPE[dtype],
                         "burn_dtype": desc["dtype"], "quantized": False,
                         "param_id": desc.get("param_id")})
        assert len(rows) == 18 and len(data) == data_start + max(
            t["data_offsets"][1] for t in meta["tensors"].values())
        manifest["tensors"] = rows
        manifest["doc"] = {"version": version, "metadata_size": msize, "layout": "aligned",
                           "data_start": data_start, "tensor_count": len(rows)}
    write_json(os.path.join(d, "manifest.json"), manifest)


# ---------------------------------------------------------------------------
# Hostile inputs


class Hostile:
    def __init__(self, outdir):
        self.dir = os.path.join(outdir, "hostile")
        os.makedirs(self.dir)
        self.rows, self.names = [], {}

    def add(self, fname, data, expect, needle, desc, names=None):
        assert "\t" not in desc and fname not in [r[0] for r in self.rows], fname
        with open(os.path.join(self.dir, fname), "wb") as f:
            f.write(data)
        self.rows.append((fname, expect, needle, desc))
        if names is not None:
            self.names[fname] = names

    def refuse(self, fname, data, needle, desc):
        self.add(fname, data, "refuse", needle, desc)

    def finish(self):
        write_cases(self.dir, self.rows)
        write_json(os.path.join(self.dir, "mount-names.json"), self.names, newline=False)


def header(msize, version=1, magic=b"NRUB"):
    return magic + struct.pack("<HI", version, msize)


def with_blob(blob, data=b"", aligned=True, version=1, declared=None):
    """A file around a hand-made CBOR blob."""
    u = 10 + len(blob)
    pad = (align(u) - u) if aligned else 0
    return header(len(blob) if declared is None else declared, version) + blob + b"\0" * pad + data


def one_tensor(desc, data=b"\0" * 16, extra_top=None, name="t"):
    top = {"tensors": {name: desc}}
    top.update(extra_top or {})
    return with_blob(bytes(cbor(top)), data)


F32_4 = {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}


def hostile_cases(outdir, rng):
    h = Hostile(outdir)
    # The base file: two tensors, param_ids, metadata.  Cut at every header field, every CBOR
    # item boundary, the padding, and the data.
    ts = [T("a.weight", "F32", [4, 4], payload(rng, "F32", [4, 4]), param_id=1),
          T("a.bias", "F32", [4], payload(rng, "F32", [4]), param_id=2)]
    base, ds, starts, blob = build(ts, metadata={"k": "v"})
    h.add("base.bpk", base, "mount", "", "the undamaged base file", ["a.weight", "a.bias"])
    top = {"tensors": {t.name: descriptor_of(t, starts[t.name], starts[t.name] + len(t.data))
                       for t in sorted(ts, key=lambda t: t.name.encode())},
           "metadata": {"k": "v"}}
    item_starts = []
    assert bytes(cbor(top, starts=item_starts)) == blob
    cuts = {0: "format|magic", 2: "format|magic", 4: "header", 6: "header", 8: "header",
            10: "metadata_size"}
    for s in sorted(set(item_starts)):
        cuts.setdefault(10 + s, "metadata_size")
    u = 10 + len(blob)
    for c in (u, u + 1, ds, ds + 1):
        cuts[c] = "data_offsets"
    for t in ts:
        a = ds + starts[t.name]
        cuts[a] = cuts[a + len(t.data) - 1] = "data_offsets"
    cuts[len(base) - 1] = "data_offsets"
    for c, needle in sorted(cuts.items()):
        h.refuse("trunc-%04d.bpk" % c, base[:c], needle,
                 "base file cut to %d bytes (field boundary)" % c)

    # Header.
    h.refuse("magic-bad.bpk", b"NRUC" + base[4:], "format|magic", "wrong magic")
    h.refuse("magic-be.bpk", b"BURN" + base[4:], "format|magic", "magic written big-endian")
    h.refuse("version-2.bpk", base[:4] + struct.pack("<H", 2) + base[6:], "version",
             "version 2")
    h.refuse("version-ffff.bpk", base[:4] + b"\xff\xff" + base[6:], "version", "version 65535")
    for name, m, desc in (("msize-huge.bpk", 0xFFFFFFFF, "metadata_size 2^32-1"),
                          ("msize-limit.bpk", METADATA_LIMIT + 1, "metadata_size 100 MiB + 1"),
                          ("msize-past-eof.bpk", len(base) - 9, "metadata_size one past EOF"),
                          ("msize-zero.bpk", 0, "metadata_size 0")):
        h.refuse(name, base[:6] + struct.pack("<I", m) + base[10:], "metadata_size", desc)
    h.refuse("msize-short.bpk", base[:6] + struct.pack("<I", len(blob) - 5) + base[10:],
             "metadata", "metadata_size cuts the CBOR short")

    # CBOR structure.
    def blob_case(fname, top_value, needle, desc, data=b"\0" * 16):
        h.refuse(fname, with_blob(bytes(cbor(top_value)), data), needle, desc)

    deep = Raw(b"\x81" * 10000 + b"\x00")
    blob_case("nest-array-10000.bpk", {"tensors": {}, "metadata": {"x": deep}}, "nesting",
              "metadata value nested 10000 arrays deep")
    blob_case("nest-map-10000.bpk",
              {"tensors": {}, "metadata": {"x": Raw(b"\xa1\x61k" * 10000 + b"\x00")}}, "nesting",
              "metadata value nested 10000 maps deep")
    blob_case("nest-indef-10000.bpk",
              {"tensors": {}, "metadata": {"x": Raw(b"\x9f" * 10000 + b"\xff" * 10000)}},
              "nesting", "10000 nested indefinite arrays")
    # A chain of tags is no nesting: the reader skips tags in a loop and keeps the value.
    h.add("tags-10000.bpk", with_blob(bytes(cbor({"tensors": {}, "metadata": {
        "x": Raw(b"\xd8\x64" * 10000 + b"\x00")}}))), "mount", "", "10000 tags on one value",
          [])
    blob_case("nest-descriptor.bpk", {"tensors": {"t": dict(F32_4, junk=deep)}}, "nesting",
              "unknown descriptor key nested 10000 deep")
    blob_case("nest-qfloat.bpk", {"tensors": {"t": dict(F32_4, dtype={"QFloat": deep})}},
              "nesting", "QFloat scheme nested 10000 deep")
    blob_case("nest-top.bpk", Raw(b"\x81" * 10000 + b"\xa0"), "map",
              "top level is an array nested 10000 deep")
    blob_case("top-array.bpk", [1, 2], "map", "top level is an array")
    blob_case("top-int.bpk", 7, "map", "top level is an integer")
    blob_case("top-break.bpk", Raw(b"\xff"), "break", "top level is a stray break")
    blob_case("reserved-byte.bpk", {"tensors": {}, "metadata": {"x": Raw(b"\x1c")}},
              "malformed", "reserved CBOR additional info 28")
    blob_case("simple-unassigned.bpk", {"tensors": {}, "metadata": {"x": Raw(b"\xf8\x20")}},
              "malformed", "unassigned one-byte simple value")
    blob_case("text-len-huge.bpk", {"tensors": {}, "metadata": {"x": Raw(b"\x7b" + b"\x40" +
                                                                           b"\0" * 7)}},
              "metadata", "text string claims 2^62 bytes")
    blob_case("bytes-len-max.bpk", {"tensors": {}, "metadata": {"x": Raw(b"\x5b" + b"\xff" * 8)}},
              "metadata", "byte string claims 2^64-1 bytes")
    blob_case("array-count-huge.bpk", {"tensors": {}, "metadata": {"x": Raw(b"\x9b" + b"\x7f" +
                                                                             b"\xff" * 7)}},
              "count", "array claims 2^63 elements")
    blob_case("map-count-huge.bpk", {"tensors": {}, "metadata": Raw(b"\xbb" + b"\x10" +
                                                                     b"\0" * 7)},
              "count", "metadata map claims 2^60 entries")
    blob_case("tensors-count-huge.bpk", {"tensors": Raw(b"\xbb" + b"\xff" * 8)}, "tensors",
              "tensors map claims 2^64-1 entries")
    blob_case("tensors-count-200k.bpk", {"tensors": Raw(b"\xba\x00\x03\x0d\x40")}, "tensors",
              "tensors map claims 200000 entries (Burn's limit is 100000)")
    blob_case("break-in-definite.bpk", {"tensors": {}, "metadata": {"x": Raw(b"\x82\x01\xff")}},
              "break", "break inside a definite array")
    blob_case("break-as-value.bpk", {"tensors": {}, "metadata": Raw(b"\xbf\x61k\xff")}, "break",
              "break where an indefinite map's value belongs")
    blob_case("chunk-wrong-type.bpk", {"tensors": {}, "metadata": {"x": Raw(b"\x7f\x41a\xff")}},
              "chunk", "indefinite text string with a byte-string chunk")
    blob_case("tag-then-break.bpk", {"tensors": {}, "metadata": {"x": Raw(b"\xc1\xff")}},
              "break", "tag followed by a break")

    # Top-level schema.
    blob_case("no-tensors.bpk", {"metadata": {"a": "b"}}, "tensors", "no \"tensors\" key")
    blob_case("tensors-array.bpk", {"tensors": [1]}, "tensors", "tensors is an array")
    blob_case("tensors-twice.bpk", Raw(b"\xa2" + bytes(cbor("tensors")) + b"\xa0" +
                                      bytes(cbor("tensors")) + b"\xa0"), "tensors",
              "\"tensors\" key twice")
    blob_case("metadata-text.bpk", {"tensors": {}, "metadata": "oops"}, "metadata",
              "metadata is a text string")
    blob_case("scalars-array.bpk", {"tensors": {}, "scalars": [1]}, "scalars",
              "scalars is an array")
    blob_case("name-int.bpk", {"tensors": {5: F32_4}}, "tensor name", "tensor name is an integer")
    blob_case("descriptor-text.bpk", {"tensors": {"t": "F32"}}, "descriptor",
              "descriptor is a text string")

    # Descriptor fields: wrong types, missing, duplicated, unknown values.
    def desc_case(fname, desc, needle, what, data=b"\0" * 16):
        h.refuse(fname, one_tensor(desc, data), needle, what)

    for fname, dt, what in (("dtype-int.bpk", 3, "dtype is an integer"),
                            ("dtype-unknown.bpk", "F8", "dtype \"F8\""),
                            ("dtype-lowercase.bpk", "f32", "dtype \"f32\""),
                            ("dtype-bool-u16.bpk", {"Bool": "U16"}, "Bool store U16"),
                            ("dtype-bool-int.bpk", {"Bool": 1}, "Bool store is an integer"),
                            ("dtype-variant.bpk", {"Complex": "F32"}, "unknown variant"),
                            ("dtype-map-2.bpk", {"Bool": "U8", "QFloat": {}},
                             "dtype map with 2 entries"),
                            ("dtype-map-empty.bpk", {}, "empty dtype map"),
                            ("dtype-indef-2.bpk", Indef({"Bool": "U8", "X": 1}),
                             "indefinite dtype map with 2 entries"),
                            ("dtype-key-int.bpk", {1: "U8"}, "dtype variant is an integer"),
                            ("dtype-qfloat-huge.bpk", {"QFloat": "x" * 5000},
                             "QFloat scheme of 5000 bytes (limit 1024 bytes of JSON)")):
        desc_case(fname, dict(F32_4, dtype=dt), "dtype", what)
    desc_case("shape-text.bpk", dict(F32_4, shape="4"), "shape", "shape is text")
    desc_case("shape-negative.bpk", dict(F32_4, shape=[-4]), "shape", "negative dim")
    desc_case("shape-float.bpk", dict(F32_4, shape=[4.0]), "shape", "float dim")
    desc_case("shape-33-dims.bpk", dict(F32_4, shape=[1] * 32 + [4]), "shape", "33 dims")
    desc_case("shape-overflow.bpk", dict(F32_4, shape=[2 ** 32, 2 ** 32, 4]), "shape",
              "numel overflows 64 bits")
    desc_case("shape-overflow-bytes.bpk", dict(F32_4, shape=[2 ** 62, 1]), "shape",
              "numel fits, bytes overflow")
    desc_case("shape-mismatch.bpk", dict(F32_4, shape=[5]), "data_offsets",
              "shape needs 20 bytes, offsets span 16")
    desc_case("offsets-3.bpk", dict(F32_4, data_offsets=[0, 8, 16]), "data_offsets",
              "3 data_offsets")
    desc_case("offsets-1.bpk", dict(F32_4, data_offsets=[16]), "data_offsets", "1 data_offset")
    desc_case("offsets-text.bpk", dict(F32_4, data_offsets="0-16"), "data_offsets",
              "data_offsets is text")
    desc_case("offsets-negative.bpk", dict(F32_4, data_offsets=[-16, 0]), "data_offsets",
              "negative start")
    desc_case("offsets-reversed.bpk", dict(F32_4, data_offsets=[16, 0]), "data_offsets",
              "end before start")
    desc_case("offsets-past-eof.bpk", dict(F32_4, data_offsets=[256, 272]), "data_offsets",
              "tensor past the end of the file")
    desc_case("offsets-huge.bpk", dict(F32_4, data_offsets=[2 ** 64 - 16, 2 ** 64 - 1],
                                       shape=[15], dtype="U8"), "data_offsets",
              "offsets near 2^64 (data_start + start overflows)")
    desc_case("param-text.bpk", dict(F32_4, param_id="7"), "param_id", "param_id is text")
    desc_case("param-negative.bpk", dict(F32_4, param_id=-7), "param_id", "param_id negative")
    desc_case("param-float.bpk", dict(F32_4, param_id=7.5), "param_id", "param_id is a float")
    desc_case("missing-dtype.bpk", {"shape": [4], "data_offsets": [0, 16]}, "dtype",
              "no dtype")
    desc_case("missing-shape.bpk", {"dtype": "F32", "data_offsets": [0, 16]}, "shape",
              "no shape")
    desc_case("missing-offsets.bpk", {"dtype": "F32", "shape": [4]}, "data_offsets",
              "no data_offsets")
    h.refuse("shape-twice.bpk", with_blob(bytes(cbor({"tensors": {"t": Raw(
        b"\xa4" + bytes(cbor("dtype")) + bytes(cbor("F32")) + bytes(cbor("shape")) +
        bytes(cbor([4])) + bytes(cbor("shape")) + bytes(cbor([4])) +
        bytes(cbor("data_offsets")) + bytes(cbor([0, 16])))}})), b"\0" * 16), "shape",
             "descriptor key \"shape\" twice")
    h.refuse("duplicate-names.bpk", with_blob(bytes(cbor({"tensors": Raw(
        b"\xa2" + bytes(cbor("t")) + bytes(cbor(F32_4)) + bytes(cbor("t")) +
        bytes(cbor(F32_4)))})), b"\0" * 16), "duplicate", "the same tensor name twice")

    # Data section.
    two = {"a": {"dtype": "F32", "shape": [8], "data_offsets": [0, 32]},
           "b": {"dtype": "F32", "shape": [8], "data_offsets": [16, 48]}}
    h.refuse("overlap.bpk", with_blob(bytes(cbor({"tensors": two})), b"\0" * 48), "overlap",
             "two tensors share 16 bytes")
    same = {"a": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]},
            "b": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}}
    h.refuse("overlap-same.bpk", with_blob(bytes(cbor({"tensors": same})), b"\0" * 8),
             "overlap", "two tensors with identical offsets")
    inner = {"a": {"dtype": "U8", "shape": [64], "data_offsets": [0, 64]},
             "b": {"dtype": "U8", "shape": [4], "data_offsets": [8, 12]},
             "c": {"dtype": "U8", "shape": [4], "data_offsets": [30, 34]}}
    h.refuse("overlap-nested.bpk", with_blob(bytes(cbor({"tensors": inner})), b"\0" * 64),
             "overlap", "a tensor inside another")

    # Mounted safely: odd but valid.
    h.add("trailing-cbor.bpk", with_blob(bytes(cbor({"tensors": {"t": F32_4}})) + b"\xff\x00junk",
                                         b"\0" * 16), "mount", "",
          "junk after the CBOR item inside metadata_size", ["t"])
    h.add("empty-tensors.bpk", with_blob(bytes(cbor({"tensors": {
        "z1": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]},
        "z2": {"dtype": "U8", "shape": [0, 5], "data_offsets": [16, 16]},
        "t": F32_4}})), b"\0" * 16), "mount", "", "zero-length tensors", ["z1", "z2", "t"])
    h.refuse("empty-past-eof.bpk", with_blob(bytes(cbor({"tensors": {
        "z": {"dtype": "U8", "shape": [0, 5], "data_offsets": [4096, 4096]},
        "t": F32_4}})), b"\0" * 16), "data_offsets",
             "zero-length tensor placed past the end of the file (Burn refuses it too)")
    odd = ["..", ".", "a..b", "ctl\x01\n.x", "%41", "slash/name", "a" * 300, "", "a", "a.b"]
    tm, data = {}, b""
    for i, n in enumerate(odd):
        tm[n] = {"dtype": "U8", "shape": [1], "data_offsets": [i, i + 1]}
        data += bytes([i])
    h.add("odd-names.bpk", with_blob(bytes(cbor({"tensors": tm})), data, aligned=False), "mount",
          "", "names that need escaping in the tree", odd)
    h.add("padding-nonzero.bpk", build([T("p", "U8", [4], b"abcd")], pad_byte=0x55,
                                       trailing=b"zz")[0], "mount", "",
          "non-zero padding and trailing bytes: read as the unaligned layout", ["p"])
    bound_cases(h)
    h.finish()
    return len(h.rows)


def bound_cases(h):
    """Every length/offset/count check at exactly its bound (mounts), one under and one over
    (bound-*.bpk). Needles name the specific complaint, so that a neighbouring check cannot
    stand in for a check that moved by one."""
    empty = {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}
    # The 10-byte header: a 9-byte file is too short for it; a 10-byte one has it, with a
    # metadata_size of 0.
    h.refuse("bound-file-9.bpk", header(0)[:9], "too short", "9-byte file: no whole header")
    h.refuse("bound-file-10.bpk", header(0), "no CBOR", "10-byte file: header, metadata_size 0")
    # metadata_size against Burn's limit (100 MiB) and against the file.
    blob = bytes(cbor({"tensors": {"e": empty}}))
    for m, needle in ((METADATA_LIMIT, "past the end"), (METADATA_LIMIT + 1, "limit")):
        h.refuse("bound-msize-%d.bpk" % m, header(m) + blob, needle,
                 "metadata_size %d in a %d-byte file (limit %d)"
                 % (m, 10 + len(blob), METADATA_LIMIT))
    h.add("bound-msize-to-eof.bpk", header(len(blob)) + blob, "mount", "",
          "metadata ends at the end of the file (one empty tensor, no data section)", ["e"])
    h.refuse("bound-msize-eof-plus-1.bpk", header(len(blob) + 1) + blob, "past the end of the file",
             "metadata_size one byte more than the file holds after the header")
    # The CBOR item reader: metadata ending exactly between two items, and one byte into an
    # item's argument.
    top = bytes(cbor({"tensors": {"t": F32_4}}))
    key_end = len(bytes(cbor({"tensors": 0}))) - 1  # map head + "tensors"
    h.refuse("bound-cbor-cut-between.bpk", header(key_end) + top[:key_end], "middle of a CBOR",
             "metadata_size ends right after the \"tensors\" key, where its value belongs")
    cut = bytes(cbor({"tensors": {"t": {"dtype": "F32", "shape": [Width(4, 4)]}}}))
    h.refuse("bound-cbor-cut-inside.bpk", header(len(cut) - 1) + cut[:-1],
             "runs past the end of the metadata",
             "metadata_size ends one byte into a 4-byte integer argument")
    # Declared counts against the bytes left: every member takes at least one byte (two for a
    # map entry). The metadata value is the last item, with one spare byte after it.
    for kind, k, room, ok in (("array", 6, 6, True), ("array", 7, 6, False),
                              ("map", 3, 7, True), ("map", 4, 7, False)):
        if kind == "array":
            head, body = cbor_head(4, k), b"\x00" * min(k, room)
        else:  # keys 0, 1, 2 ...: one byte each, all different
            head = cbor_head(5, k)
            body = b"".join(bytes([i, 0]) for i in range(min(k, room // 2)))
        blob = bytes(cbor({"tensors": {}, "metadata": {"x": Raw(bytes(head) + body)}}))
        blob += b"\x00" * (room - len(body))
        name = "bound-count-%s-%d-in-%d.bpk" % (kind, k, room)
        desc = "metadata %s declaring %d members with %d bytes left" % (kind, k, room)
        if ok:
            h.add(name, with_blob(blob), "mount", "", desc, [])
        else:
            h.refuse(name, with_blob(blob), "exceeds the", desc)
    # The tensors map against Burn's MAX_TENSOR_COUNT (100000): a definite map declaring
    # 100001 is refused by the limit, one declaring 100000 (in a small file) by its size.
    for k, needle in ((100000, "bytes left"), (100001, "limit of 100000")):
        blob = bytes(cbor({"tensors": Raw(bytes(cbor_head(5, k)))}))
        h.refuse("bound-tensors-declared-%d.bpk" % k, with_blob(blob), needle,
                 "tensors map declaring %d entries" % k)
    # An indefinite map is counted as it is read: the 100000th entry is still read (its bad
    # dtype is the complaint), the 100001st is refused by the limit.
    for k, needle in ((100000, "dtype"), (100001, "limit of 100000")):
        entries = b"".join(bytes(cbor("%x" % i)) + bytes(cbor(empty)) for i in range(k - 1))
        last = bytes(cbor("last")) + bytes(cbor({"dtype": "F99", "shape": [0],
                                                  "data_offsets": [0, 0]}))
        blob = bytes(cbor({"tensors": Raw(b"\xbf" + entries + last + b"\xff")}))
        h.refuse("bound-tensors-indef-%d.bpk" % k, with_blob(blob), needle,
                 "indefinite tensors map of %d entries, the last with dtype F99" % k)
    # Shape dims: 32 is the most (CKPT_MAX_DIMS).
    for nd in (32, 33):
        d = {"dtype": "U8", "shape": [1] * nd, "data_offsets": [0, 1]}
        name = "bound-ndim-%d.bpk" % nd
        if nd == 32:
            h.add(name, one_tensor(d, b"\1"), "mount", "", "shape of 32 dims of 1", ["t"])
        else:
            h.refuse(name, one_tensor(d, b"\1"), "dims", "shape of 33 dims of 1")
    # data_offsets: end == start is an empty tensor, end one below start is refused; exactly
    # two entries.
    h.add("bound-offsets-empty.bpk", one_tensor({"dtype": "F32", "shape": [0],
                                                 "data_offsets": [4, 4]}), "mount", "",
          "data_offsets [4, 4]: empty", ["t"])
    h.refuse("bound-offsets-end-minus-1.bpk", one_tensor({"dtype": "F32", "shape": [0],
                                                          "data_offsets": [4, 3]}),
             "before|below|less", "data_offsets [4, 3]")
    for n, needle in ((1, "1 entries"), (3, "more than 2")):
        h.refuse("bound-offsets-%d-entries.bpk" % n,
                 one_tensor({"dtype": "F32", "shape": [4], "data_offsets": [0, 16, 16][:n]}),
                 needle, "data_offsets of %d entries" % n)
    # The byte span against shape x element size: equal (mounts), one over, one under.
    for span, needle in ((8, ""), (9, "span 9 bytes"), (7, "span 7 bytes")):
        d = {"dtype": "F32", "shape": [2], "data_offsets": [0, span]}
        name = "bound-span-%d.bpk" % span
        if needle:
            h.refuse(name, one_tensor(d, b"\1" * span), needle + " but shape [2] of F32 needs 8",
                     "F32 [2] needs 8 bytes, data_offsets span %d" % span)
        else:
            h.add(name, one_tensor(d, b"\1" * 8), "mount", "", "F32 [2] in 8 bytes", ["t"])
    # The data section against the file (unaligned, packed): the last tensor ending at the end
    # of the file, one byte past it; tiling: adjacent, one byte of overlap, one byte apart.
    def two(b_start, data_len):
        tm = {"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
              "b": {"dtype": "U8", "shape": [3], "data_offsets": [b_start, b_start + 3]}}
        return with_blob(bytes(cbor({"tensors": tm})), b"\2" * data_len, aligned=False)
    h.add("bound-tile-adjacent.bpk", two(4, 7), "mount", "", "a [0,4) b [4,7)", ["a", "b"])
    h.refuse("bound-tile-overlap-1.bpk", two(3, 7), "overlap", "a [0,4) b [3,6)")
    h.add("bound-tile-gap-1.bpk", two(5, 8), "mount", "", "a [0,4) b [5,8)", ["a", "b"])
    h.refuse("bound-data-eof-plus-1.bpk", two(4, 6), "past the end of the file",
             "a [0,4) b [4,7) in a 6-byte data section")


def bound_good_cases(outdir):
    """The accepted side of the data-section bound, bytes checked against the manifest: the
    last tensor ends exactly at the end of the file (aligned and unaligned), and one byte
    before it."""
    ts = [T("w", "U8", [300], bytes(range(256)) + bytes(range(44))),
          T("b", "U8", [5], b"\1\2\3\4\5")]
    simple_case(outdir, "bound-aligned-to-eof", ts, "the last tensor ends at the end of the file")
    simple_case(outdir, "bound-unaligned-to-eof", ts, "unaligned: the last tensor ends at EOF",
                aligned=False)
    simple_case(outdir, "bound-unaligned-eof-minus-1", ts,
                "unaligned: one trailing byte after the last tensor", aligned=False,
                trailing=b"\0")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    outdir = sys.argv[1]
    repo_root = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                              ".."))
    fresh_dir(outdir)
    os.makedirs(os.path.join(outdir, "good"))
    rng = np.random.RandomState(20260321)
    good_cases(outdir, rng)
    mnist_case(outdir, repo_root)
    bound_good_cases(outdir)
    hostile_cases(outdir, rng)


if __name__ == "__main__":
    main()
