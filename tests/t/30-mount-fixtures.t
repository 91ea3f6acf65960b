#!/usr/bin/python3
"""Mount every generated safetensors fixture and compare it with its manifest.

Environment:
  CKPTFS    path of the ckptfs binary
  FIXTURES  output directory of tests/gen/safetensors_fixtures.py

Every case directory holding a manifest.json is mounted read-only through the
real kernel FUSE driver, and every tensor is checked against bytes and hashes
that the (independent) Python generator recorded.
"""

import errno
import hashlib
import json
import os
import stat
import sys
import tempfile

MOUNT_TIMEOUT = 30      # seconds for `ckptfs SRC MNT` to return
CASE_TIMEOUT = 180      # seconds for all checks of one mounted case


sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from ckptfs_test import (Tap, Watchdog, is_mounted, run_capture, skip_reason,  # noqa: E402
                         unmount)

# ---------------------------------------------------------------------------
# Checks

def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def sidecar_path(raw_path):
    # Path components never contain '.', so a trailing ".raw" can only be the
    # marker for a tensor that is also a directory.
    base = raw_path[:-4] if raw_path.endswith(".raw") else raw_path
    return base + ".json"


def summary_tensor_count(summary):
    """The tensor count from summary.json (ckptfs(5): "tensor_count")."""
    v = summary.get("tensor_count") if isinstance(summary, dict) else None
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def check_tensor(tap, case, mnt, case_dir, t):
    label = "%s: %s" % (case, t["name"])
    raw = os.path.join(mnt, t["path"]).encode("utf-8")
    src = os.path.join(case_dir, t["file"])

    problems = []
    try:
        st = os.stat(raw)
        if not stat.S_ISREG(st.st_mode):
            problems.append("not a regular file")
        if st.st_size != t["nbytes"]:
            problems.append("st_size %d != nbytes %d" % (st.st_size, t["nbytes"]))
        data = read_bytes(raw)
        if len(data) != t["nbytes"]:
            problems.append("read %d bytes, want %d" % (len(data), t["nbytes"]))
        if hashlib.sha256(data).hexdigest() != t["sha256"]:
            problems.append("sha256 mismatch")
    except OSError as e:
        problems.append("%s: %s" % (t["path"], e))
    tap.ok(not problems, "%s raw file %s: size and sha256" % (label, t["path"]), problems)

    problems, sc = [], None
    side = sidecar_path(t["path"])
    try:
        sc = json.loads(read_bytes(os.path.join(mnt, side).encode("utf-8")).decode("utf-8"))
        for key in ("name", "dtype", "shape", "nbytes"):
            if sc.get(key) != t[key]:
                problems.append("%s: got %r, want %r" % (key, sc.get(key), t[key]))
        if sc.get("byte_order") != "little":
            problems.append("byte_order: got %r" % (sc.get("byte_order"),))
        if not isinstance(sc.get("format"), str):
            problems.append("format missing")
        if t["numpy_dtype"] is None:
            if sc.get("numpy_dtype") is not None:
                problems.append("numpy_dtype %r for a dtype numpy lacks" % sc["numpy_dtype"])
        elif sc.get("numpy_dtype") != t["numpy_dtype"]:
            problems.append("numpy_dtype: got %r, want %r"
                            % (sc.get("numpy_dtype"), t["numpy_dtype"]))
        sources = sc.get("sources")
        if not isinstance(sources, list) or len(sources) != 1:
            problems.append("sources: want one entry, got %r" % (sources,))
        else:
            s = sources[0]
            if os.path.basename(str(s.get("file"))) != t["file"]:
                problems.append("sources.file %r, want %r" % (s.get("file"), t["file"]))
            if s.get("offset") != t["offset"] or s.get("length") != t["nbytes"]:
                problems.append("sources offset/length %r/%r, want %d/%d"
                                % (s.get("offset"), s.get("length"), t["offset"], t["nbytes"]))
    except (OSError, ValueError, AttributeError) as e:
        problems.append("%s: %s" % (side, e))
        sc = None
    tap.ok(not problems, "%s sidecar %s" % (label, side), problems)

    if t["numpy_dtype"] is None:
        return
    problems = []
    try:
        import numpy as np
        with open(raw, "rb") as f:
            got = np.fromfile(f, dtype=sc["numpy_dtype"]).reshape(sc["shape"])
        with open(src, "rb") as f:
            f.seek(t["offset"])
            want = np.frombuffer(f.read(t["nbytes"]), dtype=np.dtype(t["numpy_dtype"]))
        want = want.reshape(t["shape"])
        if got.dtype != want.dtype or got.shape != want.shape:
            problems.append("dtype/shape %s%s, want %s%s"
                            % (got.dtype, got.shape, want.dtype, want.shape))
        elif not np.array_equal(got, want, equal_nan=got.dtype.kind in "fc"):
            problems.append("values differ")
    except Exception as e:  # any failure here is a test failure, not a crash
        problems.append("%s: %s" % (type(e).__name__, e))
    tap.ok(not problems, "%s numpy.fromfile(%s) equals source" % (label, t["numpy_dtype"]),
           problems)


