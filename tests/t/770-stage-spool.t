#!/usr/bin/python3
"""Staging into a safetensors OUT writes each byte once (fs/stage/stage_pack.c).

Environment: CKPTFS, FIXTURES.

Every OUT is checked by a strict reader written here (the header's data_offsets tile the data
exactly, no gap, no overlap, nothing after) and compared with the bytes that were copied in.

- Tensors copied in land in the pack, and the commit makes the pack OUT: OUT is one inode
  with the spool's pack file (st_nlink 2 while the stage lives), its header padded with spaces
  to the 1 MiB reserved for it.
- With --from, the source's unchanged tensors are appended at the commit; a second commit
  after more changes; a file removed at the pack's end leaves no hole.
- A tensor rewritten after it was closed or truncated leaves a hole: the commit then writes
  OUT whole (its own inode), still exact.
- kill -9 of the daemon at 20 random points of a commit: OUT is the old file or the complete
  new one, never anything else; the stage is taken up again with its bytes, and commits. The
  same --from OUT itself: a kill after OUT was replaced (before the stage moved onto it) is
  taken up over the new OUT (SPOOL/landing names it).
- A directory OUT staged --from itself (shards another writer made): a commit after one
  tensor was copied over writes that tensor's shard only (the daemon's write_bytes), the
  shards that came out whole are the same inodes (linked, not copied); a shard that lost a
  tensor is written again. kill -9 at 20 random points of such a commit: OUT/ the old one
  (every file's bytes) or the complete new one; the stage taken up again and committed.
- On XFS (a loop mount, root only): OUT --from OUT with one tensor copied over is a clone of
  the old file with that tensor written into it (write_bytes and the blocks allocated are
  that tensor's); a tensor added goes the pack's way; kill -9 at 10 random points of a clone
  commit: OUT old or new, the stage taken up and committed.
- The pack's writes are answered before they are made (write-behind): a reader sees each
  write's bytes and size as soon as the write returned, a truncation by the writer between
  writes cuts exactly there, and the commit makes the pack OUT as usual.
- kill -9 at 20 random points of a cp into the stage: OUT is untouched, the file comes back
  as a prefix of what was being copied (the journal says where its bytes start), and a
  complete copy commits.
"""

import hashlib
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
from ckptfs_test import Tap, Watchdog, skip_reason  # noqa
from staging import (RESERVED, StageSession, commit, dir_files, put, rnd, spool_inodes,  # noqa
                     spool_of, strict_read, strict_read_dir, write_bytes, write_sidecar, write_st,
                     write_st_dir)

CKPTFS = os.environ.get("CKPTFS")
FIXTURES = os.environ.get("FIXTURES")
CHECK_TIMEOUT = 120
KILLS = 20


