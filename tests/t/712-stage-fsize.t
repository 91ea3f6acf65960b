#!/usr/bin/python3
"""A staging daemon under `ulimit -f` (issue 29 #18): a pack that passes the file size limit
gives the writer EFBIG, as a local file system does, and the daemon lives on.

Environment: CKPTFS.

The daemon is started with RLIMIT_FSIZE of 4 MiB (set in a small exec wrapper, so only the
daemon has it: the kernel applies the limit of the process that writes, and here the writer
of the pack is the daemon). 8 MiB written into the stage in 1 MiB writes: a write or the close
fails with EFBIG (the pack's writes are answered before they are made, so a later write or
close() reports it); the mount still answers (its root lists), a 1 MiB file written after
that is staged whole, and the daemon unmounts and exits by itself. Before, SIGXFSZ killed the
daemon: the mount was dead and the writer saw ECONNABORTED.
"""

import errno
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from ckptfs_test import Tap, is_mounted, run_capture, unmount  # noqa: E402
import staging  # noqa: E402

LIMIT = 4 << 20


def write_file(path, total, chunk=1 << 20):
    """Writes total bytes in chunk-sized writes: None, or the errno a write or close gave."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    except OSError as e:
        return e.errno
    failed = None
    try:
        for i in range(total // chunk):
            os.write(fd, bytes([i & 0xFF]) * chunk)
    except OSError as e:
        failed = e.errno
    try:
        os.close(fd)
    except OSError as e:
        failed = failed or e.errno
    return failed


def main():
    tap = Tap()
    ckptfs = os.environ.get("CKPTFS", "build/ckptfs")
    tmp = tempfile.mkdtemp(prefix="ckptfs-t118.")
    out, mnt = os.path.join(tmp, "out.safetensors"), os.path.join(tmp, "mnt")
    os.mkdir(mnt)
    spool = staging.spool_of(out)
    # Python ignores SIGXFSZ, and exec keeps an ignored signal ignored: the wrapper gives the
    # daemon the default action a shell's `ulimit -f; ckptfs stage` gives it.
    wrapper = ("import os, resource, signal, sys; "
               "signal.signal(signal.SIGXFSZ, signal.SIG_DFL); "
               "resource.setrlimit(resource.RLIMIT_FSIZE, (%d, %d)); "
               "os.execv(sys.argv[1], sys.argv[1:])" % (LIMIT, LIMIT))
    try:
        rc, _, err = run_capture([sys.executable, "-c", wrapper, ckptfs, "stage", out, mnt,
                                  "-o", "nocommit"], staging.MOUNT_TIMEOUT)
        if not tap.ok(rc == 0 and is_mounted(mnt), "stage under a 4 MiB file size limit",
                      [err.decode(errors="replace")]):
            tap.done()
            return 1
        pid = staging.daemon_pid(spool)
        got = write_file(os.path.join(mnt, "big.bin"), 8 << 20)
        tap.ok(got == errno.EFBIG, "8 MiB into the stage: a write or close fails with EFBIG "
               "(got %s)" % (errno.errorcode.get(got, got) if got else "no error"))
        tap.ok(pid and staging.alive(pid), "the daemon is alive (pid %s)" % pid)
        try:
            names = os.listdir(mnt)
        except OSError as e:
            names = e
        tap.ok(isinstance(names, list), "the mount still answers: its root lists",
               [repr(names)])
        os.unlink(os.path.join(mnt, "big.bin")) if isinstance(names, list) and \
            "big.bin" in names else None
        small = os.path.join(mnt, "small.bin")
        got = write_file(small, 1 << 20)
        size = os.path.getsize(small) if got is None else -1
        tap.ok(got is None and size == 1 << 20, "1 MiB written after that is staged whole "
               "(error %s, size %d)" % (got, size))
        rc, _, err = run_capture(["fusermount3", "-u", mnt], 30)
        tap.ok(rc == 0 and staging.wait_gone(pid), "the daemon unmounts and exits",
               [err.decode(errors="replace")])
    finally:
        unmount(mnt)
        pid = staging.daemon_pid(spool)
        if pid and staging.alive(pid):
            os.kill(pid, 9)
        shutil.rmtree(tmp, ignore_errors=True)
    tap.done()
    return 1 if tap.failed else 0


if __name__ == "__main__":
    sys.exit(main())
