#!/usr/bin/python3
"""The gpt-rs writer (core/write/writers/gptrs.c) through convert_tool: GPTRSCHK v2
checkpoints (.gptrs) and GPTRSTEN v2 archives (.gptrsten).

Environment: CKPTFS, FIXTURES, TOOLS (see tests/lib/readers/convert_check.py).

Conversions from gpt-rs files (v1 and v2, every dtype tag, odd layouts, a
legacy untagged config, ids 0) and from DCP-HF, DCP, MLFramework, torch, .lwt
and small safetensors files made here must be accepted by the strict reader
tests/lib/readers/gptrs_reader.py (names sorted, payloads packed from the end
of the index, real BLAKE3 base ids checked with its own BLAKE3), hold each
model tensor with the source's dtype, shape and bytes, and mount with ckptfs.
The notes' worked examples and the fixtures written like gpt-rs's Rust saver
come out byte for byte. Config: a gpt-rs source's config (a legacy one in the
tagged form), else {"kind": "ckptfs", "config": {"source_format": ...}}.
Refusals (dtypes gpt-rs lacks, incomplete tensors, non-ASCII names in a
checkpoint), a read-only directory and a full file system: exit 2, one line,
nothing left behind.
"""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib",
                                "readers"))
import gptrs_reader  # noqa: E402
from convert_check import f32, run, write_safetensors  # noqa: E402


def tensors_of(path):
    f = gptrs_reader.read(path)
    want = "GPTRSTEN" if path.endswith(".gptrsten") else "GPTRSCHK"
    if f.container != want:
        raise gptrs_reader.GptrsError("container %s, want %s" % (f.container, want))
    return f, [(t.name, t.dtype, t.shape, f.tensor_bytes(t)) for t in f.tensors]


def source_config(fx, case):
    with open(os.path.join(fx, "gptrs", case, "manifest.json")) as m:
        doc = json.load(m)["metadata"]["gpt-rs"]
    if doc["container"] != "GPTRSCHK":
        return None
    cfg = doc["config"]
    if not doc.get("legacy_config"):
        return cfg
    inner = {k: v for k, v in cfg.items() if k != "functional_overrides"}
    out = {"kind": "gpt", "config": inner}
    if cfg.get("functional_overrides"):
        out["runtime"] = {"functional_overrides": cfg["functional_overrides"]}
    return out


def main(c, tap):
    # ---- gpt-rs sources, to both containers ----
    for case in ("chk-doc-example", "chk-dtypes", "chk-odd", "chk-python", "chk-layout",
                 "chk-legacy-config", "chk-v1", "ten-doc-example", "ten-v1", "ten-v2"):
        path = os.path.join(c.fx, "gptrs", case, "model.bin")
        manifest = os.path.join(c.fx, "gptrs", case, "manifest.json")
        for ext in (".gptrs", ".gptrsten"):
            if case in ("ten-v1", "ten-v2") and ext == ".gptrs":
                continue  # UTF-8 names: refused below
            f = c.converts("%s to %s" % (case, ext), path, manifest=manifest, ext=ext)
            if f is None or ext == ".gptrsten":
                continue
            want = source_config(c.fx, case) or {"kind": "ckptfs",
                                               "config": {"source_format": "gpt-rs"}}
            tap.ok(f.config == want, "%s: the config is the source's%s" % (
                case, " (legacy form tagged)" if "legacy" in case else ""),
                ["got %r" % f.config, "want %r" % want])
    for case, ext in (("chk-doc-example", ".gptrs"), ("ten-doc-example", ".gptrsten"),
                      ("chk-dtypes", ".gptrs"), ("ten-v2", ".gptrsten")):
        out = os.path.join(c.work, "same" + ext)
        src = os.path.join(c.fx, "gptrs", case, "model.bin")
        rc = c.convert(src, out)[0]
        same = False
        if rc == 0:
            with open(src, "rb") as a, open(out, "rb") as b:
                same = a.read() == b.read()
        tap.ok(same, "%s: written as gpt-rs writes it, byte for byte the same file" % case)

    # ---- other sources ----
    for label, src in (
            ("dcp-hf grid", "dcphf/grid"),
            ("mlfw 2 ranks (rank copies left out)", "mlfw/dir2/ckpt"),
            ("lwt", "lwt/natural/model.lwt"),
            ("torch tied", os.path.join(c.torch, "tied.pt")),
            ("torch proto4 (BF16)", os.path.join(c.torch, "proto4.pt")),
            ("dcp nemo model (BF16)", os.path.join(c.dcp, "nemo_model_dcp")),
            ("dcp with optimizer state (left out)", os.path.join(c.dcp, "v2x_flat_optim")),
            ("dcp optimizer only (no model tensors)", os.path.join(c.dcp, "nemo_optim"))):
        path, manifest = c.fixture(src)
        f = c.converts(label, path, manifest=manifest)
        c.converts(label + " to .gptrsten", path, manifest=manifest, ext=".gptrsten")
        if f is not None:
            fmt = c.source_format(path)
            want = {"kind": "ckptfs", "config": {"source_format": fmt}}
            tap.ok(f.config == want, "%s: config %s" % (label, json.dumps(want)),
                   ["got %r" % f.config])

    edge = os.path.join(c.work, "edge.safetensors")
    write_safetensors(edge, [
        ("scalar", "F32", [], f32(1)),
        ("empty", "I32", [0, 5], b""),
        ("b", "BF16", [3], b"\1\2\3\4\5\6"),
        ("a.long." + "n" * 300, "F16", [2, 1], b"\7\0\10\0"),
        ("A", "F32", [1, 1, 1, 1, 1, 1, 1, 1, 1, 2], f32(2))])
    f = c.converts("scalar, empty, 10 dims, long name; sorted bytewise", edge)
    if f is not None:
        tap.ok([t.name for t in f.tensors] == ["A", "a.long." + "n" * 300, "b", "empty",
                                              "scalar"],
               "tensors are in bytewise name order", [[t.name[:10] for t in f.tensors]])
    utf8 = os.path.join(c.work, "utf8.safetensors")
    write_safetensors(utf8, [("caf\u00e9", "F32", [2], f32(2)), ("plain", "I32", [1],
                                                                 b"\1\0\0\0")])
    c.converts("a UTF-8 name in an archive", utf8, ext=".gptrsten")

    # ---- refusals ----
    c.refuses("UTF-8 names in a checkpoint", utf8, ["not ASCII", ".gptrsten"],
              {"caf\u00e9"})
    for case in ("ten-v1", "ten-v2"):
        c.refuses("%s (UTF-8 names) to a checkpoint" % case,
                  os.path.join(c.fx, "gptrs", case, "model.bin"), ["not ASCII"])
    c.refuses("safetensors shards (I64)", os.path.join(c.fx, "sharded"),
              ["which gpt-rs cannot hold", "F32, F16, BF16 and I32"])
    c.refuses("gguf v3 (I8, F64, block types)", os.path.join(c.fx, "gguf/v3/model.gguf"),
              ["which gpt-rs cannot hold"], ext=".gptrsten")
    c.refuses("torch BOOL/complex", os.path.join(c.torch, "state_dict.pt"),
              ["which gpt-rs cannot hold"])
    c.refuses("dcp with a hole", os.path.join(c.dcp, "v2x_hole"), ["incomplete"])
    c.refuses("dcp-hf with a hole", os.path.join(c.fx, "dcphf/hole"), ["incomplete"],
              ext=".gptrsten")
    c.big_and_write_failures("gpt-rs")


if __name__ == "__main__":
    sys.exit(run(".gptrs", tensors_of, "gpt-rs", main))
