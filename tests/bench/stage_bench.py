#!/usr/bin/python3
"""Bench of the staging mount: packing a checkpoint through `ckptfs stage` against a plain copy.

  (a) stage   `cp -r` of a raw tree (tensor files + .json sidecars) into a staging mount, then
              `ckptfs commit`. The tensor files land in the spool's pack as they are copied;
              the commit writes the header in front, fsyncs and links the pack as
              OUT.safetensors. Timed from the start of cp to the return of commit. Not timed:
              mounting the stage, the unmount, removing the spool.
  commit      the `ckptfs commit` part of (a) alone.
  (b) cp      `cp -r` of the same tree to a directory on the same disk, then `sync -f` on it,
              so that both (a) and (b) end with the bytes durable on disk.

Source: SIZE (default 2 GiB) of random bytes as a few large F32 tensors, kept as a raw tree in
OUTDIR/stage-data/src (made once, reused). OUT, the spool and the copy live beside it, on the
same file system. Before every timed step everything dirty is synced; with a cold source its
pages are evicted from the page cache (posix_fadvise DONTNEED), so that both (a) and (b) read
it from the disk; a warm source stays in the page cache. Both are measured (COLD=1 or COLD=0
runs one of them).

throughput ratio = median (b) / median (a): 1.0 means packing through the stage is as fast as
copying the bytes; the target is >= 0.9, warm and cold. OUT's tensors are hashed once against
the source.

variants (warm, in the same rounds, against the same (b)): the stage with -o max_threads=1
(faster than the default 8 only under heavy load, before the pack's writes were answered
first), and an HF directory OUT/ of 1 GiB shards made of packs. The order of the steps
turns by one each round: with it fixed, the step after cp + sync (the default) was the
slowest, which once made the HF directory look faster than the single file.

commit scaling: `ckptfs commit` alone after cp -r of 1, 2 and 4 GiB (SCALE_MIB=1024,2048,4096;
warm): its time should not grow with the data (flat), since the bytes are in place already.

commit after --from: OUT/ an HF directory of shards of one tensor each, staged --from itself,
one tensor copied over, then `ckptfs commit`: its seconds and the bytes the daemon wrote
(/proc/PID/io write_bytes). Unchanged shards are linked, so it should cost about one header;
CKPTFS_BEFORE=path runs another ckptfs (an older build) in the same rounds for comparison.

usage: stage_bench.py CKPTFS OUTDIR     (env RUNS=3, SIZE_MIB=2048, COLD=both, SCALE_MIB=...,
                                        CKPTFS_BEFORE=)
Writes OUTDIR/bench-stage.json and prints a table. Needs 5 x SIZE free (source, spool, OUT,
copy, the --from OUT/ kept for the commit after --from); with less than 8 GiB free it uses a
smaller size and says so.
"""
import hashlib
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

RUNS = int(os.environ.get("RUNS", "3"))
COLD_MODES = {"1": [True], "0": [False]}.get(os.environ.get("COLD", ""), [False, True])
SCALE_MIB = [int(x) for x in os.environ.get("SCALE_MIB", "1024,2048,4096").split(",") if x]
TARGET = 0.9
MiB = 1 << 20
TENSOR_MIB = 512  # each tensor: [TENSOR_MIB * 256, 1024] F32
SEED = 20261121


def tensor_layout(total_mib):
    """[(name, shape, nbytes)]: tensors of TENSOR_MIB (the last one may be smaller)."""
    out, left, i = [], total_mib, 0
    while left > 0:
        mib = min(TENSOR_MIB, left)
        out.append(("model.layers.%d.mlp.weight" % i, [mib * 256, 1024], mib * MiB))
        left -= mib
        i += 1
    return out


