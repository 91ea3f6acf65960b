#!/usr/bin/python3
"""Mount MLFramework tensor-parallel fixtures and check the consolidated tree.

Environment:
  CKPTFS    path of the ckptfs binary
  FIXTURES  output root of the fixture generators; this test reads
            FIXTURES/mlfw, written by tests/gen/mlfw_fixtures.py

Every case's manifest.json lists one or more mounts (the same checkpoint with
different -o tp_split rules).  For each mount: every consolidated tensor's
size and sha256 (plus random preads of the bigger ones), its sidecar (dtype,
shape, nbytes, split_rule, split_dim, guessed, ranks, mlframework_dtype, the
float32 "payload" note exactly where the tag lies, sources with their boxes);
every .ckptfs/ranks/N/ tensor's bytes and sidecar; no other tensor files;
.ckptfs/metadata.json's "mlframework" object; summary.json counts and
warnings (each expected needle matches a warning, every warning is expected);
.ckptfs/hf holds exactly the consolidated tensors with the same bytes.
Every row of FIXTURES/mlfw/hostile/cases.tsv must be refused: exit status 2,
one stderr line containing the needle (the source path is blanked out before
matching), nothing mounted, within 10 s.
"""

import hashlib
import json
import os
import random
import struct
import sys
import tempfile
import time

MOUNT_TIMEOUT = 30
CASE_TIMEOUT = 180
REFUSE_TIMEOUT = 10
RANDOM_READS = 100
RANDOM_READ_MIN_BYTES = 4096

ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "I64": 8, "I32": 4}

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
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


# ---------------------------------------------------------------------------
# Strict safetensors reader for the HF view

def no_duplicates(pairs):
    d = {}
    for k, v in pairs:
        if k in d:
            raise ValueError("duplicate key %r" % k)
        d[k] = v
    return d


def parse_safetensors(data):
    """Returns {name: (dtype, shape, bytes)}; raises ValueError on anything off."""
    if len(data) < 8:
        raise ValueError("%d bytes, shorter than the length prefix" % len(data))
    (hlen,) = struct.unpack("<Q", data[:8])
    if 8 + hlen > len(data):
        raise ValueError("header length %d runs past the end" % hlen)
    header = json.loads(data[8:8 + hlen].decode("utf-8"), object_pairs_hook=no_duplicates)
    header.pop("__metadata__", None)
    body = data[8 + hlen:]
    spans, out = [], {}
    for name, e in header.items():
        if not isinstance(e, dict) or set(e) != {"dtype", "shape", "data_offsets"}:
            raise ValueError("%s: entry keys %r" % (name, e))
        dt, shape, (b, end) = e["dtype"], e["shape"], e["data_offsets"]
        if dt not in ITEMSIZE:
            raise ValueError("%s: dtype %r" % (name, dt))
        n = ITEMSIZE[dt]
        for x in shape:
            n *= x
        if end - b != n:
            raise ValueError("%s: data_offsets span %d, want %d" % (name, end - b, n))
        spans.append((b, end, name))
        out[name] = (dt, shape, body[b:end])
    at = 0
    for b, end, name in sorted(spans):
        if b != at:
            raise ValueError("%s: begins at %d, previous tensor ends at %d" % (name, b, at))
        at = end
    if at != len(body):
        raise ValueError("data section is %d bytes, tensors cover %d" % (len(body), at))
    return out


def read_hf_view(mnt):
    hf = os.path.join(mnt, ".ckptfs", "hf")
    single = os.path.join(hf, "model.safetensors")
    if os.path.exists(single):
        return parse_safetensors(read_bytes(single))
    index = read_json(os.path.join(hf, "model.safetensors.index.json"))
    out = {}
    for shard in sorted(set(index["weight_map"].values())):
        out.update(parse_safetensors(read_bytes(os.path.join(hf, shard))))
    return out


# ---------------------------------------------------------------------------
# Checks on one mount

def expected_sources(srcs):
    out = []
    for s in srcs:
        d = {"file": s["file"], "offset": s["offset"], "length": s["length"]}
        if s.get("box") is not None:
            d["box"] = s["box"]
        out.append(d)
    return out


def check_common_sidecar(sc, t, problems):
    for key in ("name", "dtype", "shape", "nbytes", "mlframework_dtype"):
        if sc.get(key) != t[key]:
            problems.append("%s: got %r, want %r" % (key, sc.get(key), t[key]))
    if sc.get("format") != "mlframework-tp":
        problems.append("format %r, want mlframework-tp" % sc.get("format"))
    if ("payload" in sc) != t["payload"]:
        problems.append("payload member %s, want %s"
                        % ("present (%r)" % sc.get("payload") if "payload" in sc else "absent",
                           "present" if t["payload"] else "absent"))
    elif t["payload"] and "float32" not in str(sc["payload"]):
        problems.append("payload %r does not say float32" % sc["payload"])


