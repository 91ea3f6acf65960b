#!/usr/bin/python3
"""The daemon under valgrind: no invalid access, no definite leak, clean exit.

Environment:
  CKPTFS    path of the ckptfs binary (the plain build: valgrind cannot run an ASan one)
  FIXTURES  output directory of the fixture generators (make fixtures)

For a few small fixtures — one safetensors file, a DCP checkpoint assembled from a grid of
pieces, a sharded HF directory with config files — `valgrind --error-exitcode=99
--leak-check=full --errors-for-leak-kinds=definite ckptfs -f SRC MNT` is mounted, every file
of the tree is read (raw tensors checked against the manifest), then `fusermount3 -u`; for one
fixture a few sidecars stay open, the mount is detached lazily and the daemon gets SIGTERM, so
their RELEASE never comes and the daemon must free them itself. The exit status must be 0. Valgrind is slow, so the workload is small.
Skipped when valgrind is missing or CKPTFS is a sanitizer build.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

MOUNT_TIMEOUT = 180    # valgrind start-up + decoding
EXIT_TIMEOUT = 180     # leak check at exit
CASE_TIMEOUT = 300

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from ckptfs_test import (Tap, Watchdog, is_mounted, run_capture, skip_reason,  # noqa: E402
                         unmount, UMOUNT_TIMEOUT)

# (label, fixture, how the daemon ends)
CASES = [
    ("dtypes", "dtypes", "unmount"),
    ("dcphf-grid", "dcphf/grid", "sigterm-open"),
    ("sharded", "sharded", "unmount"),
]


def sanitizer_build(path):
    with open(path, "rb") as f:
        data = f.read()
    return b"__asan_init" in data or b"__tsan_init" in data or b"__msan_init" in data


def source_of(case_dir, manifest):
    if "source" in manifest:
        return os.path.normpath(os.path.join(case_dir, manifest["source"]))
    return os.path.join(case_dir, manifest["sources"][0])


def read_tree(mnt, tensors):
    """Reads every file; returns (files read, problems, open sidecar descriptors)."""
    problems, count, held = [], 0, []
    for dirpath, _, filenames in os.walk(mnt, onerror=problems.append):
        for f in filenames:
            p = os.path.join(dirpath, f)
            try:
                with open(p, "rb") as fh:
                    fh.read()
                count += 1
            except OSError as e:
                problems.append("%s: %s" % (os.path.relpath(p, mnt), e))
    for t in tensors:
        p = os.path.join(mnt, t["path"])
        try:
            with open(p, "rb") as fh:
                if hashlib.sha256(fh.read()).hexdigest() != t["sha256"]:
                    problems.append("%s: sha256 differs from the manifest" % t["path"])
        except OSError as e:
            problems.append("%s: %s" % (t["path"], e))
    for t in tensors[:3]:
        base = t["path"][:-4] if t["path"].endswith(".raw") else t["path"]
        try:
            held.append(os.open(os.path.join(mnt, base + ".json"), os.O_RDONLY))
        except OSError as e:
            problems.append("%s.json: %s" % (base, e))
    return count, problems, held


def run_case(tap, ckptfs, fixtures, label, case, ending, logdir):
    case_dir = os.path.join(fixtures, case)
    with open(os.path.join(case_dir, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    tensors = manifest["tensors"]
    mnt = tempfile.mkdtemp(prefix="ckptfs-t52.")
    log = os.path.join(logdir, label + ".log")
    # fuse-compatible: without it valgrind holds its big lock across a syscall such as the
    # ready thread's stat() of the mount point, which only the loop thread can answer, and the
    # daemon deadlocks before its first reply.
    argv = ["valgrind", "--error-exitcode=99", "--leak-check=full",
            "--errors-for-leak-kinds=definite", "--sim-hints=fuse-compatible",
            "--log-file=" + log,
            ckptfs, "-f", source_of(case_dir, manifest), mnt]
    out = tempfile.TemporaryFile()
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                         start_new_session=True)

    def vg_log():
        try:
            with open(log, encoding="utf-8", errors="replace") as f:
                lines = f.read().splitlines()
        except OSError:
            lines = []
        out.seek(0)
        return lines[-40:] + out.read().decode("utf-8", "replace").splitlines()[-10:]

    # The shared Watchdog's `umount -f` cannot help a daemon that never answered INIT (umount
    # itself blocks in stat): killing our own child aborts the connection instead.
    killer = threading.Timer(CASE_TIMEOUT + MOUNT_TIMEOUT, p.kill)
    killer.daemon = True
    killer.start()
    try:
        deadline = time.monotonic() + MOUNT_TIMEOUT
        while time.monotonic() < deadline and p.poll() is None and not is_mounted(mnt):
            time.sleep(0.1)
        if not tap.ok(is_mounted(mnt), "%s: mounted under valgrind" % label,
                      ["exit status %r" % p.poll()] + vg_log()):
            return
        answered = []
        probe = threading.Thread(target=lambda: answered.append(os.stat(mnt)), daemon=True)
        probe.start()
        probe.join(MOUNT_TIMEOUT)
        if not tap.ok(bool(answered), "%s: the mount answers under valgrind" % label,
                      ["stat of the mount point blocked for %d s" % MOUNT_TIMEOUT] + vg_log()):
            p.kill()  # aborts the connection, which frees the blocked stat
            return
        held = []
        with Watchdog(mnt, CASE_TIMEOUT) as dog:
            count, problems, held = read_tree(mnt, tensors)
            tap.ok(not problems and count > len(tensors),
                   "%s: read all %d files, %d tensors match the manifest"
                   % (label, count, len(tensors)), problems[:10])
        if dog.fired:
            tap.ok(False, "%s: reads finished in time" % label, ["watchdog fired"])
        if ending == "unmount":
            for fd in held:
                os.close(fd)
            rc, _, err = run_capture(["fusermount3", "-u", mnt], UMOUNT_TIMEOUT)
            tap.ok(rc == 0, "%s: fusermount3 -u" % label, [err.decode("utf-8", "replace")])
        else:
            # Sidecars still open: detach lazily, then SIGTERM. Their RELEASE never reaches
            # the daemon, which must free them itself.
            rc, _, err = run_capture(["fusermount3", "-u", "-z", mnt], UMOUNT_TIMEOUT)
            tap.ok(rc == 0, "%s: fusermount3 -u -z with %d sidecars open" % (label, len(held)),
                   [err.decode("utf-8", "replace")])
            p.terminate()
        try:
            status = p.wait(timeout=EXIT_TIMEOUT)
        except subprocess.TimeoutExpired:
            status = None
        for fd in held if ending != "unmount" else ():
            try:
                os.close(fd)
            except OSError:
                pass
        tap.ok(status == 0, "%s: exit status 0 under valgrind (no errors, no definite leaks)"
               % label, ["exit status %r%s" % (status, " (99: valgrind found errors)"
                                                if status == 99 else "")] + vg_log())
    finally:
        killer.cancel()
        if p.poll() is None:
            p.kill()
            p.wait()
        unmount(mnt)
        out.close()


def main():
    ckptfs = os.environ.get("CKPTFS", "")
    fixtures = os.environ.get("FIXTURES", "")
    reason = skip_reason(ckptfs, fixtures)
    if not reason and not shutil.which("valgrind"):
        reason = "valgrind is not installed"
    if not reason and sanitizer_build(ckptfs):
        reason = "CKPTFS is a sanitizer build; valgrind needs the plain one"
    if reason:
        print("1..0 # SKIP " + reason)
        return 0
    ckptfs, fixtures = os.path.abspath(ckptfs), os.path.abspath(fixtures)
    tap = Tap()
    logdir = tempfile.mkdtemp(prefix="ckptfs-t52-logs.")
    try:
        for label, case, ending in CASES:
            if os.path.isfile(os.path.join(fixtures, case, "manifest.json")):
                run_case(tap, ckptfs, fixtures, label, case, ending, logdir)
            else:
                tap.ok(False, "%s: fixture %s exists" % (label, case))
    finally:
        shutil.rmtree(logdir, ignore_errors=True)
    tap.done()
    return 1 if tap.failed else 0


if __name__ == "__main__":
    sys.exit(main())
