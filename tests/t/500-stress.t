#!/usr/bin/python3
"""Concurrency stress: many readers on live mounts, every byte compared.

Environment:
  CKPTFS          path of the ckptfs binary
  FIXTURES        output directory of the fixture generators (make fixtures)
  STRESS_SECONDS  how long the readers run (default 15)
  STRESS_READERS  reader processes (default 8)

Several fixtures are mounted at once: a DCP checkpoint whose 4 MiB tensor is assembled from four
files (multi-piece planning on every read), the safetensors dtype zoo, a GGUF file, and a sharded
HF directory whose HF view is re-split into shards + index by -o max_shard_size. First every file
the mounts show is read once: raw tensors must match the manifests' sha256, every tensor in an HF
view shard must match too (found through the shard's own header), sidecars must name their
tensor. Then reader processes run for STRESS_SECONDS doing random-range preads (often past EOF),
mmap slices, stats and directory walks on all of it, dropping the page cache of a file before a
read now and then so the requests reach the daemon rather than the kernel's cache. Every byte
read is compared with the verified copy: the test wants zero mismatches and zero errors, and the
daemons still answering and unmounting cleanly afterwards.
"""

import hashlib
import json
import mmap
import os
import random
import signal
import struct
import sys
import tempfile
import time

MOUNT_TIMEOUT = 30
sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from ckptfs_test import (Tap, Watchdog, is_mounted, read_to_eof, run_capture, skip_reason,  # noqa: E402
                         unmount)

# (label, case directory under FIXTURES, extra mount options)
MOUNTS = [
    ("dcphf-big_dim1", "dcphf/big_dim1", []),
    ("dtypes", "dtypes", []),
    ("gguf-v3", "gguf/v3", []),
    ("sharded", "sharded", ["-o", "max_shard_size=2KB"]),
]


def source_of(case_dir, manifest):
    if "source" in manifest:
        return os.path.normpath(os.path.join(case_dir, manifest["source"]))
    return os.path.join(case_dir, manifest["sources"][0])


def read_all(path):
    with open(path, "rb") as f:
        return f.read()


def sidecar_of(raw):
    base = raw[:-4] if raw.endswith(".raw") else raw
    return base + ".json"


# ---------------------------------------------------------------------------
# Phase 1: read everything once and verify it

def verify_view_shard(data, by_name, problems, label):
    """Every tensor of a synthesized safetensors file must be the manifest's bytes."""
    if len(data) < 8:
        problems.append("%s: %d bytes" % (label, len(data)))
        return 0
    (hlen,) = struct.unpack("<Q", data[:8])
    try:
        header = json.loads(data[8:8 + hlen])
    except ValueError as e:
        problems.append("%s: header: %s" % (label, e))
        return 0
    body = data[8 + hlen:]
    n = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        t = by_name.get(name)
        if t is None:
            problems.append("%s: %r is not in the manifest" % (label, name))
            continue
        a, b = info["data_offsets"]
        if hashlib.sha256(body[a:b]).hexdigest() != t["sha256"]:
            problems.append("%s: bytes of %r differ from the manifest" % (label, name))
        if info["dtype"] != t["dtype"] or info["shape"] != t["shape"]:
            problems.append("%s: %r dtype/shape %s%s" % (label, name, info["dtype"],
                                                          info["shape"]))
        n += 1
    return n


def load_mount(tap, label, mnt, tensors):
    """Reads every file once; returns ({path: bytes}, {dir: sorted entries}) after checks."""
    by_name = {t["name"]: t for t in tensors}
    expected, dirs, problems = {}, {}, []
    for dirpath, dirnames, filenames in os.walk(mnt, onerror=problems.append):
        dirs[dirpath] = sorted(dirnames + filenames)
        for f in filenames:
            p = os.path.join(dirpath, f)
            try:
                expected[p] = read_all(p)
            except OSError as e:
                problems.append("%s: %s" % (p, e))
    raw_ok = 0
    for t in tensors:
        p = os.path.join(mnt, t["path"])
        data = expected.get(p)
        if data is None:
            problems.append("%s: not in the tree" % t["path"])
        elif len(data) != t["nbytes"] or hashlib.sha256(data).hexdigest() != t["sha256"]:
            problems.append("%s: size or sha256 differs from the manifest" % t["path"])
        else:
            raw_ok += 1
        sc = expected.get(sidecar_of(p))
        try:
            doc = json.loads(sc) if sc is not None else None
            if not doc or doc.get("name") != t["name"] or doc.get("nbytes") != t["nbytes"]:
                problems.append("%s: sidecar does not describe the tensor" % t["path"])
        except ValueError as e:
            problems.append("%s: sidecar: %s" % (t["path"], e))
    hf = os.path.join(mnt, ".ckptfs", "hf")
    in_view = 0
    for p in sorted(expected):
        if os.path.dirname(p) == hf and p.endswith(".safetensors"):
            in_view += verify_view_shard(expected[p], by_name, problems, os.path.relpath(p, mnt))
        elif os.path.dirname(p) == hf and p.endswith(".index.json"):
            try:
                wm = json.loads(expected[p])["weight_map"]
                stray = [k for k in wm if k not in by_name]
                if stray:
                    problems.append("index names %r" % stray[:3])
            except (ValueError, KeyError) as e:
                problems.append("index: %s" % e)
    if in_view == 0:
        problems.append("the HF view holds no tensor")
    tap.ok(not problems,
           "%s: first reads of %d files: %d/%d tensors match the manifest, %d HF-view tensors "
           "verified" % (label, len(expected), raw_ok, len(tensors), in_view), problems[:20])
    return expected, dirs


