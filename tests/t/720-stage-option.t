#!/usr/bin/python3
"""Staging as a mount option: `ckptfs SOURCE MNT -o stage=OUT` (= `ckptfs stage OUT MNT
--from SOURCE`), the empty forms (`none MNT`, `MNT` alone), and the same through the mount
helper that mount(8) and fstab run.

Environment:
  CKPTFS    path of the ckptfs binary
  FIXTURES  output root of the fixture generators (dtypes/ of safetensors_fixtures.py is used)

1. Over a fixture: -o stage=OUT mounts a writable tree holding the source's tensors; a new
   tensor (raw file + sidecar) is copied in with cp; the unmount commits; OUT mounted
   read-only shows every tensor of the fixture's manifest and the new one, same sha256.
2. Empty stages with the other staging options: none MNT -o stage=OUT,nocommit,spool=DIR,
   max_threads=2 (commit by `ckptfs commit`, the spool where asked, gone after the unmount);
   MNT alone -o stage=DIR/,max_shard_size=S (an HF directory in shards).
3. Refused with exit status 1, one line naming the option, nothing mounted: read-only mount
   options with stage=, ro with stage=, staging options without it, max_shard_size= for a
   file OUT, stage= without OUT, three positional arguments.
4. The mount helper: fstab-style options plus stage=OUT make the same writable mount; the
   commit on unmount gives an OUT with the right bytes; ro with stage= is refused.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from ckptfs_test import Watchdog, is_mounted, run_capture, unmount  # noqa: E402
from mount_checks import mount_prefix, run  # noqa: E402
from staging import (COMMIT_TIMEOUT, MOUNT_TIMEOUT, commit, daemon_pid,  # noqa: E402
                     file_sha, spool_of, tensor_count_problems, wait_gone, write_sidecar)

CHECK_TIMEOUT = 120
HELPER = os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "..", "mount-helpers",
                      "mount.fuse.ckptfs")
NEW_BYTES = bytes(range(256)) * 3  # 768 bytes: F32 [12, 16]


def text(b):
    return b.decode("utf-8", "replace").strip()


def one_line(err):
    return len(text(err).splitlines()) == 1


def make_new_tensor(tmp):
    """A raw file + sidecar outside the mount, to be copied in with cp."""
    d = os.path.join(tmp, "new")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "weight"), "wb") as f:
        f.write(NEW_BYTES)
    write_sidecar(os.path.join(d, "weight.json"), "F32", [12, 16])
    return d


def cp_new_tensor(tap, tmp, mnt, what):
    """cp the new tensor to extra/added/weight (+ .json) in the mount."""
    src = make_new_tensor(tmp)
    dst = os.path.join(mnt, "extra", "added")
    with Watchdog(mnt, CHECK_TIMEOUT):
        os.makedirs(dst, exist_ok=True)
        files = [os.path.join(src, "weight"), os.path.join(src, "weight.json")]
        rc, _, err = run_capture(["cp"] + files + [dst + "/"], COMMIT_TIMEOUT)
        ok = rc == 0 and os.path.getsize(os.path.join(dst, "weight")) == len(NEW_BYTES)
    return tap.ok(ok, "%s: cp of a tensor and its sidecar into the stage" % what,
                  ["exit %r: %s" % (rc, text(err))])


def staged_status(mnt):
    with open(os.path.join(mnt, ".ckptfs", "status")) as f:
        return json.load(f)


def finish_stage(tap, mnt, spool, what):
    """Unmount (which commits) and wait for the daemon to exit."""
    pid = daemon_pid(spool)
    clean = unmount(mnt)
    gone = wait_gone(pid)
    tap.ok(clean and gone, "%s: unmounted, the daemon committed and exited" % what,
           ["clean unmount %r, daemon %d gone %r" % (clean, pid, gone)])


def check_out(tap, ckptfs, out, expect, what):
    """OUT mounted read-only shows exactly expect: {path: sha256}."""
    mnt = tempfile.mkdtemp(prefix=mount_prefix())
    try:
        rc, _, err = run_capture([ckptfs, out, mnt], MOUNT_TIMEOUT)
        if not tap.ok(rc == 0 and is_mounted(mnt), "%s: OUT mounts read-only" % what,
                      ["exit %r: %s" % (rc, text(err))]):
            return
        problems = []
        with Watchdog(mnt, CHECK_TIMEOUT) as dog:
            for path, digest in sorted(expect.items()):
                try:
                    if file_sha(os.path.join(mnt, path)) != digest:
                        problems.append("%s: sha256 differs" % path)
                except OSError as e:
                    problems.append("%s: %s" % (path, e))
            problems += tensor_count_problems(mnt, len(expect))
        if dog.fired:
            problems.append("watchdog aborted the mount")
        tap.ok(not problems, "%s: OUT holds the %d expected tensors, same sha256"
               % (what, len(expect)), problems[:20])
    finally:
        unmount(mnt)


def fixture_tensors(root):
    """{path in a mount: sha256} of the fixture in root, and its file."""
    with open(os.path.join(root, "manifest.json")) as f:
        m = json.load(f)
    return {t["path"]: t["sha256"] for t in m["tensors"]}, os.path.join(root, m["source"])


def new_tensor_entry():
    return {"extra/added/weight": hashlib.sha256(NEW_BYTES).hexdigest()}


# ---------------------------------------------------------------------------
# 1. -o stage=OUT over a source

def check_over_source(tap, ckptfs, root, tmp):
    what = "SRC MNT -o stage=OUT"
    tensors, src = fixture_tensors(root)
    out = os.path.join(tmp, "over.safetensors")
    mnt = tempfile.mkdtemp(prefix=mount_prefix())
    rc, _, err = run_capture([ckptfs, src, mnt, "-o", "stage=" + out], MOUNT_TIMEOUT)
    if not tap.ok(rc == 0 and is_mounted(mnt), "%s: mounts" % what,
                  ["exit %r: %s" % (rc, text(err))]):
        unmount(mnt)
        return
    try:
        with open("/proc/mounts") as f:
            line = [ln for ln in f if ln.split()[1] == os.path.realpath(mnt)]
        tap.ok(line and line[0].split()[2] == "fuse.ckptfs" and line[0].split()[3].startswith("rw"),
               "%s: a writable fuse.ckptfs mount" % what, line)
        with Watchdog(mnt, CHECK_TIMEOUT):
            st = staged_status(mnt)
            some = sorted(tensors)[0]
            seen = file_sha(os.path.join(mnt, some)) == tensors[some]
        tap.ok(st.get("out") == out and st.get("from") == os.path.realpath(src) and seen,
               "%s: stages OUT over SOURCE (status out/from, the source's tensors shown)" % what,
               [json.dumps(st)])
        cp_new_tensor(tap, tmp, mnt, what)
    finally:
        finish_stage(tap, mnt, spool_of(out), what)
    tap.ok(os.path.isfile(out) and not os.path.exists(spool_of(out)),
           "%s: OUT written on unmount, its spool removed" % what)
    expect = dict(tensors)
    expect.update(new_tensor_entry())
    check_out(tap, ckptfs, out, expect, what)


# ---------------------------------------------------------------------------
# 2. empty stages, with the other staging options

def check_empty(tap, ckptfs, tmp):
    what = "none MNT -o stage=OUT,nocommit,spool=DIR,max_threads=2"
    out = os.path.join(tmp, "empty.safetensors")
    spool = os.path.join(tmp, "myspool")
    mnt = tempfile.mkdtemp(prefix=mount_prefix())
    rc, _, err = run_capture([ckptfs, "none", mnt, "-o",
                              "stage=%s,nocommit,spool=%s,max_threads=2" % (out, spool)],
                             MOUNT_TIMEOUT)
    if not tap.ok(rc == 0 and is_mounted(mnt), "%s: mounts" % what,
                  ["exit %r: %s" % (rc, text(err))]):
        unmount(mnt)
        return
    try:
        with Watchdog(mnt, CHECK_TIMEOUT):
            st = staged_status(mnt)
            entries = sorted(os.listdir(mnt))
        tap.ok(st.get("from") is None and st.get("spool") == spool and entries == [".ckptfs"],
               "%s: an empty stage, the spool where asked" % what, [json.dumps(st), entries])
        cp_new_tensor(tap, tmp, mnt, what)
        rc, _, err = commit(ckptfs, mnt)
        tap.ok(rc == 0 and os.path.isfile(out), "%s: ckptfs commit writes OUT" % what,
               ["exit %r: %s" % (rc, text(err))])
    finally:
        finish_stage(tap, mnt, spool, what)
    tap.ok(not os.path.exists(spool), "%s: the spool is gone once OUT holds everything" % what)
    check_out(tap, ckptfs, out, new_tensor_entry(), what)

    what = "MNT -o stage=DIR/,max_shard_size=S"
    outdir = os.path.join(tmp, "hfout") + "/"
    mnt = tempfile.mkdtemp(prefix=mount_prefix())
    rc, _, err = run_capture([ckptfs, mnt, "-o", "stage=%s,max_shard_size=300" % outdir],
                             MOUNT_TIMEOUT)
    if not tap.ok(rc == 0 and is_mounted(mnt), "%s: mounts an empty stage" % what,
                  ["exit %r: %s" % (rc, text(err))]):
        unmount(mnt)
        return
    try:
        # two tensors of 768 bytes each: more than 300 bytes per shard, so two shards
        cp_new_tensor(tap, tmp, mnt, what)
        with Watchdog(mnt, CHECK_TIMEOUT):
            shutil.copytree(os.path.join(mnt, "extra", "added"), os.path.join(mnt, "extra", "copy"))
    finally:
        finish_stage(tap, mnt, spool_of(outdir), what)
    try:
        with open(os.path.join(outdir, "model.safetensors.index.json")) as f:
            weight_map = json.load(f)["weight_map"]
    except (OSError, ValueError, KeyError) as e:
        weight_map = {"error": str(e)}
    tap.ok(sorted(weight_map) == ["extra.added.weight", "extra.copy.weight"]
           and len(set(weight_map.values())) == 2,
           "%s: OUT is an HF directory of two shards and an index" % what,
           [json.dumps(weight_map), sorted(os.listdir(outdir)) if os.path.isdir(outdir) else []])


# ---------------------------------------------------------------------------
# 3. refusals

def check_refusals(tap, ckptfs, root, tmp):
    _, src = fixture_tensors(root)
    out = os.path.join(tmp, "refused.safetensors")
    mnt = tempfile.mkdtemp(prefix=mount_prefix())
    cases = [
        ("view=hf with stage=", [src, mnt, "-o", "stage=%s,view=hf" % out], "view=hf"),
        ("readahead_kb= with stage=", [src, mnt, "-o", "readahead_kb=64", "-o", "stage=" + out],
         "readahead_kb"),
        ("nonpy with stage=", [src, mnt, "-o", "stage=%s,nonpy" % out], "nonpy"),
        ("ro with stage=", [src, mnt, "-o", "ro,stage=" + out], "-o ro"),
        ("nocommit without stage=", [src, mnt, "-o", "nocommit"], "nocommit"),
        ("spool= without stage=", [src, mnt, "-o", "spool=" + tmp], "spool"),
        ("max_shard_size= for a file OUT", [src, mnt, "-o", "stage=%s,max_shard_size=1GB" % out],
         "max_shard_size"),
        ("stage= without OUT", [src, mnt, "-o", "stage="], "stage"),
        ("three positional arguments", [src, mnt, "extra", "-o", "stage=" + out], "MOUNTPOINT"),
    ]
    try:
        for desc, args, word in cases:
            rc, _, err = run_capture([ckptfs] + args, MOUNT_TIMEOUT)
            tap.ok(rc == 1 and one_line(err) and word in text(err) and not is_mounted(mnt),
                   "refused: %s (exit 1, one line naming %s, nothing mounted)" % (desc, word),
                   ["exit %r: %s" % (rc, text(err))])
        tap.ok(not os.path.exists(out) and not os.path.exists(spool_of(out)),
               "refusals leave no OUT and no spool")
    finally:
        unmount(mnt)


# ---------------------------------------------------------------------------
# 4. the mount helper

def check_helper(tap, ckptfs, root, tmp):
    what = "mount.fuse.ckptfs SRC MNT -o ...,stage=OUT"
    tensors, src = fixture_tensors(root)
    out = os.path.join(tmp, "helper.safetensors")
    mnt = tempfile.mkdtemp(prefix=mount_prefix())
    env = dict(os.environ, CKPTFS=ckptfs)

    def helper(*args):
        p = subprocess.run(["sh", HELPER] + list(args), env=env, stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           timeout=MOUNT_TIMEOUT, start_new_session=True)
        return p.returncode, p.stderr

    rc, err = helper(src, mnt, "-o", "rw,noauto,nofail,_netdev,x-systemd.automount,stage=%s,nodev"
                     % out)
    if not tap.ok(rc == 0 and is_mounted(mnt), "%s: mounts with fstab-style options" % what,
                  ["exit %r: %s" % (rc, text(err))]):
        unmount(mnt)
        return
    try:
        with Watchdog(mnt, CHECK_TIMEOUT):
            st = staged_status(mnt)
        tap.ok(st.get("out") == out and st.get("from") == os.path.realpath(src),
               "%s: a stage of OUT over SOURCE" % what, [json.dumps(st)])
        cp_new_tensor(tap, tmp, mnt, what)
    finally:
        finish_stage(tap, mnt, spool_of(out), what)
    expect = dict(tensors)
    expect.update(new_tensor_entry())
    check_out(tap, ckptfs, out, expect, what)

    mnt = tempfile.mkdtemp(prefix=mount_prefix())
    rc, err = helper("none", mnt, "-o", "ro,stage=" + os.path.join(tmp, "ro.safetensors"))
    tap.ok(rc == 1 and "-o ro" in text(err) and not is_mounted(mnt),
           "mount.fuse.ckptfs none MNT -o ro,stage=OUT: refused (exit 1)",
           ["exit %r: %s" % (rc, text(err))])
    unmount(mnt)


def body(tap, ckptfs, root):
    tmp = tempfile.mkdtemp(prefix="ckptfs-t72.")
    try:
        check_over_source(tap, ckptfs, root, tmp)
        check_empty(tap, ckptfs, tmp)
        check_refusals(tap, ckptfs, root, tmp)
        check_helper(tap, ckptfs, root, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(run(body, "dtypes", "safetensors_fixtures.py"))
