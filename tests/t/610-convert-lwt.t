#!/usr/bin/python3
"""The LightwatchAI2 .lwt writer (core/write/writers/lwt.c) through convert_tool.

Environment: CKPTFS, FIXTURES, TOOLS (see tests/lib/readers/convert_check.py).

Conversions of float32 sources of every kind the fixtures have (.lwt in its
layout variants, MLFramework ranks, torch zip, DCP-HF assembled tensors, DCP
with optimizer state, gpt-rs, HF safetensors, and small safetensors files made
here for a scalar, empty tensors, 8 dims and 127-byte names) must be accepted
by the strict reader tests/lib/readers/lwt_reader.py (the canonical layout:
216-byte entries, 64-byte alignment, CRC-32 in the trailer and the header),
hold each model tensor with the source's shape and bytes, and mount with
ckptfs. From a .lwt source the header's other keys (model_type, config) are
kept. Refusals (every dtype but F32, incomplete tensors, 9 dims, empty,
128-byte and NUL-holding names), a read-only directory and a full file
system: exit 2, one line, nothing left behind.
"""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib",
                                "readers"))
import lwt_reader  # noqa: E402
from convert_check import f32, run, write_safetensors  # noqa: E402


def tensors_of(path):
    f = lwt_reader.read(path)
    return f, [(t.name, t.dtype, t.shape, f.tensor_bytes(t)) for t in f.tensors]


def main(c, tap):
    # ---- .lwt sources: the header's own keys travel ----
    for variant in ("natural", "names", "packed-entries", "all-variants", "empty"):
        path = os.path.join(c.fx, "lwt", variant, "model.lwt")
        f = c.converts("lwt " + variant, path,
                       manifest=os.path.join(c.fx, "lwt", variant, "manifest.json"))
        if f is None:
            continue
        with open(os.path.join(c.fx, "lwt", variant, "manifest.json")) as m:
            src = json.load(m)
        src = src["metadata"]["lightwatch-lwt"]["header"]
        own = ("version", "dtype", "byte_order", "tensor_count", "total_bytes", "crc32",
               "source_format")
        kept = {k: v for k, v in src.items() if k not in own}
        tap.ok(all(f.header.get(k) == v for k, v in kept.items()) and
               f.header.get("source_format") == "lightwatch-lwt",
               "lwt %s: header keeps %s and says source_format lightwatch-lwt"
               % (variant, sorted(kept) or "no other keys"), [f.header])

    # ---- other float32 sources ----
    for label, src in (
            ("mlfw 2 ranks (rank copies left out)", "mlfw/dir2/ckpt"),
            ("mlfw centralized", "mlfw/centralized_one/centralized_one.ckpt"),
            ("dcp-hf big dim 1", "dcphf/big_dim1"),
            ("gpt-rs python checkpoint", "gptrs/chk-python/model.bin"),
            ("torch tied", os.path.join(c.torch, "tied.pt")),
            ("torch training", os.path.join(c.torch, "training.pt")),
            ("dcp with optimizer state (left out)", os.path.join(c.dcp, "v2x_flat_optim")),
            ("dcp optimizer only (no model tensors)", os.path.join(c.dcp, "nemo_optim"))):
        path, manifest = c.fixture(src)
        f = c.converts(label, path, manifest=manifest)
        if f is not None:
            fmt = c.source_format(path)
            tap.ok(f.header.get("source_format") == fmt and
                   set(f.header) == {"version", "dtype", "byte_order", "tensor_count",
                                     "total_bytes", "source_format", "crc32"},
                   "%s: header has the LWATCHV1 keys and source_format %r" % (label, fmt),
                   [f.header])

    edge = os.path.join(c.work, "edge.safetensors")
    write_safetensors(edge, [
        ("scalar", "F32", [], f32(1)),
        ("empty.first", "F32", [0], b""),
        ("odd", "F32", [3], f32(3, 2)),
        ("eight", "F32", [1, 2, 1, 2, 1, 2, 1, 2], f32(16, 3)),
        ("n" * 127, "F32", [5], f32(5, 4)),
        ("unicod\u00e9", "F32", [17], f32(17, 5)),
        ("zz.empty.last", "F32", [2, 0], b"")])
    f = c.converts("scalar, empty, odd sizes, 8 dims, 127-byte and UTF-8 names", edge)
    if f is not None:
        tap.ok(all(t.offset % 64 == 0 for t in f.tensors) and f.data_at % 64 == 0,
               "data section and every tensor start on a multiple of 64",
               [(t.name, t.offset) for t in f.tensors] + [f.data_at])

    # ---- refusals ----
    c.refuses("safetensors shards (BF16, F16, I64)", os.path.join(c.fx, "sharded"),
              ["which LWATCHV1 cannot hold", "float32 only"])
    c.refuses("gguf v3", os.path.join(c.fx, "gguf/v3/model.gguf"),
              ["which LWATCHV1 cannot hold"])
    c.refuses("dcp with a hole", os.path.join(c.dcp, "v2x_hole"), ["incomplete"])
    c.refuses_made((
        ("9 dims", [("nine", "F32", [1] * 8 + [2], f32(2))], ["9 dims"]),
        ("a 128-byte name", [("x" * 128, "F32", [1], f32(1))], ["128 bytes"]),
        ("an empty name", [("", "F32", [1], f32(1))], ["0 bytes"]),
        ("a NUL in a name", [("a\0b", "F32", [1], f32(1))], ["NUL"])))
    c.big_and_write_failures("lwt")


if __name__ == "__main__":
    sys.exit(run(".lwt", tensors_of, "lightwatch-lwt", main))
