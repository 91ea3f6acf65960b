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
import json
import os
import sys

CASE_TIMEOUT = 180      # seconds for all checks of one mounted case

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from mount_checks import (bytes_problems, case_dirs, check_tree, field_problems,  # noqa: E402
                          mounted, read_bytes, run, sidecar_path)

# ---------------------------------------------------------------------------
# Checks

def summary_tensor_count(summary):
    """The tensor count from summary.json (ckptfs(5): "tensor_count")."""
    v = summary.get("tensor_count") if isinstance(summary, dict) else None
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def check_tensor(tap, case, mnt, case_dir, t):
    label = "%s: %s" % (case, t["name"])
    raw = os.path.join(mnt, t["path"]).encode("utf-8")
    src = os.path.join(case_dir, t["file"])

    problems = bytes_problems(raw, t["nbytes"], t["sha256"])[0]
    tap.ok(not problems, "%s raw file %s: size and sha256" % (label, t["path"]), problems)

    problems, sc = [], None
    side = sidecar_path(t["path"])
    try:
        sc = json.loads(read_bytes(os.path.join(mnt, side).encode("utf-8")).decode("utf-8"))
        problems += field_problems(sc, {k: t[k] for k in ("name", "dtype", "shape", "nbytes")})
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

    def checks(mnt):
        for t in tensors:
            check_tensor(tap, case, mnt, case_dir, t)
        check_tree(tap, case, mnt, tensors, "tree holds exactly the expected raw files and "
                   "sidecars")
        check_catalog_files(tap, case, mnt, len(tensors))
        check_read_only(tap, case, mnt, tensors)
        if os.path.isdir(source) and os.path.exists(os.path.join(source, "config.json")):
            check_hf_config(tap, case, mnt, source)

    mounted(tap, ckptfs, source, case, checks, mount_desc="%s: mount %s"
            % (case, manifest["source"]), timeout=CASE_TIMEOUT)


def main(tap, ckptfs, fixtures):
    cases = case_dirs(fixtures)
    tap.ok(bool(cases), "found fixture cases with manifest.json in %s" % fixtures)
    for case in cases:
        run_case(tap, ckptfs, fixtures, case)


if __name__ == "__main__":
    sys.exit(run(main))
