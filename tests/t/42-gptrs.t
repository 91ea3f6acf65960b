#!/usr/bin/python3
"""Mount every gpt-rs fixture (GPTRSCHK / GPTRSTEN) and feed the hostile ones.

Environment:
  CKPTFS    path of the ckptfs binary
  FIXTURES  fixture root; tests/gen/gptrs_fixtures.py wrote FIXTURES/gptrs

Good cases (a directory with manifest.json): every tensor's bytes (sha256) and
sidecar (name, dtype, shape, nbytes, format, numpy_dtype, sources, and the
format's extra members such as base_id) equal the manifest; the tree holds
exactly the expected files; .ckptfs/metadata.json carries the expected
"gpt-rs" document; expected warnings appear in summary.json.
Hostile cases (hostile/cases.tsv): "refuse" rows must exit with status 2
within 10 s, print one stderr line containing the needle, and mount nothing;
"mount" rows must mount and expose exactly the listed tensors.
"""

import hashlib
import json
import os
import sys
import tempfile

SUBDIR = "gptrs"
FORMAT = "gpt-rs"
MOUNT_TIMEOUT = 30
REFUSE_TIMEOUT = 10
CASE_TIMEOUT = 120

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from ckptfs_test import (Tap, Watchdog, is_mounted, run_capture, skip_reason,  # noqa: E402
                         unmount)


def read(path):
    with open(path, "rb") as f:
        return f.read()


def sidecar_of(raw_path):
    return (raw_path[:-4] if raw_path.endswith(".raw") else raw_path) + ".json"


def tensor_problems(mnt, t):
    problems = []
    raw = os.path.join(mnt, t["path"])
    try:
        data = read(raw)
        if os.stat(raw).st_size != t["nbytes"] or len(data) != t["nbytes"]:
            problems.append("size %d, want %d" % (len(data), t["nbytes"]))
        if hashlib.sha256(data).hexdigest() != t["sha256"]:
            problems.append("sha256 differs")
        sc = json.loads(read(os.path.join(mnt, sidecar_of(t["path"]))))
    except (OSError, ValueError) as e:
        return problems + [str(e)]
    want = {"name": t["name"], "dtype": t["dtype"], "shape": t["shape"], "nbytes": t["nbytes"],
            "format": FORMAT, "byte_order": "little", "numpy_dtype": t["numpy_dtype"]}
    want.update(t["extra"])
    for k, v in want.items():
        if sc.get(k) != v:
            problems.append("sidecar %s: got %r, want %r" % (k, sc.get(k), v))
    src = sc.get("sources")
    if not (isinstance(src, list) and len(src) == 1 and src[0].get("file") == t["file"]
            and src[0].get("offset") == t["offset"] and src[0].get("length") == t["nbytes"]):
        problems.append("sources %r, want one %s at %d, %d bytes"
                        % (src, t["file"], t["offset"], t["nbytes"]))
    return problems


def tree_problems(mnt, tensors):
    want = {t["path"] for t in tensors} | {sidecar_of(t["path"]) for t in tensors}
    got = set()
    for dirpath, dirnames, filenames in os.walk(mnt):
        rel = os.path.relpath(dirpath, mnt)
        if rel == ".":
            dirnames[:] = [d for d in dirnames if d != ".ckptfs"]
        for name in filenames:
            if "." not in name or name.endswith((".json", ".raw")):
                got.add(os.path.normpath(os.path.join(rel, name)))
    return (["missing: " + p for p in sorted(want - got)]
            + ["unexpected: " + p for p in sorted(got - want)])


def doc_problems(mnt, manifest):
    problems = []
    try:
        meta = json.loads(read(os.path.join(mnt, ".ckptfs", "metadata.json")))
        summary = json.loads(read(os.path.join(mnt, ".ckptfs", "summary.json")))
    except (OSError, ValueError) as e:
        return [str(e)]
    if meta.get("format") != FORMAT:
        problems.append("metadata format %r" % meta.get("format"))
    for key, want in manifest["metadata"].items():
        got = meta.get(key)
        if not isinstance(got, dict):
            problems.append("metadata[%r] is %r" % (key, got))
            continue
        for k, v in want.items():
            if got.get(k) != v:
                problems.append("metadata[%r][%r]: got %r, want %r" % (key, k, got.get(k), v))
    if summary.get("tensor_count") != len(manifest["tensors"]):
        problems.append("summary tensor_count %r" % summary.get("tensor_count"))
    warnings = " ".join(summary.get("warnings", []))
    for w in manifest.get("warnings", []):
        if w not in warnings:
            problems.append("no warning mentions %r: %r" % (w, warnings))
    if not manifest.get("warnings") and summary.get("warnings"):
        problems.append("unexpected warnings %r" % summary["warnings"])
    return problems


