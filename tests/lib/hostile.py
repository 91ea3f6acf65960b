"""The hostile cases of every format: a generator writes damaged inputs and lists them in
HOSTILE/cases.tsv; ckptfs must refuse them quickly and cleanly, or mount them safely.

cases.tsv has a header line naming its tab-separated columns: path, needle and
description always; expect ("refuse", the default, or "mount") and options (for
`-o`) when the format needs them.  The needle is what the one stderr line of a
refusal must contain, case-insensitively: "a|b" accepts either word, "a&b" wants
both groups.  Next to cases.tsv:
  mount-names.json  the tensor names each "mount" case exposes through its sidecars
                    (when the file exists, a mount case it does not list must expose none)
  canaries.json     {path: {"canary": file}} for payloads that would create the file if
                    anything ran them; the file must never appear, and a control shows
                    that Python's own pickle.loads does run the payload.

Tests import it with:  sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
"""

import collections
import json
import os
import stat
import subprocess
import sys
import tempfile
import time

from ckptfs_test import Watchdog, is_mounted, run_capture, unmount
from mount_checks import mount, mount_prefix, read_json

REFUSE_TIMEOUT = 10     # a refusal that takes longer counts as a hang
MOUNT_TIMEOUT = 30
WALK_TIMEOUT = 120
EXIT_SOURCE = 2         # ckptfs: the source cannot be read or is invalid
OPTIONAL_COLUMNS = ("expect", "options")


def needle_matches(needle, text):
    text = text.lower()
    return all(any(w.lower() in text for w in group.split("|") if w)
               for group in needle.split("&"))


def read_cases(path):
    """The rows of cases.tsv as dicts with path, expect, needle, description and options."""
    rows = []
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    columns = lines[0].split("\t")
    if columns[0] != "path" or not {"needle", "description"} <= set(columns):
        raise ValueError("%s:1: header %r lacks path, needle or description" % (path, lines[0]))
    for lineno, line in enumerate(lines[1:], 2):
        if not line or line.startswith("#"):
            continue
        fields = line.split("\t")
        # Optional columns at the end may be left out.
        while len(fields) < len(columns) and columns[len(fields)] in OPTIONAL_COLUMNS:
            fields.append("")
        row = dict(zip(columns, fields))
        row["expect"] = row.get("expect") or "refuse"
        row.setdefault("options", "")
        if len(fields) != len(columns) or row["expect"] not in ("refuse", "mount"):
            raise ValueError("%s:%d: malformed row %r" % (path, lineno, line))
        rows.append(row)
    return rows


# ---------------------------------------------------------------------------
# Refusals

def check_refuse(tap, ckptfs, hostile, row, canary=None, blank=False):
    """The mount fails with EXIT_SOURCE within REFUSE_TIMEOUT, with exactly one stderr line
    that holds the needle (with blank, once the case's own path is blanked out: its name
    says what is wrong), nothing is mounted and the canary file never appears."""
    rel, needle, options = row["path"], row["needle"], row["options"]
    src = os.path.join(hostile, rel)
    mnt = tempfile.mkdtemp(prefix=mount_prefix())
    problems, took = [], 0.0
    try:
        start = time.monotonic()
        rc, _, err = run_capture([ckptfs, src, mnt] + (["-o", options] if options else []),
                                 REFUSE_TIMEOUT)
        took = time.monotonic() - start
        text = err.decode("utf-8", "replace")
        body = text[:-1] if text.endswith("\n") else text
        shown = body
        if blank:
            for p in sorted({os.path.realpath(src), os.path.abspath(src),
                             os.path.realpath(hostile), os.path.abspath(hostile)},
                            key=len, reverse=True):
                shown = shown.replace(p, "<src>")
        if rc is None:
            problems.append("did not finish within %d s (killed)" % REFUSE_TIMEOUT)
        elif rc != EXIT_SOURCE:
            problems.append("exit status %r, want %d" % (rc, EXIT_SOURCE))
        elif took >= REFUSE_TIMEOUT:
            problems.append("took %.1f s" % took)
        if not body.strip():
            problems.append("stderr is empty")
        elif "\n" in body:
            problems.append("stderr has %d lines, want 1" % (body.count("\n") + 1))
        if body.strip() and not needle_matches(needle, shown):
            problems.append("stderr%s lacks %r" % (" (path blanked)" if blank else "", needle))
        if is_mounted(mnt):
            problems.append("something is mounted on the mountpoint")
        if canary and os.path.exists(canary):
            problems.append("CANARY %s exists: the payload ran" % canary)
        if problems:
            problems.append("exit status %r after %.1f s" % (rc, took))
            problems += ["stderr: " + ln for ln in text.splitlines()[:5]]
    finally:
        unmount(mnt)
    tap.ok(not problems, "refuse %s%s (%s): %s" % (rel, " -o " + options if options else "",
                                                   needle, row["description"]), problems)


