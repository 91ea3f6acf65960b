#!/usr/bin/python3
"""The commit on unmount is reported: `ckptfs umount`, `ckptfs stage --status`, syslog.

Environment:
  CKPTFS    path of the ckptfs binary
  FIXTURES  output root of the fixture generators (a safetensors case is mounted)

1. A stage whose commit on unmount fails (a raw file without sidecar):
   `ckptfs umount MNT` waits for it and exits 2, with the problem's path on
   stderr; `ckptfs stage --status OUT` says the daemon ended with "failed 2",
   that changes are not in OUT, shows the report, and exits 2. With no
   /dev/log on the machine, one is bound here: the daemon's report lines
   arrive there (else that check is skipped: the journal is not ours to read).
2. A stage that commits on unmount: `ckptfs umount` exits 0 once OUT is
   complete (read strictly right after it returns); --status finds no stage.
3. A nocommit stage: `ckptfs umount` exits 0 and says the changes stay;
   --status says changes are pending and there was no commit.
4. A daemon killed with SIGKILL: `ckptfs umount` clears the mount and exits 3,
   saying the daemon ended without finishing.
5. `ckptfs umount` of a read-only mount exits 0; of a directory that is not a
   mount, 1.
"""

import os
import shutil
import signal
import socket
import struct
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from ckptfs_test import Watchdog, is_mounted, run_capture, unmount  # noqa: E402
from mount_checks import case_dirs, run  # noqa: E402
from staging import (daemon_pid, read_safetensors, spool_of, staged, wait_gone,  # noqa: E402
                     write_raw_tensor)

CHECK_TIMEOUT = 120
UMOUNT_TIMEOUT = 120


def text(b):
    return b.decode("utf-8", "replace")


class SyslogCatcher:
    """Binds /dev/log when the machine has none, and collects what arrives there."""

    def __init__(self):
        self.sock = None
        if os.path.exists("/dev/log"):
            self.reason = "/dev/log exists (a syslog daemon owns it)"
            return
        try:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self.sock.bind("/dev/log")
            self.sock.settimeout(0.2)
        except OSError as e:
            self.reason = "cannot bind /dev/log: %s" % e
            self.sock = None

    def lines(self):
        out = []
        while self.sock:
            try:
                out.append(self.sock.recv(65536).decode("utf-8", "replace"))
            except (socket.timeout, BlockingIOError):
                break
        return out

    def close(self):
        if self.sock:
            self.sock.close()
            os.unlink("/dev/log")


def failing_unmount(tap, ckptfs, work):
    what = "a failing commit on unmount"
    out = os.path.join(work, "fail.safetensors")
    mnt = tempfile.mkdtemp(prefix="ckptfs-t75.")
    catcher = SyslogCatcher()
    try:
        if not staged(tap, ckptfs, out, mnt, what)[0]:
            return
        with Watchdog(mnt, CHECK_TIMEOUT):
            with open(os.path.join(mnt, "lonely"), "wb") as f:
                f.write(b"\0" * 8)
        rc, _, err = run_capture([ckptfs, "umount", mnt], UMOUNT_TIMEOUT)
        tap.ok(rc == 2 and "lonely" in text(err) and not is_mounted(mnt),
               "%s: ckptfs umount waits for it and exits 2, naming the path" % what,
               ["exit %r: %s" % (rc, text(err))])
        rc, so, err = run_capture([ckptfs, "stage", "--status", out], 30)
        report = text(so)
        tap.ok(rc == 2 and "failed 2" in report and "changes not in OUT: yes" in report
               and "lonely" in report,
               "%s: ckptfs stage --status OUT reports it (exit 2)" % what,
               ["exit %r: %s %s" % (rc, report, text(err))])
        if catcher.sock:
            got = catcher.lines()
            tap.ok(any("lonely" in line and "ckptfs" in line for line in got),
                   "%s: the report reaches syslog" % what, got)
        else:
            tap.skip("%s: the report reaches syslog" % what, catcher.reason)
    finally:
        catcher.close()
        unmount(mnt)
        shutil.rmtree(spool_of(out), ignore_errors=True)