def check_tensor(tap, label, mnt, t, rnd):
    raw = os.path.join(mnt, t["path"])
    problems = []
    data = b""
    try:
        st = os.stat(raw)
        if st.st_size != t["nbytes"]:
            problems.append("st_size %d, want %d" % (st.st_size, t["nbytes"]))
        data = read_bytes(raw)
        if hashlib.sha256(data).hexdigest() != t["sha256"]:
            problems.append("sha256 mismatch (%d bytes read)" % len(data))
        elif t["nbytes"] >= RANDOM_READ_MIN_BYTES:
            fd = os.open(raw, os.O_RDONLY)
            try:
                for i in range(RANDOM_READS):
                    off = rnd.randrange(0, len(data) + 64)
                    length = rnd.randrange(1, 64 if i % 2 else 1 << 16)
                    got = os.pread(fd, length, off)
                    if got != data[off:off + length]:
                        problems.append("pread(%d, %d) differs from the whole read"
                                        % (off, length))
                        break
            finally:
                os.close(fd)
    except OSError as e:
        problems.append(str(e))
    tap.ok(not problems, "%s: size and sha256%s" % (
        label, " + %d random preads" % RANDOM_READS if t["nbytes"] >= RANDOM_READ_MIN_BYTES
        else ""), problems)

    problems = []
    try:
        sc = read_json(raw + ".json")
        check_common_sidecar(sc, t, problems)
        for key in ("split_rule", "split_dim", "guessed", "ranks"):
            if key not in sc or sc[key] != t[key] or type(sc[key]) is not type(t[key]):
                problems.append("%s: got %r, want %r" % (key, sc.get(key, "(absent)"), t[key]))
        want = expected_sources(t["sources"])
        if sc.get("sources") != want:
            problems.append("sources: got %r" % (sc.get("sources"),))
            problems.append("     want %r" % (want,))
    except (OSError, ValueError) as e:
        problems.append("%s.json: %s" % (t["path"], e))
    tap.ok(not problems, "%s: sidecar %s dim %r%s" % (label, t["split_rule"], t["split_dim"],
                                                     ", payload note" if t["payload"] else ""),
           problems)


def check_ranks(tap, case, mnt, manifest):
    by_rank = {}
    for t in manifest["ranks"]:
        by_rank.setdefault(t["rank"], []).append(t)
    for r in sorted(by_rank):
        problems = []
        for t in by_rank[r]:
            raw = os.path.join(mnt, t["path"])
            try:
                data = read_bytes(raw)
                if os.stat(raw).st_size != t["nbytes"] or len(data) != t["nbytes"]:
                    problems.append("%s: %d bytes, want %d" % (t["name"], len(data), t["nbytes"]))
                elif hashlib.sha256(data).hexdigest() != t["sha256"]:
                    problems.append("%s: sha256 mismatch" % t["name"])
                sc = read_json(raw + ".json")
                sub = []
                check_common_sidecar(sc, t, sub)
                if "split_rule" in sc:
                    sub.append("has split_rule %r (a per-rank copy is not split)"
                               % sc["split_rule"])
                want = [{"file": t["file"], "offset": t["offset"], "length": t["nbytes"]}]
                if sc.get("sources") != want:
                    sub.append("sources %r, want %r" % (sc.get("sources"), want))
                problems += ["%s: %s" % (t["name"], p) for p in sub]
            except (OSError, ValueError) as e:
                problems.append("%s: %s" % (t["name"], e))
        tap.ok(not problems, "%s: .ckptfs/ranks/%d: %d tensors, bytes and sidecars"
               % (case, r, len(by_rank[r])), problems)


def walk_files(top, problems, skip_ckptfs):
    got = set()
    for dirpath, dirnames, filenames in os.walk(top, onerror=problems.append):
        rel = os.path.relpath(dirpath, top)
        if rel == ".":
            rel = ""
            if skip_ckptfs:
                dirnames[:] = [d for d in dirnames if d != ".ckptfs"]
        for name in filenames:
            got.add(os.path.join(rel, name))
    return got