def run_good(tap, ckptfs, root, case):
    case_dir = os.path.join(root, case)
    manifest = json.loads(read(os.path.join(case_dir, "manifest.json")))
    mnt = tempfile.mkdtemp(prefix="ckptfs-t42.")
    try:
        rc, _, err = run_capture([ckptfs, os.path.join(case_dir, manifest["source"]), mnt],
                                 MOUNT_TIMEOUT)
        if not tap.ok(rc == 0 and is_mounted(mnt), "%s: mount" % case,
                      ["exit status %r" % rc, "stderr: " + err.decode("utf-8", "replace")]):
            return
        with Watchdog(mnt, CASE_TIMEOUT) as dog:
            for t in manifest["tensors"]:
                p = tensor_problems(mnt, t)
                tap.ok(not p, "%s: %s bytes and sidecar" % (case, t["name"]), p)
            p = tree_problems(mnt, manifest["tensors"])
            tap.ok(not p, "%s: tree holds exactly the expected files" % case, p)
            p = doc_problems(mnt, manifest)
            tap.ok(not p, "%s: metadata.json and summary.json" % case, p)
        if dog.fired:
            tap.ok(False, "%s: checks finished within %d s" % (case, CASE_TIMEOUT))
    finally:
        tap.ok(unmount(mnt), "%s: unmount" % case)


def read_cases(path):
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f.read().splitlines()[1:]:
            if line and not line.startswith("#"):
                rows.append(line.split("\t"))
    return rows


def sidecar_names(mnt):
    names = []
    for dirpath, dirnames, filenames in os.walk(mnt):
        if os.path.relpath(dirpath, mnt) == ".":
            dirnames[:] = [d for d in dirnames if d != ".ckptfs"]
        for name in filenames:
            full = os.path.join(dirpath, name)
            data = read(full)
            if len(data) != os.stat(full).st_size:
                raise OSError("%s: short read" % full)
            if name.endswith(".json"):
                names.append(json.loads(data)["name"])
    return names


def run_hostile(tap, ckptfs, hostile, rel, expect, needle, desc, mount_names):
    src = os.path.join(hostile, rel)
    mnt = tempfile.mkdtemp(prefix="ckptfs-t42.")
    try:
        timeout = REFUSE_TIMEOUT if expect == "refuse" else MOUNT_TIMEOUT
        rc, _, err = run_capture([ckptfs, src, mnt], timeout)
        text = err.decode("utf-8", "replace")
        problems = []
        if expect == "refuse":
            lines = text.rstrip("\n").split("\n")
            if rc != 2:
                problems.append("exit status %r, want 2" % (rc,))
            if len(lines) != 1 or not lines[0].strip():
                problems.append("stderr has %d lines, want 1" % len(lines))
            if not any(w in text.lower() for w in needle.lower().split("|")):
                problems.append("stderr lacks %r" % needle)
            if is_mounted(mnt):
                problems.append("something is mounted")
            tap.ok(not problems, "refuse %s (%s): %s" % (rel, needle, desc),
                   problems + ["stderr: " + text.strip()])
            return
        if not tap.ok(rc == 0 and is_mounted(mnt), "mount %s: %s" % (rel, desc),
                      ["exit status %r" % rc, "stderr: " + text.strip()]):
            return
        with Watchdog(mnt, CASE_TIMEOUT):
            try:
                names = sidecar_names(mnt)
                if sorted(names) != sorted(mount_names.get(rel, [])):
                    problems.append("names %r, want %r" % (sorted(names), mount_names.get(rel)))
            except (OSError, ValueError, KeyError) as e:
                problems.append("walk: %s" % e)
        tap.ok(not problems, "%s: whole tree reads, tensors %r" % (rel, mount_names.get(rel)),
               problems)
    finally:
        unmount(mnt)


def main():
    ckptfs = os.environ.get("CKPTFS", "")
    fixtures = os.environ.get("FIXTURES", "")
    reason = skip_reason(ckptfs, fixtures)
    if reason:
        print("1..0 # SKIP " + reason)
        return 0
    ckptfs = os.path.abspath(ckptfs)
    root = os.path.join(os.path.abspath(fixtures), SUBDIR)
    sys.stdout.reconfigure(encoding="utf-8", errors="backslashreplace")
    tap = Tap()
    cases = sorted(d for d in os.listdir(root)
                   if os.path.isfile(os.path.join(root, d, "manifest.json")))
    tap.ok(len(cases) >= 5, "found %d good cases in %s" % (len(cases), root))
    for case in cases:
        run_good(tap, ckptfs, root, case)
    hostile = os.path.join(root, "hostile")
    rows = read_cases(os.path.join(hostile, "cases.tsv"))
    tap.ok(len(rows) >= 25, "hostile/cases.tsv lists %d cases" % len(rows))
    mount_names = json.loads(read(os.path.join(hostile, "mount-names.json")))
    for rel, expect, needle, desc in rows:
        run_hostile(tap, ckptfs, hostile, rel, expect, needle, desc, mount_names)
    tap.done()
    return 1 if tap.failed else 0


if __name__ == "__main__":
    sys.exit(main())
