#!/usr/bin/python3
"""fsync and fallocate on a staging mount (issue 29: neither was run by any test).

Environment: CKPTFS.

In a stage of OUT.safetensors (nocommit):
- a file written in order (its bytes go to the pack): fsync and fdatasync succeed and it reads
  back whole; fallocate(2) on it is refused with EOPNOTSUPP (a pack is appended only) and
  changes nothing;
- a file rewritten in place after it was closed (kept in the spool as a file of its own):
  fallocate of 1 MiB succeeds, the file is then 1 MiB, its first bytes kept and the rest
  zeros; fsync succeeds;
- after a kill -9 of the daemon, the stage taken up again holds both files as they were at
  their fsync.
"""

import ctypes
import ctypes.util
import errno
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from ckptfs_test import Tap, is_mounted, run_capture  # noqa: E402
import staging  # noqa: E402

LIBC = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
LIBC.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
MIB = 1 << 20


def fallocate(fd, offset, length):
    """0, or the errno of fallocate(2) (mode 0) - not posix_fallocate, which writes zeros
    itself when the file system says no."""
    if LIBC.fallocate(fd, 0, offset, length) == 0:
        return 0
    return ctypes.get_errno()


def main():
    tap = Tap()
    ckptfs = os.environ.get("CKPTFS", "build/ckptfs")
    tmp = tempfile.mkdtemp(prefix="ckptfs-t113.")
    out = os.path.join(tmp, "out.safetensors")
    mnt = os.path.join(tmp, "mnt")
    os.mkdir(mnt)
    spool = staging.spool_of(out)
    packed = bytes(range(256)) * 256  # 64 KiB
    head = b"\x5a" * 4096
    try:
        rc, _, err = staging.stage(ckptfs, out, mnt, "-o", "nocommit")
        if not tap.ok(rc == 0 and is_mounted(mnt), "stage", [err.decode(errors="replace")]):
            tap.done()
            return 1
        a = os.path.join(mnt, "a.bin")
        fd = os.open(a, os.O_WRONLY | os.O_CREAT, 0o644)
        os.write(fd, packed)
        try:
            os.fsync(fd)
            os.fdatasync(fd)
            synced = True
        except OSError as e:
            synced = e
        tap.ok(synced is True, "fsync and fdatasync of a file written in order", [synced])
        e = fallocate(fd, 0, MIB)
        os.close(fd)
        tap.ok(e == errno.EOPNOTSUPP, "fallocate of a packed file: EOPNOTSUPP (got %s)"
               % errno.errorcode.get(e, e))
        with open(a, "rb") as f:
            tap.ok(f.read() == packed, "the packed file is unchanged and whole")

        b = os.path.join(mnt, "b.bin")
        with open(b, "wb") as f:
            f.write(b"\0" * 4096)
        fd = os.open(b, os.O_RDWR)
        os.pwrite(fd, head, 0)  # rewritten after it was closed: a file of its own
        e = fallocate(fd, 0, MIB)
        try:
            os.fsync(fd)
            synced = True
        except OSError as x:
            synced = x
        os.close(fd)
        tap.ok(e == 0, "fallocate of 1 MiB on a rewritten file (got %s)"
               % (errno.errorcode.get(e, e) if e else 0))
        tap.ok(synced is True, "fsync of it", [synced])
        with open(b, "rb") as f:
            got = f.read()
        tap.ok(got == head + b"\0" * (MIB - len(head)),
               "it is 1 MiB: its bytes, then zeros (%d bytes)" % len(got))

        pid = staging.daemon_pid(spool)
        tap.ok(staging.stop_stage(mnt, pid, kill=True, spool=spool), "kill -9 of the daemon")
        rc, _, err = staging.stage(ckptfs, out, mnt, "-o", "nocommit")
        tap.ok(rc == 0 and is_mounted(mnt), "taken up again", [err.decode(errors="replace")])
        try:
            with open(a, "rb") as f:
                ga = f.read()
            with open(b, "rb") as f:
                gb = f.read()
        except OSError as x:
            ga = gb = x
        tap.ok(ga == packed and gb == head + b"\0" * (MIB - len(head)),
               "both files are as they were at their fsync")
        pid = staging.daemon_pid(spool)
        tap.ok(staging.stop_stage(mnt, pid, spool=spool), "unmounted")
    finally:
        if is_mounted(mnt):
            run_capture(["fusermount3", "-u", "-z", mnt], 20)
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(spool, ignore_errors=True)
    tap.done()
    return 1 if tap.failed else 0


if __name__ == "__main__":
    sys.exit(main())
