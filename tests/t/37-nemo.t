#!/usr/bin/python3
"""NeMo Automodel step directories (model/, optim/, model/consolidated/, model/.hf_metadata/, PEFT
adapters): mount each fixture and check the layout and the HF view.

Environment:
  CKPTFS    path of the ckptfs binary
  FIXTURES  output root of the generators; this test reads FIXTURES/nemo, written by
            tests/gen/nemo_fixtures.py

Per case (manifest.json): the format; every tensor's size, sha256 and sidecar (name, dtype, shape,
and every source under the expected file: the shards, not the consolidated copy, back model/
when both exist); the tree holds exactly the tensors (model/ or adapter/, optim/); summary counts
and warnings; metadata.json's "nemo" members; .ckptfs/hf/ holds exactly the expected config,
tokenizer and adapter files (same bytes as their sources) plus a model.safetensors that a strict
safetensors reader loads, holding exactly the model's tensors (never optimizer state) with the
same bytes. Every row of FIXTURES/nemo/hostile/cases.tsv is refused: exit status 2, one stderr
line with the needle, nothing mounted, within 10 s.
"""

import hashlib
import json
import os
import struct
import sys
import tempfile
import time

MOUNT_TIMEOUT = 30
CASE_TIMEOUT = 120
REFUSE_TIMEOUT = 10

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
from ckptfs_test import (Tap, Watchdog, is_mounted, run_capture, skip_reason,  # noqa: E402
                         unmount)

ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
            "U8": 1, "BOOL": 1}


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def read_json(path):
    return json.loads(read_bytes(path))


def needle_matches(needle, text):
    text = text.lower()
    return all(any(w.lower() in text for w in group.split("|") if w)
               for group in needle.split("&"))