# ---------------------------------------------------------------------------
# Phase 2: readers

def reader(seed, deadline, files, dirs, result_fd):
    rng = random.Random(seed)
    names = sorted(files)
    big = [p for p in names if len(files[p]) >= 65536]
    dir_names = sorted(dirs)
    stats = {"pread": 0, "mmap": 0, "stat": 0, "walk": 0, "bytes": 0, "mismatch": 0,
             "errors": 0}
    notes = []
    fds = {}

    def note(msg):
        if len(notes) < 10:
            notes.append(msg)

    def fd_of(p):
        if p not in fds or rng.random() < 0.1:  # reopen now and then: open/release traffic
            if p in fds:
                os.close(fds.pop(p))
            fds[p] = os.open(p, os.O_RDONLY)
        return fds[p]

    while time.monotonic() < deadline:
        r = rng.random()
        try:
            if r < 0.70:
                p = rng.choice(big) if big and rng.random() < 0.5 else rng.choice(names)
                want = files[p]
                size = len(want)
                fd = fd_of(p)
                if rng.random() < 0.5:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                kind = rng.random()
                if kind < 0.3:
                    length = rng.randint(1, 64)
                elif kind < 0.8:
                    length = rng.randint(1, 256 << 10)
                else:
                    length = rng.randint(1, 2 << 20)
                off = rng.randint(0, size + 16)
                got = os.pread(fd, length, off)
                stats["pread"] += 1
                stats["bytes"] += len(got)
                if got != want[off:off + length]:
                    stats["mismatch"] += 1
                    note("pread %s [%d, +%d): %d bytes differ from the verified copy"
                         % (p, off, length, len(got)))
            elif r < 0.80:
                p = rng.choice(big or names)
                want = files[p]
                if not want:
                    continue
                with open(p, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                    off = rng.randrange(len(want))
                    length = rng.randint(1, 1 << 20)
                    got = m[off:off + length]
                stats["mmap"] += 1
                stats["bytes"] += len(got)
                if got != want[off:off + length]:
                    stats["mismatch"] += 1
                    note("mmap %s [%d, +%d) differs" % (p, off, length))
            elif r < 0.92:
                p = rng.choice(names)
                st = os.stat(p)
                stats["stat"] += 1
                if st.st_size != len(files[p]):
                    stats["mismatch"] += 1
                    note("stat %s: size %d, read %d bytes" % (p, st.st_size, len(files[p])))
            else:
                d = rng.choice(dir_names)
                got = sorted(os.listdir(d))
                stats["walk"] += 1
                if got != dirs[d]:
                    stats["mismatch"] += 1
                    note("readdir %s: %r" % (d, got[:5]))
        except OSError as e:
            stats["errors"] += 1
            note("%s" % e)
    for fd in fds.values():
        os.close(fd)
    stats["notes"] = notes
    os.write(result_fd, (json.dumps(stats) + "\n").encode())


def run_readers(n, seconds, files, dirs):
    deadline = time.monotonic() + seconds
    rfd, wfd = os.pipe()
    pids = []
    for i in range(n):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                os.close(rfd)
                reader(1000 + i, deadline, files, dirs, wfd)
            except BaseException as e:  # a child must never return into the test
                try:
                    os.write(wfd, (json.dumps({"crash": repr(e)}) + "\n").encode())
                except OSError:
                    pass
                code = 1
            os._exit(code)
        pids.append(pid)
    os.close(wfd)
    out = read_to_eof(rfd)
    codes = []
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        codes.append(os.waitstatus_to_exitcode(status))
    results = [json.loads(line) for line in out.decode().splitlines() if line.strip()]
    return results, codes


def daemon_cpu(mnts):
    """CPU seconds used so far by the daemons serving mnts (a diagnostic: the readers must
    reach the daemons, not only the page cache)."""
    want = {os.fsencode(m) for m in mnts}
    ticks = 0
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % d, "rb") as f:
                if not want.intersection(f.read().split(b"\0")):
                    continue
            with open("/proc/%s/stat" % d, "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            continue
    return ticks / os.sysconf("SC_CLK_TCK")


def main():
    ckptfs = os.environ.get("CKPTFS", "")
    fixtures = os.environ.get("FIXTURES", "")
    reason = skip_reason(ckptfs, fixtures)
    if reason:
        print("1..0 # SKIP " + reason)
        return 0
    seconds = float(os.environ.get("STRESS_SECONDS", "15"))
    readers = int(os.environ.get("STRESS_READERS", "8"))
    ckptfs, fixtures = os.path.abspath(ckptfs), os.path.abspath(fixtures)
    sys.stdout.reconfigure(encoding="utf-8", errors="backslashreplace")
    tap = Tap()

    mounted = []  # (label, mnt)
    files, dirs = {}, {}
    dogs = []
    try:
        for label, case, opts in MOUNTS:
            case_dir = os.path.join(fixtures, case)
            try:
                with open(os.path.join(case_dir, "manifest.json"), encoding="utf-8") as f:
                    manifest = json.load(f)
            except OSError as e:
                tap.ok(False, "%s: manifest" % label, [str(e)])
                continue
            mnt = tempfile.mkdtemp(prefix="ckptfs-t50.")
            rc, _, err = run_capture([ckptfs, source_of(case_dir, manifest), mnt] + opts,
                                     MOUNT_TIMEOUT)
            ok = rc == 0 and is_mounted(mnt)
            tap.ok(ok, "%s: mount %s" % (label, " ".join([case] + opts)),
                   ["exit status %r" % rc, err.decode("utf-8", "replace").strip()])
            if not ok:
                os.rmdir(mnt)
                continue
            mounted.append((label, mnt))
            dog = Watchdog(mnt, seconds + 180)
            dog.__enter__()
            dogs.append(dog)
            f_exp, d_exp = load_mount(tap, label, mnt, manifest["tensors"])
            files.update(f_exp)
            dirs.update(d_exp)

        if files:
            cpu0 = daemon_cpu([m for _, m in mounted])
            results, codes = run_readers(readers, seconds, files, dirs)
            cpu = daemon_cpu([m for _, m in mounted]) - cpu0
            total = {"pread": 0, "mmap": 0, "stat": 0, "walk": 0, "bytes": 0, "mismatch": 0,
                     "errors": 0}
            notes = []
            for r in results:
                if "crash" in r:
                    notes.append("reader crashed: " + r["crash"])
                    continue
                for k in total:
                    total[k] += r[k]
                notes += r["notes"]
            tap.diag("%d readers, %.0f s: %d preads, %d mmap slices, %d stats, %d readdirs, "
                     "%.1f MiB compared, %d mismatches, %d errors; daemons used %.1f CPU s"
                     % (readers, seconds, total["pread"], total["mmap"], total["stat"],
                        total["walk"], total["bytes"] / 1048576.0, total["mismatch"],
                        total["errors"], cpu))
            tap.ok(len(results) == readers and all(c == 0 for c in codes),
                   "%d reader processes ran to the end" % readers,
                   ["exit codes %r, %d reports" % (codes, len(results))] + notes[:5])
            tap.ok(total["pread"] > 0 and total["mismatch"] == 0,
                   "stress: %d reads of %.1f MiB, every byte equal to the verified copy"
                   % (total["pread"] + total["mmap"], total["bytes"] / 1048576.0), notes[:20])
            tap.ok(total["errors"] == 0, "stress: no read, stat or readdir failed", notes[:20])

        for label, mnt in mounted:
            problems = []
            try:
                json.loads(read_all(os.path.join(mnt, ".ckptfs", "summary.json")))
            except (OSError, ValueError) as e:
                problems.append(str(e))
            tap.ok(not problems and is_mounted(mnt), "%s: daemon still answers" % label,
                   problems)
    finally:
        for dog in dogs:
            dog.__exit__(None, None, None)
        fired = [d for d in dogs if d.fired]
        if fired:
            tap.ok(False, "stress finished before the watchdog", ["a mount was aborted"])
        for label, mnt in mounted:
            tap.ok(unmount(mnt), "%s: fusermount3 -u" % label)
    tap.done()
    return 1 if tap.failed else 0


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(main())
