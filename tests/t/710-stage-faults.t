#!/usr/bin/python3
"""Staging mounts under faults.

Environment:
  CKPTFS    path of the ckptfs binary
  FIXTURES  output root of the fixture generators

1. kill -9 of the daemon while it commits a 512 MiB tensor: no OUT appears,
   and nothing that looks like a finished file (a temporary name starts with
   '.' and holds '.partial-'); `ckptfs stage` over the same OUT takes the
   spool up again, removes the leftover, and the commit then succeeds.
2. kill -9 of an idle daemon: the staged tree (names, bytes, a deletion and a
   rename over a source) comes back whole.
3. A source changed while its stage was down: refused with exit status 2.
4. A full disk (a 16 MiB tmpfs holding OUT, a 64 MiB tensor): commit exits 3
   with a clear message, OUT is not created, no temporary file is left, the
   staged bytes are intact; with room made, the same commit succeeds.
   The pack full (OUT and the spool on a 16 MiB tmpfs, 24 MiB written in 1 MiB writes):
   the pack's writes are answered before they are made (write-behind), so the writer learns
   of the full disk from a later write or from close(), never not at all; the staged file
   is then a prefix of what was written; removed, its room is back, and a file written again
   commits.
5. Symlinks, hard links, FIFOs and files inside .ckptfs/ are refused.
6. Nothing is written outside the spool and OUT's directory.
"""

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

COMMIT_TIMEOUT = 300
BIG = 512 << 20

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from ckptfs_test import is_mounted, run_capture, unmount  # noqa: E402
from mount_checks import run  # noqa: E402
from staging import (commit, daemon_pid, file_sha, spool_for, spool_of, stage,  # noqa: E402
                     wait_gone, write_sidecar)


