#!/usr/bin/python3
"""Mount the GGUF fixtures and compare them with their manifests; run the GGUF hostile cases.

Environment:
  CKPTFS    path of the ckptfs binary
  FIXTURES  fixture root; tests/gen/gguf_fixtures.py wrote FIXTURES/gguf

Every case directory under FIXTURES/gguf with a manifest.json is mounted once
through each file its manifest lists in "sources" (a split model through each
of its parts).  Each mount must show every tensor with the recorded size,
sha256 and sidecar (dtype, row-major shape, ggml type fields, source file and
offset), and .ckptfs/metadata.json must hold exactly the KVs the generator
wrote, in file order, under "gguf".

FIXTURES/gguf/hostile/cases.tsv lists damaged files (path, expect, needle,
description): "refuse" cases must fail with exit status 2 and one stderr line
containing the needle within 10 s; "mount" cases must mount and read fully.
"""

import json
import os
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
import hostile  # noqa: E402
from mount_checks import (bytes_problems, case_dirs, check_tree, field_problems,  # noqa: E402
                          mounted, read_bytes, read_json, run, sidecar_path)


# ---------------------------------------------------------------------------
# Good cases

SIDECAR_KEYS = ("name", "dtype", "shape", "nbytes", "ggml_type", "ggml_type_id", "block_size",
                "type_size")


def check_tensor(tap, label, mnt, t):
    problems = bytes_problems(os.path.join(mnt, t["path"]).encode("utf-8"), t["nbytes"],
                              t["sha256"])[0]
    tap.ok(not problems, "%s: %s size and sha256" % (label, t["path"]), problems)

    problems = []
    side = sidecar_path(t["path"])
    try:
        sc = read_json(os.path.join(mnt, side).encode("utf-8"))
        problems += field_problems(sc, {k: t[k] for k in SIDECAR_KEYS}, exact_type=True)
        if sc.get("format") != "gguf" or sc.get("byte_order") != "little":
            problems.append("format/byte_order: %r/%r" % (sc.get("format"), sc.get("byte_order")))
        if sc.get("numpy_dtype") != t["numpy_dtype"]:
            problems.append("numpy_dtype: got %r, want %r" % (sc.get("numpy_dtype"),
                                                             t["numpy_dtype"]))
        src = sc.get("sources")
        want = [{"file": t["file"], "offset": t["offset"], "length": t["nbytes"]}]
        if src != want:
            problems.append("sources: got %r, want %r" % (src, want))
    except (OSError, ValueError, AttributeError) as e:
        problems.append("%s: %s" % (side, e))
    tap.ok(not problems, "%s: %s" % (label, side), problems)


def same_value(got, want, spec):
    """got (from metadata.json) equals want (from the generator), judged by the GGUF type."""
    if spec == "ELIDED":
        return got == want
    if isinstance(spec, dict):
        if not isinstance(got, list) or len(got) != len(want):
            return False
        specs = spec["items"] if "items" in spec else [spec["array"]] * len(want)
        return all(same_value(g, w, s) for g, w, s in zip(got, want, specs))
    if spec in ("FLOAT32", "FLOAT64"):
        if isinstance(want, str):          # "NaN", "Infinity", "-Infinity"
            return got == want
        if type(got) is not float:         # floats always show a fraction or exponent
            return False
        fmt = "<f" if spec == "FLOAT32" else "<d"
        try:
            return struct.pack(fmt, got) == struct.pack(fmt, want)
        except OverflowError:
            return False
    if spec == "BOOL":
        return got is want
    if spec == "STRING":
        return isinstance(got, str) and got == want
    return type(got) is int and got == want


def check_metadata(tap, label, mnt, manifest, ntensors):
    dot = os.path.join(mnt, ".ckptfs")
    problems = []
    try:
        meta = json.loads(read_bytes(os.path.join(dot, "metadata.json")))
        if meta.get("format") != "gguf":
            problems.append("format %r" % meta.get("format"))
        kvs = meta.get("gguf")
        if not isinstance(kvs, dict):
            problems.append("no \"gguf\" object")
            kvs = {}
        want_keys = [kv["key"] for kv in manifest["kv"]]
        if list(kvs) != want_keys:
            problems.append("keys: got %d %r..., want %d %r..."
                            % (len(kvs), list(kvs)[:3], len(want_keys), want_keys[:3]))
        for kv in manifest["kv"]:
            if kv["key"] in kvs and not same_value(kvs[kv["key"]], kv["value"], kv["type"]):
                problems.append("%s: got %s, want %s"
                                % (kv["key"], ascii(kvs[kv["key"]])[:200],
                                   ascii(kv["value"])[:200]))
    except (OSError, ValueError) as e:
        problems.append(str(e))
    tap.ok(not problems, "%s: metadata.json \"gguf\" holds the %d KVs exactly"
           % (label, len(manifest["kv"])), problems)

    problems = []
    try:
        files = json.loads(read_bytes(os.path.join(dot, "metadata.json"))).get("gguf_files")
        if not isinstance(files, list) or len(files) != len(manifest["files"]):
            problems.append("gguf_files: %r" % (files,))
        else:
            for got, want in zip(files, manifest["files"]):
                for k, v in want.items():
                    if got.get(k) != v:
                        problems.append("%s: %s %r, want %r" % (want["file"], k, got.get(k), v))
                off = got.get("data_offset")
                if type(off) is not int or off % want["alignment"]:
                    problems.append("%s: data_offset %r" % (want["file"], off))
        summary = json.loads(read_bytes(os.path.join(dot, "summary.json")))
        if summary.get("tensor_count") != ntensors:
            problems.append("summary tensor_count %r, want %d"
                            % (summary.get("tensor_count"), ntensors))
        if sorted(f.get("path") for f in summary.get("files", [])) != \
                sorted(f["file"] for f in manifest["files"]):
            problems.append("summary files %r" % (summary.get("files"),))
    except (OSError, ValueError, AttributeError) as e:
        problems.append(str(e))
    tap.ok(not problems, "%s: gguf_files and summary.json describe every part" % label, problems)


def run_case(tap, ckptfs, root, case):
    case_dir = os.path.join(root, case)
    manifest = read_json(os.path.join(case_dir, "manifest.json"))
    for source in manifest["sources"]:
        label = "%s via %s" % (case, source)

        def checks(mnt):
            for t in manifest["tensors"]:
                check_tensor(tap, label, mnt, t)
            check_tree(tap, label, mnt, manifest["tensors"])
            check_metadata(tap, label, mnt, manifest, len(manifest["tensors"]))

        mounted(tap, ckptfs, os.path.join(case_dir, source), label, checks)


def main(tap, ckptfs, root):
    cases = case_dirs(root)
    tap.ok(len(cases) >= 5, "found %d GGUF cases with manifest.json" % len(cases))
    for case in cases:
        run_case(tap, ckptfs, root, case)
    hostile.run_cases(tap, ckptfs, os.path.join(root, "hostile"), min_cases=40, named=True)


if __name__ == "__main__":
    sys.exit(run(main, "gguf", "gguf_fixtures.py"))
