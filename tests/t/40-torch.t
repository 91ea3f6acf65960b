#!/usr/bin/python3
"""torch.save files: mount real torch 1.13 fixtures and check them against torch's own
figures; refuse hostile files quickly, with one line, without running anything.

Environment:
  CKPTFS    path of the ckptfs binary
  FIXTURES  output directory of the generators; FIXTURES/torch_hostile comes from
            tests/gen/torch_hostile_fixtures.py
The good fixtures are committed in tests/fixtures/torch (written by tests/gen/torch_fixtures.py
with real torch), so this test needs no torch.
"""

import hashlib
import json
import os
import stat
import subprocess
import sys
import tempfile
import time

MOUNT_TIMEOUT = 30
CASE_TIMEOUT = 120
REFUSE_TIMEOUT = 10

HERE = os.path.dirname(os.path.realpath(__file__))
COMMITTED = os.path.normpath(os.path.join(HERE, "..", "fixtures", "torch"))

sys.path.insert(0, os.path.join(HERE, "..", "lib"))
from ckptfs_test import (Tap, Watchdog, is_mounted, run_capture, skip_reason,  # noqa: E402
                         unmount)


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


# ---------------------------------------------------------------------------
# Good fixtures

def check_tensor(tap, label, mnt, t):
    raw = os.path.join(mnt, t["path"])
    problems = []
    try:
        st = os.stat(raw)
        if not stat.S_ISREG(st.st_mode):
            problems.append("not a regular file")
        if st.st_size != t["nbytes"]:
            problems.append("st_size %d != nbytes %d" % (st.st_size, t["nbytes"]))
        data = read_bytes(raw)
        if hashlib.sha256(data).hexdigest() != t["sha256"]:
            problems.append("sha256 of %d bytes differs from torch's contiguous bytes" % len(data))
    except OSError as e:
        problems.append(str(e))
    tap.ok(not problems, "%s: %s bytes equal torch's row-major bytes (sha256)" % (label, t["name"]),
           problems)

    problems, sc = [], {}
    try:
        sc = json.loads(read_bytes(raw + ".json"))
    except (OSError, ValueError) as e:
        problems.append("sidecar: %s" % e)
    for key in ("name", "dtype", "shape", "nbytes", "requires_grad", "stride", "storage_offset"):
        if sc and sc.get(key) != t[key]:
            problems.append("%s: got %r, want %r" % (key, sc.get(key), t[key]))
    if sc and sc.get("format") != "torch-zip":
        problems.append("format %r" % sc.get("format"))
    if sc and not isinstance(sc.get("storage"), str):
        problems.append("storage key missing: %r" % sc.get("storage"))
    got_shared = sorted(sc.get("shared_with", [])) if sc else []
    if sc and got_shared != t["shared_with"]:
        problems.append("shared_with: got %r, want %r" % (got_shared, t["shared_with"]))
    tap.ok(not problems, "%s: %s sidecar (dtype, shape, stride, offset, requires_grad, sharing)"
           % (label, t["name"]), problems)
    return sc


def check_tree(tap, label, mnt, tensors):
    want = set()
    for t in tensors:
        want.add(t["path"])
        want.add(t["path"] + ".json")
    got, problems = set(), []
    for dirpath, dirnames, filenames in os.walk(mnt, onerror=problems.append):
        rel = os.path.relpath(dirpath, mnt)
        if rel == ".":
            dirnames[:] = [d for d in dirnames if d != ".ckptfs"]
            rel = ""
        for name in filenames:
            if "." not in name or name.endswith(".json") or name.endswith(".raw"):
                got.add(os.path.join(rel, name))
    problems += ["missing: " + p for p in sorted(want - got)]
    problems += ["unexpected: " + p for p in sorted(got - want)]
    tap.ok(not problems, "%s: tree holds exactly the tensors and sidecars" % label, problems)


