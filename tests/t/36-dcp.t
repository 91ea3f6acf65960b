#!/usr/bin/python3
"""Native PyTorch DCP (.metadata + __R_N.distcp): mount real torch 1.13 checkpoints and 2.x-layout
ones and check them against torch's own figures; refuse hostile ones.

Environment:
  CKPTFS    path of the ckptfs binary
  FIXTURES  output root of the generators; FIXTURES/dcp/hostile comes from
            tests/gen/dcp_fixtures.py (standard library only)
The good fixtures are committed in tests/fixtures/dcp (written by tests/gen/dcp_fixtures.py with
real torch 1.13), so this test needs no torch.

Per case: every tensor's size and sha256 (torch's row-major bytes, computed before saving), or for
an incomplete one the covered leading bytes and EIO inside the hole; every sidecar (name, dtype,
shape, format, fqn, requires_grad, the chunks with file/offset/length/box, strides of strided
chunks, the BYTE_IO item of tensors found inside one); the tree holds exactly these tensors
(model at the root, optimizer state under optim/); summary counts and warnings; metadata.json's
"dcp" (layout, version, checkpoint_id, other attributes, replicas, every non-tensor value); the
HF view holds exactly the complete model tensors, same bytes.
Hostile rows (FIXTURES/dcp/hostile/cases.tsv): "refuse" = exit status 2, one stderr line with
the needle, nothing mounted, within 10 s, canary file never created; "mount" = mounts, every file
reads, a summary warning contains the needle, canary never created.
"""

import errno
import hashlib
import json
import os
import struct
import subprocess
import sys
import tempfile
import time

MOUNT_TIMEOUT = 30
CASE_TIMEOUT = 120
REFUSE_TIMEOUT = 10
PAGE = 4096

HERE = os.path.dirname(os.path.realpath(__file__))
COMMITTED = os.path.normpath(os.path.join(HERE, "..", "fixtures", "dcp"))

sys.path.insert(0, os.path.join(HERE, "..", "lib"))
from ckptfs_test import (Tap, Watchdog, is_mounted, run_capture, skip_reason,  # noqa: E402
                         unmount)


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def read_json(path):
    return json.loads(read_bytes(path))


def needle_matches(needle, text):
    text = text.lower()
    return all(any(w.lower() in text for w in group.split("|") if w)
               for group in needle.split("&"))


def read_safetensors(path):
    """{name: (dtype, shape, bytes)} of a safetensors file, read with the standard library."""
    data = read_bytes(path)
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        out[name] = (e["dtype"], e["shape"], data[8 + n + a:8 + n + b])
    return out


# ---------------------------------------------------------------------------
# Good cases

def check_bytes(tap, label, mnt, t):
    raw = os.path.join(mnt, t["path"])
    problems = []
    try:
        size = os.stat(raw).st_size
        if size != t["nbytes"]:
            problems.append("st_size %d, want %d" % (size, t["nbytes"]))
        if not t["incomplete"]:
            data = read_bytes(raw)
            if hashlib.sha256(data).hexdigest() != t["sha256"]:
                problems.append("sha256 of %d bytes differs from torch's" % len(data))
        else:
            # Reads go through the page cache: only whole covered pages can be read.
            n = t["covered_prefix_bytes"]
            with open(raw, "rb") as f:
                if n >= PAGE:
                    head = os.pread(f.fileno(), PAGE, 0)
                    if hashlib.sha256(head).hexdigest() != t["head_sha256"]:
                        problems.append("the first covered page differs")
                for off in (n, t["nbytes"] - 1):
                    try:
                        os.pread(f.fileno(), 1, off)
                        problems.append("a read inside the hole (offset %d) succeeded" % off)
                    except OSError as e:
                        if e.errno != errno.EIO:
                            problems.append("read inside the hole: %s, want EIO" % e)
    except OSError as e:
        problems.append(str(e))
    what = "covered page equals torch's, EIO in the hole" if t["incomplete"] else \
        "bytes equal torch's (sha256)"
    tap.ok(not problems, "%s: %s %s" % (label, t["path"], what), problems)