# ---------------------------------------------------------------------------
# Mounts that must be safe

def walk_tree(mnt, symlinks=True):
    """Walk and read the whole mount without following anything outward.

    Returns (problems, sidecar names, number of files).  Every file reads fully, every
    .json parses, sidecars outside .ckptfs name their tensor.  Symlinks must stay inside
    (with symlinks=False there must be none).  Uses directory file descriptors and bytes
    names, so deep trees and odd bytes cannot trip the walker itself.
    """
    top = os.fsencode(mnt)
    problems, names, nfiles = [], [], 0

    def bad(what):
        if len(problems) < 20:
            problems.append(what)

    def inside(p):
        return os.path.normpath(p).startswith(top + b"/")

    for dirpath, dirnames, filenames, dirfd in os.fwalk(
            top, onerror=lambda e: bad("walk: %s" % e), follow_symlinks=False):
        in_meta = (dirpath + b"/").startswith(top + b"/.ckptfs/")
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            if name in (b"", b".", b"..") or b"/" in name or b"\0" in name:
                bad("bad directory entry %r in %r" % (name, dirpath))
            elif not inside(full):
                bad("%r leaves the mount" % full)
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            try:
                st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
            except OSError as e:
                bad("stat %r: %s" % (full, e))
                continue
            if stat.S_ISDIR(st.st_mode):
                continue
            nfiles += 1
            if stat.S_ISLNK(st.st_mode) and symlinks:
                target = os.readlink(name, dir_fd=dirfd)
                if target.startswith(b"/") or not inside(os.path.join(dirpath, target)):
                    bad("symlink %r points outside: %r" % (full, target))
                continue
            if not stat.S_ISREG(st.st_mode):
                bad("%r is not a regular file%s" % (full, "" if symlinks else " (symlinks "
                                                    "neither)"))
                continue
            try:
                fd = os.open(name, os.O_RDONLY, dir_fd=dirfd)
                try:
                    chunks = []
                    while True:
                        chunk = os.read(fd, 1 << 20)
                        if not chunk:
                            break
                        chunks.append(chunk)
                finally:
                    os.close(fd)
            except OSError as e:
                bad("read %r: %s" % (full, e))
                continue
            data = b"".join(chunks)
            if in_meta and name == b"stats.json" and st.st_size == 0:
                # Computed on the first read and sized then (ckptfs(5)): stat again.
                st = os.stat(name, dir_fd=dirfd)
            if len(data) != st.st_size:
                bad("%r: read %d bytes, st_size %d" % (full, len(data), st.st_size))
            if not name.endswith(b".json"):
                continue
            try:
                doc = json.loads(data.decode("utf-8"))
                # Outside .ckptfs every .json file is a tensor sidecar.
                if not in_meta:
                    names.append(doc["name"])
            except (ValueError, KeyError, TypeError) as e:
                bad("%s %r: %s" % ("JSON" if in_meta else "sidecar", full, e))
    return problems, names, nfiles


def check_mount(tap, ckptfs, hostile, row, want_names=None, canary=None, warning=False,
                symlinks=True):
    """The case mounts; the whole tree stays inside and reads fully (walk_tree); with
    warning, a summary.json warning holds the needle; the canary never appears; the
    sidecars name exactly want_names (unless None), each once."""
    rel = row["path"]
    mnt = tempfile.mkdtemp(prefix=mount_prefix())
    try:
        if not mount(tap, ckptfs, os.path.join(hostile, rel), mnt,
                     "mount %s: %s" % (rel, row["description"])):
            return
        with Watchdog(mnt, WALK_TIMEOUT) as dog:
            try:
                problems, names, nfiles = walk_tree(mnt, symlinks)
            except Exception as e:  # the walker must report, never crash the test
                problems, names, nfiles = ["walk crashed: %r" % e], [], 0
            if warning:
                try:
                    warnings = read_json(os.path.join(mnt, ".ckptfs", "summary.json"))["warnings"]
                    if not any(needle_matches(row["needle"], w) for w in warnings):
                        problems.append("no warning contains %r: %r" % (row["needle"], warnings))
                except (OSError, ValueError, KeyError, TypeError) as e:
                    problems.append("summary.json: %s" % e)
        if dog.fired:
            problems.insert(0, "checks did not finish within %d s" % WALK_TIMEOUT)
        if canary and os.path.exists(canary):
            problems.append("CANARY %s exists: the payload ran" % canary)
        tap.ok(not problems, "%s: every entry stays inside and reads fully (%d files)%s"
               % (rel, nfiles, ", a warning says %r" % row["needle"] if warning else ""),
               problems)
        if want_names is not None and not dog.fired:
            got, want = collections.Counter(names), collections.Counter(want_names)
            missing, extra = sorted(want - got), sorted(got - want)
            diag = ["missing: %s" % ascii(missing[:10])] if missing else []
            diag += ["unexpected: %s" % ascii(extra[:10])] if extra else []
            tap.ok(not diag, "%s: all %d tensors reachable, one sidecar each"
                   % (rel, len(want_names)), diag)
    finally:
        tap.ok(unmount(mnt), "%s: fusermount3 -u" % rel)


