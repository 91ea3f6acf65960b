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

import os
import random
import sys

CASE_TIMEOUT = 180
RANDOM_READS = 100
RANDOM_READ_MIN_BYTES = 4096

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
import hostile  # noqa: E402
from hostile import needle_matches  # noqa: E402
from mount_checks import (bytes_problems, case_dirs, check_hf_view,  # noqa: E402
                          field_problems, mounted, read_bytes, read_json, run, tree_files)


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
    problems += field_problems(sc, {k: t[k] for k in ("name", "dtype", "shape", "nbytes",
                                                      "mlframework_dtype")})
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
    problems, data = bytes_problems(raw, t["nbytes"], t["sha256"])
    try:
        if not problems and t["nbytes"] >= RANDOM_READ_MIN_BYTES:
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
            problems += ["%s: %s" % (t["name"], p)
                         for p in bytes_problems(raw, t["nbytes"], t["sha256"])[0]]
            try:
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


def check_tree(tap, case, mnt, manifest, tensors):
    problems = []
    want = set()
    for t in tensors:
        want |= {t["path"], t["path"] + ".json"}
    # NAME.npy views of numpy-typed tensors are checked by 350-npy.t
    got = tree_files(mnt, problems, every_file=True)
    problems += ["missing: " + p for p in sorted(want - got)]
    problems += ["unexpected: " + p for p in sorted(got - want)]
    ranks_dir = os.path.join(mnt, ".ckptfs", "ranks")
    if manifest["ranks_tree"]:
        want = set()
        for t in manifest["ranks"]:
            p = os.path.relpath(t["path"], ".ckptfs/ranks")
            want |= {p, p + ".json"}
        got = tree_files(ranks_dir, problems, skip_ckptfs=False, every_file=True)
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


def run_mount(tap, ckptfs, case_dir, case, manifest, m):
    label = "%s [%s]" % (case, m["label"])
    rnd = random.Random(label)

    def checks(mnt):
        for t in m["tensors"]:
            check_tensor(tap, "%s: %s" % (label, t["name"]), mnt, t, rnd)
        if manifest["ranks_tree"]:
            check_ranks(tap, label, mnt, manifest)
        check_tree(tap, label, mnt, manifest, m["tensors"])
        check_docs(tap, label, mnt, manifest, m)
        check_hf_view(tap, label, mnt, {t["name"]: t for t in m["tensors"]},
                      ".ckptfs/hf holds exactly the %d consolidated tensors, same bytes"
                      % len(m["tensors"]))

    mounted(tap, ckptfs, os.path.join(case_dir, manifest["source"]), label, checks,
            m["options"], "%s: mount %s %s" % (label, manifest["source"], " ".join(m["options"])),
            timeout=CASE_TIMEOUT)


def main(tap, ckptfs, root):
    cases = case_dirs(root)
    tap.ok(len(cases) >= 8, "found %d MLFramework fixture cases in %s" % (len(cases), root))
    for case in cases:
        case_dir = os.path.join(root, case)
        manifest = read_json(os.path.join(case_dir, "manifest.json"))
        for m in manifest["mounts"]:
            run_mount(tap, ckptfs, case_dir, case, manifest, m)
    # Case names say what is wrong: only the message itself may match the needle.
    hostile.run_cases(tap, ckptfs, os.path.join(root, "hostile"), blank=True)


if __name__ == "__main__":
    sys.exit(run(main, "mlfw", "mlfw_fixtures.py"))