def check_tree(tap, case, mnt, manifest, tensors):
    problems = []
    want = set()
    for t in tensors:
        want |= {t["path"], t["path"] + ".json"}
    # NAME.npy views of numpy-typed tensors are checked by 35-npy.t
    got = {p for p in walk_files(mnt, problems, True) if not p.endswith(".npy")}
    problems += ["missing: " + p for p in sorted(want - got)]
    problems += ["unexpected: " + p for p in sorted(got - want)]
    ranks_dir = os.path.join(mnt, ".ckptfs", "ranks")
    if manifest["ranks_tree"]:
        want = set()
        for t in manifest["ranks"]:
            p = os.path.relpath(t["path"], ".ckptfs/ranks")
            want |= {p, p + ".json"}
        got = {p for p in walk_files(ranks_dir, problems, False) if not p.endswith(".npy")}
        problems += ["missing: .ckptfs/ranks/" + p for p in sorted(want - got)]
        problems += ["unexpected: .ckptfs/ranks/" + p for p in sorted(got - want)]
    elif os.path.exists(ranks_dir):
        problems.append(".ckptfs/ranks exists, but a single shard needs no per-rank tree")
    tap.ok(not problems, "%s: the tree holds exactly the consolidated tensors%s" % (
        case, " + the per-rank copies" if manifest["ranks_tree"] else ""), problems)


def check_docs(tap, case, mnt, manifest, m):
    problems = []
    try:
        meta = read_json(os.path.join(mnt, ".ckptfs", "metadata.json"))
        if meta.get("format") != "mlframework-tp":
            problems.append("metadata.json format %r" % meta.get("format"))
        got, want = meta.get("mlframework"), manifest["metadata"]
        if not isinstance(got, dict):
            problems.append("metadata.json mlframework is %r" % (got,))
        else:
            for k in sorted(set(got) | set(want)):
                if got.get(k, "(absent)") != want.get(k, "(absent)") or \
                        type(got.get(k)) is not type(want.get(k)):
                    problems.append("mlframework.%s: got %r, want %r"
                                    % (k, got.get(k, "(absent)"), want.get(k, "(absent)")))
    except (OSError, ValueError) as e:
        problems.append("metadata.json: %s" % e)
    tap.ok(not problems, "%s: metadata.json mlframework object (%s order, %s)"
           % (case, manifest["metadata"]["field_order"], manifest["layout"]), problems)

    problems = []
    try:
        s = read_json(os.path.join(mnt, ".ckptfs", "summary.json"))
        if s.get("format") != "mlframework-tp":
            problems.append("format %r" % s.get("format"))
        if s.get("tensor_count") != len(m["tensors"]):
            problems.append("tensor_count %r, want %d" % (s.get("tensor_count"),
                                                          len(m["tensors"])))
        copies = len(manifest["ranks"]) if manifest["ranks_tree"] else None
        if s.get("tensors_outside_the_model") != copies:
            problems.append("tensors_outside_the_model %r, want %r" % (s.get("tensors_outside_the_model"), copies))
        warnings = [str(w) for w in s.get("warnings", [])]
        for n in m["warnings"]:
            if not any(needle_matches(n, w) for w in warnings):
                problems.append("no warning matches %r" % n)
        for w in warnings:
            if not any(needle_matches(n, w) for n in m["warnings"]):
                problems.append("unexpected warning %r" % w)
        if problems:
            problems += ["warning: " + w for w in warnings]
        lines = read_bytes(os.path.join(mnt, ".ckptfs", "tensors.tsv")).splitlines()
        want = 1 + len(m["tensors"]) + (copies or 0)
        if len(lines) != want:
            problems.append("tensors.tsv has %d lines, want %d" % (len(lines), want))
    except (OSError, ValueError) as e:
        problems.append("summary.json: %s" % e)
    tap.ok(not problems, "%s: summary.json counts and %d expected warning(s); tensors.tsv"
           % (case, len(m["warnings"])), problems)


def check_hf_view(tap, case, mnt, tensors):
    problems = []
    try:
        view = read_hf_view(mnt)
        want = {t["name"]: t for t in tensors}
        problems += ["unexpected tensor %s" % n for n in sorted(set(view) - set(want))]
        problems += ["missing tensor %s" % n for n in sorted(set(want) - set(view))]
        for name in sorted(set(view) & set(want)):
            dt, shape, data = view[name]
            t = want[name]
            if dt != t["dtype"] or shape != t["shape"]:
                problems.append("%s: %s%r, want %s%r" % (name, dt, shape, t["dtype"], t["shape"]))
            elif hashlib.sha256(data).hexdigest() != t["sha256"]:
                problems.append("%s: bytes differ" % name)
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        problems.append("%s: %s" % (type(e).__name__, e))
    tap.ok(not problems, "%s: .ckptfs/hf holds exactly the %d consolidated tensors, same bytes"
           % (case, len(tensors)), problems)