# ---------------------------------------------------------------------------
# Canaries

def payload_is_live(tap, hostile, rel, info):
    """Python's own unpickler runs the payload: proof that the canary would catch it.
    The pickle is info["pickle"] inside the case, or record info["record"] of the zip
    info["zip"] inside the case (of the case itself without "zip")."""
    canary = info["canary"]
    case = os.path.join(hostile, rel)
    if "pickle" in info:
        script = ("import pickle, sys\n"
                  "try:\n    pickle.loads(open(sys.argv[1], 'rb').read())\n"
                  "except Exception:\n    pass\n")
        args = [os.path.join(case, info["pickle"])]
    else:
        script = ("import pickle, sys, zipfile\n"
                  "data = zipfile.ZipFile(sys.argv[1]).read(sys.argv[2])\n"
                  "try:\n    pickle.loads(data)\nexcept Exception:\n    pass\n")
        args = [os.path.join(case, info["zip"]) if "zip" in info else case, info["record"]]
    with tempfile.TemporaryDirectory() as cwd:
        subprocess.run([sys.executable, "-c", script] + args, cwd=cwd, timeout=30,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 5  # Popen runs its command asynchronously
    while not os.path.exists(canary) and time.monotonic() < deadline:
        time.sleep(0.05)
    live = os.path.exists(canary)
    if live:
        os.unlink(canary)
    tap.ok(live, "%s: control: Python's pickle.loads runs the payload (creates %s)"
           % (rel, canary))


# ---------------------------------------------------------------------------
# All cases of one directory

def run_cases(tap, ckptfs, hostile, min_cases=1, min_canaries=0, named=False, blank=False,
              warning=False, symlinks=True):
    """Every row of hostile/cases.tsv, after a line that counts them (at least min_cases,
    and at least min_canaries canaries).  named: mount-names.json must exist; blank:
    refusals' needles are matched with the case's path blanked out; warning: a mount
    case's needle must be in a summary warning; symlinks: may a mount show any."""
    try:
        rows = read_cases(os.path.join(hostile, "cases.tsv"))
        names_file = os.path.join(hostile, "mount-names.json")
        mount_names = read_json(names_file) if named or os.path.exists(names_file) else None
        canaries_file = os.path.join(hostile, "canaries.json")
        canaries = read_json(canaries_file) if os.path.exists(canaries_file) else {}
    except (OSError, ValueError) as e:
        tap.ok(False, "read %s/cases.tsv, mount-names.json, canaries.json" % hostile, [str(e)])
        return
    tap.ok(len(rows) >= min_cases and len(canaries) >= min_canaries,
           "%s/cases.tsv lists %d cases (want >= %d)%s"
           % (os.path.basename(hostile), len(rows), min_cases,
              ", %d with canaries (want >= %d)" % (len(canaries), min_canaries)
              if canaries or min_canaries else ""))
    for row in rows:
        rel = row["path"]
        info = canaries.get(rel, {})
        canary = info.get("canary")
        if canary and os.path.exists(canary):
            os.unlink(canary)
        if not os.path.lexists(os.path.join(hostile, rel)):
            tap.ok(False, "%s exists" % rel)
            continue
        if row["expect"] == "refuse":
            check_refuse(tap, ckptfs, hostile, row, canary, blank)
        else:
            check_mount(tap, ckptfs, hostile, row,
                        None if mount_names is None else mount_names.get(rel, []),
                        canary, warning, symlinks)
        if canary and info.get("live", True):
            payload_is_live(tap, hostile, rel, info)