def check_tree(tap, case, mnt, tensors):
    """Raw files and sidecars outside .ckptfs are exactly the manifest's."""
    want = set()
    for t in tensors:
        want.add(t["path"])
        want.add(sidecar_path(t["path"]))
    got, problems = set(), []
    for dirpath, dirnames, filenames in os.walk(mnt, onerror=problems.append):
        rel = os.path.relpath(dirpath, mnt)
        if rel == ".":
            dirnames[:] = [d for d in dirnames if d != ".ckptfs"]
            rel = ""
        for name in filenames:
            p = os.path.join(rel, name)
            # Raw tensors have no '.', sidecars end in .json, tensor-dirs'
            # bytes in .raw; anything else (e.g. an .npy view) is extra and
            # allowed.
            if "." not in name or name.endswith(".json") or name.endswith(".raw"):
                got.add(p)
    for p in sorted(want - got):
        problems.append("missing: " + p)
    for p in sorted(got - want):
        problems.append("unexpected: " + p)
    tap.ok(not problems, "%s: tree holds exactly the expected raw files and sidecars" % case,
           problems)


def check_catalog_files(tap, case, mnt, ntensors):
    dot = os.path.join(mnt, ".ckptfs")
    problems = []
    try:
        summary = json.loads(read_bytes(os.path.join(dot, "summary.json")))
        count = summary_tensor_count(summary)
        if count != ntensors:
            problems.append("tensor count %r, want %d" % (count, ntensors))
    except (OSError, ValueError) as e:
        problems.append(str(e))
    tap.ok(not problems, "%s: .ckptfs/summary.json parses, tensor count %d" % (case, ntensors),
           problems)

    problems = []
    try:
        json.loads(read_bytes(os.path.join(dot, "metadata.json")))
    except (OSError, ValueError) as e:
        problems.append(str(e))
    tap.ok(not problems, "%s: .ckptfs/metadata.json parses" % case, problems)

    problems = []
    try:
        lines = read_bytes(os.path.join(dot, "tensors.tsv")).split(b"\n")
        if lines and lines[-1] == b"":
            lines.pop()
        if len(lines) != ntensors + 1:
            problems.append("%d lines, want %d" % (len(lines), ntensors + 1))
        short = [ln for ln in lines[1:] if ln.count(b"\t") < 3]
        if short:
            problems.append("%d lines with fewer than 4 fields, e.g. %r" % (len(short), short[0]))
    except OSError as e:
        problems.append(str(e))
    tap.ok(not problems, "%s: .ckptfs/tensors.tsv has header + %d lines" % (case, ntensors),
           problems)


def expect_erofs(what, fn, problems):
    try:
        fn()
    except OSError as e:
        if e.errno != errno.EROFS:
            problems.append("%s: %s, want EROFS" % (what, e))
        return
    problems.append("%s: succeeded" % what)


