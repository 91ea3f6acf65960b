#!/usr/bin/python3
"""What a commit writes, and what it leaves: names, directories, leftovers.

Environment:
  CKPTFS    path of the ckptfs binary
  FIXTURES  output root of the fixture generators (only checked to exist)

1. A tensor whose name is not valid UTF-8 (a staged file named b"bad\\xff"):
   the commit into a .safetensors and into DIR/ is refused with exit 2,
   naming the tensor with %XX escapes; OUT is not written. The same for
   `ckptfs convert` of a GGUF (written here) holding such a name, to a file
   and to a directory: exit 2, nothing written, never a dropped tensor.
2. A directory OUT commits again and again: a second and third commit (the
   last one on unmount) replace it; a README.md and a subdirectory the user
   keeps in OUT stay; old shards do not; a strict reader written here sees
   the last staged tensors.
4. A Hugging Face folder's own files: `stage OUT/ --from DIR/` shows DIR's
   config.json and tokenizer.json; a generation_config.json written into the
   stage and both go into OUT/ byte for byte. config.json copied into a stage
   of one .safetensors is accepted, and the commit notes it is not written;
   a raw "tokenizer" + tokenizer.json there stays a tensor.
3. A killed directory commit's leftover, .OUT.partial-XXXXXX/ beside OUT
   (made here as the writer names it), is removed when the stage is taken
   up again; a user's subdirectory inside it is not.
"""

import json
import os
import shutil
import struct
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from ckptfs_test import Watchdog, run_capture, unmount  # noqa: E402
from mount_checks import run  # noqa: E402
from staging import (commit, daemon_pid, read_safetensors, read_safetensors_dir,  # noqa: E402
                     spool_of, staged, wait_gone, wait_spool_free, write_raw_tensor)

CHECK_TIMEOUT = 120


def text(b):
    return b.decode("utf-8", "replace")


def gguf_f32(path, tensors):
    """A GGUF v3 file of F32 tensors: [(name bytes, float32 values)]."""
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), 0)
    data, offsets = b"", []
    for _, values in tensors:
        offsets.append(len(data))
        data += struct.pack("<%df" % len(values), *values)
        data += b"\0" * (-len(data) % 32)
    for (name, values), off in zip(tensors, offsets):
        head += struct.pack("<Q", len(name)) + name + struct.pack("<IQIQ", 1, len(values), 0, off)
    head += b"\0" * (-len(head) % 32)
    with open(path, "wb") as f:
        f.write(head + data)


def non_utf8_names(tap, ckptfs, work):
    for out_name in ("bad.safetensors", "baddir/"):
        what = "a non-UTF-8 name into %s" % out_name
        out = os.path.join(work, out_name)
        mnt = tempfile.mkdtemp(prefix="ckptfs-t73.")
        try:
            ok, _ = staged(tap, ckptfs, out, mnt, what)
            if not ok:
                continue
            with Watchdog(mnt, CHECK_TIMEOUT):
                write_raw_tensor(os.fsencode(mnt) + b"/good", [1.0, 2.0])
                write_raw_tensor(os.fsencode(mnt) + b"/bad\xff", [3.0, 4.0])
                rc, _, err = commit(ckptfs, mnt)
            tap.ok(rc == 2 and "bad%FF" in text(err) and "UTF-8" in text(err),
                   "%s: the commit is refused (exit 2), naming the tensor escaped" % what,
                   ["exit %r: %s" % (rc, text(err))])
            tap.ok(not os.path.exists(out), "%s: OUT is not written" % what,
                   sorted(os.listdir(work)))
        finally:
            run_capture(["fusermount3", "-u", mnt], 20)
            wait_spool_free(spool_of(out))
            unmount(mnt)
            shutil.rmtree(spool_of(out), ignore_errors=True)

    src = os.path.join(work, "names.gguf")
    gguf_f32(src, [(b"good", [1.0, 2.0]), (b"bad\xff", [3.0, 4.0])])
    for out_name in ("conv.safetensors", "conv.safetensors.zst", "convdir/"):
        out = os.path.join(work, out_name)
        rc, _, err = run_capture([ckptfs, "convert", src, out], 60)
        tap.ok(rc == 2 and "bad%FF" in text(err) and not os.path.exists(out.rstrip("/")),
               "convert of a non-UTF-8 name to %s: refused (exit 2), named, nothing written"
               % out_name, ["exit %r: %s" % (rc, text(err)), sorted(os.listdir(work))])