def load_safetensors(data):
    """A strict reader: the header is JSON, offsets tile the data section exactly, every tensor's
    byte count matches its dtype and shape. Returns {name: (dtype, shape, bytes)}."""
    if len(data) < 8:
        raise ValueError("shorter than 8 bytes")
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        raise ValueError("header length %d past the end" % n)
    header = json.loads(data[8:8 + n].decode("utf-8"))
    body = data[8 + n:]
    spans, out = [], {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        count = 1
        for s in e["shape"]:
            count *= s
        if b - a != count * ITEMSIZE[e["dtype"]]:
            raise ValueError("%s: %d bytes for %s%r" % (name, b - a, e["dtype"], e["shape"]))
        spans.append((a, b))
        out[name] = (e["dtype"], e["shape"], body[a:b])
    at = 0
    for a, b in sorted(spans):
        if a != at:
            raise ValueError("data offsets leave a gap or overlap at %d" % a)
        at = b
    if at != len(body):
        raise ValueError("data section is %d bytes, offsets cover %d" % (len(body), at))
    return out


def subset_matches(got, want):
    if isinstance(want, dict):
        return isinstance(got, dict) and all(k in got and subset_matches(got[k], v)
                                             for k, v in want.items())
    return got == want


def check_tensor(tap, case, mnt, t):
    problems = []
    raw = os.path.join(mnt, t["path"])
    try:
        data = read_bytes(raw)
        if len(data) != t["nbytes"]:
            problems.append("%d bytes, want %d" % (len(data), t["nbytes"]))
        elif hashlib.sha256(data).hexdigest() != t["sha256"]:
            problems.append("sha256 differs")
        sc = read_json(raw + ".json")
        for key in ("name", "dtype", "shape", "nbytes"):
            if sc.get(key) != t[key]:
                problems.append("%s %r, want %r" % (key, sc.get(key), t[key]))
        files = [s.get("file", "") for s in sc.get("sources", [])]
        if not files or any(not f.startswith(t["source_prefix"]) for f in files):
            problems.append("sources %r, want all under %r" % (files, t["source_prefix"]))
    except (OSError, ValueError) as e:
        problems.append(str(e))
    tap.ok(not problems, "%s: %s bytes and sidecar (sources under %s)"
           % (case, t["path"], t["source_prefix"]), problems)


def check_tree(tap, case, mnt, tensors):
    want = set()
    for t in tensors:
        want.update((t["path"], t["path"] + ".json"))
    got, problems = set(), []
    for dirpath, dirnames, filenames in os.walk(mnt, onerror=problems.append):
        rel = os.path.relpath(dirpath, mnt)
        if rel == ".":
            dirnames[:] = [d for d in dirnames if d != ".ckptfs"]
            rel = ""
        for name in filenames:
            if not name.endswith(".npy"):
                got.add(os.path.join(rel, name))
    problems += ["missing: " + p for p in sorted(want - got)]
    problems += ["unexpected: " + p for p in sorted(got - want)]
    tops = sorted({t["path"].split("/")[0] for t in tensors})
    tap.ok(not problems, "%s: tree holds exactly the tensors (top level: %s)"
           % (case, ", ".join(tops)), problems)


def check_documents(tap, case, mnt, man):
    problems = []
    try:
        summary = read_json(os.path.join(mnt, ".ckptfs", "summary.json"))
        model = sum(not t["aside"] for t in man["tensors"])
        aside = sum(t["aside"] for t in man["tensors"])
        if summary.get("format") != man["format"]:
            problems.append("format %r, want %r" % (summary.get("format"), man["format"]))
        if summary.get("tensor_count") != model:
            problems.append("tensor_count %r, want %d" % (summary.get("tensor_count"), model))
        if summary.get("tensors_outside_the_model", 0) != aside:
            problems.append("tensors_outside_the_model %r, want %d"
                            % (summary.get("tensors_outside_the_model"), aside))
        warnings = " ".join(summary.get("warnings", []))
        for w in man["warnings"]:
            if w not in warnings:
                problems.append("no warning mentions %r" % w)
        if not man["warnings"] and summary.get("warnings"):
            problems.append("unexpected warnings %r" % summary["warnings"])
        nemo = read_json(os.path.join(mnt, ".ckptfs", "metadata.json")).get("nemo")
        if not subset_matches(nemo, man["nemo"]):
            problems.append("nemo %r" % (nemo,))
            problems.append("want %r" % (man["nemo"],))
    except (OSError, ValueError) as e:
        problems.append(str(e))
    tap.ok(not problems, "%s: summary (format, counts, warnings) and metadata.json nemo" % case,
           problems)


def check_hf_view(tap, case, mnt, src, man):
    problems = []
    hf = os.path.join(mnt, ".ckptfs", "hf")
    try:
        names = set(os.listdir(hf))
        want = set(man["hf_files"]) | {"model.safetensors"}
        problems += ["missing %s" % n for n in sorted(want - names)]
        problems += ["unexpected %s" % n for n in sorted(names - want)]
        for name, digest in sorted(man["hf_files"].items()):
            if name in names and hashlib.sha256(read_bytes(os.path.join(hf, name))).hexdigest() \
                    != digest:
                problems.append("%s: bytes differ from its source" % name)
        if "config.json" in names:
            cfg = read_json(os.path.join(hf, "config.json"))
            if cfg.get("model_type") != "llama":
                problems.append("config.json model_type %r" % cfg.get("model_type"))
        view = load_safetensors(read_bytes(os.path.join(hf, "model.safetensors")))
        by_name = {t["name"]: t for t in man["tensors"] if not t["aside"]}
        if sorted(view) != man["hf_tensors"]:
            problems.append("model.safetensors holds %r, want %r" % (sorted(view),
                                                                     man["hf_tensors"]))
        for name, (dt, shape, data) in sorted(view.items()):
            t = by_name.get(name)
            if t and (dt != t["dtype"] or shape != t["shape"] or
                      hashlib.sha256(data).hexdigest() != t["sha256"]):
                problems.append("%s: %s%r or its bytes differ" % (name, dt, shape))
        if "adapter_model.safetensors" in names:
            adapter = load_safetensors(read_bytes(os.path.join(hf, "adapter_model.safetensors")))
            if sorted(adapter) != man["hf_tensors"]:
                problems.append("adapter_model.safetensors holds %r" % sorted(adapter))
    except (OSError, ValueError, KeyError, UnicodeDecodeError) as e:
        problems.append("%s: %s" % (type(e).__name__, e))
    tap.ok(not problems, "%s: .ckptfs/hf has %s + a loadable model.safetensors with exactly the "
           "model's %d tensors" % (case, ", ".join(sorted(man["hf_files"])) or "no other files",
                                   len(man["hf_tensors"])), problems)


def run_case(tap, ckptfs, root, case):
    man = read_json(os.path.join(root, case, "manifest.json"))
    src = os.path.join(root, case, man["source"])
    mnt = tempfile.mkdtemp(prefix="ckptfs-t37.")
    try:
        rc, _, err = run_capture([ckptfs, src, mnt], MOUNT_TIMEOUT)
        if not tap.ok(rc == 0 and is_mounted(mnt), "%s: mounts %s" % (case, man["source"]),
                      ["exit status %r" % rc, "stderr: " + err.decode("utf-8", "replace")]):
            return
        with Watchdog(mnt, CASE_TIMEOUT) as dog:
            for t in man["tensors"]:
                check_tensor(tap, case, mnt, t)
            check_tree(tap, case, mnt, man["tensors"])
            check_documents(tap, case, mnt, man)
            check_hf_view(tap, case, mnt, src, man)
        if dog.fired:
            tap.ok(False, "%s: checks finished within %d s" % (case, CASE_TIMEOUT))
    finally:
        tap.ok(unmount(mnt), "%s: unmounts" % case)


def refuse(tap, ckptfs, hostile, rel, needle, desc):
    src = os.path.join(hostile, rel)
    mnt = tempfile.mkdtemp(prefix="ckptfs-t37h.")
    problems, took = [], 0.0
    try:
        start = time.monotonic()
        rc, _, err = run_capture([ckptfs, src, mnt], REFUSE_TIMEOUT)
        took = time.monotonic() - start
        text = err.decode("utf-8", "replace")
        body = text[:-1] if text.endswith("\n") else text
        if rc != 2:
            problems.append("exit status %r, want 2" % rc)
        if not body.strip() or "\n" in body:
            problems.append("stderr is not one line")
        if not needle_matches(needle, body):
            problems.append("stderr lacks %r" % needle)
        if is_mounted(mnt):
            problems.append("something is mounted")
        if problems:
            problems += ["stderr: " + ln for ln in text.splitlines()[:5]]
    finally:
        unmount(mnt)
    tap.ok(not problems, "refuse %s in %.2f s (%s): %s" % (rel, took, needle, desc), problems)


def main():
    ckptfs = os.environ.get("CKPTFS", "")
    fixtures = os.environ.get("FIXTURES", "")
    reason = skip_reason(ckptfs, fixtures)
    root = os.path.join(fixtures, "nemo")
    if not reason and not os.path.isdir(root):
        reason = "%s is missing (tests/gen/nemo_fixtures.py not run)" % root
    if reason:
        print("1..0 # SKIP " + reason)
        return 0
    ckptfs = os.path.abspath(ckptfs)
    root = os.path.abspath(root)
    sys.stdout.reconfigure(encoding="utf-8", errors="backslashreplace")
    tap = Tap()
    cases = sorted(d for d in os.listdir(root)
                   if os.path.isfile(os.path.join(root, d, "manifest.json")))
    tap.ok(len(cases) >= 10, "found %d NeMo fixture cases in %s" % (len(cases), root))
    for case in cases:
        run_case(tap, ckptfs, root, case)
    hostile = os.path.join(root, "hostile")
    rows = []
    with open(os.path.join(hostile, "cases.tsv"), encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i and line.strip():
                rows.append(line.rstrip("\n").split("\t"))
    tap.ok(len(rows) >= 3, "nemo/hostile lists %d cases" % len(rows))
    for rel, needle, desc in rows:
        refuse(tap, ckptfs, hostile, rel, needle, desc)
    tap.done()
    return 1 if tap.failed else 0


if __name__ == "__main__":
    sys.exit(main())
