"""What the everyday-layout tests (tests/t/65-68) share: mount every case of one group of
FIXTURES/layouts/cases.json (written by tests/gen/layouts_fixtures.py) and check it, then
every hostile row of that group.

Per case: every tensor's bytes (sha256 from the generator: numpy for safetensors and GGUF,
torch itself for .bin/.pt/.ckpt) and sidecar (name, dtype, shape); the tree holds exactly those
tensors; summary.json's format, tensor counts, warnings and layout members ("weights",
"checkpoints"); metadata.json members; .ckptfs/hf/ config and tokenizer files with the bytes of
their sources; the HF view (a strict safetensors reader) holds exactly the model's tensors; for
archives, every sidecar source names the archive and an offset where, read straight from the
archive file, the tensor's bytes are, inside the member Python's tarfile says holds them.
"""

import hashlib
import os
import shutil
import sys
import tarfile
import tempfile

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import hostile  # noqa: E402
from ckptfs_test import run_capture  # noqa: E402
from mount_checks import (bytes_problems, check_hf_view, check_tree, field_problems,  # noqa: E402
                          mounted, read_bytes, read_json, sidecar_path, start, finish,
                          warning_problems)


def subset(got, want):
    if isinstance(want, dict):
        return isinstance(got, dict) and all(k in got and subset(got[k], v)
                                             for k, v in want.items())
    if isinstance(want, list):
        return (isinstance(got, list) and len(got) == len(want)
                and all(subset(g, w) for g, w in zip(got, want)))
    return got == want


