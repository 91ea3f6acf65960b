#!/usr/bin/python3
"""Staging mounts: `ckptfs stage OUT MNT [--from SRC]` and `ckptfs commit MNT`.

Environment:
  CKPTFS    path of the ckptfs binary
  FIXTURES  output root of the fixture generators (safetensors cases at the top,
            DCP-HF cases under dcphf/)

1. Round trip: each fixture is mounted read-only and `cp -r` of its tree goes
   into an empty stage (raw + .json + .npy of every tensor); the commit's
   output, mounted again, shows every tensor of the manifest with the same
   name and sha256, and a strict safetensors reader written here agrees.
2. Overlay (--from): a tensor deleted, one replaced, one patched in place, one
   added as raw + sidecar and one as .npy, one renamed, a directory renamed;
   the output holds exactly the expected tensors; the source is unchanged.
3. Partial and out-of-order writes (dd conv=notrunc seek=...), several writers
   at once (two processes on one file, two threads on two files).
4. Validation: wrong byte count, missing sidecar, unknown dtype, name clash,
   sidecar without data, bad .npy: commit exits 2 and names every path, OUT
   keeps its bytes, the staged files stay; fixed, the commit succeeds.
5. Commit on unmount, and the spool removed once OUT holds everything.
"""

import errno
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import threading

CHECK_TIMEOUT = 180

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from ckptfs_test import Watchdog, is_mounted, run_capture, unmount  # noqa: E402
from mount_checks import run, sidecar_path  # noqa: E402
from staging import (COMMIT_TIMEOUT, MOUNT_TIMEOUT, commit, daemon_pid, file_sha,  # noqa: E402
                     sha, spool_for, spool_of, stage, tensor_count_problems, wait_gone,
                     write_sidecar)

ROUND_TRIP_CASES = ["dtypes", "sharded", "odd", "dcphf/dim1x4", "dcphf/grid"]


# ---------------------------------------------------------------------------
# helpers

def tree_shas(root):
    out = {}
    for d, _, files in os.walk(root):
        for n in files:
            p = os.path.join(d, n)
            out[os.path.relpath(p, root)] = file_sha(p)
    return out


