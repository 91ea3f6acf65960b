#!/usr/bin/python3
"""Burnpack (.bpk): mount every generated fixture and the real Burn sample, compare them with
the manifests of tests/gen/burnpack_fixtures.py, and run every hostile case.

Environment:
  CKPTFS    path of the ckptfs binary
  FIXTURES  fixture root; this test reads FIXTURES/burnpack

good/CASE/manifest.json: every tensor's raw bytes (size, sha256), its sidecar (name, dtype,
shape, nbytes, numpy_dtype, burn_dtype, param_id, quantized, burn_shape, source offset), the
exact set of files in the tree, and the "burnpack" member of .ckptfs/metadata.json.
hostile/cases.tsv: "refuse" cases must exit with status 2 within 10 s, print one stderr line
holding the needle (case-insensitive, "a|b" accepts either) and mount nothing; "mount" cases
must mount, and every file in them must read fully.
"""

import hashlib
import json
import os
import stat
import sys
import tempfile

MOUNT_TIMEOUT = 30
REFUSE_TIMEOUT = 10
CASE_TIMEOUT = 120
EXIT_SOURCE = 2  # ckptfs: the source could not be opened

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from ckptfs_test import (Tap, Watchdog, is_mounted, run_capture, skip_reason,  # noqa: E402
                         unmount)


def skip(tap, desc, reason):
    # Tap.ok would escape the '#' of the directive.
    tap.n += 1
    print("ok %d - %s # SKIP %s" % (tap.n, Tap._clean(desc), Tap._clean(reason)))
    sys.stdout.flush()


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def mount(tap, ckptfs, source, mnt, label):
    rc, _, err = run_capture([ckptfs, source, mnt], MOUNT_TIMEOUT)
    return tap.ok(rc == 0 and is_mounted(mnt), "%s: mount" % label,
                  ["exit status %r%s" % (rc, " (timed out)" if rc is None else ""),
                   "stderr: " + err.decode("utf-8", "replace").strip()])


# ---------------------------------------------------------------------------
# Good cases


def check_tensor(tap, case, mnt, t):
    label = "%s: %s" % (case, t["name"])
    raw = os.path.join(mnt, t["path"])
    problems = []
    try:
        st = os.stat(raw)
        data = read_bytes(raw)
        if not stat.S_ISREG(st.st_mode):
            problems.append("not a regular file")
        if st.st_size != t["nbytes"] or len(data) != t["nbytes"]:
            problems.append("st_size %d, read %d bytes, want %d"
                            % (st.st_size, len(data), t["nbytes"]))
        if hashlib.sha256(data).hexdigest() != t["sha256"]:
            problems.append("sha256 mismatch")
    except OSError as e:
        problems.append(str(e))
    tap.ok(not problems, "%s: raw bytes (size, sha256)" % label, problems)

    problems = []
    try:
        sc = json.loads(read_bytes(raw + ".json"))
    except (OSError, ValueError) as e:
        tap.ok(False, "%s: sidecar" % label, [str(e)])
        return
    for key in ("name", "dtype", "shape", "nbytes", "burn_dtype"):
        if sc.get(key) != t[key]:
            problems.append("%s: got %r, want %r" % (key, sc.get(key), t[key]))
    if sc.get("format") != "burnpack":
        problems.append("format: got %r" % (sc.get("format"),))
    if sc.get("numpy_dtype") != t["numpy_dtype"]:
        problems.append("numpy_dtype: got %r, want %r" % (sc.get("numpy_dtype"), t["numpy_dtype"]))
    if t["param_id"] is None:
        if "param_id" in sc:
            problems.append("param_id %r, want none" % (sc["param_id"],))
    elif sc.get("param_id") != t["param_id"] or isinstance(sc.get("param_id"), bool):
        problems.append("param_id: got %r, want %r" % (sc.get("param_id"), t["param_id"]))
    if t["quantized"]:
        if sc.get("quantized") is not True or sc.get("burn_shape") != t["burn_shape"]:
            problems.append("quantized/burn_shape: got %r/%r, want true/%r"
                            % (sc.get("quantized"), sc.get("burn_shape"), t["burn_shape"]))
    elif "quantized" in sc or "burn_shape" in sc:
        problems.append("quantized/burn_shape on a plain tensor")
    src = sc.get("sources")
    if not (isinstance(src, list) and len(src) == 1 and src[0].get("offset") == t["offset"]
            and src[0].get("length") == t["nbytes"]):
        problems.append("sources: got %r, want offset %d length %d"
                        % (src, t["offset"], t["nbytes"]))
    tap.ok(not problems, "%s: sidecar" % label, problems)


def check_tree(tap, case, mnt, tensors):
    want = {t["path"] for t in tensors} | {t["path"] + ".json" for t in tensors}
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
    tap.ok(not problems, "%s: tree holds exactly the manifest's files" % case, problems)


def check_docs(tap, case, mnt, manifest):
    problems = []
    try:
        meta = json.loads(read_bytes(os.path.join(mnt, ".ckptfs", "metadata.json")))
        if meta.get("format") != "burnpack":
            problems.append("format %r" % (meta.get("format"),))
        if meta.get("burnpack") != manifest["doc"]:
            problems.append("burnpack: got %s" % json.dumps(meta.get("burnpack")))
            problems.append("want %s" % json.dumps(manifest["doc"]))
        summary = json.loads(read_bytes(os.path.join(mnt, ".ckptfs", "summary.json")))
        if summary.get("tensor_count") != len(manifest["tensors"]):
            problems.append("summary tensor_count %r" % (summary.get("tensor_count"),))
    except (OSError, ValueError) as e:
        problems.append(str(e))
    tap.ok(not problems, "%s: .ckptfs/metadata.json \"burnpack\" and summary" % case, problems)


