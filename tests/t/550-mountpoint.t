#!/usr/bin/python3
"""Sources that are not regular files, and mount points that cannot work.

fifo     a FIFO where a source file is expected is refused by name, at once (within 20 s), not
         waited on: a split GGUF part, an MLFramework shard_rank1.pt (ls and mount), a shard of
         an HF directory, the SOURCE itself, a verify --manifest; a character device as SOURCE.
apart    a mount point that is the source directory, lies inside it, or holds the source file
         is refused with status 1 before anything is mounted (also with -s, which used to hang
         readers); so is a shard symlinked into the mount point, and a staging mount over its
         --from source.
dead     after kill -9 of a daemon, mounting on the dead mount fails with status 3, names it and
         says how to clear it, and mounts nothing; `fusermount3 -u` clears it and a mount works
         again; a staging mount refuses it too; ckptfs(1) documents the state.
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from ckptfs_test import is_mounted, run_capture, unmount  # noqa: E402
from mount_checks import run  # noqa: E402

QUICK = 20  # seconds: a refusal is immediate, a hang is a failure


def mounts_at(mnt):
    target = os.fsencode(os.path.realpath(mnt))
    with open("/proc/self/mountinfo", "rb") as f:
        return sum(1 for line in f if line.split(b" ")[4] == target)


def refuses(tap, label, argv, must_name, status=None):
    rc, _, err = run_capture(argv, QUICK)
    err = err.decode("utf-8", "replace").strip()
    good = rc is not None and rc != 0 and (status is None or rc == status) and \
        all(s in err for s in must_name)
    tap.ok(good, label, ["exit %s" % ("timed out (hung)" if rc is None else rc), "stderr: " + err,
                         "must name: %r" % (must_name,)])


def fifo_cases(tap, ckptfs, fixtures, scratch):
    split = os.path.join(scratch, "split")
    shutil.copytree(os.path.join(fixtures, "gguf", "split"), split)
    part2 = os.path.join(split, "model-00002-of-00003.gguf")
    os.unlink(part2)
    os.mkfifo(part2)
    refuses(tap, "fifo: a split GGUF part that is a FIFO is refused by name",
            [ckptfs, "ls", os.path.join(split, "model-00001-of-00003.gguf")], [part2, "FIFO"])

    tp = os.path.join(scratch, "tp")
    shutil.copytree(os.path.join(fixtures, "mlfw", "dir2", "ckpt"), tp)
    rank1 = os.path.join(tp, "shard_rank1.pt")
    os.unlink(rank1)
    os.mkfifo(rank1)
    refuses(tap, "fifo: ls of a TP directory whose shard_rank1.pt is a FIFO",
            [ckptfs, "ls", tp], [rank1, "FIFO"])
    mnt = tempfile.mkdtemp(prefix="ckptfs-t55.")
    refuses(tap, "fifo: mount of that TP directory", [ckptfs, tp, mnt], [rank1, "FIFO"], 2)
    tap.ok(not is_mounted(mnt), "fifo: nothing mounted")
    unmount(mnt)

    hf = os.path.join(scratch, "hf")
    shutil.copytree(os.path.join(fixtures, "sharded"), hf)
    shard = os.path.join(hf, "model-00002-of-00003.safetensors")
    os.unlink(shard)
    os.mkfifo(shard)
    refuses(tap, "fifo: an HF shard that is a FIFO", [ckptfs, "info", hf], [shard, "FIFO"])

    alone = os.path.join(scratch, "alone.safetensors")
    os.mkfifo(alone)
    refuses(tap, "fifo: SOURCE itself a FIFO", [ckptfs, "ls", alone], [alone, "FIFO"])
    refuses(tap, "fifo: a character device as SOURCE", [ckptfs, "ls", "/dev/zero"],
            ["/dev/zero", "character device"])
    manifest = os.path.join(scratch, "manifest.fifo")
    os.mkfifo(manifest)
    refuses(tap, "fifo: verify --manifest FIFO",
            [ckptfs, "verify", os.path.join(fixtures, "odd", "model.safetensors"),
             "--manifest", manifest], [manifest, "not a regular file"])


def apart_cases(tap, ckptfs, fixtures, scratch):
    src = os.path.join(scratch, "apart")
    os.mkdir(src)
    shutil.copy(os.path.join(fixtures, "odd", "model.safetensors"), src)
    sub = os.path.join(src, "sub")
    os.mkdir(sub)
    for label, argv, where in (
            ("the source directory itself", [ckptfs, src, src], src),
            ("the source directory itself, -s", [ckptfs, "-s", src, src], src),
            ("the directory holding the source file",
             [ckptfs, os.path.join(src, "model.safetensors"), src], src),
            ("a directory inside the source", [ckptfs, src, sub], sub)):
        before = mounts_at(where)
        refuses(tap, "apart: mounting on %s is refused" % label, argv,
                ["mount point", "outside the source"], 1)
        tap.ok(mounts_at(where) == before, "apart: %s: nothing mounted" % label)
        while mounts_at(where) > before:
            run_capture(["fusermount3", "-u", "-z", where], QUICK)

    # A shard reached through a symlink whose target lies in the mount point.
    mnt = os.path.join(scratch, "mnt")
    os.mkdir(mnt)
    shutil.copy(os.path.join(fixtures, "odd", "model.safetensors"), os.path.join(mnt, "real"))
    linked = os.path.join(scratch, "linked")
    os.mkdir(linked)
    os.symlink(os.path.join(mnt, "real"), os.path.join(linked, "model.safetensors"))
    refuses(tap, "apart: a source file symlinked into the mount point is refused",
            [ckptfs, linked, mnt], [os.path.join(linked, "model.safetensors"), "mount point"], 1)
    tap.ok(not is_mounted(mnt), "apart: symlinked shard: nothing mounted")
    unmount(mnt)

    out = os.path.join(scratch, "stage-out.safetensors")
    refuses(tap, "apart: a staging mount over its --from source is refused",
            [ckptfs, "stage", out, src, "--from", src], ["mount point", "outside the source"], 1)
    tap.ok(mounts_at(src) == 0, "apart: staging: nothing mounted")


def dead_cases(tap, ckptfs, fixtures, scratch):
    src = os.path.join(fixtures, "odd", "model.safetensors")
    mnt = tempfile.mkdtemp(prefix="ckptfs-t55.")
    try:
        p = subprocess.Popen([ckptfs, "-f", src, mnt], stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + QUICK
        while not is_mounted(mnt) and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.05)
        if not tap.ok(is_mounted(mnt), "dead: a foreground daemon mounts"):
            p.kill()
            p.wait()
            return
        os.stat(mnt)  # answered: the kernel has the root's attributes cached from now on
        p.send_signal(signal.SIGKILL)
        p.wait()
        try:
            os.listdir(mnt)
            state = "listable"
        except OSError as e:
            state = e.strerror
        tap.ok(state == "Transport endpoint is not connected",
               "dead: after kill -9 the mount is left dead", ["listdir: %s" % state])
        refuses(tap, "dead: mounting on it fails with 3 and says how to clear it",
                [ckptfs, src, mnt], [mnt, "fusermount3 -u " + mnt, "daemon has ended"], 3)
        tap.ok(mounts_at(mnt) == 1, "dead: nothing was stacked on it",
               ["%d mounts at %s" % (mounts_at(mnt), mnt)])
        out = os.path.join(scratch, "dead-stage.safetensors")
        refuses(tap, "dead: a staging mount on it is refused too",
                [ckptfs, "stage", out, mnt], [mnt, "fusermount3 -u " + mnt])
        rc, _, err = run_capture(["fusermount3", "-u", mnt], QUICK)
        tap.ok(rc == 0 and mounts_at(mnt) == 0, "dead: fusermount3 -u clears it",
               [err.decode("utf-8", "replace")])
        rc, _, err = run_capture([ckptfs, src, mnt], QUICK)
        tap.ok(rc == 0 and os.listdir(mnt), "dead: then a mount works again",
               ["exit %s: %s" % (rc, err.decode("utf-8", "replace"))])
    finally:
        while mounts_at(mnt):
            run_capture(["fusermount3", "-u", "-z", mnt], QUICK)
        os.rmdir(mnt)
    man = os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "..", "man", "ckptfs.1")
    with open(man, encoding="utf-8") as f:
        text = f.read()
    tap.ok("Transport endpoint is not connected" in text and "fusermount3 \\-u" in text,
           "dead: ckptfs(1) names the state and how to clear it")


def body(tap, ckptfs, fixtures):
    scratch = tempfile.mkdtemp(prefix="ckptfs-t55-src.")
    try:
        fifo_cases(tap, ckptfs, fixtures, scratch)
        apart_cases(tap, ckptfs, fixtures, scratch)
        dead_cases(tap, ckptfs, fixtures, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


sys.exit(run(body))
