#!/usr/bin/python3
"""The GGUF writer (core/write/writers/gguf.c) through convert_tool.

Environment: CKPTFS, FIXTURES, TOOLS (see tests/lib/readers/convert_check.py).

Conversions from every source format the fixtures have (safetensors file and
HF shards, GGUF v2/v3 with block types and a split model, DCP-HF assembled
tensors, DCP, torch zip, MLFramework, gpt-rs, .lwt, and small safetensors
files made here for scalars, empty and 4-dim tensors and 63-byte names) must
be accepted by the strict reader tests/lib/readers/gguf_reader.py (ggml's
packed, aligned layout), hold each model tensor with the source's dtype, shape
and bytes, and mount with ckptfs. KVs: general.alignment and
ckptfs.source_format always; from a GGUF source its KVs, copied with their
types and bytes. Converting the output again gives the same bytes.
Refusals (dtypes ggml lacks, incomplete tensors, 5 dims, 64-byte names, a NUL
in a name), a read-only directory and a full file system: exit 2, one line,
nothing left behind.
"""

import os
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib",
                                "readers"))
import gguf_reader  # noqa: E402
from convert_check import f32, run, write_safetensors  # noqa: E402

RESTATED = ("general.alignment", "ckptfs.source_format")


def tensors_of(path):
    g = gguf_reader.read(path)
    return g, [(t.name, t.type_name, t.shape, g.tensor_bytes(t)) for t in g.tensors]


def own_kvs_ok(g, source_format):
    a, s = g.kv("general.alignment"), g.kv("ckptfs.source_format")
    return (g.version == 3 and g.alignment == 32 and a is not None and a.type == 4 and
            a.value == 32 and s is not None and s.type == 8 and s.value == source_format)


def copied_kvs(source_path):
    """The KVs a conversion must carry over from a GGUF source (its first part)."""
    src = gguf_reader.read(source_path, layout=False)
    return [k.raw for k in src.kvs if k.key not in RESTATED and not k.key.startswith("split.")]


def main(c, tap):
    # ---- GGUF sources: tensors, and KVs copied with their types ----
    for label, src, first in (
            ("gguf v3 (block types, every KV type)", "gguf/v3/model.gguf", None),
            ("gguf v2", "gguf/v2/model.gguf", None),
            ("gguf alignment 64", "gguf/align64/model.gguf", None),
            ("gguf split into 3", "gguf/split/model-00002-of-00003.gguf",
             "gguf/split/model-00001-of-00003.gguf")):
        path = os.path.join(c.fx, src)
        g = c.converts(label, path, manifest=os.path.join(os.path.dirname(path),
                                                          "manifest.json"))
        if g is None:
            continue
        want = copied_kvs(os.path.join(c.fx, first or src))
        got = [k.raw for k in g.kvs if k.key not in RESTATED]
        tap.ok(got == want and own_kvs_ok(g, "gguf"),
               "%s: the source's KVs are copied byte for byte (%d), then general.alignment "
               "32 and ckptfs.source_format" % (label, len(want)),
               ["got keys %r" % [k.key for k in g.kvs][:12]])
    out1 = os.path.join(c.work, "again1.gguf")
    out2 = os.path.join(c.work, "again2.gguf")
    rc1 = c.convert(os.path.join(c.fx, "gguf/v3/model.gguf"), out1)[0]
    rc2 = c.convert(out1, out2)[0]
    with open(out1, "rb") as a, open(out2, "rb") as b:
        tap.ok(rc1 == rc2 == 0 and a.read() == b.read(),
               "gguf v3 converted twice: the second file is the first, byte for byte")

    # ---- other sources: only the two KVs this writer states ----
    for label, src in (
            ("safetensors HF shards", "sharded"),
            ("safetensors file + index", "both"),
            ("dcp-hf grid", "dcphf/grid"),
            ("dcp-hf dim1x4", "dcphf/dim1x4"),
            ("dcp-hf mixed", "dcphf/mixed"),
            ("mlfw 2 ranks (rank copies left out)", "mlfw/dir2/ckpt"),
            ("gpt-rs checkpoint", "gptrs/chk-dtypes/model.bin"),
            ("lwt", "lwt/natural/model.lwt"),
            ("torch tied", os.path.join(c.torch, "tied.pt")),
            ("torch training", os.path.join(c.torch, "training.pt")),
            ("torch legacy", os.path.join(c.torch, "legacy.pt")),
            ("dcp sharded (optimizer state left out)", os.path.join(c.dcp, "v113_sharded")),
            ("dcp with optimizer state", os.path.join(c.dcp, "v2x_flat_optim")),
            ("dcp optimizer only (no model tensors)", os.path.join(c.dcp, "nemo_optim"))):
        path, manifest = c.fixture(src)
        g = c.converts(label, path, manifest=manifest)
        if g is not None:
            fmt = c.source_format(path)
            tap.ok(len(g.kvs) == 2 and own_kvs_ok(g, fmt),
                   "%s: KVs are general.alignment 32 and ckptfs.source_format %r"
                   % (label, fmt), [repr(g.kvs)])

    # ---- shapes and names at the edges of what GGUF holds ----
    edge = os.path.join(c.work, "edge.safetensors")
    write_safetensors(edge, [
        ("scalar", "F32", [], f32(1)),
        ("empty", "F32", [0, 3], b""),
        ("four.dims", "I16", [2, 1, 3, 2], bytes(range(24))),
        ("n" * 63, "BF16", [2], b"\1\2\3\4"),
        ("f64", "F64", [3], struct.pack("<3d", 1.5, -2, 1e300))])
    g = c.converts("scalar, empty, 4 dims, 63-byte name", edge)
    if g is not None:
        by = {t.name: t for t in g.tensors}
        tap.ok(by["scalar"].ne == [] and by["four.dims"].ne == [2, 3, 1, 2] and
               by["empty"].ne == [3, 0],
               "ne is the shape reversed; a scalar has n_dims 0",
               [(t.name, t.ne) for t in g.tensors])

    # ---- refusals ----
    c.refuses("safetensors dtypes", os.path.join(c.fx, "dtypes/model.safetensors"),
              ["which GGUF cannot hold"], {"model.layers.0.mlp.bool"})
    c.refuses("safetensors U8/U16", os.path.join(c.fx, "odd/model.safetensors"),
              ["which GGUF cannot hold"])
    c.refuses("torch BOOL/complex", os.path.join(c.torch, "state_dict.pt"),
              ["which GGUF cannot hold"])
    c.refuses("dcp-hf with a hole", os.path.join(c.fx, "dcphf/hole"), ["incomplete"])
    c.refuses_made((
        ("5 dims", [("five", "F32", [1, 1, 1, 1, 2], f32(2))], ["5 dims"]),
        ("a 64-byte name", [("x" * 64, "F32", [1], f32(1))], ["64 bytes"]),
        ("a NUL in a name", [("a\0b", "F32", [1], f32(1))], ["NUL"])))
    c.big_and_write_failures("gguf")


if __name__ == "__main__":
    sys.exit(run(".gguf", tensors_of, "gguf", main))
