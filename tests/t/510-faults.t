#!/usr/bin/python3
"""Faults under a live mount: damaged sources, unmounts with work in flight, signals.

Environment:
  CKPTFS    path of the ckptfs binary
  FIXTURES  output directory of the fixture generators (make fixtures)

Cases (each bounded in time; sources are scratch copies, never the fixtures):
  truncate   a shard of a sharded HF directory is cut in the middle of its last tensor while
             mounted: reading that tensor (raw file or HF view range) gives EIO, never other
             bytes; a tensor before the cut, through a descriptor opened before the cut or
             opened after it, gives EIO or the right bytes; tensors of the other shards keep working; the daemon keeps answering.
  replace    the source file is replaced by rename(2) with a file of other bytes: opening a
             tensor gives EIO; a descriptor opened before keeps giving the old, right bytes.
  lazy       a reader loops over a 4 MiB multi-piece tensor with O_DIRECT (every read reaches
             the daemon) while `fusermount3 -u -z` runs: the unmount returns at once, the reader
             never sees wrong bytes and ends, then the daemon exits with status 0.
  in flight  the same reader, and SIGTERM to the daemon: it unmounts and exits 0, the reader
             gets an error or its bytes (never others) and does not hang.
  signals    SIGTERM, SIGINT and SIGHUP to a daemon in the foreground (-f), and SIGTERM to a
             detached one: the mount goes away and the exit status is 0.
  busy       `fusermount3 -u` while a tensor is open fails with "busy" and changes nothing; the
             lazy form succeeds, the open file keeps reading right, and the daemon exits 0 once
             it is closed.

Descriptors use O_DIRECT where a read must reach the daemon (not the page cache).
"""

import ctypes
import errno
import hashlib
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

MOUNT_TIMEOUT = 30
EXIT_TIMEOUT = 20      # seconds a daemon may take to exit after its unmount or signal
CASE_TIMEOUT = 120     # watchdog per mounted case

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from ckptfs_test import (Tap, Watchdog, is_mounted, run_capture, skip_reason,  # noqa: E402
                         unmount, UMOUNT_TIMEOUT)

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper():
    """Detached daemons become our children, so their exit status can be collected."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def sha(data):
    return hashlib.sha256(data).hexdigest()


def read_direct(path, off=0, length=None):
    """pread through O_DIRECT: the request goes to the daemon."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        return pread_all(fd, off, length)
    finally:
        os.close(fd)


def pread_all(fd, off=0, length=None):
    out = b""
    while length is None or len(out) < length:
        want = 1 << 20 if length is None else min(1 << 20, length - len(out))
        chunk = os.pread(fd, want, off + len(out))
        if not chunk:
            break
        out += chunk
    return out


def outcome(fn):
    """('ok', bytes) or ('errno', name) of a read."""
    try:
        return "ok", fn()
    except OSError as e:
        return "errno", errno.errorcode.get(e.errno, str(e.errno))


