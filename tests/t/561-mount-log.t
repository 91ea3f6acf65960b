#!/usr/bin/python3
"""A detached mount says why its reads fail (issue 28 item 6): with -o log=FILE, a source
rewritten in place under the mount (reads then give EIO) is named in FILE once, with its path
and what changed, however many reads fail; a second source replaced by another file is named
once too, with that reason. In the foreground (-f) the same line goes to stderr.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from ckptfs_test import is_mounted, run_capture, unmount  # noqa: E402
from mount_checks import run  # noqa: E402
from staging import write_st_dir  # noqa: E402


def read(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        return e


def body(tap, ckptfs, _root):
    work = tempfile.mkdtemp(prefix="ckptfs-t90.")
    src = os.path.join(work, "src")
    write_st_dir(src, [{"a": ("F32", [64], bytes(256))}, {"b": ("F32", [64], bytes(256))}])
    s1 = os.path.join(src, "model-00001-of-00002.safetensors")
    s2 = os.path.join(src, "model-00002-of-00002.safetensors")
    mnt = os.path.join(work, "mnt")
    os.mkdir(mnt)
    log = os.path.join(work, "mount.log")
    proc = None
    try:
        rc, _, err = run_capture([ckptfs, src, mnt, "-o", "log=" + log], 30)
        if not tap.ok(rc == 0 and is_mounted(mnt), "mount -o log=FILE (detached)", [err]):
            return
        tap.ok(read(os.path.join(mnt, "a")) == bytes(256), "reads before the change")
        time.sleep(0.05)
        with open(s1, "r+b") as f:  # in place, same size: other bytes
            f.seek(-4, 2)
            f.write(b"\x01\x02\x03\x04")
        fails = [read(os.path.join(mnt, "a")) for _ in range(5)]
        tap.ok(all(isinstance(x, OSError) and x.errno == 5 for x in fails),
               "reads of the changed shard give EIO", [fails[:2]])
        os.rename(s2, s2 + ".old")
        shutil.copy(s2 + ".old", s2)  # another file under its name
        fails2 = [read(os.path.join(mnt, "b")) for _ in range(3)]
        tap.ok(all(isinstance(x, OSError) for x in fails2), "the replaced shard gives EIO too")
        lines = open(log).read().splitlines() if os.path.exists(log) else []
        one = [l for l in lines if s1 in l]
        two = [l for l in lines if s2 in l]
        tap.ok(len(one) == 1 and "rewritten in place" in one[0] and "EIO" in one[0],
               "the log names the rewritten shard once, with the reason", lines)
        tap.ok(len(two) == 1 and "another file took its name" in two[0],
               "and the replaced one once, with its reason", lines)
        unmount(mnt)
        os.makedirs(mnt, exist_ok=True)
        write_st_dir(src, [{"a": ("F32", [64], bytes(256))}, {"b": ("F32", [64], bytes(256))}])
        proc = subprocess.Popen([ckptfs, src, mnt, "-f"], stderr=subprocess.PIPE)
        for _ in range(100):
            if is_mounted(mnt):
                break
            time.sleep(0.1)
        read(os.path.join(mnt, "a"))
        with open(s1, "r+b") as f:
            f.seek(-4, 2)
            f.write(b"\x05\x06\x07\x08")
        for _ in range(3):
            read(os.path.join(mnt, "a"))
        unmount(mnt)
        _, err = proc.communicate(timeout=30)
        said = [l for l in err.decode(errors="replace").splitlines() if s1 in l]
        tap.ok(len(said) == 1 and said[0].startswith("ckptfs: "),
               "in the foreground the reason goes to stderr, once", [err])
    finally:
        if is_mounted(mnt):
            unmount(mnt)
        if proc and proc.poll() is None:
            proc.kill()
        shutil.rmtree(work, ignore_errors=True)


sys.exit(run(body))
