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

import hashlib
import json
import os
import stat
import struct
import sys
import tempfile
import time

MOUNT_TIMEOUT = 30
REFUSE_TIMEOUT = 10
CASE_TIMEOUT = 120
EXIT_SOURCE = 2   # ckptfs: the source cannot be read or is invalid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from ckptfs_test import (Tap, Watchdog, is_mounted, run_capture, skip_reason,  # noqa: E402
                         unmount)


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def sidecar_path(raw_path):
    base = raw_path[:-4] if raw_path.endswith(".raw") else raw_path
    return base + ".json"


# ---------------------------------------------------------------------------
# Good cases

SIDECAR_KEYS = ("name", "dtype", "shape", "nbytes", "ggml_type", "ggml_type_id", "block_size",
                "type_size")


def check_tensor(tap, label, mnt, t):
    problems = []
    raw = os.path.join(mnt, t["path"]).encode("utf-8")
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
        problems.append(str(e))
    tap.ok(not problems, "%s: %s size and sha256" % (label, t["path"]), problems)

    problems = []
    side = sidecar_path(t["path"])
    try:
        sc = json.loads(read_bytes(os.path.join(mnt, side).encode("utf-8")))
        for key in SIDECAR_KEYS:
            got = sc.get(key)
            if got != t[key] or type(got) is not type(t[key]):
                problems.append("%s: got %r, want %r" % (key, got, t[key]))
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