def run_good(tap, ckptfs, good, case):
    case_dir = os.path.join(good, case)
    with open(os.path.join(case_dir, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    if "skip" in manifest:
        skip(tap, "%s: mount and compare" % case, manifest["skip"])
        return
    source = os.path.join(case_dir, manifest["source"])  # absolute sources stay absolute
    mnt = tempfile.mkdtemp(prefix="ckptfs-t44.")
    try:
        if not mount(tap, ckptfs, source, mnt, case):
            return
        with Watchdog(mnt, CASE_TIMEOUT) as dog:
            for t in manifest["tensors"]:
                check_tensor(tap, case, mnt, t)
            check_tree(tap, case, mnt, manifest["tensors"])
            check_docs(tap, case, mnt, manifest)
        if dog.fired:
            tap.ok(False, "%s: checks finished within %d s" % (case, CASE_TIMEOUT))
    finally:
        tap.ok(unmount(mnt), "%s: fusermount3 -u" % case)


# ---------------------------------------------------------------------------
# Hostile cases


def check_refuse(tap, ckptfs, src, rel, needle, desc):
    mnt = tempfile.mkdtemp(prefix="ckptfs-t44.")
    problems = []
    try:
        rc, _, err = run_capture([ckptfs, src, mnt], REFUSE_TIMEOUT)
        text = err.decode("utf-8", "replace")
        body = text[:-1] if text.endswith("\n") else text
        if rc is None:
            problems.append("did not finish within %d s (killed)" % REFUSE_TIMEOUT)
        elif rc != EXIT_SOURCE:
            problems.append("exit status %r, want %d" % (rc, EXIT_SOURCE))
        if not body.strip():
            problems.append("stderr is empty")
        elif "\n" in body:
            problems.append("stderr has %d lines, want 1" % (body.count("\n") + 1))
        elif not any(w in body.lower() for w in needle.lower().split("|") if w):
            problems.append("stderr lacks %r" % needle)
        if is_mounted(mnt):
            problems.append("something is mounted")
        if problems:
            problems += ["stderr: " + ln for ln in text.splitlines()[:5]]
    finally:
        unmount(mnt)
    tap.ok(not problems, "refuse %s (%s): %s" % (rel, needle, desc), problems)


def walk_and_read(mnt):
    problems, names = [], []
    for dirpath, dirnames, filenames in os.walk(os.fsencode(mnt),
                                                onerror=lambda e: problems.append(str(e))):
        in_meta = b"/.ckptfs" in dirpath[len(os.fsencode(mnt)):]
        for name in filenames:
            full = os.path.join(dirpath, name)
            try:
                st = os.lstat(full)
                if not stat.S_ISREG(st.st_mode):
                    problems.append("%r is not a regular file" % full)
                    continue
                data = read_bytes(full)
                if len(data) != st.st_size:
                    problems.append("%r: read %d of %d bytes" % (full, len(data), st.st_size))
                if not in_meta and name.endswith(b".json"):
                    names.append(json.loads(data)["name"])
            except (OSError, ValueError, KeyError) as e:
                problems.append("%r: %s" % (full, e))
    return problems[:20], names


def check_mount(tap, ckptfs, src, rel, desc, want_names):
    mnt = tempfile.mkdtemp(prefix="ckptfs-t44.")
    try:
        if not mount(tap, ckptfs, src, mnt, "mount %s (%s)" % (rel, desc)):
            return
        with Watchdog(mnt, CASE_TIMEOUT) as dog:
            problems, names = walk_and_read(mnt)
        if dog.fired:
            problems.insert(0, "walk did not finish within %d s" % CASE_TIMEOUT)
        if want_names is not None and sorted(names) != sorted(want_names):
            problems.append("sidecar names %s, want %s" % (ascii(sorted(names)[:12]),
                                                           ascii(sorted(want_names)[:12])))
        tap.ok(not problems, "%s: every file reads fully, names as expected" % rel, problems)
    finally:
        tap.ok(unmount(mnt), "%s: fusermount3 -u" % rel)


def run_hostile(tap, ckptfs, hostile):
    rows = []
    with open(os.path.join(hostile, "cases.tsv"), encoding="utf-8") as f:
        for line in f.read().splitlines()[1:]:
            if line and not line.startswith("#"):
                rows.append(line.split("\t"))
    with open(os.path.join(hostile, "mount-names.json"), encoding="utf-8") as f:
        names = json.load(f)
    tap.ok(len(rows) >= 100, "hostile/cases.tsv lists %d cases" % len(rows))
    for rel, expect, needle, desc in rows:
        src = os.path.join(hostile, rel)
        if expect == "refuse":
            check_refuse(tap, ckptfs, src, rel, needle, desc)
        else:
            check_mount(tap, ckptfs, src, rel, desc, names.get(rel))


def main():
    ckptfs = os.environ.get("CKPTFS", "")
    fixtures = os.environ.get("FIXTURES", "")
    reason = skip_reason(ckptfs, fixtures)
    if reason:
        print("1..0 # SKIP " + reason)
        return 0
    ckptfs = os.path.abspath(ckptfs)
    root = os.path.join(os.path.abspath(fixtures), "burnpack")
    sys.stdout.reconfigure(encoding="utf-8", errors="backslashreplace")
    tap = Tap()
    good = os.path.join(root, "good")
    cases = sorted(os.listdir(good)) if os.path.isdir(good) else []
    tap.ok(len(cases) >= 10, "found %d Burnpack fixture cases in %s" % (len(cases), good))
    for case in cases:
        run_good(tap, ckptfs, good, case)
    run_hostile(tap, ckptfs, os.path.join(root, "hostile"))
    tap.done()
    return 1 if tap.failed else 0


if __name__ == "__main__":
    sys.exit(main())