def directory_twice(tap, ckptfs, work):
    what = "directory OUT committed three times"
    out = os.path.join(work, "hf")
    os.makedirs(os.path.join(out, "notes"))
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write("model card\n")
    with open(os.path.join(out, "notes", "log.txt"), "w") as f:
        f.write("keep me\n")
    mnt = tempfile.mkdtemp(prefix="ckptfs-t73.")
    pid = 0
    try:
        ok, _ = staged(tap, ckptfs, out + "/", mnt, what, "-o", "max_shard_size=100")
        if not ok:
            return
        pid = daemon_pid(spool_of(out))
        with Watchdog(mnt, CHECK_TIMEOUT):
            write_raw_tensor(os.path.join(mnt, "a"), [1.0] * 20)
            write_raw_tensor(os.path.join(mnt, "b"), [2.0] * 20)
            rc1, _, err1 = commit(ckptfs, mnt)
            first = sorted(os.listdir(out))
            os.unlink(os.path.join(mnt, "b"))
            os.unlink(os.path.join(mnt, "b.json"))
            write_raw_tensor(os.path.join(mnt, "c"), [3.0] * 4)
            rc2, _, err2 = commit(ckptfs, mnt)
            second = read_safetensors_dir(out)
            write_raw_tensor(os.path.join(mnt, "d"), [4.0] * 2)
        tap.ok(rc1 == 0 and "model.safetensors.index.json" in first,
               "%s: the first commit writes shards and an index" % what,
               ["exit %r: %s" % (rc1, text(err1)), first])
        tap.ok(rc2 == 0 and sorted(second) == ["a", "c"],
               "%s: the second commit replaces OUT" % what,
               ["exit %r: %s" % (rc2, text(err2)), sorted(second)])
    finally:
        run_capture(["fusermount3", "-u", mnt], 20)
        gone = wait_gone(pid)
        unmount(mnt)
    got = read_safetensors_dir(out)
    tap.ok(gone and sorted(got) == ["a", "c", "d"] and got["d"] == ("F32", [2], [4.0, 4.0]),
           "%s: the commit on unmount replaces it once more" % what, [sorted(got)])
    left = sorted(os.listdir(out))
    shards = [n for n in left if n.endswith(".safetensors")]
    try:
        with open(os.path.join(out, "model.safetensors.index.json")) as f:
            indexed = set(json.load(f)["weight_map"].values())
    except (OSError, ValueError, KeyError):
        indexed = None
    tap.ok("README.md" in left and os.path.isfile(os.path.join(out, "notes", "log.txt"))
           and indexed is not None and sorted(shards) == sorted(indexed),
           "%s: the user's README.md and notes/ stay, no stale shard" % what, [left])
    stray = [n for n in os.listdir(work) if ".partial-" in n]
    tap.ok(not stray and not os.path.exists(spool_of(out)),
           "%s: no temporary directory and no spool left" % what, [stray])


def stale_partial(tap, ckptfs, work):
    what = "a killed directory commit's leftover"
    out = os.path.join(work, "hf2")
    mnt = tempfile.mkdtemp(prefix="ckptfs-t73.")
    try:
        ok, _ = staged(tap, ckptfs, out + "/", mnt, what, "-o", "nocommit")
        if not ok:
            return
        with Watchdog(mnt, CHECK_TIMEOUT):
            write_raw_tensor(os.path.join(mnt, "w"), [1.0, 2.0])
        run_capture(["fusermount3", "-u", mnt], 20)
        wait_spool_free(spool_of(out))
        left = os.path.join(work, ".hf2.partial-Ab12Cd")
        os.makedirs(os.path.join(left, "user-dir"))
        with open(os.path.join(left, "model.safetensors"), "wb") as f:
            f.write(b"\0" * 4096)
        decoy = os.path.join(work, "hf2.partial-Ab12Cd")  # not a name the writer uses
        os.makedirs(decoy)
        ok, err = staged(tap, ckptfs, out + "/", mnt, what + " (taken up)")
        tap.ok(ok and not os.path.exists(os.path.join(left, "model.safetensors"))
               and os.path.isdir(os.path.join(left, "user-dir")) and os.path.isdir(decoy),
               "%s: .OUT.partial-XXXXXX/ is emptied of files, a directory in it and other "
               "names stay" % what, [text(err), sorted(os.listdir(work))])
        tap.ok(".hf2.partial-Ab12Cd" in text(err), "%s: and the stage says so" % what,
               [text(err)])
    finally:
        run_capture(["fusermount3", "-u", mnt], 20)
        wait_spool_free(spool_of(out))
        unmount(mnt)