def check_sidecar(tap, label, mnt, t):
    problems = []
    try:
        sc = read_json(os.path.join(mnt, t["path"] + ".json"))
    except (OSError, ValueError) as e:
        tap.ok(False, "%s: %s sidecar" % (label, t["path"]), [str(e)])
        return
    for key in ("name", "dtype", "shape", "nbytes", "fqn"):
        if sc.get(key) != t[key]:
            problems.append("%s: got %r, want %r" % (key, sc.get(key), t[key]))
    if sc.get("format") != "dcp":
        problems.append("format %r, want dcp" % sc.get("format"))
    if t["byte_io_item"]:
        if sc.get("byte_io_item") != t["byte_io_item"]:
            problems.append("byte_io_item %r, want %r" % (sc.get("byte_io_item"),
                                                          t["byte_io_item"]))
    else:
        if sc.get("requires_grad") != t["requires_grad"]:
            problems.append("requires_grad %r, want %r" % (sc.get("requires_grad"),
                                                           t["requires_grad"]))
        want = sorted((c["file"], c["offset"], c["length"], tuple(c["offsets"]),
                       tuple(c["sizes"])) for c in t["chunks"])
        chunks = [c for c in sc.get("chunks", []) if "transforms" not in c]
        got = sorted((c.get("file"), c.get("offset"), c.get("length"),
                      tuple(c.get("offsets", ())), tuple(c.get("sizes", ()))) for c in chunks)
        if got != want:
            problems.append("chunks %r, want %r" % (got, want))
        strided = any("stride" in c for c in chunks)
        if strided != t["strided"]:
            problems.append("a chunk with strides: %r, want %r" % (strided, t["strided"]))
        boxes = sorted((tuple(s.get("box", {}).get("offsets", [0] * len(t["shape"]))),
                        tuple(s.get("box", {}).get("sizes", t["shape"])))
                       for s in sc.get("sources", []))
        if t["chunks"] and boxes != sorted((tuple(c["offsets"]), tuple(c["sizes"]))
                                           for c in t["chunks"]):
            problems.append("sources' boxes %r differ from the chunks" % (boxes,))
    tap.ok(not problems, "%s: %s sidecar (dtype, shape, fqn, chunks with file/offset/length/box)"
           % (label, t["path"]), problems)


def check_tree(tap, label, mnt, tensors):
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
    tap.ok(not problems, "%s: tree holds exactly the tensors (optimizer state under optim/)"
           % label, problems)