def run_fixture(tap, ckptfs, fx):
    label = fx["file"]
    src = os.path.join(COMMITTED, fx["file"])
    mnt = tempfile.mkdtemp(prefix="ckptfs-t40.")
    try:
        rc, _, err = run_capture([ckptfs, src, mnt], MOUNT_TIMEOUT)
        if not tap.ok(rc == 0 and is_mounted(mnt), "%s: mounts" % label,
                      ["exit status %r" % rc, "stderr: " + err.decode("utf-8", "replace")]):
            return
        with Watchdog(mnt, CASE_TIMEOUT) as dog:
            sidecars = {}
            for t in fx["tensors"]:
                sidecars[t["name"]] = check_tensor(tap, label, mnt, t)
            # Tensors sharing a storage show the same key; others show different keys.
            problems = []
            for t in fx["tensors"]:
                for o in fx["tensors"]:
                    if o is t or not sidecars[t["name"]] or not sidecars[o["name"]]:
                        continue
                    same = sidecars[t["name"]].get("storage") == sidecars[o["name"]].get("storage")
                    if same != (o["name"] in t["shared_with"]):
                        problems.append("%s and %s: storage keys %s" % (
                            t["name"], o["name"], "equal" if same else "differ"))
            tap.ok(not problems, "%s: storage keys group exactly the tensors torch shares" % label,
                   problems[:10])
            check_tree(tap, label, mnt, fx["tensors"])
            problems = []
            try:
                meta = json.loads(read_bytes(os.path.join(mnt, ".ckptfs", "metadata.json")))
                if meta.get("pickle") != fx["pickle"]:
                    problems.append("pickle: got %r" % (meta.get("pickle"),))
                    problems.append("want %r" % (fx["pickle"],))
                summary = json.loads(read_bytes(os.path.join(mnt, ".ckptfs", "summary.json")))
                if summary.get("tensor_count") != len(fx["tensors"]):
                    problems.append("tensor_count %r, want %d"
                                    % (summary.get("tensor_count"), len(fx["tensors"])))
                if fx["file"] == "renamed.pt" and meta.get("torch", {}).get("archive") != \
                        "other_name":
                    problems.append("torch.archive %r, want 'other_name'"
                                    % (meta.get("torch"),))
            except (OSError, ValueError) as e:
                problems.append(str(e))
            tap.ok(not problems, "%s: metadata.json \"pickle\" holds every non-tensor value, "
                   "summary counts %d tensors" % (label, len(fx["tensors"])), problems)
        if dog.fired:
            tap.ok(False, "%s: checks finished within %d s" % (label, CASE_TIMEOUT))
    finally:
        tap.ok(unmount(mnt), "%s: unmounts" % label)


# ---------------------------------------------------------------------------
# Hostile files

def refuse(tap, ckptfs, src, rel, needle, desc, canary=None):
    mnt = tempfile.mkdtemp(prefix="ckptfs-t40.")
    problems = []
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
        words = [w.lower() for w in needle.split("|") if w]
        if body.strip() and not any(w in body.lower() for w in words):
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


def mount_safely(tap, ckptfs, src, rel, desc):
    mnt = tempfile.mkdtemp(prefix="ckptfs-t40.")
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
                        if len(data) != os.stat(p).st_size:
                            problems.append("%s: short read" % p)
                        if name.endswith(".json"):
                            json.loads(data)
                    except (OSError, ValueError) as e:
                        problems.append("%s: %s" % (p, e))
        if dog.fired:
            problems.insert(0, "walk did not finish within %d s" % CASE_TIMEOUT)
        tap.ok(not problems, "%s: all %d files read fully, JSON parses" % (rel, nfiles),
               problems[:10])
    finally:
        tap.ok(unmount(mnt), "%s: unmounts" % rel)


def payload_is_live(tap, hostile, rel, info):
    """Python's own unpickler runs the payload: proof that the canary would catch it."""
    canary = info["canary"]
    script = ("import pickle, sys, zipfile\n"
              "data = zipfile.ZipFile(sys.argv[1]).read(sys.argv[2])\n"
              "try:\n    pickle.loads(data)\nexcept Exception:\n    pass\n")
    with tempfile.TemporaryDirectory() as cwd:
        subprocess.run([sys.executable, "-c", script, os.path.join(hostile, rel), info["record"]],
                       cwd=cwd, timeout=30, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 5  # Popen runs its command asynchronously
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
    with open(os.path.join(hostile, "canaries.json"), encoding="utf-8") as f:
        canaries = json.load(f)
    tap.ok(len(rows) >= 60 and len(canaries) >= 5,
           "torch_hostile lists %d cases, %d with canaries" % (len(rows), len(canaries)))
    for rel, expect, needle, desc in rows:
        src = os.path.join(hostile, rel)
        canary = canaries.get(rel, {}).get("canary")
        if canary and os.path.exists(canary):
            os.unlink(canary)
        if expect == "refuse":
            refuse(tap, ckptfs, src, rel, needle, desc, canary)
        else:
            mount_safely(tap, ckptfs, src, rel, desc)
        if canary:
            payload_is_live(tap, hostile, rel, canaries[rel])


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
    with open(os.path.join(COMMITTED, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    fixtures_list = manifest["fixtures"]
    tap.ok(len(fixtures_list) >= 8, "manifest lists %d torch %s fixtures"
           % (len(fixtures_list), manifest.get("torch_version")))
    for fx in fixtures_list:
        run_fixture(tap, ckptfs, fx)
    hostile = os.path.join(os.path.abspath(fixtures), "torch_hostile")
    if tap.ok(os.path.isfile(os.path.join(hostile, "cases.tsv")),
              "%s/cases.tsv exists" % hostile):
        run_hostile(tap, ckptfs, hostile)
    tap.done()
    return 1 if tap.failed else 0


if __name__ == "__main__":
    sys.exit(main())