def good_unmount(tap, ckptfs, work):
    what = "a commit on unmount"
    out = os.path.join(work, "good.safetensors")
    mnt = tempfile.mkdtemp(prefix="ckptfs-t75.")
    try:
        if not staged(tap, ckptfs, out, mnt, what)[0]:
            return
        with Watchdog(mnt, CHECK_TIMEOUT):
            with open(os.path.join(mnt, "big"), "wb") as f:
                block = struct.pack("<f", 1.5) * (1 << 18)
                for _ in range(64):  # 64 MiB: a commit that takes a moment
                    f.write(block)
            with open(os.path.join(mnt, "big.json"), "w") as f:
                f.write('{"dtype": "F32", "shape": [%d]}' % (64 << 18))
            write_raw_tensor(os.path.join(mnt, "small"), [2.0, 3.0])
        rc, _, err = run_capture([ckptfs, "umount", mnt], UMOUNT_TIMEOUT)
        try:
            got = read_safetensors(out)
        except (OSError, ValueError, struct.error) as e:
            got = {"error": str(e)}
        ok = (got.get("small") == ("F32", [2], [2.0, 3.0]) and "big" in got
              and got["big"][2][:1] == [1.5] and got["big"][2][-1] == 1.5)
        tap.ok(rc == 0 and ok, "%s: ckptfs umount exits 0 once OUT is complete" % what,
               ["exit %r: %s" % (rc, text(err)), sorted(got)])
        rc, so, _ = run_capture([ckptfs, "stage", "--status", out], 30)
        tap.ok(rc == 0 and "no stage" in text(so) and not os.path.exists(spool_of(out)),
               "%s: --status finds no stage left" % what, ["exit %r: %s" % (rc, text(so))])
    finally:
        unmount(mnt)


def nocommit_unmount(tap, ckptfs, work):
    what = "a nocommit stage"
    out = os.path.join(work, "later.safetensors")
    mnt = tempfile.mkdtemp(prefix="ckptfs-t75.")
    try:
        if not staged(tap, ckptfs, out, mnt, what, "-o", "nocommit")[0]:
            return
        with Watchdog(mnt, CHECK_TIMEOUT):
            write_raw_tensor(os.path.join(mnt, "w"), [1.0])
        rc, _, err = run_capture([ckptfs, "umount", mnt], UMOUNT_TIMEOUT)
        tap.ok(rc == 0 and "nocommit" in text(err) and not os.path.exists(out),
               "%s: ckptfs umount exits 0 and says the changes stay" % what,
               ["exit %r: %s" % (rc, text(err))])
        rc, so, _ = run_capture([ckptfs, "stage", "--status", out], 30)
        tap.ok(rc == 0 and "changes not in OUT: yes" in text(so)
               and "last commit: none" in text(so),
               "%s: --status says the changes are pending" % what,
               ["exit %r: %s" % (rc, text(so))])
    finally:
        unmount(mnt)
        shutil.rmtree(spool_of(out), ignore_errors=True)


def killed(tap, ckptfs, work):
    what = "a killed stage daemon"
    out = os.path.join(work, "killed.safetensors")
    mnt = tempfile.mkdtemp(prefix="ckptfs-t75.")
    try:
        if not staged(tap, ckptfs, out, mnt, what)[0]:
            return
        pid = daemon_pid(spool_of(out))
        os.kill(pid, signal.SIGKILL)
        wait_gone(pid, 10)
        rc, _, err = run_capture([ckptfs, "umount", mnt], UMOUNT_TIMEOUT)
        tap.ok(rc == 3 and "without finishing" in text(err) and not is_mounted(mnt),
               "%s: ckptfs umount clears the mount and exits 3" % what,
               ["exit %r: %s" % (rc, text(err))])
    finally:
        unmount(mnt)
        shutil.rmtree(spool_of(out), ignore_errors=True)


def other_mounts(tap, ckptfs, root):
    case = case_dirs(root)[0]
    src = os.path.join(root, case)
    src = os.path.join(src, sorted(n for n in os.listdir(src) if n.endswith(".safetensors"))[0])
    mnt = tempfile.mkdtemp(prefix="ckptfs-t75.")
    try:
        rc, _, err = run_capture([ckptfs, src, mnt], 30)
        if tap.ok(rc == 0 and is_mounted(mnt), "read-only mount of %s" % case, [text(err)]):
            rc, _, err = run_capture([ckptfs, "umount", mnt], UMOUNT_TIMEOUT)
            tap.ok(rc == 0 and not is_mounted(mnt), "ckptfs umount of a read-only mount: exit 0",
                   ["exit %r: %s" % (rc, text(err))])
        rc, _, err = run_capture([ckptfs, "umount", mnt], UMOUNT_TIMEOUT)
        tap.ok(rc == 1, "ckptfs umount of a directory that is not a mount: exit 1",
               ["exit %r: %s" % (rc, text(err))])
    finally:
        unmount(mnt)


def body(tap, ckptfs, root):
    work = tempfile.mkdtemp(prefix="ckptfs-t75w.")
    try:
        failing_unmount(tap, ckptfs, work)
        good_unmount(tap, ckptfs, work)
        nocommit_unmount(tap, ckptfs, work)
        killed(tap, ckptfs, work)
        other_mounts(tap, ckptfs, root)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(run(body))