def make_source(src, total_mib):
    """The raw tree as a staging mount takes it; returns {name: sha256}. Reused when present."""
    manifest_path = os.path.join(src, "manifest.json")
    layout = tensor_layout(total_mib)
    try:
        with open(manifest_path) as f:
            m = json.load(f)
        if m["seed"] == SEED and m["size_mib"] == total_mib and all(
                os.path.getsize(os.path.join(src, *n.split("."))) == b for n, _, b in layout):
            return m["sha256"]
    except (OSError, ValueError, KeyError):
        pass
    shutil.rmtree(src, ignore_errors=True)
    rng = np.random.default_rng(SEED)
    digests = {}
    for name, shape, nbytes in layout:
        path = os.path.join(src, *name.split("."))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        h = hashlib.sha256()
        with open(path, "wb") as f:
            for _ in range(nbytes // (64 * MiB)):
                chunk = rng.bytes(64 * MiB)
                h.update(chunk)
                f.write(chunk)
        with open(path + ".json", "w") as f:
            json.dump({"dtype": "F32", "shape": shape}, f)
        digests[name] = h.hexdigest()
    with open(manifest_path, "w") as f:
        json.dump({"seed": SEED, "size_mib": total_mib, "sha256": digests}, f, indent=1)
    return digests


def settle(src, cold):
    """Nothing dirty left from an earlier step; cold: the source is not in the page cache."""
    subprocess.run(["sync"], check=True)
    if not cold:
        return
    for d, _, files in os.walk(src):
        for n in files:
            fd = os.open(os.path.join(d, n), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def warm_up(src):
    """Reads the source once: a warm source is in the page cache before the first round too
    (where the kernel pages out what was idle for a minute, as DAMON did on the VM this was
    measured on, ~10% of it was gone after a pause)."""
    for d, _, files in os.walk(src):
        for n in files:
            with open(os.path.join(d, n), "rb") as f:
                while f.read(64 * MiB):
                    pass


def run(argv, timeout=900):
    p = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError("%s: exit %d: %s" % (" ".join(argv), p.returncode,
                                                p.stderr.decode(errors="replace").strip()))
    return p


def is_mounted(mnt):
    target = os.path.realpath(mnt)
    with open("/proc/mounts") as f:
        return any(line.split()[1] == target for line in f)


def wait_gone(spool, seconds=120):
    """The daemon removes its spool after the unmount once OUT holds everything."""
    end = time.time() + seconds
    while os.path.exists(spool) and time.time() < end:
        time.sleep(0.05)


def bench_stage(ckptfs, src, work, cold, extra=(), directory=False):
    """One run of (a): returns (total seconds, cp seconds, commit seconds, OUT path)."""
    out = os.path.join(work, "out" if directory else "out.safetensors")
    spool = os.path.join(work, ".out.stage" if directory else ".out.safetensors.stage")
    for p in (out, spool):
        if os.path.isdir(p):
            shutil.rmtree(p)
        elif os.path.exists(p):
            os.unlink(p)
    mnt = tempfile.mkdtemp(prefix="ckptfs-stage-bench.")
    try:
        run([ckptfs, "stage", out + ("/" if directory else ""), mnt] + list(extra))
        settle(src, cold)
        t0 = time.perf_counter()
        run(["cp", "-r", os.path.join(src, "model"), mnt + "/"])
        t1 = time.perf_counter()
        run([ckptfs, "commit", mnt])
        t2 = time.perf_counter()
    finally:
        if is_mounted(mnt):
            subprocess.run(["fusermount3", "-u", mnt], timeout=300)
        wait_gone(spool)
        os.rmdir(mnt)
    return t2 - t0, t1 - t0, t2 - t1, out


def daemon_write_bytes(spool):
    with open(os.path.join(spool, "lock")) as f:
        pid = int(f.read().split()[0])
    with open("/proc/%d/io" % pid) as f:
        return next(int(l.split()[1]) for l in f if l.startswith("write_bytes:"))


def from_commit_runs(binaries, src, work):
    """RUNS of a commit after --from OUT/ with one tensor copied over, for each binary in
    the same rounds: {binary: {"seconds": summary, "written": summary}}."""
    shard = "-o", "max_shard_size=%dMiB" % TENSOR_MIB
    base = os.path.join(work, "from-base")
    if not os.path.isdir(base):  # OUT/ made once by the stage itself, then hard-linked
        mnt = tempfile.mkdtemp(prefix="ckptfs-stage-bench.")
        try:
            run([binaries[0], "stage", base + "/", mnt] + list(shard))
            run(["cp", "-r", os.path.join(src, "model"), mnt + "/"])
            run([binaries[0], "commit", mnt])
        finally:
            subprocess.run(["fusermount3", "-u", mnt], timeout=300)
            wait_gone(os.path.join(work, ".from-base.stage"))
            os.rmdir(mnt)
    victim = os.path.join("model", "layers", "0", "mlp", "weight")
    res = {b: {"seconds": [], "written": []} for b in binaries}
    out = os.path.join(work, "from-out")
    spool = os.path.join(work, ".from-out.stage")
    for r in range(RUNS):
        for b in binaries:
            shutil.rmtree(out, ignore_errors=True)
            run(["cp", "-al", base, out])  # the stage never writes into OUT's files
            mnt = tempfile.mkdtemp(prefix="ckptfs-stage-bench.")
            try:
                run([b, "stage", out + "/", mnt, "--from", out + "/"] + list(shard))
                run(["cp", os.path.join(src, victim), os.path.join(mnt, victim)])
                subprocess.run(["sync"], check=True)
                w0 = daemon_write_bytes(spool)
                t0 = time.perf_counter()
                run([b, "commit", mnt])
                res[b]["seconds"].append(time.perf_counter() - t0)
                res[b]["written"].append(daemon_write_bytes(spool) - w0)
            finally:
                subprocess.run(["fusermount3", "-u", mnt], timeout=300)
                wait_gone(spool)
                os.rmdir(mnt)
            print("commit after --from, run %d, %s: %.3f s, %d bytes written" % (
                r + 1, b, res[b]["seconds"][-1], res[b]["written"][-1]))
    shutil.rmtree(out, ignore_errors=True)
    return {b: {k: summary(v) for k, v in d.items()} for b, d in res.items()}


def remove_out(out):
    if os.path.isdir(out):
        shutil.rmtree(out)
    else:
        os.unlink(out)


def bench_copy(src, work, cold):
    """One run of (b): cp -r to the same disk, then sync -f."""
    dst = os.path.join(work, "copy")
    shutil.rmtree(dst, ignore_errors=True)
    os.makedirs(dst)
    settle(src, cold)
    t0 = time.perf_counter()
    run(["cp", "-r", os.path.join(src, "model"), dst + "/"])
    run(["sync", "-f", dst])
    t1 = time.perf_counter()
    shutil.rmtree(dst)
    return t1 - t0


def check_file(path, expect, problems, want_names=True):
    """Tensors of one safetensors file against expect (sha256 by name); returns their names."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        base = 8 + n
        names = sorted(set(header) - {"__metadata__"})
        for name in names:
            e = header[name]
            if name not in expect:
                problems.append("%s: not in the source" % name)
                continue
            a, b = e["data_offsets"]
            f.seek(base + a)
            h, left = hashlib.sha256(), b - a
            while left:
                chunk = f.read(min(left, 64 * MiB))
                if not chunk:
                    break
                h.update(chunk)
                left -= len(chunk)
            if left or h.hexdigest() != expect[name]:
                problems.append("%s: sha256 differs" % name)
    return names


def check_out(out, expect):
    """Problems found reading OUT (a file, or an HF directory of shards + index) as a strict
    safetensors reader would."""
    problems, seen = [], []
    if os.path.isdir(out):
        index = os.path.join(out, "model.safetensors.index.json")
        shards = (sorted(set(json.load(open(index))["weight_map"].values()))
                  if os.path.exists(index) else ["model.safetensors"])
        for shard in shards:
            seen += check_file(os.path.join(out, shard), expect, problems)
    else:
        seen = check_file(out, expect, problems)
    problems += ["%s: missing" % name for name in sorted(set(expect) - set(seen))]
    return problems


def summary(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "runs": xs}


# What else is measured against the same cp + sync runs (warm source): the levers tried for
# the write path, kept or not (see ckptfs(1) STAGING and the stage's max_threads default).
VARIANTS = [
    ("default", (), False),
    ("max_threads=1 (for busy machines)", ("-o", "max_threads=1"), False),
    ("HF directory OUT/, 1 GiB shards", ("-o", "max_shard_size=1GiB"), True),
]


def ratio_runs(ckptfs, src, work, expect, cold):
    """RUNS of (a) and (b) alternating; the figures of one source temperature. Warm: the
    variants too, each in every round, so every ratio comes from the same run. The order
    within a round turns by one each round: a step's time depends on the one before it (what
    it left to free, write back or discard: on the VM this was measured on, the step right
    after cp + sync ran slowest), so every step takes every place in turn."""
    variants = VARIANTS if not cold else VARIANTS[:1]
    totals = {v[0]: [] for v in variants}
    stage_cp, commit, plain = [], [], []
    problems, checked = None, set()
    steps = list(variants) + [None]  # None: (b)
    if not cold:
        warm_up(src)
    for r in range(RUNS):
        for step in steps[r % len(steps):] + steps[:r % len(steps)]:
            if step is None:
                plain.append(bench_copy(src, work, cold))
                print("%s run %d: cp+sync %.2f s" % ("cold" if cold else "warm", r + 1,
                                                     plain[-1]))
                continue
            name, extra, directory = step
            total, cp_s, commit_s, out = bench_stage(ckptfs, src, work, cold, extra, directory)
            totals[name].append(total)
            if name == "default":
                stage_cp.append(cp_s)
                commit.append(commit_s)
            if name not in checked:
                checked.add(name)
                problems = (problems or []) + check_out(out, expect)
            remove_out(out)
            print("%s run %d, %s: stage cp+commit %.2f s (cp %.2f, commit %.2f)" % (
                "cold" if cold else "warm", r + 1, name, total, cp_s, commit_s))
    ratio = statistics.median(plain) / statistics.median(totals["default"])
    return {
        "seconds": {
            "stage_cp_commit": summary(totals["default"]),
            "stage_cp": summary(stage_cp),
            "commit": summary(commit),
            "cp_sync": summary(plain),
        },
        "throughput_ratio": ratio,
        "meets_target": ratio >= TARGET,
        "variants": {name: {"stage_cp_commit": summary(totals[name]),
                            "throughput_ratio": statistics.median(plain) /
                            statistics.median(totals[name])}
                     for name in totals},
    }, problems


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: stage_bench.py CKPTFS OUTDIR")
    ckptfs, outdir = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    work = os.path.join(outdir, "stage-data")
    os.makedirs(work, exist_ok=True)
    src = os.path.join(work, "src")
    notes = []

    size_mib = int(os.environ.get("SIZE_MIB", "2048"))
    have_src = os.path.isdir(src) and sum(
        os.path.getsize(os.path.join(d, n)) for d, _, fs in os.walk(src) for n in fs)
    free = shutil.disk_usage(work).free + (have_src or 0)
    if free < 8 << 30:
        # source, spool, OUT and the copy: four times the size must fit, with room to spare
        size_mib = max(64, min(size_mib, int(free * 0.8 / 4 / MiB) // 64 * 64))
        notes.append("only %.1f GiB free on %s: size reduced to %d MiB" % (free / (1 << 30), work,
                                                                          size_mib))
    nbytes = size_mib * MiB
    print("stage bench: %d MiB in %d tensors, %d runs, %s source, data in %s" % (
        size_mib, len(tensor_layout(size_mib)), RUNS,
        " and ".join("cold" if c else "warm" for c in COLD_MODES), work))
    for n in notes:
        print("note: " + n)
    expect = make_source(src, size_mib)

    load_before = os.getloadavg()[0]
    by_mode, problems = {}, None
    for cold in COLD_MODES:
        res, p = ratio_runs(ckptfs, src, work, expect, cold)
        by_mode["cold" if cold else "warm"] = res
        problems = problems if problems is not None else p

    # commit time against the size of what was copied in (warm source: only the commit counts)
    scale = []
    for mib in SCALE_MIB:
        if free < 3 * mib * MiB + (1 << 30):
            notes.append("commit scaling: %d MiB skipped (not enough free space)" % mib)
            continue
        ssrc = os.path.join(work, "src-%d" % mib) if mib != size_mib else src
        sexp = make_source(ssrc, mib) if mib != size_mib else expect
        secs = []
        for r in range(RUNS):
            _, _, commit_s, out = bench_stage(ckptfs, ssrc, work, False)
            if r == 0:
                problems = (problems or []) + check_out(out, sexp)
            remove_out(out)
            secs.append(commit_s)
        scale.append({"mib": mib, "commit_seconds": summary(secs)})
        print("commit after cp -r of %d MiB: %.3f s (median of %d)" % (
            mib, statistics.median(secs), RUNS))
        if ssrc != src:
            shutil.rmtree(ssrc, ignore_errors=True)

    binaries = [ckptfs] + ([os.path.abspath(os.environ["CKPTFS_BEFORE"])]
                           if os.environ.get("CKPTFS_BEFORE") else [])
    from_commit = from_commit_runs(binaries, src, work)

    results = {
        "bytes": nbytes,
        "tensors": len(expect),
        "runs": RUNS,
        "loadavg_1min": {"before": load_before, "after": os.getloadavg()[0]},
        "notes": notes,
        "included": {
            "stage_cp_commit": "cp -r of raw files + sidecars into the staging mount, then "
                               "ckptfs commit (validate, header into the pack, fsync, link "
                               "as OUT, fsync the directory); mount, unmount and spool "
                               "removal excluded",
            "stage_cp": "the cp -r part of stage_cp_commit",
            "commit": "the ckptfs commit part of stage_cp_commit",
            "cp_sync": "cp -r of the same files to a directory on the same disk, then sync -f",
        },
        "by_source": by_mode,
        "target_ratio": TARGET,
        "commit_scaling": scale,
        "commit_after_from": {"what": "OUT/ of %d shards of one %d MiB tensor, staged --from "
                                      "itself, one tensor copied over" % (len(expect), TENSOR_MIB),
                              "by_binary": from_commit},
        "out_sha256_ok": not problems,
        "out_problems": problems,
    }
    results["meets_target"] = all(m["meets_target"] for m in by_mode.values())
    path = os.path.join(outdir, "bench-stage.json")
    with open(path, "w") as f:
        json.dump(results, f, indent=2)

    print()
    for mode, res in by_mode.items():
        print("%s source:" % mode)
        print("%-34s %9s %17s %9s" % ("", "median s", "min-max s", "MB/s"))
        for key, label in (("stage_cp_commit", "(a) stage: cp -r + ckptfs commit"),
                           ("stage_cp", "    cp -r into the stage"),
                           ("commit", "    ckptfs commit"),
                           ("cp_sync", "(b) cp -r + sync -f")):
            s = res["seconds"][key]
            print("%-34s %9.2f %8.2f-%-8.2f %9.0f" % (label, s["median"], s["min"], s["max"],
                                                     nbytes / 1e6 / s["median"]))
        print("throughput ratio (b)/(a): %.2fx (target >= %.1fx)%s" % (
            res["throughput_ratio"], TARGET, "" if res["meets_target"] else "  BELOW TARGET"))
        for name, v in res["variants"].items():
            if name != "default":
                print("  %-40s %.2fx" % (name, v["throughput_ratio"]))
    for row in scale:
        print("commit alone after %5d MiB: %.3f s" % (row["mib"], row["commit_seconds"]["median"]))
    for b, v in from_commit.items():
        print("commit after --from OUT/, one of %d shards changed (%s): %.3f s, %.1f MB written"
              % (len(expect), b, v["seconds"]["median"], v["written"]["median"] / 1e6))
    print("OUT's tensors: %s" % ("sha256 match the source" if not problems
                                 else "; ".join(problems[:5])))
    print("load average (1 min) %.2f before, %.2f after: other work on the machine skews the "
          "figures" % (results["loadavg_1min"]["before"], results["loadavg_1min"]["after"]))
    print("wrote " + path)
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
