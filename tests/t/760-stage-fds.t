#!/usr/bin/python3
"""A commit does not hold one file descriptor per staged tensor.

Environment:
  CKPTFS    path of the ckptfs binary
  FIXTURES  output root of the fixture generators (only checked to exist)

A stage started with RLIMIT_NOFILE 256 (soft and hard, so the daemon cannot
raise it) takes 700 tensors (raw + sidecar each, 1400 files), and commits
them into a .safetensors and into a sharded directory OUT: both succeed, and
a strict reader written here finds every tensor with its values. /proc shows
the daemon's open descriptors stay far below the tensor count meanwhile.
"""

import os
import resource
import shutil
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from ckptfs_test import Watchdog, is_mounted, unmount  # noqa: E402
from mount_checks import run  # noqa: E402
from staging import (MOUNT_TIMEOUT, commit, daemon_pid, read_safetensors,  # noqa: E402
                     read_safetensors_dir, spool_of, stop_stage, write_raw_tensor)

TENSORS = 700
LIMIT = 256
CHECK_TIMEOUT = 300


def low_limit():
    resource.setrlimit(resource.RLIMIT_NOFILE, (LIMIT, LIMIT))


def open_fds(pid):
    try:
        return len(os.listdir("/proc/%d/fd" % pid))
    except OSError:
        return -1


def one(tap, ckptfs, work, out_name, extra, read):
    what = "%d tensors into %s under ulimit -n %d" % (TENSORS, out_name, LIMIT)
    out = os.path.join(work, out_name)
    mnt = tempfile.mkdtemp(prefix="ckptfs-t76.")
    pid = 0
    try:
        p = subprocess.run([ckptfs, "stage", out, mnt] + extra, preexec_fn=low_limit,
                           stdin=subprocess.DEVNULL, capture_output=True, timeout=MOUNT_TIMEOUT)
        if not tap.ok(p.returncode == 0 and is_mounted(mnt), "%s: ckptfs stage" % what,
                      ["exit %r: %s" % (p.returncode, p.stderr.decode(errors="replace"))]):
            return
        pid = daemon_pid(spool_of(out))
        with open("/proc/%d/limits" % pid) as f:
            limits = [line for line in f if line.startswith("Max open files")]
        tap.ok(limits and limits[0].split()[3] == str(LIMIT),
               "%s: the daemon runs with that limit" % what, limits)
        with Watchdog(mnt, CHECK_TIMEOUT):
            for i in range(TENSORS):
                write_raw_tensor(os.path.join(mnt, "t%04d" % i), [float(i), -float(i)])
            rc, _, err = commit(ckptfs, mnt)
        fds = open_fds(pid)
        tap.ok(rc == 0, "%s: the commit succeeds" % what,
               ["exit %r: %s" % (rc, err.decode(errors="replace"))])
        tap.ok(0 <= fds < 64, "%s: the daemon holds few descriptors after it (%d)" % (what, fds))
    finally:
        stop_stage(mnt, pid)
        unmount(mnt)
    got = read(out)
    bad = [i for i in range(TENSORS)
           if got.get("t%04d" % i) != ("F32", [2], [float(i), -float(i)])]
    tap.ok(len(got) == TENSORS and not bad, "%s: every tensor is in OUT" % what,
           ["%d tensors, %d wrong, e.g. %s" % (len(got), len(bad), bad[:5])])


def body(tap, ckptfs, root):
    work = tempfile.mkdtemp(prefix="ckptfs-t76w.")
    try:
        one(tap, ckptfs, work, "many.safetensors", [], read_safetensors_or_empty)
        one(tap, ckptfs, work, "many/", ["-o", "max_shard_size=2000"],
            lambda out: read_safetensors_dir(out.rstrip("/")))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def read_safetensors_or_empty(path):
    try:
        return read_safetensors(path)
    except (OSError, ValueError, struct.error):
        return {}


if __name__ == "__main__":
    sys.exit(run(body))