def check_read_only(tap, case, mnt, tensors):
    problems = []

    def create():
        os.close(os.open(os.path.join(mnt, "ckptfs-write-probe"),
                         os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    expect_erofs("create file", create, problems)
    expect_erofs("mkdir", lambda: os.mkdir(os.path.join(mnt, "ckptfs-dir-probe")), problems)
    nonempty = [t for t in tensors if t["nbytes"] > 0]
    if nonempty:
        raw = os.path.join(mnt, nonempty[0]["path"]).encode("utf-8")

        # Probes that would not change any bytes even if they succeeded, so
        # a buggy write-through can never corrupt the fixtures.
        expect_erofs("open tensor O_WRONLY",
                     lambda: os.close(os.open(raw, os.O_WRONLY)), problems)
        expect_erofs("truncate tensor to its own size",
                     lambda: os.truncate(raw, nonempty[0]["nbytes"]), problems)
        expect_erofs("chmod tensor", lambda: os.chmod(raw, 0o644), problems)
    tap.ok(not problems, "%s: writes into the mount fail with EROFS" % case, problems)


def check_hf_config(tap, case, mnt, case_dir):
    problems = []
    try:
        if read_bytes(os.path.join(mnt, ".ckptfs", "hf", "config.json")) != \
                read_bytes(os.path.join(case_dir, "config.json")):
            problems.append("bytes differ from the source config.json")
    except OSError as e:
        problems.append(str(e))
    tap.ok(not problems, "%s: .ckptfs/hf/config.json equals source config.json" % case,
           problems)


def run_case(tap, ckptfs, fixtures, case):
    case_dir = os.path.join(fixtures, case)
    with open(os.path.join(case_dir, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    source = os.path.normpath(os.path.join(case_dir, manifest["source"]))
    tensors = manifest["tensors"]

    mnt = tempfile.mkdtemp(prefix="ckptfs-t30.")
    try:
        rc, _, err = run_capture([ckptfs, source, mnt], MOUNT_TIMEOUT)
        mounted = rc == 0 and is_mounted(mnt)
        diag = ["exit status %r%s" % (rc, " (timed out)" if rc is None else ""),
                "stderr: %s" % err.decode("utf-8", "replace").strip()]
        if not tap.ok(mounted, "%s: mount %s" % (case, manifest["source"]), diag):
            return
        with Watchdog(mnt, CASE_TIMEOUT) as dog:
            for t in tensors:
                check_tensor(tap, case, mnt, case_dir, t)
            check_tree(tap, case, mnt, tensors)
            check_catalog_files(tap, case, mnt, len(tensors))
            check_read_only(tap, case, mnt, tensors)
            if os.path.isdir(source) and os.path.exists(os.path.join(source, "config.json")):
                check_hf_config(tap, case, mnt, source)
        if dog.fired:
            tap.ok(False, "%s: checks finished within %d s" % (case, CASE_TIMEOUT),
                   ["watchdog aborted the mount"])
    finally:
        tap.ok(unmount(mnt), "%s: fusermount3 -u" % case)


def main():
    ckptfs = os.environ.get("CKPTFS", "")
    fixtures = os.environ.get("FIXTURES", "")
    reason = skip_reason(ckptfs, fixtures)
    if reason:
        print("1..0 # SKIP " + reason)
        return 0
    ckptfs = os.path.abspath(ckptfs)
    fixtures = os.path.abspath(fixtures)

    # Names are UTF-8 whatever the locale of the harness says.
    sys.stdout.reconfigure(encoding="utf-8", errors="backslashreplace")
    tap = Tap()
    cases = sorted(d for d in os.listdir(fixtures)
                   if os.path.isfile(os.path.join(fixtures, d, "manifest.json")))
    tap.ok(bool(cases), "found fixture cases with manifest.json in %s" % fixtures)
    for case in cases:
        run_case(tap, ckptfs, fixtures, case)
    tap.done()
    return 1 if tap.failed else 0


if __name__ == "__main__":
    sys.exit(main())
