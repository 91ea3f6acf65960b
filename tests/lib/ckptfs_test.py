"""Shared pieces of the Python TAP tests: TAP output, mounting with timeouts, cleanup.

Tests import it with:  sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
"""

import os
import signal
import subprocess
import sys
import tempfile
import threading

UMOUNT_TIMEOUT = 20


# ---------------------------------------------------------------------------
# TAP output

class Tap:
    def __init__(self):
        self.n = 0
        self.failed = 0

    @staticmethod
    def _clean(text):
        # A newline would end the TAP line and '#' would start a directive;
        # tensor names contain such bytes, so show them as \xNN.
        return "".join("\\x%02x" % ord(c) if ord(c) < 0x20 or c in "\x7f#" else c
                       for c in str(text))

    def ok(self, cond, desc, diag=()):
        self.n += 1
        if not cond:
            self.failed += 1
        print("%s %d - %s" % ("ok" if cond else "not ok", self.n, self._clean(desc)))
        if not cond:
            for line in diag:
                for part in str(line).splitlines() or [""]:
                    print("#   " + self._clean(part))
        sys.stdout.flush()
        return cond

    def skip(self, desc, reason):
        # ok() would escape the '#' of the directive.
        self.n += 1
        print("ok %d - %s # SKIP %s" % (self.n, self._clean(desc), self._clean(reason)))
        sys.stdout.flush()

    def skip_unless_ci(self, desc, reason):
        """A skip outside CI; in CI (CKPTFS_CI=1, exported by .ci/run) a missing tool or input
        fails: a run that passes must have run the check."""
        if os.environ.get("CKPTFS_CI") == "1":
            self.ok(False, "%s (CI: cannot be skipped)" % desc, [reason])
        else:
            self.skip(desc, reason)

    def diag(self, text):
        print("# " + self._clean(text))

    def done(self):
        print("1..%d" % self.n)


# ---------------------------------------------------------------------------
# Mount helpers

def unescape_mounts_field(field):
    # /proc/mounts escapes space, tab, newline and backslash as \ooo.
    out, i = bytearray(), 0
    while i < len(field):
        if field[i:i + 1] == b"\\" and field[i + 1:i + 4].isdigit():
            out.append(int(field[i + 1:i + 4], 8))
            i += 4
        else:
            out += field[i:i + 1]
            i += 1
    return bytes(out)


def is_mounted(mnt):
    target = os.fsencode(os.path.realpath(mnt))
    with open("/proc/mounts", "rb") as f:
        for line in f:
            fields = line.split(b" ")
            if len(fields) > 1 and unescape_mounts_field(fields[1]) == target:
                return True
    return False


def read_to_eof(fd, got=b""):
    """What is left to read from the descriptor fd (a pipe), appended to got; fd is closed."""
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        got += chunk
    os.close(fd)
    return got


def run_capture(argv, timeout):
    """Run argv; return (rc or None on timeout, stdout bytes, stderr bytes).

    Output goes to temporary files, not pipes: a daemon that forgets to close
    an inherited pipe must not make us wait for it.
    """
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        # Own process group, so a hung command is killed with its children.
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                             start_new_session=True)
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
            rc = None
        out.seek(0)
        err.seek(0)
        return rc, out.read(), err.read()


def unmount(mnt):
    """Unmount if mounted; returns True if a plain unmount worked."""
    clean = True
    if is_mounted(mnt):
        rc, _, _ = run_capture(["fusermount3", "-u", mnt], UMOUNT_TIMEOUT)
        if rc != 0 or is_mounted(mnt):
            clean = False
            run_capture(["fusermount3", "-u", "-z", mnt], UMOUNT_TIMEOUT)
    try:
        os.rmdir(mnt)
    except OSError:
        pass
    return clean


class Watchdog:
    """Abort the FUSE connection if checks on a mount take too long.

    A hung daemon would otherwise block this process in the kernel forever;
    `umount -f` on a FUSE mount aborts the connection, so every pending and
    later request fails with ENOTCONN and the checks end as failures.
    """

    def __init__(self, mnt, seconds):
        self.mnt, self.fired = mnt, False
        self.timer = threading.Timer(seconds, self._fire)
        self.timer.daemon = True

    def _fire(self):
        self.fired = True
        run_capture(["umount", "-f", self.mnt], UMOUNT_TIMEOUT)
        run_capture(["fusermount3", "-u", "-z", self.mnt], UMOUNT_TIMEOUT)

    def __enter__(self):
        self.timer.start()
        return self

    def __exit__(self, *exc):
        self.timer.cancel()
        # If it already fired, let the abort and lazy unmount finish before
        # anyone looks at the mount; otherwise this returns at once.
        self.timer.join()
        return False


def run_cases(prefix, *cases):
    """The main of a test made of cases, each called as case(tap, work): a SKIP when CKPTFS,
    FIXTURES or FUSE are missing, one scratch directory (removed at the end), and the exit
    status prove expects."""
    import shutil
    why = skip_reason(os.environ.get("CKPTFS"), os.environ.get("FIXTURES"))
    if why:
        print("1..0 # SKIP %s" % why)
        return 0
    tap = Tap()
    work = tempfile.mkdtemp(prefix=prefix)
    try:
        for case in cases:
            case(tap, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    tap.done()
    return 0 if tap.failed == 0 else 1


def skip_reason(ckptfs, fixtures):
    if not ckptfs or not os.access(ckptfs, os.X_OK):
        return "CKPTFS (%r) is not an executable" % ckptfs
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing"
    if not fixtures or not os.path.isdir(fixtures):
        return "FIXTURES (%r) is not a directory" % fixtures
    for tool in ("fusermount3",):
        if not any(os.access(os.path.join(d, tool), os.X_OK)
                   for d in os.environ.get("PATH", "/usr/bin:/bin").split(":")):
            return "%s not found" % tool
    return None