def daemon_pids(mnt):
    """Processes whose command line holds the mount point (the daemon)."""
    pids = []
    want = os.fsencode(mnt)
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % d, "rb") as f:
                args = f.read().split(b"\0")
            with open("/proc/%s/stat" % d, "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if want in args and state != b"Z" and int(d) != os.getpid():
            pids.append(int(d))
    return pids


def wait_pid(pid, timeout):
    """Exit status of a child (reparented daemons are children of a subreaper), or None."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            got, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return "not a child"
        if got == pid:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    return None


def mount_bg(ckptfs, src, mnt, opts=()):
    rc, _, err = run_capture([ckptfs, src, mnt] + list(opts), MOUNT_TIMEOUT)
    ok = rc == 0 and is_mounted(mnt)
    return ok, ["exit status %r" % rc, err.decode("utf-8", "replace").strip()]


class Foreground:
    """ckptfs -f SRC MNT as our child."""

    def __init__(self, ckptfs, src, mnt):
        self.log = tempfile.TemporaryFile()
        self.p = subprocess.Popen([ckptfs, "-f", src, mnt], stdin=subprocess.DEVNULL,
                                  stdout=self.log, stderr=self.log, start_new_session=True)
        self.mnt = mnt

    def wait_mounted(self):
        deadline = time.monotonic() + MOUNT_TIMEOUT
        while time.monotonic() < deadline:
            if self.p.poll() is not None:
                return False
            if is_mounted(self.mnt):
                os.stat(self.mnt)  # returns once the daemon answered INIT
                return True
            time.sleep(0.05)
        return False

    def wait(self, timeout):
        try:
            return self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def output(self):
        self.log.seek(0)
        return self.log.read().decode("utf-8", "replace").strip()

    def kill(self):
        if self.p.poll() is None:
            try:
                os.killpg(self.p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.p.wait()


def load_manifest(case_dir):
    with open(os.path.join(case_dir, "manifest.json"), encoding="utf-8") as f:
        return json.load(f)


def view_ranges(mnt):
    """{tensor name: (offset, length)} of the HF view's model.safetensors."""
    view = os.path.join(mnt, ".ckptfs", "hf", "model.safetensors")
    head = read_direct(view, 0, 8)
    (hlen,) = struct.unpack("<Q", head)
    header = json.loads(read_direct(view, 8, hlen))
    return view, {k: (8 + hlen + v["data_offsets"][0], v["data_offsets"][1] - v["data_offsets"][0])
                  for k, v in header.items() if k != "__metadata__"}


# ---------------------------------------------------------------------------

def case_truncate(tap, ckptfs, fixtures, scratch):
    src = os.path.join(scratch, "sharded")
    shutil.copytree(os.path.join(fixtures, "sharded"), src)
    tensors = load_manifest(src)["tensors"]
    by_file = {}
    for t in tensors:
        by_file.setdefault(t["file"], []).append(t)
    victim = max(sorted(by_file), key=lambda f: len(by_file[f]))
    in_victim = sorted(by_file[victim], key=lambda t: t["offset"])
    intact, reopened, lost = in_victim[0], in_victim[1], in_victim[-1]
    other = next(t for t in tensors if t["file"] != victim and t["nbytes"] > 0)
    cut = lost["offset"] + lost["nbytes"] // 2

    mnt = tempfile.mkdtemp(prefix="ckptfs-t51.")
    ok, diag = mount_bg(ckptfs, src, mnt)
    if not tap.ok(ok, "truncate: mount a scratch copy of sharded/", diag):
        os.rmdir(mnt)
        return
    try:
        with Watchdog(mnt, CASE_TIMEOUT):
            raw = lambda t: os.path.join(mnt, t["path"])  # noqa: E731
            fd_intact = os.open(raw(intact), os.O_RDONLY | os.O_DIRECT)
            fd_lost = os.open(raw(lost), os.O_RDONLY | os.O_DIRECT)
            os.truncate(os.path.join(src, victim), cut)

            r = outcome(lambda: pread_all(fd_lost))
            tap.ok(r == ("errno", "EIO"),
                   "truncate: reading %s (cut at byte %d of its %d) gives EIO"
                   % (lost["name"], cut - lost["offset"], lost["nbytes"]),
                   ["got %s" % (r[0] if r[0] == "ok" else r[1])])
            # A changed file gives EIO on every read (530-changed-source.t): a cut cannot be
            # told from a rewrite in place, so the bytes before it are not served either.
            r = outcome(lambda: pread_all(fd_intact))
            tap.ok(r == ("errno", "EIO") or (r[0] == "ok" and sha(r[1]) == intact["sha256"]),
                   "truncate: %s (before the cut, opened before) gives EIO or its bytes"
                   % intact["name"], ["got %s" % (r[1] if r[0] == "errno" else "other bytes")])
            os.close(fd_intact)
            os.close(fd_lost)

            r = outcome(lambda: read_direct(raw(reopened)))
            tap.ok(r == ("errno", "EIO") or (r[0] == "ok" and sha(r[1]) == reopened["sha256"]),
                   "truncate: opening %s of the cut file after the cut gives EIO or its bytes"
                   % reopened["name"], ["got other bytes"])
            tap.diag("opening a tensor before the cut in the cut file now gives: %s"
                     % ("its bytes" if r[0] == "ok" else r[1]))
            r = outcome(lambda: read_direct(raw(lost)))
            tap.ok(r == ("errno", "EIO"), "truncate: reopening %s gives EIO" % lost["name"],
                   ["got %s" % (r[0] if r[0] == "ok" else r[1])])

            r = outcome(lambda: read_direct(raw(other)))
            tap.ok(r[0] == "ok" and sha(r[1]) == other["sha256"],
                   "truncate: %s in %s keeps working" % (other["name"], other["file"]),
                   ["got %s" % (r[1] if r[0] == "errno" else "other bytes")])

            problems = []
            try:
                view, ranges = view_ranges(mnt)
                off, n = ranges[lost["name"]]
                r = outcome(lambda: read_direct(view, off, n))
                if r != ("errno", "EIO"):
                    problems.append("lost tensor through the view: %s"
                                    % (r[1] if r[0] == "errno" else "bytes"))
                off, n = ranges[other["name"]]
                r = outcome(lambda: read_direct(view, off, n))
                if r[0] != "ok" or sha(r[1]) != other["sha256"]:
                    problems.append("intact tensor through the view: %s"
                                    % (r[1] if r[0] == "errno" else "other bytes"))
            except (OSError, ValueError, KeyError) as e:
                problems.append("view: %s" % e)
            tap.ok(not problems, "truncate: HF view gives EIO for the lost range, bytes for "
                   "the others", problems)

            problems = []
            try:
                json.loads(read_direct(os.path.join(mnt, ".ckptfs", "summary.json")))
                os.listdir(os.path.join(mnt, "model"))
                os.stat(raw(lost))
            except (OSError, ValueError) as e:
                problems.append(str(e))
            tap.ok(not problems and is_mounted(mnt),
                   "truncate: the daemon survives and keeps answering", problems)
    finally:
        tap.ok(unmount(mnt), "truncate: fusermount3 -u")


def case_replace(tap, ckptfs, fixtures, scratch):
    case_dir = os.path.join(fixtures, "dtypes")
    tensors = [t for t in load_manifest(case_dir)["tensors"] if t["nbytes"] > 0]
    src = os.path.join(scratch, "model.safetensors")
    shutil.copyfile(os.path.join(case_dir, "model.safetensors"), src)
    mnt = tempfile.mkdtemp(prefix="ckptfs-t51.")
    ok, diag = mount_bg(ckptfs, src, mnt)
    if not tap.ok(ok, "replace: mount a scratch copy of dtypes/model.safetensors", diag):
        os.rmdir(mnt)
        return
    try:
        with Watchdog(mnt, CASE_TIMEOUT):
            first, second = tensors[0], tensors[-1]
            fd_old = os.open(os.path.join(mnt, first["path"]), os.O_RDONLY | os.O_DIRECT)
            # Same header, every data byte inverted: a stale read would be visible.
            with open(src, "rb") as f:
                data = bytearray(f.read())
            (hlen,) = struct.unpack("<Q", data[:8])
            for i in range(8 + hlen, len(data)):
                data[i] ^= 0xFF
            tmp = src + ".new"
            with open(tmp, "wb") as f:
                f.write(data)
            os.rename(tmp, src)

            r = outcome(lambda: read_direct(os.path.join(mnt, second["path"])))
            tap.ok(r == ("errno", "EIO"), "replace: opening %s after the rename gives EIO"
                   % second["name"], ["got %s" % (r[0] if r[0] == "ok" else r[1])])
            r = outcome(lambda: pread_all(fd_old))
            tap.ok(r == ("errno", "EIO") or (r[0] == "ok" and sha(r[1]) == first["sha256"]),
                   "replace: a descriptor opened before gives the old bytes or EIO, never the "
                   "new file's", ["got the replacement's bytes"])
            tap.diag("a descriptor opened before the rename now gives: %s"
                     % ("the old bytes" if r[0] == "ok" else r[1]))
            os.close(fd_old)
            tap.ok(is_mounted(mnt) and os.path.isdir(os.path.join(mnt, ".ckptfs")),
                   "replace: the daemon keeps answering")
    finally:
        tap.ok(unmount(mnt), "replace: fusermount3 -u")


READER = r"""
import hashlib, os, sys, time
path, want, seconds, progress = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
end = time.monotonic() + seconds
passes = bad = 0
err = ""
while time.monotonic() < end:
    try:
        data, off = b"", 0
        while True:
            chunk = os.pread(fd, 1 << 20, off)
            if not chunk:
                break
            data += chunk
            off += len(chunk)
    except OSError as e:
        err = "%s after %d passes" % (e, passes)
        break
    passes += 1
    bad += hashlib.sha256(data).hexdigest() != want
    with open(progress, "w") as f:
        f.write("%d %d" % (passes, bad))
try:
    os.close(fd)
except OSError as e:  # a FLUSH to a dead connection fails too
    err = err or "close: %s" % e
with open(progress, "w") as f:
    f.write("%d %d %s" % (passes, bad, err))
"""


def start_reader(mnt, t, npasses, progress):
    """READER over tensor t of the mount, in its own session, NPASSES passes: (the process, the
    passes it finished) once it has done 2 passes, died, or 30 s went by."""
    reader = subprocess.Popen([sys.executable, "-c", READER, os.path.join(mnt, t["path"]),
                               t["sha256"], str(npasses), progress], start_new_session=True)
    deadline = time.monotonic() + 30
    passes = 0
    while time.monotonic() < deadline and passes < 2 and reader.poll() is None:
        try:
            with open(progress) as f:
                passes = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
        time.sleep(0.02)
    return reader, passes


def case_lazy_unmount(tap, ckptfs, fixtures, scratch):
    case_dir = os.path.join(fixtures, "dcphf", "big_dim1")
    t = load_manifest(case_dir)["tensors"][0]
    mnt = tempfile.mkdtemp(prefix="ckptfs-t51.")
    fg = Foreground(ckptfs, case_dir, mnt)
    try:
        if not tap.ok(fg.wait_mounted(), "lazy: mount dcphf/big_dim1 in the foreground",
                      [fg.output()]):
            return
        progress = os.path.join(scratch, "progress")
        reader, passes = start_reader(mnt, t, 4, progress)
        t0 = time.monotonic()
        rc, _, err = run_capture(["fusermount3", "-u", "-z", mnt], UMOUNT_TIMEOUT)
        took = time.monotonic() - t0
        tap.ok(passes >= 2 and rc == 0 and not is_mounted(mnt),
               "lazy: fusermount3 -u -z with reads in flight returns (%.2f s) and detaches" % took,
               ["reader passes before: %d" % passes, "exit %r: %s" % (rc, err.decode().strip())])
        try:
            reader.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(reader.pid, signal.SIGKILL)
            reader.wait()
        with open(progress) as f:
            fields = f.read().split(None, 2)
        total, bad = int(fields[0]), int(fields[1])
        tail = fields[2] if len(fields) > 2 else ""
        tap.ok(reader.returncode == 0 and bad == 0,
               "lazy: the reader finished %d passes over the 4 MiB tensor, none with wrong "
               "bytes%s" % (total, " (then: %s)" % tail if tail else ""),
               ["reader exit %r, %d bad passes" % (reader.returncode, bad)])
        status = fg.wait(EXIT_TIMEOUT)
        tap.ok(status == 0, "lazy: the daemon exits with status 0 once the reader is gone",
               ["status %r%s" % (status, " (still running)" if status is None else ""),
                fg.output()])
    finally:
        fg.kill()
        unmount(mnt)


def case_signal_in_flight(tap, ckptfs, fixtures, scratch):
    """SIGTERM while a reader hammers the daemon: it exits 0, the reader is not left hanging."""
    case_dir = os.path.join(fixtures, "dcphf", "big_dim1")
    t = load_manifest(case_dir)["tensors"][0]
    mnt = tempfile.mkdtemp(prefix="ckptfs-t51.")
    fg = Foreground(ckptfs, case_dir, mnt)
    reader = None
    try:
        if not tap.ok(fg.wait_mounted(), "in flight: mount dcphf/big_dim1 in the foreground",
                      [fg.output()]):
            return
        progress = os.path.join(scratch, "progress")
        reader, passes = start_reader(mnt, t, 20, progress)
        fg.p.send_signal(signal.SIGTERM)
        status = fg.wait(EXIT_TIMEOUT)
        tap.ok(passes >= 2 and status == 0 and not is_mounted(mnt),
               "in flight: SIGTERM during reads: the daemon unmounts and exits with status 0",
               ["reader passes before: %d, status %r" % (passes, status), fg.output()])
        try:
            reader.wait(timeout=EXIT_TIMEOUT)
            ended = True
        except subprocess.TimeoutExpired:
            ended = False
        fields = ["0", "0"]
        try:
            with open(progress) as f:
                fields = f.read().split(None, 2)
        except OSError:
            pass
        tap.ok(ended and int(fields[1]) == 0,
               "in flight: the reader does not hang and never saw wrong bytes (%s)"
               % (fields[2] if len(fields) > 2 else "no error"),
               ["reader ended: %s, bad passes %s" % (ended, fields[1])])
    finally:
        if reader and reader.poll() is None:
            os.killpg(reader.pid, signal.SIGKILL)
            reader.wait()
        fg.kill()
        unmount(mnt)


def case_signals(tap, ckptfs, fixtures, subreaper):
    case_dir = os.path.join(fixtures, "dtypes")
    src = os.path.join(case_dir, "model.safetensors")
    t = [t for t in load_manifest(case_dir)["tensors"] if t["nbytes"] > 0][0]
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        name = signal.Signals(sig).name
        mnt = tempfile.mkdtemp(prefix="ckptfs-t51.")
        fg = Foreground(ckptfs, src, mnt)
        try:
            if not tap.ok(fg.wait_mounted(), "%s: mount in the foreground" % name,
                          [fg.output()]):
                continue
            with Watchdog(mnt, CASE_TIMEOUT):
                good = sha(read_direct(os.path.join(mnt, t["path"]))) == t["sha256"]
            fg.p.send_signal(sig)
            status = fg.wait(EXIT_TIMEOUT)
            tap.ok(good and status == 0 and not is_mounted(mnt),
                   "%s: the daemon unmounts and exits with status 0" % name,
                   ["read ok: %s, status %r, still mounted: %s"
                    % (good, status, is_mounted(mnt)), fg.output()])
        finally:
            fg.kill()
            unmount(mnt)

    mnt = tempfile.mkdtemp(prefix="ckptfs-t51.")
    ok, diag = mount_bg(ckptfs, src, mnt)
    try:
        if not tap.ok(ok, "SIGTERM: mount detached", diag):
            return
        pids = daemon_pids(mnt)
        if not tap.ok(len(pids) == 1, "SIGTERM: found the detached daemon", ["pids %r" % pids]):
            return
        os.kill(pids[0], signal.SIGTERM)
        status = wait_pid(pids[0], EXIT_TIMEOUT) if subreaper else None
        deadline = time.monotonic() + EXIT_TIMEOUT
        while is_mounted(mnt) and time.monotonic() < deadline:
            time.sleep(0.05)
        tap.ok(not is_mounted(mnt) and (status == 0 or not subreaper),
               "SIGTERM: a detached daemon unmounts%s" % (" and exits with status 0"
                                                          if subreaper else ""),
               ["status %r, still mounted: %s" % (status, is_mounted(mnt))])
    finally:
        unmount(mnt)


def case_busy(tap, ckptfs, fixtures, subreaper):
    case_dir = os.path.join(fixtures, "dtypes")
    src = os.path.join(case_dir, "model.safetensors")
    ts = [t for t in load_manifest(case_dir)["tensors"] if t["nbytes"] > 0]
    for lazy in (False, True):
        what = "busy (lazy)" if lazy else "busy"
        mnt = tempfile.mkdtemp(prefix="ckptfs-t51.")
        ok, diag = mount_bg(ckptfs, src, mnt)
        try:
            if not tap.ok(ok, "%s: mount" % what, diag):
                continue
            pids = daemon_pids(mnt)
            with Watchdog(mnt, CASE_TIMEOUT):
                fd = os.open(os.path.join(mnt, ts[0]["path"]), os.O_RDONLY | os.O_DIRECT)
                os.pread(fd, 1, 0)
                argv = ["fusermount3", "-u"] + (["-z"] if lazy else []) + [mnt]
                rc, _, err = run_capture(argv, UMOUNT_TIMEOUT)
                err = err.decode("utf-8", "replace").strip()
                if lazy:
                    tap.ok(rc == 0 and not is_mounted(mnt),
                           "%s: fusermount3 -u -z with a file open detaches the mount" % what,
                           ["exit %r: %s" % (rc, err)])
                else:
                    tap.ok(rc not in (0, None) and "busy" in err.lower() and is_mounted(mnt),
                           "%s: fusermount3 -u with a file open fails with busy" % what,
                           ["exit %r: %s" % (rc, err), "mounted: %s" % is_mounted(mnt)])
                problems = []
                r = outcome(lambda: pread_all(fd))
                if r[0] != "ok" or sha(r[1]) != ts[0]["sha256"]:
                    problems.append("open file: %s" % (r[1] if r[0] == "errno" else "bytes"))
                if not lazy:
                    r = outcome(lambda: read_direct(os.path.join(mnt, ts[1]["path"])))
                    if r[0] != "ok" or sha(r[1]) != ts[1]["sha256"]:
                        problems.append("new open: %s" % (r[1] if r[0] == "errno" else "bytes"))
                tap.ok(not problems, "%s: the daemon keeps serving right bytes" % what, problems)
                os.close(fd)
            if not lazy:
                rc, _, err = run_capture(["fusermount3", "-u", mnt], UMOUNT_TIMEOUT)
                tap.ok(rc == 0 and not is_mounted(mnt),
                       "%s: fusermount3 -u works once the file is closed" % what,
                       ["exit %r: %s" % (rc, err.decode().strip())])
            if len(pids) == 1:
                if subreaper:
                    status = wait_pid(pids[0], EXIT_TIMEOUT)
                    tap.ok(status == 0, "%s: the daemon exits with status 0" % what,
                           ["status %r" % (status,)])
                else:
                    deadline = time.monotonic() + EXIT_TIMEOUT
                    while daemon_pids(mnt) and time.monotonic() < deadline:
                        time.sleep(0.05)
                    tap.ok(not daemon_pids(mnt), "%s: the daemon exits" % what)
        finally:
            unmount(mnt)


def main():
    ckptfs = os.environ.get("CKPTFS", "")
    fixtures = os.environ.get("FIXTURES", "")
    reason = skip_reason(ckptfs, fixtures)
    if reason:
        print("1..0 # SKIP " + reason)
        return 0
    ckptfs, fixtures = os.path.abspath(ckptfs), os.path.abspath(fixtures)
    subreaper = become_subreaper()
    tap = Tap()
    scratch = tempfile.mkdtemp(prefix="ckptfs-t51-src.")
    try:
        for case in (case_truncate, case_replace, case_lazy_unmount, case_signal_in_flight):
            sub = tempfile.mkdtemp(dir=scratch)
            case(tap, ckptfs, fixtures, sub)
        case_signals(tap, ckptfs, fixtures, subreaper)
        case_busy(tap, ckptfs, fixtures, subreaper)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        # Reap whatever detached daemons ended up as our children.
        while True:
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break
    tap.done()
    return 1 if tap.failed else 0


if __name__ == "__main__":
    sys.exit(main())