def commit_or_kill(s, i, durations):
    """Round 0 commits and times it (durations[0]); later rounds kill -9 the daemon at a random
    point of that time while `ckptfs commit` waits."""
    client = subprocess.Popen([CKPTFS, "commit", s.mnt], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    t0 = time.time()
    if i > 0:
        time.sleep(kill_point(durations[0]))
        during = client.poll() is None
        if not s.kill():
            raise RuntimeError("kill %d: the killed daemon did not end within 60 s" % i)
        KILLS_DURING[0] += during
        KILLS_DURING[1] += 1
    client.wait(120)
    if i == 0:
        durations.append(time.time() - t0)
        s.close()


# Kills that came while the commit (or copy) ran, of all kills: a kill after it ended tests
# nothing, so the kill points are seeded fractions of the unkilled run below its end, and the
# count is reported (and must not be 0).
KILLS_DURING = [0, 0]


def kill_point(duration):
    """Seconds into a run of about `duration` to kill at: seeded (SEED), before its end."""
    return random.uniform(0, duration * 0.9)


def killed(s, bad, i):
    """s.kill(), checked: False (and why in bad) when the daemon did not end."""
    if s.kill():
        return True
    bad.append("kill %d: the killed daemon did not end within 60 s" % i)
    return False


def pack_inode(out):
    return spool_inodes(out)


def Stage(tap, out, *extra):
    return StageSession(CKPTFS, out, *extra, prefix="ckptfs-t77.")


def check_out(tap, out, want, what, linked=None):
    try:
        got, n, head = strict_read(out)
    except (OSError, ValueError) as e:
        tap.ok(False, "%s: OUT is a strictly valid safetensors file" % what, [str(e)])
        return
    same = {k: v[2] for k, v in got.items()} == want
    tap.ok(same, "%s: OUT holds exactly the staged tensors (%d), tiled without a gap"
           % (what, len(want)), [sorted(got), sorted(want)])
    if linked is not None:
        st = os.stat(out)
        is_pack = st.st_ino in pack_inode(out)
        tap.ok(is_pack == linked,
               "%s: %s" % (what, "OUT is the spool's pack, written once (header padded to 1 MiB)"
                           if linked else "OUT was written whole, apart from the pack"),
               ["nlink %d, header %d bytes" % (st.st_nlink, n)])
        if linked:
            tap.ok(n == RESERVED - 8 and head.rstrip(b" ").endswith(b"}"),
                   "%s: the header fills the reserved room with spaces" % what, [n])


def basic(tap, work):
    out = os.path.join(work, "a.safetensors")
    s = Stage(tap, out)
    if not tap.ok(s.ok, "stage a.safetensors", [s.err]):
        return
    want = {"w%d" % i: rnd(4 << 20, i) for i in range(3)}
    try:
        with Watchdog(s.mnt, CHECK_TIMEOUT):
            for k, v in want.items():
                put(s.mnt, k, v)
            rc, o, e = commit(CKPTFS, s.mnt)
        tap.ok(rc == 0, "first commit", [o, e])
        check_out(tap, out, want, "three tensors copied in", linked=True)
        with Watchdog(s.mnt, CHECK_TIMEOUT):
            want["later"] = rnd(1 << 20, 9)
            put(s.mnt, "later", want["later"])
            os.unlink(os.path.join(s.mnt, "w1"))
            os.unlink(os.path.join(s.mnt, "w1.json"))
            del want["w1"]
            rc, o, e = commit(CKPTFS, s.mnt)
        tap.ok(rc == 0, "second commit (one added, one removed)", [o, e])
        check_out(tap, out, want, "second commit", linked=True)
    finally:
        s.close()
    tap.ok(not os.path.exists(spool_of(out)) and os.stat(out).st_nlink == 1,
           "after the unmount the spool is gone and OUT stands alone")
    check_out(tap, out, want, "after the unmount")


def read_while_written(tap, work):
    what = "read while written"
    out = os.path.join(work, "rw.safetensors")
    s = Stage(tap, out)
    if not tap.ok(s.ok, "%s: stage" % what, [s.err]):
        return
    data = rnd(24 << 20, 61)
    bad = []
    try:
        with Watchdog(s.mnt, CHECK_TIMEOUT):
            path = s.path("r")
            w = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            r = os.open(path, os.O_RDONLY)
            at = 0
            for i in range(24):
                if i == 16:  # the writer cuts the file back: later bytes go on from there
                    os.ftruncate(w, 12 << 20)
                    os.lseek(w, 12 << 20, os.SEEK_SET)
                    at = 12 << 20
                    data = data[:at] + rnd(12 << 20, 62)
                chunk = data[at:at + (1 << 20)]
                os.write(w, chunk)
                size = os.stat(path).st_size
                got = os.pread(r, 1 << 20, at)
                if size != at + len(chunk) or got != chunk:
                    bad.append("write %d at %d MiB: size %d, %s" % (
                        i, at >> 20, size, "bytes equal" if got == chunk else
                        "read %d bytes, not those written" % len(got)))
                at += len(chunk)
            data = data[:at]
            os.close(w)
            whole = os.pread(r, len(data) + 1, 0)
            os.close(r)
            if whole != data:
                bad.append("the whole file: %d bytes, %s" % (
                    len(whole), "equal" if whole == data else "not those written"))
            write_sidecar(path + ".json", "U8", [len(data)])
            rc, o, e = commit(CKPTFS, s.mnt)
        tap.ok(not bad, "%s: each write's bytes and size are there when it returns, also "
               "across a truncation by the writer" % what, bad)
        tap.ok(rc == 0, "%s: commit" % what, [o, e])
        check_out(tap, out, {"r": data}, what, linked=True)
    finally:
        s.close()


def from_source(tap, work):
    src = os.path.join(work, "src.safetensors")
    a, b = rnd(8 << 20, 20), rnd(2 << 20, 21)
    write_st(src, {"a": ("F32", [len(a) // 4], a), "b": ("F32", [len(b) // 4], b)})
    out = os.path.join(work, "b.safetensors")
    s = Stage(tap, out, "--from", src)
    if not tap.ok(s.ok, "stage b.safetensors --from src", [s.err]):
        return
    try:
        c = rnd(3 << 20, 22)
        with Watchdog(s.mnt, CHECK_TIMEOUT):
            put(s.mnt, "c", c)
            os.unlink(os.path.join(s.mnt, "b"))
            os.unlink(os.path.join(s.mnt, "b.json"))
            rc, o, e = commit(CKPTFS, s.mnt)
        tap.ok(rc == 0, "--from: commit", [o, e])
        check_out(tap, out, {"a": a, "c": c}, "--from: source tensor appended, new in place",
                  linked=True)
        with Watchdog(s.mnt, CHECK_TIMEOUT):
            d = rnd(1 << 20, 23)
            put(s.mnt, "d", d)
            put(s.mnt, "e", rnd(1 << 20, 24))
            os.unlink(os.path.join(s.mnt, "e"))  # the pack's last file: its bytes come off
            os.unlink(os.path.join(s.mnt, "e.json"))
            rc, o, e = commit(CKPTFS, s.mnt)
        check_out(tap, out, {"a": a, "c": c, "d": d},
                  "--from: removed last file leaves no hole", linked=True)
    finally:
        s.close()


def holes(tap, work):
    for how in ("rewritten", "truncated"):
        out = os.path.join(work, "h-%s.safetensors" % how)
        s = Stage(tap, out)
        if not tap.ok(s.ok, "stage (%s)" % how, [s.err]):
            continue
        try:
            x, y = rnd(2 << 20, 30), rnd(2 << 20, 31)
            with Watchdog(s.mnt, CHECK_TIMEOUT):
                put(s.mnt, "x", x)
                put(s.mnt, "y", y)
                if how == "rewritten":
                    x = rnd(2 << 20, 32)
                    put(s.mnt, "x", x)
                else:
                    os.truncate(os.path.join(s.mnt, "x"), 1 << 20)
                    x = x[:1 << 20]
                    write_sidecar(os.path.join(s.mnt, "x.json"), "F32", [len(x) // 4])
                rc, o, e = commit(CKPTFS, s.mnt)
            tap.ok(rc == 0, "%s after close: commit" % how, [o, e])
            check_out(tap, out, {"x": x, "y": y}, "%s after close (a hole)" % how, linked=False)
        finally:
            s.close()


def expect_old_or_new(out, old_sha, new):
    """'old', 'new', or what else OUT is."""
    try:
        with open(out, "rb") as f:
            if hashlib.sha256(f.read()).hexdigest() == old_sha:
                return "old"
        got, _, _ = strict_read(out)
        return "new" if {k: v[2] for k, v in got.items()} == new else "other tensors"
    except (OSError, ValueError) as e:
        return "broken: %s" % e


def kill_commit(tap, work, own=False):
    """kill -9 during a commit of OUT.safetensors --from another file, or (own) --from OUT
    itself: then a kill after OUT was replaced leaves a source that is not the stage's any
    more, and the stage must know the new OUT as its own commit."""
    src = os.path.join(work, "ksrc.safetensors")
    big = rnd(24 << 20, 40)
    write_st(src, {"s": ("F32", [len(big) // 4], big)})
    new = {"s": big, "n": rnd(8 << 20, 41)}
    seen, bad, durations, landed = {"old": 0, "new": 0}, [], [], 0
    for i in range(KILLS + 1):
        d = os.path.join(work, "kc%s%d" % ("o" if own else "", i))
        os.mkdir(d)
        out = os.path.join(d, "out.safetensors")
        if own:
            shutil.copyfile(src, out)
        else:
            write_st(out, {"old": ("F32", [4], b"\1" * 16)})
        with open(out, "rb") as f:
            old_sha = hashlib.sha256(f.read()).hexdigest()
        s = Stage(tap, out, "--from", out if own else src, "-o", "nocommit")
        if not s.ok:
            bad.append("stage %d: %s" % (i, s.err))
            continue
        put(s.mnt, "n", new["n"])
        client = subprocess.Popen([CKPTFS, "commit", s.mnt], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        t0 = time.time()
        if i == 0:  # how long a commit takes, unkilled
            client.wait(120)
            durations.append(time.time() - t0)
            s.close()
            state = expect_old_or_new(out, old_sha, new)
            if state != "new":
                bad.append("an unkilled commit left OUT %s" % state)
            continue
        time.sleep(kill_point(durations[0]))
        KILLS_DURING[0] += client.poll() is None
        KILLS_DURING[1] += 1
        if not killed(s, bad, i):
            break
        client.wait(60)
        state = expect_old_or_new(out, old_sha, new)
        seen[state] = seen.get(state, 0) + 1
        if state not in ("old", "new"):
            bad.append("kill %d: OUT is %s" % (i, state))
        again = Stage(tap, out)
        if not again.ok:
            bad.append("kill %d (OUT %s): not taken up again: %s" % (i, state, again.err))
            continue
        landed += "cut short after it put OUT in place" in again.err
        try:
            with open(os.path.join(again.mnt, "n"), "rb") as f:
                if f.read() != new["n"]:
                    bad.append("kill %d: the staged bytes changed" % i)
            rc, o, e = commit(CKPTFS, again.mnt)
            if rc != 0 or expect_old_or_new(out, old_sha, new) != "new":
                bad.append("kill %d: the commit after taking it up: exit %r %s" % (i, rc, e))
        finally:
            again.close()
        shutil.rmtree(d, ignore_errors=True)
    what = "--from OUT itself" if own else "--from another file"
    tap.diag("commit of 32 MiB (24 %s) takes %.3f s unkilled; kills left OUT %s; %d taken up "
             "over a commit cut short after OUT was in place"
             % (what, durations[0] if durations else -1, seen, landed))
    tap.ok(not bad, "kill -9 at %d random points of a commit %s: OUT old or complete new, the "
           "stage taken up and committed after each" % (KILLS, what), bad)


def dir_state(out, old_sha, new):
    """'old', 'new', or what else the directory OUT is (README.md must be kept either way)."""
    try:
        names = sorted(os.listdir(out))
        if "README.md" not in names:
            return "without README.md: %r" % names
        if names == ["README.md", "model.safetensors"]:
            with open(os.path.join(out, "model.safetensors"), "rb") as f:
                if hashlib.sha256(f.read()).hexdigest() == old_sha:
                    return "old"
        got, sizes = strict_read_dir(out)
        if got != new:
            return "other tensors: %r" % sorted(got)
        big = [k for k, v in sizes.items() if v > DIR_SHARD]
        return "new" if not big else "shards over the limit: %r" % big
    except (OSError, ValueError, KeyError) as e:
        return "broken: %s" % e


DIR_SHARD = 16 << 20


def kill_dir_commit(tap, work):
    """The same for an HF directory OUT made of packs: two new tensors that cross the shard
    limit (the second moves to another pack at the commit) and one from --from appended."""
    src = os.path.join(work, "kdsrc.safetensors")
    big = rnd(12 << 20, 60)
    write_st(src, {"s": ("F32", [len(big) // 4], big)})
    new = {"s": big, "n1": rnd(10 << 20, 61), "n2": rnd(10 << 20, 62)}
    opts = ("-o", "max_shard_size=%d" % DIR_SHARD)
    seen, bad, durations = {}, [], []
    for i in range(KILLS + 1):
        d = os.path.join(work, "kd%d" % i)
        out = os.path.join(d, "out")
        os.makedirs(out)
        write_st(os.path.join(out, "model.safetensors"), {"old": ("F32", [4], b"\3" * 16)})
        with open(os.path.join(out, "README.md"), "w") as f:
            f.write("kept\n")
        with open(os.path.join(out, "model.safetensors"), "rb") as f:
            old_sha = hashlib.sha256(f.read()).hexdigest()
        s = Stage(tap, out + "/", "--from", src, "-o", "nocommit", *opts)
        if not s.ok:
            bad.append("stage %d: %s" % (i, s.err))
            continue
        put(s.mnt, "n1", new["n1"])
        put(s.mnt, "n2", new["n2"])
        client = subprocess.Popen([CKPTFS, "commit", s.mnt], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        t0 = time.time()
        if i == 0:
            client.wait(120)
            durations.append(time.time() - t0)
            s.close()
            state = dir_state(out, old_sha, new)
            if state != "new":
                bad.append("an unkilled commit left OUT %s" % state)
            shutil.rmtree(d, ignore_errors=True)
            continue
        time.sleep(kill_point(durations[0]))
        KILLS_DURING[0] += client.poll() is None
        KILLS_DURING[1] += 1
        if not killed(s, bad, i):
            break
        client.wait(60)
        state = dir_state(out, old_sha, new)
        seen[state] = seen.get(state, 0) + 1
        if state not in ("old", "new"):
            bad.append("kill %d: OUT is %s" % (i, state))
        again = Stage(tap, out + "/", *opts)
        if not again.ok:
            bad.append("kill %d: not taken up again: %s" % (i, again.err))
            continue
        try:
            left = [n for n in os.listdir(d) if ".partial-" in n]
            if left:
                bad.append("kill %d: left behind after taking it up: %r" % (i, left))
            for k in ("n1", "n2"):
                with open(os.path.join(again.mnt, k), "rb") as f:
                    if f.read() != new[k]:
                        bad.append("kill %d: the staged bytes of %s changed" % (i, k))
            rc, text = again.commit()
            state = dir_state(out, old_sha, new)
            if rc != 0 or state != "new":
                bad.append("kill %d: the commit after taking it up: exit %r %s, OUT %s"
                           % (i, rc, text, state))
        finally:
            again.close()
        shutil.rmtree(d, ignore_errors=True)
    tap.diag("directory commit of 32 MiB (12 from --from, one file moved past the shard "
             "limit) takes %.3f s unkilled; kills left OUT %s"
             % (durations[0] if durations else -1, seen))
    tap.ok(not bad, "kill -9 at %d random points of a directory commit: OUT/ the old one or "
           "the complete new one (README.md kept), nothing left beside it, the stage taken up "
           "and committed after each" % KILLS, bad)


FROM_T = 4 << 20  # each tensor of the --from directory tests
FROM_SHARD = 8 << 20


def from_dir_tensors():
    return {"t%d" % i: rnd(FROM_T, 70 + i) for i in range(6)}


def make_from_dir(out, tensors):
    """OUT/ as another writer makes it: three shards of two tensors, an index, README.md."""
    names = sorted(tensors)
    write_st_dir(out, [{k: ("F32", [FROM_T // 4], tensors[k]) for k in names[i:i + 2]}
                       for i in range(0, 6, 2)], {"README.md": "kept\n"})


def from_dir_cost(tap, work):
    out = os.path.join(work, "fd")
    tensors = from_dir_tensors()
    make_from_dir(out, tensors)
    before = dir_files(out)
    s = Stage(tap, out + "/", "--from", out + "/", "-o", "max_shard_size=%d" % FROM_SHARD)
    if not tap.ok(s.ok, "stage OUT/ --from OUT/ (shards of another writer)", [s.err]):
        return
    try:
        if write_bytes(s.pid) is None:
            for what in ("one tensor copied over", "linked shards", "a shard that lost one"):
                tap.skip("--from OUT/: %s" % what, "the kernel does not count write_bytes")
            return
        tensors["t3"] = rnd(FROM_T, 90)
        with Watchdog(s.mnt, CHECK_TIMEOUT):
            put(s.mnt, "t3", tensors["t3"])
            w0 = write_bytes(s.pid)
            rc, text = s.commit()
            w1 = write_bytes(s.pid)
        got, sizes = strict_read_dir(out)
        after = dir_files(out)
        kept = {k for k, v in before.items() if k.startswith("model-") and v in after.values()}
        # t2 comes along with the new t3 (their shard is written: header + 4 MiB), the rest
        # is linked: well below the 24 MiB of the whole model
        tap.ok(rc == 0 and got == tensors and w1 - w0 <= FROM_T + 2 * RESERVED,
               "--from OUT/, one tensor copied over: the commit writes %d bytes (that "
               "tensor's shard), OUT/ exact" % (w1 - w0), [text, sorted(got), sizes])
        tap.ok(kept == {"model-00001-of-00003.safetensors", "model-00003-of-00003.safetensors"},
               "the two shards that came out whole are linked into the new OUT/ (same "
               "inodes, same bytes)", [before, after])
        os.unlink(os.path.join(s.mnt, "t5"))
        os.unlink(os.path.join(s.mnt, "t5.json"))
        del tensors["t5"]
        before = dir_files(out)
        with Watchdog(s.mnt, CHECK_TIMEOUT):
            w0 = write_bytes(s.pid)
            rc, text = s.commit()
            w1 = write_bytes(s.pid)
        got, sizes = strict_read_dir(out)
        after = dir_files(out)
        same = sorted(k for k, v in before.items() if k.startswith("model-") and
                      v in after.values())
        tap.ok(rc == 0 and got == tensors and w1 - w0 <= FROM_T + 2 * RESERVED and
               len(same) == 2, "a shard that lost a tensor is written again (%d bytes), the "
               "other two linked again (%r)" % (w1 - w0, same), [text, sizes, before, after])
    finally:
        s.close()


def kill_from_dir_commit(tap, work):
    opts = ("-o", "max_shard_size=%d" % FROM_SHARD)
    old = from_dir_tensors()
    new = dict(old, t3=rnd(FROM_T, 91))
    seen, bad, durations, landed = {}, [], [], 0
    for i in range(KILLS + 1):
        d = os.path.join(work, "kf%d" % i)
        out = os.path.join(d, "out")
        make_from_dir(out, old)
        before = dir_files(out)
        s = Stage(tap, out + "/", "--from", out + "/", "-o", "nocommit", *opts)
        if not s.ok:
            bad.append("stage %d: %s" % (i, s.err))
            continue
        put(s.mnt, "t3", new["t3"])
        try:
            commit_or_kill(s, i, durations)
        except RuntimeError as e:
            bad.append(str(e))
            break

        def state():
            try:
                if dir_files(out) == before:
                    return "old"
                got, _ = strict_read_dir(out)
                kept = os.path.exists(os.path.join(out, "README.md"))
                return "new" if got == new and kept else "other: %r" % sorted(got)
            except (OSError, ValueError, KeyError) as e:
                return "broken: %s" % e
        st = state()
        seen[st] = seen.get(st, 0) + 1
        if st not in ("old", "new"):
            bad.append("kill %d: OUT is %s" % (i, st))
        if i == 0:
            shutil.rmtree(d, ignore_errors=True)
            continue
        again = Stage(tap, out + "/", "--from", out + "/", *opts)
        if not again.ok:
            bad.append("kill %d (OUT %s): not taken up again: %s" % (i, st, again.err))
            continue
        landed += "cut short after it put OUT in place" in again.err
        try:
            left = [n for n in os.listdir(d) if ".partial-" in n]
            if left:
                bad.append("kill %d: left behind after taking it up: %r" % (i, left))
            for k, v in new.items():
                with open(os.path.join(again.mnt, k), "rb") as f:
                    if f.read() != v:
                        bad.append("kill %d: the staged bytes of %s changed" % (i, k))
            rc, text = again.commit()
            if rc != 0 or state() != "new":
                bad.append("kill %d: the commit after taking it up: exit %r %s, OUT %s"
                           % (i, rc, text, state()))
        finally:
            again.close()
        shutil.rmtree(d, ignore_errors=True)
    tap.diag("commit of OUT/ --from OUT/ (one of three shards written) takes %.3f s unkilled; "
             "kills left OUT %s; %d taken up over a commit cut short after OUT was in place"
             % (durations[0] if durations else -1, seen, landed))
    tap.ok(not bad, "kill -9 at %d random points of a commit that links shards of --from OUT/: "
           "OUT/ the old one or the complete new one, the stage taken up and committed after "
           "each" % KILLS, bad)


class ReflinkFs:
    """A small XFS (reflink=1) on a loop device mounted at .path; .why says why not (not
    root, no mkfs.xfs, no loop device in this container). Unmounted by close()."""

    def __init__(self, work):
        self.path, self.why = None, None
        self.image = os.path.join(work, "xfs.img")
        if os.geteuid() != 0:
            self.why = "not root: cannot mount a loop file system"
            return
        mkfs = shutil.which("mkfs.xfs") or ("/usr/sbin/mkfs.xfs"
                                            if os.path.exists("/usr/sbin/mkfs.xfs") else None)
        if not mkfs:
            self.why = "no mkfs.xfs (xfsprogs, make deps)"
            return
        with open(self.image, "wb") as f:
            f.truncate(400 << 20)
        p = subprocess.run([mkfs, "-q", "-m", "reflink=1", self.image], capture_output=True)
        if p.returncode != 0:
            self.why = "mkfs.xfs: %s" % p.stderr.decode(errors="replace").strip()
            return
        path = os.path.join(work, "xfs")
        os.mkdir(path)
        p = subprocess.run(["mount", "-o", "loop", self.image, path], capture_output=True)
        if p.returncode != 0:
            self.why = "mount -o loop: %s" % p.stderr.decode(errors="replace").strip()
            os.rmdir(path)
            return
        self.path = path

    def free(self):
        v = os.statvfs(self.path)
        return v.f_bfree * v.f_frsize

    def close(self):
        if self.path:
            subprocess.run(["umount", self.path], capture_output=True)
            os.rmdir(self.path)
        if os.path.exists(self.image):
            os.unlink(self.image)


CLONE_T = 4 << 20


def clone_tensors():
    return {"t%d" % i: rnd(CLONE_T, 100 + i) for i in range(6)}


def write_clone_out(out, tensors):
    write_st(out, {k: ("F32", [CLONE_T // 4], v) for k, v in tensors.items()})


def reflink(tap, work):
    """On a file system that shares extents, a safetensors OUT --from itself with one tensor
    copied over is a clone of the old file with that tensor rewritten: the commit writes and
    allocates ~that tensor; kill -9 at random points of it leaves OUT old or new."""
    fs = ReflinkFs(work)
    checks = ("--from OUT on XFS, one tensor copied over: the commit writes and allocates that "
              "tensor", "--from OUT on XFS, a tensor added: the pack's way, exact",
              "kill -9 at %d random points of a clone commit" % (KILLS // 2),
              "after a commit the pack's way, the next one clones OUT (the pack) again")
    if not fs.path:
        for c in checks:
            tap.skip(c, fs.why)
        return
    try:
        out = os.path.join(fs.path, "o.safetensors")
        tensors = clone_tensors()
        write_clone_out(out, tensors)
        s = Stage(tap, out, "--from", out)
        if not tap.ok(s.ok, "stage OUT --from OUT on XFS", [s.err]):
            return
        try:
            tensors["t3"] = rnd(CLONE_T, 120)
            with Watchdog(s.mnt, CHECK_TIMEOUT):
                put(s.mnt, "t3", tensors["t3"])
                f0, w0 = fs.free(), write_bytes(s.pid)
                rc, text = s.commit()
                f1, w1 = fs.free(), write_bytes(s.pid)
            got, _, _ = strict_read(out)
            got = {k: v[2] for k, v in got.items()}
            # the model is 24 MiB: copying the other five tensors would write 20 MiB more
            tap.ok(rc == 0 and got == tensors and w1 - w0 <= CLONE_T + RESERVED and
                   f0 - f1 <= CLONE_T + RESERVED, checks[0] + " (%d bytes written, %d "
                   "allocated)" % (w1 - w0, f0 - f1), [text, sorted(got)])
            tensors["extra"] = rnd(1 << 20, 121)
            with Watchdog(s.mnt, CHECK_TIMEOUT):
                put(s.mnt, "extra", tensors["extra"])
                rc, text = s.commit()
            got, _, _ = strict_read(out)
            tap.ok(rc == 0 and {k: v[2] for k, v in got.items()} == tensors, checks[1],
                   [text, sorted(got)])
            # OUT is now the pack, which the staged t3 and extra still refer to as a spool
            # file: they are in place in it, only the tensor copied over is written
            tensors["t1"] = rnd(CLONE_T, 122)
            with Watchdog(s.mnt, CHECK_TIMEOUT):
                put(s.mnt, "t1", tensors["t1"])
                f0, w0 = fs.free(), write_bytes(s.pid)
                rc, text = s.commit()
                f1, w1 = fs.free(), write_bytes(s.pid)
            got, _, _ = strict_read(out)
            got = {k: v[2] for k, v in got.items()}
            tap.ok(rc == 0 and got == tensors and w1 - w0 <= CLONE_T + RESERVED and
                   f0 - f1 <= CLONE_T + RESERVED, checks[3] + " (%d bytes written, %d "
                   "allocated)" % (w1 - w0, f0 - f1), [text, sorted(got)])
        finally:
            s.close()
        os.unlink(out)
        kill_clone(tap, fs, checks[2])
    finally:
        fs.close()


def kill_clone(tap, fs, what):
    old = clone_tensors()
    new = dict(old, t2=rnd(CLONE_T, 130))
    seen, bad, durations = {}, [], []
    for i in range(KILLS // 2 + 1):
        d = os.path.join(fs.path, "k%d" % i)
        os.mkdir(d)
        out = os.path.join(d, "o.safetensors")
        write_clone_out(out, old)
        with open(out, "rb") as f:
            old_sha = hashlib.sha256(f.read()).hexdigest()
        s = Stage(tap, out, "--from", out, "-o", "nocommit")
        if not s.ok:
            bad.append("stage %d: %s" % (i, s.err))
            continue
        put(s.mnt, "t2", new["t2"])
        try:
            commit_or_kill(s, i, durations)
        except RuntimeError as e:
            bad.append(str(e))
            break
        state = expect_old_or_new(out, old_sha, new)
        seen[state] = seen.get(state, 0) + 1
        if state not in ("old", "new"):
            bad.append("kill %d: OUT is %s" % (i, state))
        if i > 0:
            again = Stage(tap, out)
            if not again.ok:
                bad.append("kill %d (OUT %s): not taken up again: %s" % (i, state, again.err))
                continue
            try:
                with open(os.path.join(again.mnt, "t2"), "rb") as f:
                    if f.read() != new["t2"]:
                        bad.append("kill %d: the staged bytes changed" % i)
                rc, text = again.commit()
                if rc != 0 or expect_old_or_new(out, old_sha, new) != "new":
                    bad.append("kill %d: the commit after taking it up: exit %r %s" % (i, rc, text))
            finally:
                again.close()
        shutil.rmtree(d, ignore_errors=True)
    tap.diag("clone commit of a 24 MiB OUT (4 MiB changed) takes %.3f s unkilled; kills left "
             "OUT %s" % (durations[0] if durations else -1, seen))
    tap.ok(not bad, what + ": OUT old or complete new, the stage taken up and committed after "
           "each", bad)


def kill_cp(tap, work):
    payload = os.path.join(work, "payload")
    data = rnd(32 << 20, 50)
    with open(payload, "wb") as f:
        f.write(data)
    t0 = time.time()
    bad, prefixes, cp_time = [], [], None
    for i in range(KILLS + 1):
        d = os.path.join(work, "kp%d" % i)
        os.mkdir(d)
        out = os.path.join(d, "out.safetensors")
        write_st(out, {"old": ("F32", [4], b"\2" * 16)})
        with open(out, "rb") as f:
            old_sha = hashlib.sha256(f.read()).hexdigest()
        s = Stage(tap, out, "-o", "nocommit")
        if not s.ok:
            bad.append("stage %d: %s" % (i, s.err))
            continue
        put(s.mnt, "first", rnd(1 << 20, 51))  # something before it in the pack
        t0 = time.time()
        cp = subprocess.Popen(["cp", payload, os.path.join(s.mnt, "p")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if i == 0:
            cp.wait(120)
            cp_time = time.time() - t0
            s.close()
            shutil.rmtree(d, ignore_errors=True)
            continue
        time.sleep(kill_point(cp_time))
        KILLS_DURING[0] += cp.poll() is None
        KILLS_DURING[1] += 1
        if not killed(s, bad, i):
            break
        cp.wait(60)
        with open(out, "rb") as f:
            if hashlib.sha256(f.read()).hexdigest() != old_sha:
                bad.append("kill %d: OUT changed by a cp" % i)
        again = Stage(tap, out)
        if not again.ok:
            bad.append("kill %d: not taken up again: %s" % (i, again.err))
            continue
        try:
            p = os.path.join(again.mnt, "p")
            got = open(p, "rb").read() if os.path.exists(p) else b""
            prefixes.append(len(got))
            if got != data[:len(got)]:
                bad.append("kill %d: the staged file is not a prefix of what was copied" % i)
            with open(os.path.join(again.mnt, "first"), "rb") as f:
                if f.read() != rnd(1 << 20, 51):
                    bad.append("kill %d: the file before it changed" % i)
            shutil.copyfile(payload, p)
            write_sidecar(p + ".json", "F32", [len(data) // 4])
            rc, o, e = commit(CKPTFS, again.mnt)
            state = expect_old_or_new(out, old_sha, {"first": rnd(1 << 20, 51), "p": data})
            if rc != 0 or state != "new":
                bad.append("kill %d: commit after taking it up: exit %r, OUT %s" % (i, rc, state))
        finally:
            again.close()
        shutil.rmtree(d, ignore_errors=True)
    tap.diag("cp of 32 MiB into the stage takes %.3f s; the killed copies came back with %s "
             "bytes" % (cp_time or -1, sorted(prefixes)))
    tap.ok(not bad, "kill -9 at %d random points of a cp: OUT untouched, the file a prefix of "
           "its source, the stage committed after each" % KILLS, bad)


def main():
    tap = Tap()
    why = skip_reason(CKPTFS, FIXTURES)
    if why:
        print("1..0 # SKIP %s" % why)
        return 0
    work = tempfile.mkdtemp(prefix="ckptfs-t77w.")
    random.seed(int(os.environ.get("SEED", "77")))
    try:
        basic(tap, work)
        read_while_written(tap, work)
        from_source(tap, work)
        holes(tap, work)
        kill_commit(tap, work)
        kill_commit(tap, work, own=True)
        kill_dir_commit(tap, work)
        from_dir_cost(tap, work)
        kill_from_dir_commit(tap, work)
        reflink(tap, work)
        kill_cp(tap, work)
        tap.diag("%d of %d kills came while the commit or copy ran" % tuple(KILLS_DURING))
        tap.ok(KILLS_DURING[0] > 0, "kills came while commits and copies ran (%d of %d; a kill "
               "after the end tests nothing)" % tuple(KILLS_DURING))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    tap.done()
    return 0 if tap.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