def run_mount(tap, ckptfs, case_dir, case, manifest, m):
    src = os.path.join(case_dir, manifest["source"])
    label = "%s [%s]" % (case, m["label"])
    mnt = tempfile.mkdtemp(prefix="ckptfs-t34.")
    try:
        rc, _, err = run_capture([ckptfs, src, mnt] + m["options"], MOUNT_TIMEOUT)
        mounted = rc == 0 and is_mounted(mnt)
        if not tap.ok(mounted, "%s: mount %s %s" % (label, manifest["source"],
                                                    " ".join(m["options"])),
                      ["exit status %r" % (rc,),
                       "stderr: " + err.decode("utf-8", "replace").strip()]):
            return
        rnd = random.Random(label)
        with Watchdog(mnt, CASE_TIMEOUT) as dog:
            for t in m["tensors"]:
                check_tensor(tap, "%s: %s" % (label, t["name"]), mnt, t, rnd)
            if manifest["ranks_tree"]:
                check_ranks(tap, label, mnt, manifest)
            check_tree(tap, label, mnt, manifest, m["tensors"])
            check_docs(tap, label, mnt, manifest, m)
            check_hf_view(tap, label, mnt, m["tensors"])
        if dog.fired:
            tap.ok(False, "%s: checks finished within %d s" % (label, CASE_TIMEOUT),
                   ["watchdog aborted the mount"])
    finally:
        tap.ok(unmount(mnt), "%s: fusermount3 -u" % label)


# ---------------------------------------------------------------------------
# Hostile inputs

def check_refuse(tap, ckptfs, root, rel, needle, desc, options):
    mnt = tempfile.mkdtemp(prefix="ckptfs-t34h.")
    src = os.path.join(root, rel)
    argv = [ckptfs, src, mnt] + (["-o", options] if options else [])
    problems = []
    try:
        started = time.monotonic()
        rc, _, err = run_capture(argv, REFUSE_TIMEOUT)
        took = time.monotonic() - started
        text = err.decode("utf-8", "replace")
        body = text[:-1] if text.endswith("\n") else text
        # Case names say what is wrong; only the message itself may match the needle.
        blanked = body
        for p in sorted({os.path.realpath(src), os.path.abspath(src), os.path.realpath(root),
                         os.path.abspath(root)}, key=len, reverse=True):
            blanked = blanked.replace(p, "<src>")
        if rc is None:
            problems.append("did not finish within %d s (killed)" % REFUSE_TIMEOUT)
        elif rc != 2:
            problems.append("exit status %r, want 2" % rc)
        elif took >= REFUSE_TIMEOUT:
            problems.append("took %.1f s" % took)
        if not body.strip():
            problems.append("stderr is empty")
        elif "\n" in body:
            problems.append("stderr has %d lines, want 1" % (body.count("\n") + 1))
        if body.strip() and not needle_matches(needle, blanked):
            problems.append("stderr (path blanked) lacks %r" % needle)
        if is_mounted(mnt):
            problems.append("something is mounted on the mountpoint")
        if problems:
            problems += ["stderr: " + ln for ln in text.splitlines()[:5]]
    finally:
        unmount(mnt)
    tap.ok(not problems, "refuse hostile/%s%s (%s): %s"
           % (rel, " -o " + options if options else "", needle, desc), problems)


def run_hostile(tap, ckptfs, root):
    path = os.path.join(root, "hostile", "cases.tsv")
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line or line.startswith("#") or (lineno == 1 and line.startswith("path\t")):
                continue
            fields = line.split("\t")
            if len(fields) == 3:
                fields.append("")
            if len(fields) != 4:
                raise ValueError("%s:%d: malformed row %r" % (path, lineno, line))
            rows.append(fields)
    tap.ok(bool(rows), "hostile/cases.tsv lists %d cases" % len(rows))
    for rel, needle, desc, options in rows:
        check_refuse(tap, ckptfs, os.path.join(root, "hostile"), rel, needle, desc, options)


def main():
    ckptfs = os.environ.get("CKPTFS", "")
    fixtures = os.environ.get("FIXTURES", "")
    reason = skip_reason(ckptfs, fixtures)
    root = os.path.join(fixtures, "mlfw")
    if not reason and not os.path.isdir(root):
        reason = "%s is missing (tests/gen/mlfw_fixtures.py not run)" % root
    if reason:
        print("1..0 # SKIP " + reason)
        return 0
    ckptfs = os.path.abspath(ckptfs)
    root = os.path.abspath(root)
    sys.stdout.reconfigure(encoding="utf-8", errors="backslashreplace")
    tap = Tap()
    cases = sorted(d for d in os.listdir(root)
                   if os.path.isfile(os.path.join(root, d, "manifest.json")))
    tap.ok(len(cases) >= 8, "found %d MLFramework fixture cases in %s" % (len(cases), root))
    for case in cases:
        case_dir = os.path.join(root, case)
        manifest = read_json(os.path.join(case_dir, "manifest.json"))
        for m in manifest["mounts"]:
            run_mount(tap, ckptfs, case_dir, case, manifest, m)
    run_hostile(tap, ckptfs, root)
    tap.done()
    return 1 if tap.failed else 0


if __name__ == "__main__":
    sys.exit(main())
