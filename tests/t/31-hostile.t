#!/usr/bin/python3
"""Feed ckptfs hostile inputs and check it refuses or survives them.

Environment:
  CKPTFS    path of the ckptfs binary
  FIXTURES  output directory of tests/gen/safetensors_fixtures.py

FIXTURES/hostile/cases.tsv lists one case per line:
  path <TAB> expect <TAB> needle <TAB> description
expect "refuse": the mount must fail quickly with exactly one line on stderr
that contains the needle (case-insensitive; "a|b" accepts either word) and
leave nothing mounted.  expect "mount": the mount must succeed and the whole
tree must be safe to walk and read.  FIXTURES/hostile/mount-names.json, when
present, lists the tensor names each mount case must expose through sidecars.
"""

import json
import os
import stat
import sys
import tempfile

REFUSE_TIMEOUT = 10     # a refusal that takes longer counts as a hang
MOUNT_TIMEOUT = 30
WALK_TIMEOUT = 120


sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from ckptfs_test import (Tap, Watchdog, is_mounted, run_capture, skip_reason,  # noqa: E402
                         unmount)

# ---------------------------------------------------------------------------
# Cases

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
    mnt = tempfile.mkdtemp(prefix="ckptfs-t31.")
    problems = []
    try:
        rc, _, err = run_capture([ckptfs, src, mnt], REFUSE_TIMEOUT)
        text = err.decode("utf-8", "replace")
        if rc is None:
            problems.append("did not finish within %d s (killed)" % REFUSE_TIMEOUT)
        elif rc == 0:
            problems.append("exit status 0")
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
            problems.append("exit status: %r" % (rc,))
            problems += ["stderr: " + ln for ln in text.splitlines()[:5]]
    finally:
        unmount(mnt)
    tap.ok(not problems, "refuse %s (%s): %s" % (rel, needle, desc), problems)


def walk_tree(mnt):
    """Walk and read the whole mount without following anything outward.

    Returns (problems, sidecar names, number of files).  Uses directory file
    descriptors and bytes names, so deep trees and odd bytes cannot trip the
    walker itself.
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
            if stat.S_ISLNK(st.st_mode):
                target = os.readlink(name, dir_fd=dirfd)
                if target.startswith(b"/") or not inside(os.path.join(dirpath, target)):
                    bad("symlink %r points outside: %r" % (full, target))
                continue
            if not stat.S_ISREG(st.st_mode):
                bad("%r is neither file, directory nor symlink" % full)
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
            if len(data) != st.st_size:
                bad("%r: read %d bytes, st_size %d" % (full, len(data), st.st_size))
            if not in_meta and name.endswith(b".json"):
                # Outside .ckptfs every .json file is a tensor sidecar.
                try:
                    names.append(json.loads(data.decode("utf-8"))["name"])
                except (ValueError, KeyError, TypeError) as e:
                    bad("sidecar %r: %s" % (full, e))
    return problems, names, nfiles


def check_mount(tap, ckptfs, src, rel, desc, want_names):
    mnt = tempfile.mkdtemp(prefix="ckptfs-t31.")
    try:
        rc, _, err = run_capture([ckptfs, src, mnt], MOUNT_TIMEOUT)
        mounted = rc == 0 and is_mounted(mnt)
        if not tap.ok(mounted, "mount %s: %s" % (rel, desc),
                      ["exit status %r%s" % (rc, " (timed out)" if rc is None else ""),
                       "stderr: " + err.decode("utf-8", "replace").strip()]):
            return
        with Watchdog(mnt, WALK_TIMEOUT) as dog:
            try:
                problems, names, nfiles = walk_tree(mnt)
            except Exception as e:  # the walker must report, never crash the test
                problems, names, nfiles = ["walk crashed: %r" % e], [], 0
        if dog.fired:
            problems.insert(0, "walk did not finish within %d s" % WALK_TIMEOUT)
        tap.ok(not problems, "%s: every entry stays inside and reads fully (%d files)"
               % (rel, nfiles), problems)
        if want_names is not None and not dog.fired:
            missing = sorted(set(want_names) - set(names))
            extra = sorted(set(names) - set(want_names))
            dups = len(names) - len(set(names))
            diag = ["missing: %s" % ascii(missing[:10])] if missing else []
            diag += ["unexpected: %s" % ascii(extra[:10])] if extra else []
            diag += ["%d names appear in more than one sidecar" % dups] if dups else []
            tap.ok(not diag, "%s: all %d tensors reachable, one sidecar each"
                   % (rel, len(want_names)), diag)
    finally:
        tap.ok(unmount(mnt), "%s: fusermount3 -u" % rel)


def main():
    ckptfs = os.environ.get("CKPTFS", "")
    fixtures = os.environ.get("FIXTURES", "")
    reason = skip_reason(ckptfs, fixtures)
    if reason:
        print("1..0 # SKIP " + reason)
        return 0
    ckptfs = os.path.abspath(ckptfs)
    hostile = os.path.join(os.path.abspath(fixtures), "hostile")
    sys.stdout.reconfigure(encoding="utf-8", errors="backslashreplace")

    tap = Tap()
    try:
        rows = read_cases(os.path.join(hostile, "cases.tsv"))
    except (OSError, ValueError) as e:
        tap.ok(False, "read hostile/cases.tsv", [str(e)])
        tap.done()
        return 1
    tap.ok(len(rows) >= 25, "hostile/cases.tsv lists %d cases (want >= 25)" % len(rows))
    try:
        with open(os.path.join(hostile, "mount-names.json"), encoding="utf-8") as f:
            mount_names = json.load(f)
    except OSError:
        mount_names = {}

    for rel, expect, needle, desc in rows:
        src = os.path.join(hostile, rel)
        if not os.path.lexists(src):
            tap.ok(False, "%s exists" % rel)
        elif expect == "refuse":
            check_refuse(tap, ckptfs, src, rel, needle, desc)
        else:
            check_mount(tap, ckptfs, src, rel, desc, mount_names.get(rel))
    tap.done()
    return 1 if tap.failed else 0


if __name__ == "__main__":
    sys.exit(main())