def read_safetensors(path):
    """name -> (dtype, shape, sha256), read strictly without ckptfs."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n].decode("utf-8"))
    base = 8 + n
    out, end = {}, 0
    for name, v in header.items():
        if name == "__metadata__":
            continue
        a, b = v["data_offsets"]
        assert 0 <= a <= b <= len(data) - base, "data_offsets out of bounds"
        out[name] = (v["dtype"], v["shape"], sha(data[base + a:base + b]))
        end = max(end, b)
    assert end == len(data) - base, "bytes after the last tensor"
    return out


class Mounted:
    """A read-only ckptfs mount of path, unmounted on exit."""

    def __init__(self, tap, ckptfs, path, what):
        self.tap, self.ckptfs, self.path, self.what = tap, ckptfs, path, what
        self.mnt = None

    def __enter__(self):
        self.mnt = tempfile.mkdtemp(prefix="ckptfs-t70-ro.")
        rc, _, err = run_capture([self.ckptfs, self.path, self.mnt], MOUNT_TIMEOUT)
        if rc != 0 or not is_mounted(self.mnt):
            self.tap.ok(False, "%s: mount %s" % (self.what, self.path),
                        ["exit %r, stderr %s" % (rc, err.decode(errors="replace"))])
            unmount(self.mnt)
            return None
        return self.mnt

    def __exit__(self, *exc):
        unmount(self.mnt)
        return False


def check_output(tap, ckptfs, out, expect, what):
    """expect: name -> (path or None, sha256). OUT mounted shows exactly these tensors."""
    problems = []
    try:
        got = read_safetensors(out)
        for name in sorted(set(expect) - set(got)):
            problems.append("missing in OUT: %r" % name)
        for name in sorted(set(got) - set(expect)):
            problems.append("unexpected in OUT: %r" % name)
        for name in sorted(set(expect) & set(got)):
            if got[name][2] != expect[name][1]:
                problems.append("%r: sha256 differs in OUT" % name)
    except (OSError, ValueError, KeyError, AssertionError) as e:
        problems.append("reading %s: %s" % (out, e))
    tap.ok(not problems, "%s: OUT holds exactly the expected tensors (own reader)" % what,
           problems[:20])

    with Mounted(tap, ckptfs, out, what) as mnt:
        if not mnt:
            return
        problems = []
        with Watchdog(mnt, CHECK_TIMEOUT):
            for name, (path, digest) in sorted(expect.items()):
                if path is None:
                    continue
                try:
                    with open(os.path.join(mnt, path).encode(), "rb") as f:
                        data = f.read()
                    if sha(data) != digest:
                        problems.append("%s: sha256 differs" % path)
                    with open(os.path.join(mnt, sidecar_path(path)).encode(), "rb") as f:
                        sc = json.loads(f.read())
                    if sc.get("name") != name:
                        problems.append("%s: name %r, want %r" % (path, sc.get("name"), name))
                except (OSError, ValueError) as e:
                    problems.append("%s: %s" % (path, e))
            problems += tensor_count_problems(mnt, len(expect))
        tap.ok(not problems, "%s: mounted OUT: same names, sha256 and count" % what,
               problems[:20])


class Stage:
    """`ckptfs stage OUT MNT ...`; on exit unmounts and waits for the daemon."""

    def __init__(self, tap, ckptfs, out, what, *extra):
        self.tap, self.ckptfs, self.out, self.what, self.extra = tap, ckptfs, out, what, extra
        self.mnt = tempfile.mkdtemp(prefix="ckptfs-t70-stage.")
        self.pid = 0

    def __enter__(self):
        rc, _, err = stage(self.ckptfs, self.out, self.mnt, *self.extra)
        ok = rc == 0 and is_mounted(self.mnt)
        self.tap.ok(ok, "%s: ckptfs stage" % self.what,
                    ["exit %r, stderr %s" % (rc, err.decode(errors="replace"))])
        self.pid = daemon_pid(spool_for(self.out, self.extra))
        return self.mnt if ok else None

    def close(self):
        clean = unmount(self.mnt)
        return clean and wait_gone(self.pid)

    def __exit__(self, *exc):
        if is_mounted(self.mnt):
            self.close()
        return False


def commit_ok(tap, ckptfs, mnt, what):
    rc, out, err = commit(ckptfs, mnt)
    return tap.ok(rc == 0, "%s: ckptfs commit exits 0" % what,
                  ["exit %r" % rc, "stdout: %s" % out.decode(errors="replace"),
                   "stderr: %s" % err.decode(errors="replace")])


def copy_tree(ro, dst):
    """cp -r of every top-level entry of a read-only mount except .ckptfs."""
    entries = [os.path.join(ro, e) for e in sorted(os.listdir(ro)) if e != ".ckptfs"]
    return run_capture(["cp", "-r"] + entries + [dst], COMMIT_TIMEOUT)


# ---------------------------------------------------------------------------
# 1. round trip through cp -r

def round_trip(tap, ckptfs, fixtures, work, case, out_name="model.safetensors"):
    case_dir = os.path.join(fixtures, case)
    with open(os.path.join(case_dir, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    source = os.path.normpath(os.path.join(case_dir, manifest["source"]))
    expect = {t["name"]: (t["path"], t["sha256"]) for t in manifest["tensors"]}
    what = "round trip %s%s" % (case, " to an HF directory" if out_name[-1] == "/" else "")
    outdir = os.path.join(work, "rt-" + case.replace("/", "-") + ("-dir" if out_name[-1] == "/" else ""))
    os.makedirs(outdir)
    out = os.path.join(outdir, out_name)
    with Mounted(tap, ckptfs, source, what) as ro:
        if not ro:
            return
        st = Stage(tap, ckptfs, out, what)
        with st as mnt:
            if not mnt:
                return
            rc, _, err = copy_tree(ro, mnt)
            tap.ok(rc == 0, "%s: cp -r from the read-only mount" % what,
                   ["exit %r, stderr %s" % (rc, err.decode(errors="replace"))])
            if not commit_ok(tap, ckptfs, mnt, what):
                return
            tap.ok(st.close(), "%s: unmount, daemon exits" % what)
    tap.ok(not os.path.exists(spool_of(out)), "%s: the spool is gone after the unmount" % what,
           [str(os.listdir(outdir))])
    target = out
    if out.endswith("/"):
        target = os.path.join(out, "model.safetensors")
        tap.ok(os.path.isfile(target), "%s: OUT/ is an HF directory" % what,
               [str(os.listdir(out)) if os.path.isdir(out) else "no directory"])
    check_output(tap, ckptfs, target, expect, what)


# ---------------------------------------------------------------------------
# 2. overlay over a source

def overlay(tap, ckptfs, fixtures, work):
    what = "overlay"
    src = os.path.join(work, "overlay-src")
    shutil.copytree(os.path.join(fixtures, "sharded"), src)
    before = tree_shas(src)
    with open(os.path.join(fixtures, "sharded", "manifest.json")) as f:
        manifest = json.load(f)
    expect = {t["name"]: (t["path"], t["sha256"]) for t in manifest["tensors"]}
    out = os.path.join(work, "overlay-out", "model.safetensors")
    os.makedirs(os.path.dirname(out))
    st = Stage(tap, ckptfs, out, what, "--from", src)
    with st as mnt:
        if not mnt:
            return
        problems = []
        try:
            p = lambda rel: os.path.join(mnt, rel)  # noqa: E731
            # delete
            os.unlink(p("model/embed_tokens/weight"))
            os.unlink(p("model/embed_tokens/weight.json"))
            del expect["model.embed_tokens.weight"]
            # replace (O_TRUNC: nothing is copied from the source)
            name = "model.layers.0.mlp.down_proj.weight"
            path, _ = expect[name]
            new = bytes((i * 7) & 0xFF for i in range(1536))
            with open(p(path), "wb") as f:
                f.write(new)
            expect[name] = (path, sha(new))
            # patch in place: the source's bytes are copied, then changed
            name = "model.layers.1.self_attn.o_proj.weight"
            path, _ = expect[name]
            with open(p(path), "rb") as f:
                orig = bytearray(f.read())
            rc, _, err = run_capture(["dd", "if=/dev/zero", "of=" + p(path), "bs=4", "seek=3",
                                      "count=2", "conv=notrunc", "status=none"], 30)
            if rc != 0:
                problems.append("dd: %s" % err.decode(errors="replace"))
            orig[12:20] = b"\0" * 8
            expect[name] = (path, sha(bytes(orig)))
            # add raw + sidecar, and an .npy written by numpy into the mount
            os.mkdir(p("extra"))
            with open(p("extra/raw"), "wb") as f:
                f.write(b"\x01\x02\x03\x04\x05\x06")
            write_sidecar(p("extra/raw.json"), "U8", [2, 3])
            expect["extra.raw"] = ("extra/raw", sha(b"\x01\x02\x03\x04\x05\x06"))
            import numpy as np
            arr = np.arange(12, dtype=np.float32).reshape(3, 4)
            np.save(p("extra/from_numpy.npy"), arr)
            expect["extra.from_numpy"] = ("extra/from_numpy", sha(arr.tobytes()))
            # rename a tensor (raw and sidecar) and a directory
            os.rename(p("model/norm/weight"), p("model/norm/renamed"))
            os.rename(p("model/norm/weight.json"), p("model/norm/renamed.json"))
            expect["model.norm.renamed"] = ("model/norm/renamed",
                                            expect.pop("model.norm.weight")[1])
            os.rename(p("model/layers/1"), p("model/layers/7"))
            for n in [n for n in expect if n.startswith("model.layers.1.")]:
                path, digest = expect.pop(n)
                nn = "model.layers.7." + n[len("model.layers.1."):]
                expect[nn] = ("model/layers/7/" + path[len("model/layers/1/"):], digest)
            # the overlay shows the source's bytes where nothing changed
            path, digest = expect["model.layers.0.self_attn.q_proj.weight"]
            with open(p(path), "rb") as f:
                if sha(f.read()) != digest:
                    problems.append("%s: source bytes differ through the overlay" % path)
        except OSError as e:
            problems.append(str(e))
        tap.ok(not problems, "%s: delete, replace, patch, add, rename in the mount" % what,
               problems)
        if not commit_ok(tap, ckptfs, mnt, what):
            return
        tap.ok(st.close(), "%s: unmount, daemon exits" % what)
    check_output(tap, ckptfs, out, expect, what)
    tap.ok(tree_shas(src) == before, "%s: the source is unchanged" % what)


def edit_in_place(tap, ckptfs, fixtures, work):
    """--from OUT: OUT is the source, replaced by each commit; later commits still work."""
    what = "edit in place"
    outdir = os.path.join(work, "edit")
    os.makedirs(outdir)
    out = os.path.join(outdir, "x.safetensors")
    shutil.copy(os.path.join(fixtures, "dtypes", "model.safetensors"), out)
    with open(os.path.join(fixtures, "dtypes", "manifest.json")) as f:
        manifest = json.load(f)
    expect = {t["name"]: (t["path"], t["sha256"]) for t in manifest["tensors"]}
    st = Stage(tap, ckptfs, out, what, "--from", out)
    with st as mnt:
        if not mnt:
            return
        for step, name in enumerate(("model.layers.0.mlp.u32", "model.layers.0.mlp.u16")):
            path = expect[name][0]
            with open(os.path.join(mnt, path), "r+b") as f:
                size = len(f.read())
                f.seek(0)
                f.write(bytes([step + 1]) * size)
            expect[name] = (path, sha(bytes([step + 1]) * size))
            if not commit_ok(tap, ckptfs, mnt, "%s (commit %d)" % (what, step + 1)):
                return
        tap.ok(st.close(), "%s: unmount, daemon exits" % what)
    tap.ok(sorted(os.listdir(outdir)) == ["x.safetensors"], "%s: no spool left" % what,
           os.listdir(outdir))
    check_output(tap, ckptfs, out, expect, what)


# ---------------------------------------------------------------------------
# 3. partial, out-of-order and concurrent writes

def writes(tap, ckptfs, work):
    what = "writes"
    out = os.path.join(work, "writes-out", "w.safetensors")
    os.makedirs(os.path.dirname(out))
    blob = os.path.join(work, "blob")
    with open(blob, "wb") as f:
        f.write(os.urandom(8 << 20))
    with open(blob, "rb") as f:
        data = f.read()
    expect = {}
    st = Stage(tap, ckptfs, out, what)
    with st as mnt:
        if not mnt:
            return
        problems = []
        # blocks written out of order with dd conv=notrunc seek=...
        target = os.path.join(mnt, "ooo")
        for block in (3, 1, 0, 2):
            rc, _, err = run_capture(
                ["dd", "if=" + blob, "of=" + target, "bs=64K", "skip=%d" % block,
                 "seek=%d" % block, "count=1", "conv=notrunc", "status=none"], 30)
            if rc != 0:
                problems.append("dd block %d: %s" % (block, err.decode(errors="replace")))
        write_sidecar(target + ".json", "F32", [256, 256])
        expect["ooo"] = ("ooo", sha(data[:256 << 10]))
        # a file grown past a hole, the hole filled afterwards
        with open(os.path.join(mnt, "holes"), "wb") as f:
            f.seek(100)
            f.write(data[100:200])
            f.seek(0)
            f.write(data[:100])
        write_sidecar(os.path.join(mnt, "holes.json"), "U8", [200])
        expect["holes"] = ("holes", sha(data[:200]))
        # two processes writing halves of one file at once
        half = 4 << 20
        target = os.path.join(mnt, "two_procs")
        procs = [subprocess.Popen(["dd", "if=" + blob, "of=" + target, "bs=64K",
                                   "skip=%d" % s, "seek=%d" % s, "count=64", "conv=notrunc",
                                   "status=none"]) for s in (64, 0)]
        for pr in procs:
            if pr.wait(60) != 0:
                problems.append("concurrent dd exited %r" % pr.returncode)
        write_sidecar(target + ".json", "U8", [8 << 20])
        expect["two_procs"] = ("two_procs", sha(data))
        # two threads writing two files, interleaved
        errs = []

        def writer(name, part):
            try:
                with open(os.path.join(mnt, name), "wb") as f:
                    for off in range(0, half, 32 << 10):
                        f.write(part[off:off + (32 << 10)])
            except OSError as e:
                errs.append("%s: %s" % (name, e))
        threads = [threading.Thread(target=writer, args=("t%d" % i, data[i * half:(i + 1) * half]))
                   for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        problems += errs
        for i in range(2):
            write_sidecar(os.path.join(mnt, "t%d.json" % i), "I32", [half // 4])
            expect["t%d" % i] = ("t%d" % i, sha(data[i * half:(i + 1) * half]))
        # the mount reads back what was written
        for name, (path, digest) in expect.items():
            if file_sha(os.path.join(mnt, path)) != digest:
                problems.append("%s: reads back other bytes" % path)
        tap.ok(not problems, "%s: out-of-order, sparse and concurrent writes read back" % what,
               problems)
        if not commit_ok(tap, ckptfs, mnt, what):
            return
        tap.ok(st.close(), "%s: unmount, daemon exits" % what)
    check_output(tap, ckptfs, out, expect, what)


# ---------------------------------------------------------------------------
# 4. validation

def validation(tap, ckptfs, work):
    what = "validation"
    outdir = os.path.join(work, "val-out")
    os.makedirs(outdir)
    out = os.path.join(outdir, "v.safetensors")
    good = b"\x00\x00\x80\x3f" * 6
    expect = {"good": ("good", sha(good))}
    st = Stage(tap, ckptfs, out, what)
    with st as mnt:
        if not mnt:
            return
        p = lambda rel: os.path.join(mnt, rel)  # noqa: E731
        with open(p("good"), "wb") as f:
            f.write(good)
        write_sidecar(p("good.json"), "F32", [2, 3])
        if not commit_ok(tap, ckptfs, mnt, what + " (first, valid)"):
            return
        out_sha = file_sha(out)

        bad = {}
        with open(p("short"), "wb") as f:  # 100 bytes for F32 [5, 6]
            f.write(b"\1" * 100)
        write_sidecar(p("short.json"), "F32", [5, 6])
        bad["short"] = "short"
        with open(p("lonely"), "wb") as f:  # no sidecar
            f.write(b"\2" * 8)
        bad["lonely"] = "lonely"
        with open(p("weird"), "wb") as f:
            f.write(b"\3" * 8)
        write_sidecar(p("weird.json"), "F33", [2])
        bad["weird"] = "weird.json"
        os.mkdir(p("clash"))
        for path in ("clash/a", "clash.a"):
            with open(p(path), "wb") as f:
                f.write(b"\4" * 4)
            write_sidecar(p(path + ".json"), "F32", [1])
        bad["clash"] = ("clash.a", "clash/a")  # either one, naming the other
        write_sidecar(p("orphan.json"), "F32", [1])
        bad["orphan"] = "orphan.json"
        with open(p("noshape"), "wb") as f:
            f.write(b"\5" * 4)
        with open(p("noshape.json"), "w") as f:
            f.write('{"dtype": "F32"}')
        bad["noshape"] = "noshape.json"
        with open(p("broken.json"), "w") as f:
            f.write('{"dtype": "F32", "shape": [1]')
        with open(p("broken"), "wb") as f:
            f.write(b"\6" * 4)
        bad["broken"] = "broken.json"
        with open(p("fortran.npy"), "wb") as f:
            hdr = b"{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }"
            hdr += b" " * (64 - 10 - len(hdr) - 1) + b"\n"
            f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr)) + hdr + b"\0" * 16)
        bad["fortran"] = "fortran.npy"
        staged_before = tree_shas(mnt + "/")
        staged_before = {k: v for k, v in staged_before.items() if not k.startswith(".ckptfs")}

        rc, _, err = commit(ckptfs, mnt)
        text = err.decode(errors="replace")
        tap.ok(rc == 2, "%s: commit exits 2" % what, ["exit %r" % rc, text])
        lines = text.splitlines()
        missing = [str(paths) for paths in bad.values()
                   if not any(ln.startswith(path + ": ")
                              for ln in lines for path in ((paths,) if isinstance(paths, str) else paths))]
        tap.ok(not missing, "%s: every problem listed by path" % what, missing + lines)
        tap.ok(file_sha(out) == out_sha, "%s: OUT keeps its bytes" % what)
        leftovers = [n for n in os.listdir(outdir)
                     if n not in ("v.safetensors", ".v.safetensors.stage")]
        tap.ok(not leftovers, "%s: no temporary file left next to OUT" % what, leftovers)
        after = {k: v for k, v in tree_shas(mnt + "/").items() if not k.startswith(".ckptfs")}
        tap.ok(after == staged_before, "%s: the staged files are kept as they were" % what)
        try:
            with open(p(".ckptfs/status")) as f:
                status = json.load(f)
            last = status.get("last_commit") or {}
            ok = last.get("exit_status") == 2 and any("short" in ln for ln in last.get("report", []))
            tap.ok(ok, "%s: .ckptfs/status reports the failed commit" % what, [json.dumps(status)])
        except (OSError, ValueError) as e:
            tap.ok(False, "%s: .ckptfs/status reports the failed commit" % what, [str(e)])
        # the control file alone: a write fails with EINVAL
        try:
            with open(p(".ckptfs/commit"), "w") as f:
                f.write("1\n")
            tap.ok(False, "%s: a write to .ckptfs/commit fails (EINVAL)" % what)
        except OSError as e:
            tap.ok(e.errno == errno.EINVAL, "%s: a write to .ckptfs/commit fails (EINVAL)" % what,
                   [str(e)])

        # fix everything
        problems = []
        try:
            os.truncate(p("short"), 120)
            expect["short"] = ("short", sha(b"\1" * 100 + b"\0" * 20))
            write_sidecar(p("lonely.json"), "U8", [8])
            expect["lonely"] = ("lonely", sha(b"\2" * 8))
            write_sidecar(p("weird.json"), "F16", [4])
            expect["weird"] = ("weird", sha(b"\3" * 8))
            os.rename(p("clash.a"), p("clash_b"))
            os.rename(p("clash.a.json"), p("clash_b.json"))
            expect["clash.a"] = ("clash/a", sha(b"\4" * 4))
            expect["clash_b"] = ("clash_b", sha(b"\4" * 4))
            os.unlink(p("orphan.json"))
            write_sidecar(p("noshape.json"), "F32", [1])
            expect["noshape"] = ("noshape", sha(b"\5" * 4))
            write_sidecar(p("broken.json"), "I32", [1])
            expect["broken"] = ("broken", sha(b"\6" * 4))
            os.unlink(p("fortran.npy"))
        except OSError as e:
            problems.append(str(e))
        tap.ok(not problems, "%s: problems fixed in the mount" % what, problems)
        if not commit_ok(tap, ckptfs, mnt, what + " (fixed)"):
            return
        tap.ok(st.close(), "%s: unmount, daemon exits" % what)
    check_output(tap, ckptfs, out, expect, what)


# ---------------------------------------------------------------------------
# 5. commit on unmount

def unmount_commits(tap, ckptfs, work):
    what = "commit on unmount"
    outdir = os.path.join(work, "unmount-out")
    os.makedirs(outdir)
    out = os.path.join(outdir, "u.safetensors")
    st = Stage(tap, ckptfs, out, what)
    with st as mnt:
        if not mnt:
            return
        with open(os.path.join(mnt, "x"), "wb") as f:
            f.write(b"\7" * 12)
        write_sidecar(os.path.join(mnt, "x.json"), "I32", [3])
        tap.ok(not os.path.exists(out), "%s: nothing written before the unmount" % what)
        tap.ok(st.close(), "%s: unmount, daemon exits" % what)
    tap.ok(os.path.exists(out) and not os.path.exists(spool_of(out)),
           "%s: OUT written, spool removed" % what, [str(os.listdir(outdir))])
    if os.path.exists(out):
        check_output(tap, ckptfs, out, {"x": ("x", sha(b"\7" * 12))}, what)

    # An invalid stage is not written on unmount, and comes back when staged again. (A new
    # stage without --from starts empty, even over an existing OUT.)
    st = Stage(tap, ckptfs, out, what + " (invalid)")
    with st as mnt:
        if not mnt:
            return
        before = file_sha(out)
        with open(os.path.join(mnt, "y"), "wb") as f:
            f.write(b"\1" * 3)
        tap.ok(st.close(), "%s: unmount, daemon exits" % what)
    tap.ok(file_sha(out) == before and os.path.isdir(spool_of(out)),
           "%s: invalid stage: OUT unchanged, spool kept" % what)
    st = Stage(tap, ckptfs, out, what + " (again)")
    with st as mnt:
        if not mnt:
            return
        try:
            with open(os.path.join(mnt, ".ckptfs", "status")) as f:
                last = json.load(f).get("last_commit") or {}
            tap.ok(last.get("exit_status") == 2 and os.path.exists(os.path.join(mnt, "y")),
                   "%s: remounted: staged file and last report are back" % what, [str(last)])
        except (OSError, ValueError) as e:
            tap.ok(False, "%s: remounted: staged file and last report are back" % what, [str(e)])
        write_sidecar(os.path.join(mnt, "y.json"), "U8", [3])
        tap.ok(st.close(), "%s: unmount, daemon exits" % what)
    check_output(tap, ckptfs, out, {"y": ("y", sha(b"\1" * 3))}, what + " (fixed)")

    # -o nocommit: the unmount leaves OUT alone and keeps the spool
    before = file_sha(out)
    st = Stage(tap, ckptfs, out, what + " (nocommit)", "-o", "nocommit")
    with st as mnt:
        if not mnt:
            return
        with open(os.path.join(mnt, "z"), "wb") as f:
            f.write(b"\2" * 2)
        write_sidecar(os.path.join(mnt, "z.json"), "U8", [2])
        tap.ok(st.close(), "%s: unmount, daemon exits" % what)
    tap.ok(file_sha(out) == before and os.path.isdir(spool_of(out)),
           "%s: -o nocommit: OUT unchanged, spool kept" % what)


def main(tap, ckptfs, fixtures):
    work = tempfile.mkdtemp(prefix="ckptfs-t70.")
    try:
        for case in ROUND_TRIP_CASES:
            if os.path.isfile(os.path.join(fixtures, case, "manifest.json")):
                round_trip(tap, ckptfs, fixtures, work, case)
            else:
                tap.ok(False, "fixture %s exists" % case)
        round_trip(tap, ckptfs, fixtures, work, "sharded", out_name="hf/")
        overlay(tap, ckptfs, fixtures, work)
        edit_in_place(tap, ckptfs, fixtures, work)
        writes(tap, ckptfs, work)
        validation(tap, ckptfs, work)
        unmount_commits(tap, ckptfs, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(run(main))