def hf_folder_files(tap, ckptfs, work):
    what = "a Hugging Face folder's own files"
    src = os.path.join(work, "hfsrc")
    os.makedirs(src)
    header = b'{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'
    header += b" " * (-len(header) % 8)
    with open(os.path.join(src, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + struct.pack("<2f", 1.0, 2.0))
    own = {"config.json": b'{"model_type": "llama"}\n', "tokenizer.json": b'{"v": [1, 2]}\n'}
    for name, data in own.items():
        with open(os.path.join(src, name), "wb") as f:
            f.write(data)
    out = os.path.join(work, "hfout")
    mnt = tempfile.mkdtemp(prefix="ckptfs-t73.")
    try:
        ok, _ = staged(tap, ckptfs, out + "/", mnt, what, "--from", src + "/")
        if not ok:
            return
        with Watchdog(mnt, CHECK_TIMEOUT):
            shown = sorted(n for n in os.listdir(mnt) if not n.startswith("."))
            with open(os.path.join(mnt, "generation_config.json"), "wb") as f:
                f.write(b'{"top_p": 0.9}\n')
            rc, _, err = commit(ckptfs, mnt)
        tap.ok(shown == ["config.json", "tokenizer.json", "w", "w.json"],
               "%s: --from DIR shows config.json and tokenizer.json" % what, [shown])
        want = dict(own, **{"generation_config.json": b'{"top_p": 0.9}\n'})
        got = {}
        for name in want:
            try:
                with open(os.path.join(out, name), "rb") as f:
                    got[name] = f.read()
            except OSError as e:
                got[name] = str(e)
        tensors = read_safetensors_dir(out)
        tap.ok(rc == 0 and got == want and sorted(tensors) == ["w"],
               "%s: a commit into DIR/ carries them byte for byte" % what,
               ["exit %r: %s" % (rc, text(err)), got, sorted(tensors)])
    finally:
        run_capture(["fusermount3", "-u", mnt], 20)
        wait_spool_free(spool_of(out))
        unmount(mnt)
    out = os.path.join(work, "flat.safetensors")
    mnt = tempfile.mkdtemp(prefix="ckptfs-t73.")
    try:
        ok, _ = staged(tap, ckptfs, out, mnt, what + " into one file")
        if not ok:
            return
        with Watchdog(mnt, CHECK_TIMEOUT):
            shutil.copy(os.path.join(src, "config.json"), os.path.join(mnt, "config.json"))
            write_raw_tensor(os.path.join(mnt, "w"), [1.0])
            write_raw_tensor(os.path.join(mnt, "tokenizer"), [9.0])  # its sidecar: tokenizer.json
            rc, so, err = commit(ckptfs, mnt)
        tensors = read_safetensors(out) if rc == 0 else {}
        tap.ok(sorted(tensors) == ["tokenizer", "w"],
               "%s: a raw file \"tokenizer\" + tokenizer.json stays a tensor" % what,
               [sorted(tensors)])
        tap.ok(rc == 0 and "config.json: not written" in text(so + err),
               "%s: copying config.json into a stage of one file works, and the commit "
               "says it is not written" % what, ["exit %r: %s %s" % (rc, text(so), text(err))])
    finally:
        run_capture(["fusermount3", "-u", mnt], 20)
        wait_spool_free(spool_of(out))
        unmount(mnt)


def body(tap, ckptfs, root):
    work = tempfile.mkdtemp(prefix="ckptfs-t73w.")
    try:
        non_utf8_names(tap, ckptfs, work)
        directory_twice(tap, ckptfs, work)
        stale_partial(tap, ckptfs, work)
        hf_folder_files(tap, ckptfs, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(run(body))