def check_tensors(tap, case, mnt, root):
    members = {}
    if case.get("archive"):
        with tarfile.open(os.path.join(root, case["archive"])) as tf:
            members = {m.name[2:] if m.name.startswith("./") else m.name: m
                       for m in tf.getmembers()}
        archive_bytes = read_bytes(os.path.join(root, case["archive"]))
    problems = []
    for t in case["tensors"]:
        raw = os.path.join(mnt, t["path"])
        p, _ = bytes_problems(raw, t["nbytes"], t["sha256"])
        problems += ["%s: %s" % (t["path"], x) for x in p]
        try:
            sc = read_json(sidecar_path(raw))
            problems += ["%s: %s" % (t["path"], x) for x in
                         field_problems(sc, {k: t[k] for k in ("name", "dtype", "shape")})]
            if bool(sc.get("aside")) != t["aside"]:
                problems.append("%s: aside %r, want %r" % (t["path"], sc.get("aside"), t["aside"]))
            if members:
                got = b""
                for s in sc["sources"]:
                    m = members.get(s.get("member"))
                    if s.get("file") != os.path.basename(case["archive"]) or m is None:
                        problems.append("%s: source %r names no member of the archive"
                                        % (t["path"], s))
                        continue
                    if not (m.offset_data <= s["offset"] and
                            s["offset"] + s["length"] <= m.offset_data + m.size):
                        problems.append("%s: source %r lies outside member %s [%d, +%d)"
                                        % (t["path"], s, m.name, m.offset_data, m.size))
                    got += archive_bytes[s["offset"]:s["offset"] + s["length"]]
                if hashlib.sha256(got).hexdigest() != t["sha256"]:
                    problems.append("%s: bytes at the sidecar's archive offsets differ"
                                    % t["path"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            problems.append("%s: sidecar: %s" % (t["path"], e))
    tap.ok(not problems, "%s: %d tensors: bytes and sidecars%s" % (
        case["name"], len(case["tensors"]),
        ", sources point into the archive (checked with tarfile)" if members else ""), problems)


def check_documents(tap, case, mnt):
    problems = []
    try:
        summary = read_json(os.path.join(mnt, ".ckptfs", "summary.json"))
        model = len(case["tensors"]) - case["outside"]
        for key, want in (("format", case["format"]), ("tensor_count", model)):
            if summary.get(key) != want:
                problems.append("%s %r, want %r" % (key, summary.get(key), want))
        if summary.get("tensors_outside_the_model", 0) != case["outside"]:
            problems.append("tensors_outside_the_model %r, want %d"
                            % (summary.get("tensors_outside_the_model"), case["outside"]))
        problems += warning_problems(summary, case["warnings"])
        for key, want in case.get("summary", {}).items():
            if not subset(summary.get(key), want):
                problems.append("summary %s: %r, want %r" % (key, summary.get(key), want))
        meta = read_json(os.path.join(mnt, ".ckptfs", "metadata.json"))
        for key, want in case["metadata"].items():
            if not subset(meta.get(key), want):
                problems.append("metadata %s: %r, want %r" % (key, meta.get(key), want))
    except (OSError, ValueError) as e:
        problems.append(str(e))
    tap.ok(not problems, "%s: summary.json (format, counts, warnings%s) and metadata.json"
           % (case["name"], ", " + ", ".join(case.get("summary", {})) if case.get("summary")
              else ""), problems)


def check_aux(tap, case, mnt, root):
    problems = []
    hf = os.path.join(mnt, ".ckptfs", "hf")
    for name, src in sorted(case["aux"].items()):
        try:
            if read_bytes(os.path.join(hf, name)) != read_bytes(os.path.join(root, src)):
                problems.append("%s differs from %s" % (name, src))
        except OSError as e:
            problems.append(str(e))
    tap.ok(not problems, "%s: .ckptfs/hf/ has %s with their sources' bytes"
           % (case["name"], ", ".join(sorted(case["aux"])) or "no config files"), problems)


def case_checks(tap, case, root):
    """The checks of one case of cases.json, as a function of the mount point (what a remote
    test runs too, on a mount of the same case from a URL)."""
    def checks(mnt):
        check_tensors(tap, case, mnt, root)
        check_tree(tap, case["name"], mnt, case["tensors"])
        check_documents(tap, case, mnt)
        check_aux(tap, case, mnt, root)
        if case["hf_view"]:
            want = {t["name"]: t for t in case["tensors"] if not t["aside"]}
            check_hf_view(tap, case["name"], mnt, want,
                          "HF view holds exactly the model's %d tensors" % len(want))
    return checks


def run(group, extra=None):
    """extra(tap, ckptfs, root), when given, runs after the cases and the hostile rows."""
    started = start("layouts", "layouts_fixtures.py")
    if not started:
        return 0
    tap, ckptfs, root = started
    cases = [c for c in read_json(os.path.join(root, "cases.json")) if c["group"] == group]
    tap.ok(cases, "cases.json has %d %s cases" % (len(cases), group))
    for case in cases:
        checks = case_checks(tap, case, root)
        opts = ["-o", case["options"]] if case["options"] else []
        mounted(tap, ckptfs, os.path.join(root, case["src"]), case["name"], checks, opts,
                mount_desc="%s: mount %s%s" % (case["name"], case["src"],
                                               " -o " + case["options"] if opts else ""))
    hdir = os.path.join(root, "hostile")
    prefix = {"hfcache": "hf_", "binrepo": "bin_", "folders": "folder_",
              "tar": ("tar_", "model.tar.gz", "old.nemo", "bad_weights.nemo")}[group]
    rows = [r for r in hostile.read_cases(os.path.join(hdir, "cases.tsv"))
            if r["path"].startswith(prefix) or r["path"] in prefix]
    tap.ok(len(rows) >= 3, "%d hostile %s cases" % (len(rows), group))
    names_file = os.path.join(hdir, "mount-names.json")
    names = read_json(names_file) if os.path.exists(names_file) else {}
    for row in rows:
        if row["expect"] == "mount":
            # A mount row's needle, when it has one, is a warning summary.json must give.
            hostile.check_mount(tap, ckptfs, hdir, row, names.get(row["path"]),
                                warning=bool(row["needle"]))
        else:
            hostile.check_refuse(tap, ckptfs, hdir, row)
    if extra:
        extra(tap, ckptfs, root)
    return finish(tap)


# ---------------------------------------------------------------------------
# FIFOs where a layout's files are: refused naming them, or skipped, never waited on

FIFO_TIMEOUT = 10


def fifo_refused(tap, ckptfs, src, must_name, desc):
    """`ckptfs info src` ends within FIFO_TIMEOUT, exit 2, its one line naming must_name."""
    rc, _, err = run_capture([ckptfs, "info", src], FIFO_TIMEOUT)
    text = err.decode("utf-8", "replace")
    tap.ok(rc == 2 and all(w in text for w in must_name), desc,
           ["exit %s" % ("timed out (hung)" if rc is None else rc), "stderr: " + text.strip(),
            "must name: %r" % (must_name,)])


def fifo_hfcache(tap, ckptfs, root):
    with tempfile.TemporaryDirectory(prefix="ckptfs-fifo.") as scratch:
        repo = os.path.join(scratch, "models--org--tiny")
        shutil.copytree(os.path.join(root, "hfcache", "models--org--tiny"), repo, symlinks=True)
        ref = os.path.join(repo, "refs", "main")
        os.unlink(ref)
        os.mkfifo(ref)
        fifo_refused(tap, ckptfs, repo, [ref, "not a regular file"],
                     "fifo: refs/main a FIFO: refused naming it, not waited on")


def fifo_folders(tap, ckptfs, root):
    with tempfile.TemporaryDirectory(prefix="ckptfs-fifo.") as scratch:
        folder = os.path.join(scratch, "quants")
        shutil.copytree(os.path.join(root, "folders", "quants"), folder)
        os.mkfifo(os.path.join(folder, "tiny-Z.gguf"))
        rc1, want, _ = run_capture([ckptfs, "ls", os.path.join(root, "folders", "quants")],
                                   FIFO_TIMEOUT)
        rc2, got, err = run_capture([ckptfs, "ls", folder], FIFO_TIMEOUT)
        tap.ok(rc1 == 0 and rc2 == 0 and got == want,
               "fifo: a FIFO named like a GGUF in a folder is skipped, not waited on",
               ["exit %s" % ("timed out (hung)" if rc2 is None else rc2), err])
