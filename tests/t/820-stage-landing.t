#!/usr/bin/python3
"""A stage --from OUT whose commit writes OUT whole (ckpt_write, not the pack) knows the new
OUT as its own after a kill -9 between the rename into place and the stage's move onto it.

Environment: CKPTFS, FIXTURES.

Cases written whole: a .gguf OUT (GGUF is never a pack), and a .safetensors OUT and an HF
directory OUT/ whose staged tensor was rewritten after it was closed (a hole in the pack: the
commit writes OUT apart; the directory is swapped in whole). The directory case goes the
pack's directory commit, which recorded its landing already: it guards that sibling.
Each round stages OUT --from OUT, copies a tensor in, starts `ckptfs commit`, watches OUT's
inode and kills the daemon with SIGKILL the moment it changes: the commit has renamed the new
file into place and is (most likely) still moving the stage onto it. Then:
- OUT is the complete new checkpoint (read with tests/lib/readers, not with ckptfs);
- the stage is taken up again (before SPOOL/landing was written for these commits, it was
  refused as "the source changed" whenever the kill came before the stage's move), its staged
  bytes are there, and a commit after it succeeds with OUT still the new checkpoint.
"""

import os
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
sys.path.insert(0, os.path.join(HERE, "..", "lib", "readers"))
import gguf_reader  # noqa: E402
from ckptfs_test import run_cases  # noqa: E402
from staging import (StageSession, put, rnd, strict_read, strict_read_dir, write_st,  # noqa: E402
                     write_st_dir)

CKPTFS = os.environ.get("CKPTFS")
FIXTURES = os.environ.get("FIXTURES")
ROUNDS = 5


def gguf_tensors(path):
    g = gguf_reader.read(path)
    return {t.name: gguf_reader.tensor_bytes(g, t) for t in g.tensors}


def st_tensors(path):
    got, _, _ = strict_read(path)
    return {k: v[2] for k, v in got.items()}


def make_gguf(work, out, tensors):
    src = os.path.join(work, "src.safetensors")
    write_st(src, {k: ("F32", [len(v) // 4], v) for k, v in tensors.items()})
    r = subprocess.run([CKPTFS, "convert", src, out], capture_output=True, timeout=120)
    os.unlink(src)
    return r.returncode == 0


def kill_at_rename(s, out):
    """Starts a commit and kills the daemon as soon as OUT is another inode: True when the kill
    came after the rename (False: the commit ended first or never renamed)."""
    before = os.stat(out).st_ino
    client = subprocess.Popen([CKPTFS, "commit", s.mnt], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    renamed = False
    while time.time() < deadline and client.poll() is None:
        try:
            if os.stat(out).st_ino != before:
                os.kill(s.pid, signal.SIGKILL)
                renamed = True
                break
        except FileNotFoundError:
            pass
    client.wait(60)
    if not s.kill():
        raise RuntimeError("the killed daemon (pid %d) did not end within 60 s" % s.pid)
    return renamed


def case(tap, work, what, suffix, read, make_old, stage_new):
    old = {"s": rnd(8 << 20, 1)}
    new_t = rnd(4 << 20, 2)
    bad, cut_short, renamed = [], 0, 0
    for i in range(ROUNDS):
        d = os.path.join(work, "%s%d" % (suffix.strip("./") or "dir", i))
        os.mkdir(d)
        out = os.path.join(d, "out" + suffix)
        if not make_old(work, out, old):
            bad.append("round %d: the old OUT could not be made" % i)
            break
        s = StageSession(CKPTFS, out, "--from", out, "-o", "nocommit", prefix="ckptfs-t82.")
        if not s.ok:
            bad.append("round %d: stage: %s" % (i, s.err))
            break
        stage_new(s.mnt, new_t)
        try:
            renamed += kill_at_rename(s, out)
        except RuntimeError as e:
            bad.append("round %d: %s" % (i, e))
            break
        want = dict(old, n=new_t)
        try:
            state = "new" if read(out) == want else "other tensors"
        except (OSError, ValueError) as e:
            state = "unreadable: %s" % e
        if state != "new":
            bad.append("round %d: OUT is %s" % (i, state))
        again = StageSession(CKPTFS, out, prefix="ckptfs-t82.")
        if not again.ok:
            bad.append("round %d: not taken up again after the kill: %s" % (i, again.err.strip()))
            shutil.rmtree(d, ignore_errors=True)
            continue
        cut_short += "cut short after it put OUT in place" in again.err
        try:
            with open(again.path("n"), "rb") as f:
                if f.read() != new_t:
                    bad.append("round %d: the staged tensor changed" % i)
            rc, text = again.commit()
            if rc != 0 or read(out) != want:
                bad.append("round %d: commit after taking it up: exit %r: %s" % (i, rc, text))
        finally:
            again.close()
        shutil.rmtree(d, ignore_errors=True)
    tap.diag("%s: %d of %d kills came after the rename, %d stages taken up over a commit cut "
             "short" % (what, renamed, ROUNDS, cut_short))
    tap.ok(not bad, "%s: kill -9 right after OUT was renamed into place: OUT is new, the stage "
           "is taken up again and commits (%d rounds)" % (what, ROUNDS), bad)
    tap.ok(renamed > 0, "%s: at least one kill came after the rename (else nothing was tested)"
           % what, ["0 of %d" % ROUNDS])


def stage_plain(mnt, data):
    put(mnt, "n", data)


def stage_with_hole(mnt, data):
    put(mnt, "n", rnd(len(data), 3))  # closed, then written again: a hole in the pack
    put(mnt, "n", data)


def make_st(work, out, tensors):
    write_st(out, {k: ("F32", [len(v) // 4], v) for k, v in tensors.items()})
    return True


def gguf_case(tap, work):
    case(tap, work, "GGUF OUT --from itself", ".gguf", gguf_tensors, make_gguf, stage_plain)


def safetensors_case(tap, work):
    case(tap, work, "safetensors OUT --from itself, written whole (a hole)", ".safetensors",
         st_tensors, make_st, stage_with_hole)


def dir_case(tap, work):
    case(tap, work, "HF directory OUT/ --from itself, written whole (a hole)", "/", dir_tensors,
         make_dir, stage_with_hole)


def make_dir(work, out, tensors):
    write_st_dir(out, [{k: ("F32", [len(v) // 4], v) for k, v in tensors.items()}])
    return True


def dir_tensors(out):
    return strict_read_dir(out)[0]


def main():
    return run_cases("ckptfs-t82w.", gguf_case, safetensors_case, dir_case)


if __name__ == "__main__":
    sys.exit(main())