def check_tree(tap, label, mnt, tensors):
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
            if "." not in name or name.endswith(".json") or name.endswith(".raw"):
                got.add(os.path.join(rel, name))
    problems += ["missing: " + p for p in sorted(want - got)]
    problems += ["unexpected: " + p for p in sorted(got - want)]
    tap.ok(not problems, "%s: tree holds exactly the expected files" % label, problems)


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
    with open(os.path.join(case_dir, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    for source in manifest["sources"]:
        label = "%s via %s" % (case, source)
        mnt = tempfile.mkdtemp(prefix="ckptfs-t41.")
        try:
            rc, _, err = run_capture([ckptfs, os.path.join(case_dir, source), mnt], MOUNT_TIMEOUT)
            if not tap.ok(rc == 0 and is_mounted(mnt), "%s: mount" % label,
                          ["exit status %r" % (rc,),
                           "stderr: " + err.decode("utf-8", "replace").strip()]):
                continue
            with Watchdog(mnt, CASE_TIMEOUT) as dog:
                for t in manifest["tensors"]:
                    check_tensor(tap, label, mnt, t)
                check_tree(tap, label, mnt, manifest["tensors"])
                check_metadata(tap, label, mnt, manifest, len(manifest["tensors"]))
            if dog.fired:
                tap.ok(False, "%s: checks finished within %d s" % (label, CASE_TIMEOUT))
        finally:
            tap.ok(unmount(mnt), "%s: fusermount3 -u" % label)


# ---------------------------------------------------------------------------
# Hostile cases

def read_cases(path):
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line or line.startswith("#") or (lineno == 1 and line.startswith("path\t")):
                continue
            fields = line.split("\t")
            if len(fields) != 4 or fields[1] not in ("refuse", "mount"):
                raise ValueError("%s:%d: malformed row %r" % (path, lineno, line))
            rows.append(fields)
    return rows


def check_refuse(tap, ckptfs, src, rel, needle, desc):
    mnt = tempfile.mkdtemp(prefix="ckptfs-t41.")
    problems = []
    try:
        start = time.monotonic()
        rc, _, err = run_capture([ckptfs, src, mnt], REFUSE_TIMEOUT)
        took = time.monotonic() - start
        text = err.decode("utf-8", "replace")
        if rc is None:
            problems.append("did not finish within %d s (killed)" % REFUSE_TIMEOUT)
        elif rc != EXIT_SOURCE:
            problems.append("exit status %r, want %d" % (rc, EXIT_SOURCE))
        body = text[:-1] if text.endswith("\n") else text
        if not body.strip():
            problems.append("stderr is empty")
        elif "\n" in body:
            problems.append("stderr has %d lines, want 1" % (body.count("\n") + 1))
        words = [w for w in needle.lower().split("|") if w]
        if body.strip() and not any(w in body.lower() for w in words):
            problems.append("stderr lacks %r" % needle)
        if is_mounted(mnt):
            problems.append("something is mounted on the mountpoint")
        if problems:
            problems.append("took %.1f s" % took)
            problems += ["stderr: " + ln for ln in text.splitlines()[:5]]
    finally:
        unmount(mnt)
    tap.ok(not problems, "refuse %s (%s): %s" % (rel, needle, desc), problems)


def walk_and_read(mnt):
    """Reads every file of the mount; returns (problems, sidecar names, file count)."""
    problems, names, nfiles = [], [], 0
    top = os.fsencode(mnt)
    for dirpath, dirnames, filenames in os.walk(top, onerror=problems.append):
        in_meta = (dirpath + b"/").startswith(top + b"/.ckptfs/")
        for name in filenames:
            full = os.path.join(dirpath, name)
            nfiles += 1
            try:
                st = os.lstat(full)
                data = read_bytes(full)
                if len(data) != st.st_size:
                    problems.append("%r: read %d bytes, st_size %d" % (full, len(data),
                                                                        st.st_size))
                if full.endswith(b".json"):
                    doc = json.loads(data)
                    if not in_meta:
                        names.append(doc["name"])
            except (OSError, ValueError, KeyError, TypeError) as e:
                problems.append("%r: %s" % (full, e))
    return problems[:20], names, nfiles


def check_mount(tap, ckptfs, src, rel, desc, want_names):
    mnt = tempfile.mkdtemp(prefix="ckptfs-t41.")
    try:
        rc, _, err = run_capture([ckptfs, src, mnt], MOUNT_TIMEOUT)
        if not tap.ok(rc == 0 and is_mounted(mnt), "mount %s: %s" % (rel, desc),
                      ["exit status %r" % (rc,),
                       "stderr: " + err.decode("utf-8", "replace").strip()]):
            return
        with Watchdog(mnt, CASE_TIMEOUT) as dog:
            problems, names, nfiles = walk_and_read(mnt)
        if dog.fired:
            problems.insert(0, "walk did not finish within %d s" % CASE_TIMEOUT)
        if want_names is not None and sorted(names) != sorted(want_names):
            problems.append("sidecar names %s, want %s" % (ascii(sorted(names))[:300],
                                                           ascii(sorted(want_names))[:300]))
        tap.ok(not problems, "%s: every file reads fully, sidecars name every tensor (%d files)"
               % (rel, nfiles), problems)
    finally:
        tap.ok(unmount(mnt), "%s: fusermount3 -u" % rel)


def run_hostile(tap, ckptfs, hostile):
    try:
        rows = read_cases(os.path.join(hostile, "cases.tsv"))
        with open(os.path.join(hostile, "mount-names.json"), encoding="utf-8") as f:
            names = json.load(f)
    except (OSError, ValueError) as e:
        tap.ok(False, "read hostile/cases.tsv and mount-names.json", [str(e)])
        return
    tap.ok(len(rows) >= 40, "hostile/cases.tsv lists %d cases" % len(rows))
    for rel, expect, needle, desc in rows:
        src = os.path.join(hostile, rel)
        if not os.path.lexists(src):
            tap.ok(False, "%s exists" % rel)
        elif expect == "refuse":
            check_refuse(tap, ckptfs, src, rel, needle, desc)
        else:
            check_mount(tap, ckptfs, src, rel, desc, names.get(rel))


def main():
    ckptfs = os.environ.get("CKPTFS", "")
    fixtures = os.environ.get("FIXTURES", "")
    reason = skip_reason(ckptfs, fixtures)
    if not reason and not os.path.isdir(os.path.join(fixtures, "gguf")):
        reason = "FIXTURES/gguf is missing (tests/gen/gguf_fixtures.py not run)"
    if reason:
        print("1..0 # SKIP " + reason)
        return 0
    ckptfs = os.path.abspath(ckptfs)
    root = os.path.join(os.path.abspath(fixtures), "gguf")
    sys.stdout.reconfigure(encoding="utf-8", errors="backslashreplace")

    tap = Tap()
    cases = sorted(d for d in os.listdir(root)
                   if os.path.isfile(os.path.join(root, d, "manifest.json")))
    tap.ok(len(cases) >= 5, "found %d GGUF cases with manifest.json" % len(cases))
    for case in cases:
        run_case(tap, ckptfs, root, case)
    run_hostile(tap, ckptfs, os.path.join(root, "hostile"))
    tap.done()
    return 1 if tap.failed else 0


if __name__ == "__main__":
    sys.exit(main())