def kill9(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return wait_gone(pid, 10)


def safetensors_index(path):
    """name -> (dtype, shape, absolute offset, length), read strictly without ckptfs."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n).decode("utf-8"))
    out = {}
    for name, v in header.items():
        if name != "__metadata__":
            a, b = v["data_offsets"]
            out[name] = (v["dtype"], v["shape"], 8 + n + a, b - a)
    return out


def output_sha(path, name):
    try:
        dt, shape, off, length = safetensors_index(path)[name]
        return file_sha(path, off, length)
    except (OSError, ValueError, KeyError) as e:
        return "unreadable: %s" % e


def cat_sha(ckptfs, path, name, work):
    """sha256 of a tensor of any OUT, as `ckptfs cat` gives it."""
    dump = os.path.join(work, "cat.bin")
    with open(dump, "wb") as f:
        rc = subprocess.run([ckptfs, "cat", path, name], stdout=f).returncode
    digest = file_sha(dump) if rc == 0 else "ckptfs cat exit %d" % rc
    os.unlink(dump)
    return digest


def unfinished_only(d, out):
    """Names in d besides the spool; each must be marked unfinished."""
    spool = os.path.basename(spool_of(out))
    return [n for n in os.listdir(d)
            if n != spool and not (n.startswith(".") and ".partial-" in n)]


def mounted_stage(tap, ckptfs, out, mnt, what, *extra):
    """(mounted?, stderr, the daemon's pid) of `ckptfs stage OUT MNT EXTRA...`."""
    rc, _, err = stage(ckptfs, out, mnt, *extra)
    ok = tap.ok(rc == 0 and is_mounted(mnt), "%s: ckptfs stage" % what,
                ["exit %r, stderr %s" % (rc, err.decode(errors="replace"))])
    return ok, err, daemon_pid(spool_for(out, extra))


def fill_big(path):
    """512 MiB of bytes that are nowhere zero, written through the mount."""
    h = hashlib.sha256()
    block = bytearray(os.urandom(1 << 20))
    with open(path, "wb") as f:
        for i in range(BIG >> 20):
            block[:8] = struct.pack("<Q", i + 1)
            f.write(block)
            h.update(block)
    return h.hexdigest()


# ---------------------------------------------------------------------------

def kill_during_commit(tap, ckptfs, work):
    what = "kill -9 during commit"
    outdir = os.path.join(work, "kill-out")
    os.makedirs(outdir)
    # A GGUF OUT is written by ckpt_write through a temporary file, the path this kill tests
    # (a safetensors OUT is committed in place from the pack: tests/t/770-stage-spool.t).
    out = os.path.join(outdir, "big.gguf")
    mnt = tempfile.mkdtemp(prefix="ckptfs-t71.")
    try:
        ok, _, pid = mounted_stage(tap, ckptfs, out, mnt, what)
        if not ok:
            return
        os.mkdir(os.path.join(mnt, "big"))
        digest = fill_big(os.path.join(mnt, "big", "w"))
        write_sidecar(os.path.join(mnt, "big", "w.json"), "F32", [128, BIG // 512])
        client = subprocess.Popen([ckptfs, "commit", mnt], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        seen, end = None, time.time() + 60
        while time.time() < end and not seen and client.poll() is None:
            partial = [n for n in os.listdir(outdir) if ".partial-" in n]
            for n in partial:
                try:
                    if os.path.getsize(os.path.join(outdir, n)) > 0:
                        seen = n
                except OSError:
                    pass
            time.sleep(0.002)
        busy, state = None, None
        if seen:
            try:
                with open(os.path.join(mnt, ".ckptfs", "status")) as f:
                    state = json.load(f).get("state")
                os.close(os.open(os.path.join(mnt, "during"), os.O_WRONLY | os.O_CREAT, 0o644))
                busy = "created"
            except (OSError, ValueError) as e:
                busy = getattr(e, "errno", str(e))
        killed = kill9(pid)
        tap.ok(busy == errno.EBUSY and state == "committing",
               "%s: during the commit, status says so and changes fail with EBUSY" % what,
               ["create: %r, state %r" % (busy, state)])
        tap.ok(seen is not None and killed,
               "%s: daemon killed while OUT's temporary file was being written" % what,
               ["partial %r, commit client %r" % (seen, client.poll())])
        try:
            rc = client.wait(30)
        except subprocess.TimeoutExpired:
            client.kill()
            rc = None
        tap.ok(rc not in (0, None), "%s: ckptfs commit reports the failure" % what,
               ["exit %r" % rc])
        tap.ok(not os.path.exists(out), "%s: no OUT" % what)
        odd = unfinished_only(outdir, out)
        tap.ok(not odd, "%s: nothing next to OUT looks finished" % what, odd)
        unmount(mnt)
        mnt = tempfile.mkdtemp(prefix="ckptfs-t71.")

        ok, err, pid = mounted_stage(tap, ckptfs, out, mnt, what + " (taken up again)")
        if not ok:
            return
        left = [n for n in os.listdir(outdir) if ".partial-" in n]
        tap.ok(not left, "%s: the unfinished file is removed" % what,
               left + [err.decode(errors="replace")])
        tap.ok(file_sha(os.path.join(mnt, "big", "w")) == digest,
               "%s: the staged bytes are intact" % what)
        rc, o, e = commit(ckptfs, mnt, COMMIT_TIMEOUT)
        tap.ok(rc == 0, "%s: the commit succeeds now" % what,
               ["exit %r" % rc, (o + e).decode(errors="replace")])
        tap.ok(cat_sha(ckptfs, out, "big.w", work) == digest, "%s: OUT holds the tensor" % what)
        unmount(mnt)
        tap.ok(wait_gone(pid) and not os.path.exists(spool_of(out)),
               "%s: after the unmount the spool is gone" % what, os.listdir(outdir))
    finally:
        unmount(mnt)


def kill_idle(tap, ckptfs, fixtures, work):
    what = "kill -9 of an idle stage"
    src = os.path.join(work, "idle-src")
    shutil.copytree(os.path.join(fixtures, "sharded"), src)
    outdir = os.path.join(work, "idle-out")
    os.makedirs(outdir)
    out = os.path.join(outdir, "m.safetensors")
    mnt = tempfile.mkdtemp(prefix="ckptfs-t71.")
    try:
        ok, _, pid = mounted_stage(tap, ckptfs, out, mnt, what, "--from", src)
        if not ok:
            return
        p = lambda rel: os.path.join(mnt, rel)  # noqa: E731
        os.unlink(p("model/embed_tokens/weight"))
        os.unlink(p("model/embed_tokens/weight.json"))
        os.rename(p("model/norm"), p("model/final_norm"))
        with open(p("added"), "wb") as f:
            f.write(b"\x09" * 40)
        write_sidecar(p("added.json"), "F64", [5])
        with open(p("model/layers/0/mlp/down_proj/weight"), "r+b") as f:
            f.write(b"\xff" * 16)

        def snapshot():
            shas = {}
            for d, dirs, files in os.walk(mnt):
                if d == mnt:
                    dirs[:] = [x for x in dirs if x != ".ckptfs"]
                for n in files:
                    shas[os.path.relpath(os.path.join(d, n), mnt)] = file_sha(os.path.join(d, n))
            return shas
        before = snapshot()
        tap.ok(kill9(pid), "%s: daemon killed" % what)
        unmount(mnt)
        mnt = tempfile.mkdtemp(prefix="ckptfs-t71.")
        ok, _, pid = mounted_stage(tap, ckptfs, out, mnt, what + " (taken up again)")
        if not ok:
            return
        after = snapshot()
        diff = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
        tap.ok(not diff, "%s: the staged tree comes back whole" % what, diff)
        rc, o, e = commit(ckptfs, mnt, COMMIT_TIMEOUT)
        tap.ok(rc == 0, "%s: commit" % what, [(o + e).decode(errors="replace")])
        names = set(safetensors_index(out)) if rc == 0 else set()
        want = {"added", "model.final_norm.weight"}
        tap.ok(want <= names and "model.embed_tokens.weight" not in names
               and "model.norm.weight" not in names, "%s: OUT has the changes" % what,
               sorted(names))

        # the source changes while the stage is down: it cannot be taken up again
        tap.ok(kill9(pid), "%s: daemon killed again" % what)
        unmount(mnt)
        mnt = tempfile.mkdtemp(prefix="ckptfs-t71.")
        victim = os.path.join(src, "model-00001-of-00003.safetensors")
        with open(victim, "r+b") as f:
            f.seek(os.path.getsize(victim) - 1)
            f.write(b"\x01")
        os.utime(victim, (1, 1))
        rc, _, err = stage(ckptfs, out, mnt)
        text = err.decode(errors="replace")
        tap.ok(rc == 2 and not is_mounted(mnt) and "changed" in text,
               "source changed: refused with exit status 2", ["exit %r" % rc, text])
    finally:
        unmount(mnt)


def small_tmpfs(tap, work, name, what):
    """A 16 MiB tmpfs mounted at WORK/NAME (its path), or None with a SKIP saying why."""
    small = os.path.join(work, name)
    os.makedirs(small)
    rc, _, err = run_capture(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", small], 30)
    if rc != 0:
        tap.skip(what, "cannot mount a tmpfs (%s)" % err.decode(errors="replace").strip())
        return None
    return small


def drop_tmpfs(small):
    """Unmounts a small_tmpfs; lazily when a daemon still holds a file there (a run cut short
    by a failed check), so no mount outlives the test."""
    rc, _, _ = run_capture(["umount", small], 30)
    if rc != 0:
        run_capture(["umount", "-l", small], 30)


def full_disk(tap, ckptfs, work):
    what = "full disk"
    small = small_tmpfs(tap, work, "small", what)
    if not small:
        return
    mnt = tempfile.mkdtemp(prefix="ckptfs-t71.")
    spool = os.path.join(work, "full-spool")
    out = os.path.join(small, "out.safetensors")
    try:
        ok, _, pid = mounted_stage(tap, ckptfs, out, mnt, what, "-o", "spool=" + spool)
        if not ok:
            return
        data = bytearray(os.urandom(1 << 20))
        h = hashlib.sha256()
        with open(os.path.join(mnt, "t"), "wb") as f:
            for i in range(64):
                data[:4] = struct.pack("<I", i)
                f.write(data)
                h.update(data)
        digest = h.hexdigest()
        write_sidecar(os.path.join(mnt, "t.json"), "U8", [64 << 20])
        rc, o, e = commit(ckptfs, mnt, COMMIT_TIMEOUT)
        text = e.decode(errors="replace")
        tap.ok(rc == 3, "%s: commit exits 3" % what, ["exit %r" % rc, text])
        tap.ok("No space left on device" in text and out in text,
               "%s: the message names OUT and the cause" % what, [text])
        tap.ok(os.listdir(small) == [], "%s: no OUT and no temporary file" % what,
               os.listdir(small))
        tap.ok(file_sha(os.path.join(mnt, "t")) == digest, "%s: staged bytes intact" % what)
        rc, _, err = run_capture(["mount", "-o", "remount,size=128m", small], 30)
        tap.ok(rc == 0, "%s: tmpfs grown" % what, [err.decode(errors="replace")])
        rc, o, e = commit(ckptfs, mnt, COMMIT_TIMEOUT)
        tap.ok(rc == 0 and output_sha(out, "t") == digest,
               "%s: with room, the same commit succeeds" % what,
               ["exit %r" % rc, (o + e).decode(errors="replace")])
        unmount(mnt)
        tap.ok(wait_gone(pid) and not os.path.exists(spool), "%s: spool removed" % what)
    finally:
        unmount(mnt)
        drop_tmpfs(small)


def full_pack(tap, ckptfs, work):
    what = "full pack"
    small = small_tmpfs(tap, work, "small-pack", what)
    if not small:
        return
    mnt = tempfile.mkdtemp(prefix="ckptfs-t71.")
    out = os.path.join(small, "out.safetensors")  # the spool beside it: the pack is there too
    try:
        ok, _, pid = mounted_stage(tap, ckptfs, out, mnt, what)
        if not ok:
            return
        data = b"".join(struct.pack("<I", i) * (1 << 18) for i in range(1, 25))
        path = os.path.join(mnt, "t")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        failed, told = None, []
        for at in range(0, len(data), 1 << 20):
            try:
                os.write(fd, data[at:at + (1 << 20)])
            except OSError as e:
                failed, told = e.errno, told + ["write at %d MiB" % (at >> 20)]
                break
        try:
            os.close(fd)
        except OSError as e:
            failed, told = failed or e.errno, told + ["close"]
        tap.ok(failed == errno.ENOSPC, "%s: the writer is told (ENOSPC from a write or the "
               "close)" % what, ["errno %r from %s" % (failed, told)])
        with open(path, "rb") as f:  # a reader's close is not told of the writer's error
            got = f.read()
        tap.ok(0 < len(got) < len(data) and got == data[:len(got)],
               "%s: the staged file is a prefix of what was written" % what,
               ["%d of %d bytes" % (len(got), len(data))])
        os.unlink(path)
        again = data[:4 << 20]
        with open(path, "wb") as f:
            f.write(again)
        write_sidecar(path + ".json", "U8", [len(again)])
        rc, o, e = commit(ckptfs, mnt, COMMIT_TIMEOUT)
        tap.ok(rc == 0 and output_sha(out, "t") == hashlib.sha256(again).hexdigest(),
               "%s: removed, its room is back: a file written again commits" % what,
               ["exit %r" % rc, (o + e).decode(errors="replace")])
        unmount(mnt)
        tap.ok(wait_gone(pid), "%s: the daemon ends" % what)
    finally:
        unmount(mnt)
        drop_tmpfs(small)


def refused(tap, ckptfs, work):
    what = "refused"
    outdir = os.path.join(work, "refused-out")
    os.makedirs(outdir)
    out = os.path.join(outdir, "r.safetensors")
    mnt = tempfile.mkdtemp(prefix="ckptfs-t71.")
    try:
        ok, _, pid = mounted_stage(tap, ckptfs, out, mnt, what)
        if not ok:
            return
        other = tempfile.mkdtemp(prefix="ckptfs-t71.")
        rc, _, err = stage(ckptfs, out, other)
        text = err.decode(errors="replace")
        tap.ok(rc == 2 and not is_mounted(other) and "already being staged" in text
               and str(pid) in text, "%s: a second stage of the same OUT" % what,
               ["exit %r" % rc, text])
        unmount(other)
        with open(os.path.join(mnt, "a"), "wb") as f:
            f.write(b"\0" * 4)
        cases = [
            ("symlink", lambda: os.symlink("a", os.path.join(mnt, "link")), errno.EPERM),
            ("hard link", lambda: os.link(os.path.join(mnt, "a"), os.path.join(mnt, "hard")),
             errno.EPERM),
            ("FIFO", lambda: os.mkfifo(os.path.join(mnt, "fifo")), errno.EPERM),
            ("file in .ckptfs/", lambda: open(os.path.join(mnt, ".ckptfs", "x"), "w"),
             errno.EPERM),
            ("rename over .ckptfs", lambda: os.rename(os.path.join(mnt, "a"),
                                                      os.path.join(mnt, ".ckptfs")), None),
            ("remove .ckptfs/status", lambda: os.unlink(os.path.join(mnt, ".ckptfs", "status")),
             errno.EPERM),
        ]
        for name, fn, want in cases:
            try:
                fn()
                tap.ok(False, "%s: %s" % (what, name), ["succeeded"])
            except OSError as e:
                tap.ok(want is None or e.errno == want, "%s: %s (%s)" % (what, name, e.strerror),
                       [str(e)])
        names = sorted(os.listdir(mnt))
        tap.ok(names == [".ckptfs", "a"], "%s: nothing was created" % what, names)
        os.unlink(os.path.join(mnt, "a"))
        unmount(mnt)
        tap.ok(wait_gone(pid), "%s: daemon exits" % what)
    finally:
        unmount(mnt)


def confined(tap, ckptfs, fixtures, work):
    """Writes go to the spool and OUT's directory only; the source stays as it was."""
    what = "confined writes"
    base = os.path.join(work, "confined")
    src = os.path.join(base, "src")
    outdir = os.path.join(base, "outdir")
    shutil.copytree(os.path.join(fixtures, "sharded"), src)
    os.makedirs(outdir)
    out = os.path.join(outdir, "c.safetensors")

    def state():
        s = {}
        for d, dirs, files in os.walk(base):
            for n in dirs + files:
                p = os.path.join(d, n)
                st = os.lstat(p)
                s[os.path.relpath(p, base)] = (st.st_mode, st.st_size, st.st_mtime_ns,
                                               file_sha(p) if os.path.isfile(p) else None)
        return s
    before = state()
    src_before = {k: v for k, v in before.items() if k.startswith("src")}
    mnt = tempfile.mkdtemp(prefix="ckptfs-t71.")
    try:
        ok, _, pid = mounted_stage(tap, ckptfs, out, mnt, what, "--from", src)
        if not ok:
            return
        with open(os.path.join(mnt, "model/layers/0/mlp/down_proj/weight"), "r+b") as f:
            f.write(b"\1" * 8)
        os.unlink(os.path.join(mnt, "model/norm/weight"))
        os.unlink(os.path.join(mnt, "model/norm/weight.json"))
        rc, o, e = commit(ckptfs, mnt, COMMIT_TIMEOUT)
        tap.ok(rc == 0, "%s: commit" % what, [(o + e).decode(errors="replace")])
        unmount(mnt)
        tap.ok(wait_gone(pid), "%s: daemon exits" % what)
        after = state()
        changed = sorted(k for k in set(before) | set(after)
                         if before.get(k) != after.get(k) and not k.startswith("outdir"))
        tap.ok(not changed, "%s: nothing changed outside OUT's directory" % what, changed)
        tap.ok({k: v for k, v in after.items() if k.startswith("src")} == src_before,
               "%s: the source is unchanged" % what)
        tap.ok(sorted(os.listdir(outdir)) == ["c.safetensors"],
               "%s: OUT's directory holds OUT only" % what, os.listdir(outdir))
    finally:
        unmount(mnt)


def main(tap, ckptfs, fixtures):
    work = tempfile.mkdtemp(prefix="ckptfs-t71.")
    try:
        kill_during_commit(tap, ckptfs, work)
        kill_idle(tap, ckptfs, fixtures, work)
        if os.geteuid() == 0:
            full_disk(tap, ckptfs, work)
            full_pack(tap, ckptfs, work)
        else:
            tap.skip("full disk", "mounting a tmpfs needs root")
            tap.skip("full pack", "mounting a tmpfs needs root")
        refused(tap, ckptfs, work)
        confined(tap, ckptfs, fixtures, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(run(main))