def same_value(a, b):
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and float(a) == float(b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    return a == b and type(a) is type(b)


def check_documents(tap, label, mnt, man):
    problems = []
    try:
        summary = read_json(os.path.join(mnt, ".ckptfs", "summary.json"))
        model = [t for t in man["tensors"] if not t["aside"]]
        aside = [t for t in man["tensors"] if t["aside"]]
        if summary.get("format") != "dcp":
            problems.append("format %r" % summary.get("format"))
        if summary.get("tensor_count") != len(model):
            problems.append("tensor_count %r, want %d" % (summary.get("tensor_count"), len(model)))
        if summary.get("tensors_outside_the_model", 0) != len(aside):
            problems.append("tensors_outside_the_model %r, want %d"
                            % (summary.get("tensors_outside_the_model"), len(aside)))
        if summary.get("incomplete_tensors") != man["incomplete_tensors"]:
            problems.append("incomplete_tensors %r, want %d"
                            % (summary.get("incomplete_tensors"), man["incomplete_tensors"]))
        warnings = " ".join(summary.get("warnings", []))
        for w in man["warnings"]:
            if w not in warnings:
                problems.append("no warning mentions %r" % w)
        if not man["warnings"] and summary.get("warnings"):
            problems.append("unexpected warnings %r" % summary["warnings"])
        dcp = read_json(os.path.join(mnt, ".ckptfs", "metadata.json")).get("dcp", {})
        for key, want in (("layout", man["layout"]), ("version", man["version"]),
                          ("replicated_chunks", man["replicated_chunks"])):
            if dcp.get(key) != want:
                problems.append("dcp.%s %r, want %r" % (key, dcp.get(key), want))
        cid = (dcp.get("storage_meta") or {}).get("checkpoint_id")
        if cid != man["checkpoint_id"]:
            problems.append("storage_meta.checkpoint_id %r, want %r" % (cid, man["checkpoint_id"]))
        if sorted(dcp.get("other_attributes", [])) != man["other_attributes"]:
            problems.append("other_attributes %r, want %r" % (dcp.get("other_attributes"),
                                                             man["other_attributes"]))
        values = dcp.get("values", {})
        if not same_value(values, man["values"]):
            problems.append("values %r" % (values,))
            problems.append("want   %r" % (man["values"],))
    except (OSError, ValueError) as e:
        problems.append(str(e))
    tap.ok(not problems, "%s: summary counts/warnings, metadata.json dcp (layout, version, "
           "storage_meta, %d values)" % (label, len(man["values"])), problems)


def check_hf_view(tap, label, mnt, man):
    problems = []
    try:
        view = read_safetensors(os.path.join(mnt, ".ckptfs", "hf", "model.safetensors"))
        want = {t["name"]: t for t in man["tensors"] if not t["aside"] and not t["incomplete"]}
        problems += ["unexpected %s" % n for n in sorted(set(view) - set(want))]
        problems += ["missing %s" % n for n in sorted(set(want) - set(view))]
        for name in sorted(set(view) & set(want)):
            dt, shape, data = view[name]
            t = want[name]
            if dt != t["dtype"] or shape != t["shape"]:
                problems.append("%s: %s%r, want %s%r" % (name, dt, shape, t["dtype"], t["shape"]))
            elif hashlib.sha256(data).hexdigest() != t["sha256"]:
                problems.append("%s: bytes differ" % name)
    except (OSError, ValueError, KeyError) as e:
        problems.append("%s: %s" % (type(e).__name__, e))
    tap.ok(not problems, "%s: .ckptfs/hf/model.safetensors holds exactly the complete model "
           "tensors, same bytes" % label, problems)


def run_case(tap, ckptfs, case):
    src = os.path.join(COMMITTED, case)
    man = read_json(os.path.join(src, "manifest.json"))
    mnt = tempfile.mkdtemp(prefix="ckptfs-t36.")
    try:
        rc, _, err = run_capture([ckptfs, src, mnt], MOUNT_TIMEOUT)
        if not tap.ok(rc == 0 and is_mounted(mnt), "%s: mounts" % case,
                      ["exit status %r" % rc, "stderr: " + err.decode("utf-8", "replace")]):
            return
        with Watchdog(mnt, CASE_TIMEOUT) as dog:
            for t in man["tensors"]:
                check_bytes(tap, case, mnt, t)
                check_sidecar(tap, case, mnt, t)
            check_tree(tap, case, mnt, man["tensors"])
            check_documents(tap, case, mnt, man)
            check_hf_view(tap, case, mnt, man)
        if dog.fired:
            tap.ok(False, "%s: checks finished within %d s" % (case, CASE_TIMEOUT))
    finally:
        tap.ok(unmount(mnt), "%s: unmounts" % case)


# ---------------------------------------------------------------------------
# Hostile cases

def refuse(tap, ckptfs, src, rel, needle, desc, canary):
    mnt = tempfile.mkdtemp(prefix="ckptfs-t36h.")
    problems, took = [], 0.0
    try:
        start = time.monotonic()
        rc, _, err = run_capture([ckptfs, src, mnt], REFUSE_TIMEOUT)
        took = time.monotonic() - start
        text = err.decode("utf-8", "replace")
        body = text[:-1] if text.endswith("\n") else text
        if rc is None:
            problems.append("did not finish within %d s (killed)" % REFUSE_TIMEOUT)
        elif rc != 2:
            problems.append("exit status %r, want 2" % rc)
        if not body.strip():
            problems.append("stderr is empty")
        elif "\n" in body:
            problems.append("stderr has %d lines, want 1" % (body.count("\n") + 1))
        if body.strip() and not needle_matches(needle, body.replace(src, "SRC")):
            problems.append("stderr lacks %r" % needle)
        if is_mounted(mnt):
            problems.append("something is mounted")
        if canary and os.path.exists(canary):
            problems.append("CANARY %s exists: the payload ran" % canary)
        if problems:
            problems += ["stderr: " + ln for ln in text.splitlines()[:5]]
    finally:
        unmount(mnt)
    tap.ok(not problems, "refuse %s in %.2f s (%s): %s" % (rel, took, needle, desc), problems)


def mount_safely(tap, ckptfs, src, rel, needle, desc, canary):
    mnt = tempfile.mkdtemp(prefix="ckptfs-t36h.")
    try:
        rc, _, err = run_capture([ckptfs, src, mnt], MOUNT_TIMEOUT)
        if not tap.ok(rc == 0 and is_mounted(mnt), "mount %s: %s" % (rel, desc),
                      ["exit status %r" % rc, "stderr: " + err.decode("utf-8", "replace")]):
            return
        problems, nfiles = [], 0
        with Watchdog(mnt, CASE_TIMEOUT) as dog:
            for dirpath, _dirs, files in os.walk(mnt, onerror=problems.append):
                for name in files:
                    p = os.path.join(dirpath, name)
                    try:
                        data = read_bytes(p)
                        nfiles += 1
                        if name.endswith(".json"):
                            json.loads(data)
                    except (OSError, ValueError) as e:
                        problems.append("%s: %s" % (p, e))
            try:
                warnings = read_json(os.path.join(mnt, ".ckptfs", "summary.json"))["warnings"]
                if not any(needle_matches(needle, w) for w in warnings):
                    problems.append("no warning contains %r: %r" % (needle, warnings))
            except (OSError, ValueError, KeyError) as e:
                problems.append(str(e))
        if dog.fired:
            problems.insert(0, "checks did not finish within %d s" % CASE_TIMEOUT)
        if canary and os.path.exists(canary):
            problems.append("CANARY %s exists: the payload ran" % canary)
        tap.ok(not problems, "%s: all %d files read, a warning says %r" % (rel, nfiles, needle),
               problems[:10])
    finally:
        tap.ok(unmount(mnt), "%s: unmounts" % rel)


def payload_is_live(tap, hostile, rel, info):
    """Python's own unpickler runs the payload: proof that the canary would catch it."""
    canary = info["canary"]
    case = os.path.join(hostile, rel)
    if "zip" in info:
        script = ("import pickle, sys, zipfile\n"
                  "data = zipfile.ZipFile(sys.argv[1]).read(sys.argv[2])\n"
                  "try:\n    pickle.loads(data)\nexcept Exception:\n    pass\n")
        args = [os.path.join(case, info["zip"]), info["record"]]
    else:
        script = ("import pickle, sys\n"
                  "try:\n    pickle.loads(open(sys.argv[1], 'rb').read())\n"
                  "except Exception:\n    pass\n")
        args = [os.path.join(case, info["pickle"])]
    with tempfile.TemporaryDirectory() as cwd:
        subprocess.run([sys.executable, "-c", script] + args, cwd=cwd, timeout=30,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 5
    while not os.path.exists(canary) and time.monotonic() < deadline:
        time.sleep(0.05)
    live = os.path.exists(canary)
    if live:
        os.unlink(canary)
    tap.ok(live, "%s: control: Python's pickle.loads runs the payload (creates %s)"
           % (rel, canary))


def run_hostile(tap, ckptfs, hostile):
    rows = []
    with open(os.path.join(hostile, "cases.tsv"), encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i and line.strip():
                rows.append(line.rstrip("\n").split("\t"))
    canaries = read_json(os.path.join(hostile, "canaries.json"))
    tap.ok(len(rows) >= 40 and len(canaries) >= 4,
           "dcp/hostile lists %d cases, %d with canaries" % (len(rows), len(canaries)))
    for rel, expect, needle, desc in rows:
        info = canaries.get(rel, {})
        canary = info.get("canary")
        if canary and os.path.exists(canary):
            os.unlink(canary)
        src = os.path.join(hostile, rel)
        if expect == "refuse":
            refuse(tap, ckptfs, src, rel, needle, desc, canary)
        else:
            mount_safely(tap, ckptfs, src, rel, needle, desc, canary)
        if canary and info.get("live", True):
            payload_is_live(tap, hostile, rel, info)


def main():
    ckptfs = os.environ.get("CKPTFS", "")
    fixtures = os.environ.get("FIXTURES", "")
    reason = skip_reason(ckptfs, fixtures)
    if reason:
        print("1..0 # SKIP " + reason)
        return 0
    ckptfs = os.path.abspath(ckptfs)
    sys.stdout.reconfigure(encoding="utf-8", errors="backslashreplace")
    tap = Tap()
    cases = sorted(d for d in os.listdir(COMMITTED)
                   if os.path.isfile(os.path.join(COMMITTED, d, "manifest.json")))
    tap.ok(len(cases) >= 8, "found %d committed DCP cases in %s" % (len(cases), COMMITTED))
    for case in cases:
        run_case(tap, ckptfs, case)
    hostile = os.path.join(os.path.abspath(fixtures), "dcp", "hostile")
    if tap.ok(os.path.isfile(os.path.join(hostile, "cases.tsv")), "%s/cases.tsv exists" % hostile):
        run_hostile(tap, ckptfs, hostile)
    tap.done()
    return 1 if tap.failed else 0


if __name__ == "__main__":
    sys.exit(main())
