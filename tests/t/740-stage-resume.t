#!/usr/bin/python3
"""Taking a stage up again: over its own commits, and without false alarms.

Environment:
  CKPTFS    path of the ckptfs binary
  FIXTURES  output root of the fixture generators (only checked to exist)

1. `ckptfs stage OUT MNT --from OUT` (a .safetensors written here, and an HF
   directory OUT/): commit (OUT replaced), change more, then the daemon is
   killed with SIGKILL (file) or unmounted with nocommit (directory). The
   same `ckptfs stage` takes the stage up (exit 0, no "changed"), shows the
   later changes, and its commit writes OUT with all of them; a strict
   reader written here checks names, shapes and values. A file opened for
   reading before the first commit reads the same bytes after it.
2. An ordinary create-then-delete (and a file replaced by a rename) before a
   nocommit unmount: taking the stage up prints no "missing" and no "no such
   file". A data file removed from the spool behind the stage's back is
   named, by the staged path, when the stage is taken up.
"""

import os
import shutil
import struct
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from ckptfs_test import Watchdog, is_mounted, unmount  # noqa: E402
from mount_checks import run  # noqa: E402
from staging import (commit, daemon_pid, read_safetensors, read_safetensors_dir,  # noqa: E402
                     spool_of, stage, stop_stage, write_raw_tensor)

CHECK_TIMEOUT = 120


def text(b):
    return b.decode("utf-8", "replace")


def write_safetensors(path, tensors):
    """tensors: [(name, [float32 values])] as one .safetensors file."""
    import json
    header, data = {}, b""
    for name, values in tensors:
        raw = struct.pack("<%df" % len(values), *values)
        header[name] = {"dtype": "F32", "shape": [len(values)],
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)


def read_out(out):
    try:
        return read_safetensors_dir(out) if os.path.isdir(out) else read_safetensors(out)
    except (OSError, ValueError, struct.error):
        return {}


def own_commits(tap, ckptfs, work, directory, kill):
    what = "--from OUT (%s), %s" % ("directory" if directory else "file",
                                    "kill -9" if kill else "nocommit unmount")
    if directory:
        out = os.path.join(work, "own-dir")
        os.makedirs(out)
        write_safetensors(os.path.join(out, "model.safetensors"),
                          [("a.w", [1.0, 2.0]), ("b", [3.0, 4.0])])
        arg = out + "/"
    else:
        out = arg = os.path.join(work, "own.safetensors")
        write_safetensors(out, [("a.w", [1.0, 2.0]), ("b", [3.0, 4.0])])
    mnt = tempfile.mkdtemp(prefix="ckptfs-t74.")
    pid = 0
    try:
        rc, _, err = stage(ckptfs, arg, mnt, "--from", arg, "-o", "nocommit")
        if not tap.ok(rc == 0 and is_mounted(mnt), "%s: ckptfs stage" % what,
                      ["exit %r: %s" % (rc, text(err))]):
            return
        pid = daemon_pid(spool_of(out))
        with Watchdog(mnt, CHECK_TIMEOUT):
            held = open(os.path.join(mnt, "b"), "rb")
            os.unlink(os.path.join(mnt, "a", "w"))
            os.unlink(os.path.join(mnt, "a", "w.json"))
            write_raw_tensor(os.path.join(mnt, "c"), [5.0])
            rc1, _, err1 = commit(ckptfs, mnt)
            after_first = read_out(out)
            held_bytes = held.read()
            held.close()
            os.rename(os.path.join(mnt, "b"), os.path.join(mnt, "bb"))
            os.rename(os.path.join(mnt, "b.json"), os.path.join(mnt, "bb.json"))
            write_raw_tensor(os.path.join(mnt, "d"), [6.0, 7.0])
        tap.ok(rc1 == 0 and sorted(after_first) == ["b", "c"],
               "%s: the first commit replaces OUT" % what,
               ["exit %r: %s" % (rc1, text(err1)), sorted(after_first)])
        tap.ok(held_bytes == struct.pack("<2f", 3.0, 4.0),
               "%s: a file opened before the commit reads its bytes after it" % what,
               [held_bytes.hex()])
        stop_stage(mnt, pid, kill)
        rc, _, err = stage(ckptfs, arg, mnt)
        pid = daemon_pid(spool_of(out))
        tap.ok(rc == 0 and is_mounted(mnt) and "changed" not in text(err),
               "%s: the stage is taken up again" % what, ["exit %r: %s" % (rc, text(err))])
        if rc != 0:
            return
        with Watchdog(mnt, CHECK_TIMEOUT):
            names = sorted(n for n in os.listdir(mnt) if not n.startswith("."))
            with open(os.path.join(mnt, "bb"), "rb") as f:
                bb = f.read()
            rc2, _, err2 = commit(ckptfs, mnt)
        tap.ok(names == ["a", "bb", "bb.json", "c", "c.json", "d", "d.json"]
               and bb == struct.pack("<2f", 3.0, 4.0),
               "%s: the later changes are there" % what, [names, bb.hex()])
        got = read_out(out)
        tap.ok(rc2 == 0 and got == {"bb": ("F32", [2], [3.0, 4.0]), "c": ("F32", [1], [5.0]),
                                    "d": ("F32", [2], [6.0, 7.0])},
               "%s: the next commit writes OUT with all of them" % what,
               ["exit %r: %s" % (rc2, text(err2)), got])
    finally:
        stop_stage(mnt, daemon_pid(spool_of(out)), False)
        unmount(mnt)
        shutil.rmtree(spool_of(out), ignore_errors=True)


def no_false_alarms(tap, ckptfs, work):
    what = "create-then-delete before a nocommit unmount"
    out = os.path.join(work, "quiet.safetensors")
    mnt = tempfile.mkdtemp(prefix="ckptfs-t74.")
    try:
        rc, _, err = stage(ckptfs, out, mnt, "-o", "nocommit")
        if not tap.ok(rc == 0 and is_mounted(mnt), "%s: ckptfs stage" % what,
                      ["exit %r: %s" % (rc, text(err))]):
            return
        with Watchdog(mnt, CHECK_TIMEOUT):
            write_raw_tensor(os.path.join(mnt, "tmp"), [1.0])
            os.unlink(os.path.join(mnt, "tmp"))
            os.unlink(os.path.join(mnt, "tmp.json"))
            write_raw_tensor(os.path.join(mnt, "x"), [1.0])
            write_raw_tensor(os.path.join(mnt, "y"), [2.0])
            os.rename(os.path.join(mnt, "y"), os.path.join(mnt, "x"))
            os.mkdir(os.path.join(mnt, "gone"))
            write_raw_tensor(os.path.join(mnt, "gone", "t"), [3.0])
            os.rename(os.path.join(mnt, "gone", "t"), os.path.join(mnt, "t"))
            os.unlink(os.path.join(mnt, "gone", "t.json"))
            os.rmdir(os.path.join(mnt, "gone"))
        stop_stage(mnt, daemon_pid(spool_of(out)), False)
        rc, _, err = stage(ckptfs, out, mnt, "-o", "nocommit")
        msg = text(err)
        tap.ok(rc == 0 and "missing" not in msg and "no such" not in msg,
               "%s: taking the stage up says nothing was lost" % what, [msg])
        with Watchdog(mnt, CHECK_TIMEOUT):
            names = sorted(n for n in os.listdir(mnt) if not n.startswith("."))
            with open(os.path.join(mnt, "x"), "rb") as f:
                x = f.read()
        tap.ok(names == ["t", "x", "x.json", "y.json"] and x == struct.pack("<f", 2.0),
               "%s: and the tree is as it was" % what, [names, x.hex()])
        stop_stage(mnt, daemon_pid(spool_of(out)), False)
        data = os.path.join(spool_of(out), "data")
        with open(os.path.join(spool_of(out), "journal")) as f:
            # its bytes: a data file of its own (f) or the pack it was appended to (p)
            ids = [line.split()[3] for line in f if line.startswith(("f /t ", "p /t "))]
        for i in ids:
            try:
                os.unlink(os.path.join(data, i))
            except OSError:
                pass
        rc, _, err = stage(ckptfs, out, mnt, "-o", "nocommit")
        tap.ok(rc == 0 and ids and "/t," in text(err) and "missing" in text(err)
               and not os.path.exists(os.path.join(mnt, "t")),
               "a data file removed behind the stage's back is named by its staged path",
               [text(err), ids])
    finally:
        stop_stage(mnt, daemon_pid(spool_of(out)), False)
        unmount(mnt)
        shutil.rmtree(spool_of(out), ignore_errors=True)


def body(tap, ckptfs, root):
    work = tempfile.mkdtemp(prefix="ckptfs-t74w.")
    try:
        own_commits(tap, ckptfs, work, directory=False, kill=True)
        own_commits(tap, ckptfs, work, directory=True, kill=False)
        no_false_alarms(tap, ckptfs, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(run(body))
