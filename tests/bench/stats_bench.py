#!/usr/bin/python3
"""ckptfs stats and diff over a 4 GiB BF16 checkpoint (targets: stats >= 3x faster than numpy,
RSS < 64 MiB; diff of the checkpoint with itself < 1 s).

usage: stats_bench.py CKPTFS OUTDIR [--gib N] [--runs N]        (`make bench` calls this)

The checkpoint (OUTDIR/stats-data/bf16.safetensors: 32 layers x 4 tensors of BF16, normal
values with a few NaN and Inf) is written once and cached; each run reads it from the page cache
(a warm-up pass first), so the figures compare computation, not the disk.

  ckptfs   `ckptfs stats --json FILE`: wall time and peak RSS (getrusage of the child)
  cpu      user+sys seconds of each side: the fair comparison when other work shares the CPUs
  numpy    the same figures per tensor with numpy in this process: memory-mapped bytes in
           chunks of 64 Mi elements, BF16 -> float32 by a shift, float64 sums (np.sum is
           pairwise) of values and squares, min/max/absmax and NaN/Inf/zero counts over the
           finite values, then mean, std (from sum and sum of squares) and L2 norm; one
           thread, as numpy reductions run
  agree    the two results agree (counts exactly, min/max exactly, mean/L2 to 1e-9 relative)
  diff     `ckptfs diff FILE FILE`: every tensor on the fast path (same file, same bytes)

Prints a table and writes OUTDIR/bench-stats.json. Exit status 0, or 1 when a command failed
or the results disagree; a missed target alone does not fail the run.
"""

import argparse
import json
import os
import resource
import struct
import subprocess
import sys
import threading
import time

import numpy as np

LAYERS, PER_LAYER = 32, 4
CHUNK = 64 << 20


def write_checkpoint(path, gib):
    n_tensors = LAYERS * PER_LAYER
    numel = (gib << 30) // 2 // n_tensors
    rows = numel // 4096
    numel = rows * 4096
    names = ["model.layers.%d.%s.weight" % (i, k) for i in range(LAYERS)
             for k in ("self_attn.q_proj", "self_attn.o_proj", "mlp.up_proj", "mlp.down_proj")]
    header, off = {}, 0
    for nm in names:
        header[nm] = {"dtype": "BF16", "shape": [rows, 4096], "data_offsets": [off, off + 2 * numel]}
        off += 2 * numel
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    rng = np.random.default_rng(7)
    tmp = path + ".partial"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        base = (rng.standard_normal(1 << 22).astype(np.float32) * 0.02).view(np.uint32)
        for i, nm in enumerate(names):
            done = 0
            while done < numel:
                n = min(numel - done, base.size)
                chunk = (np.roll(base, i * 7919 + done)[:n] >> 16).astype(np.uint16)
                if done == 0 and i % 17 == 3:
                    chunk[:3] = [0x7FC0, 0x7F80, 0xFF80]  # NaN, +Inf, -Inf
                f.write(chunk.tobytes())
                done += n
    os.replace(tmp, path)


def numpy_stats(path):
    with open(path, "rb") as f:
        hlen = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(hlen))
    mm = np.memmap(path, np.uint16, "r", offset=8 + hlen)
    out = {}
    for name, t in header.items():
        a, b = (x // 2 for x in t["data_offsets"])
        n = fin = nan = pinf = ninf = zeros = 0
        s = ss = 0.0
        lo, hi = np.inf, -np.inf
        for c in range(a, b, CHUNK):
            v = (mm[c:min(b, c + CHUNK)].astype(np.uint32) << 16).view(np.float32)
            finite = np.isfinite(v)
            n += v.size
            nan += int(np.isnan(v).sum())
            pinf += int(np.isposinf(v).sum())
            ninf += int(np.isneginf(v).sum())
            x = v[finite].astype(np.float64)
            fin += x.size
            zeros += int((x == 0).sum())
            s += float(x.sum())
            ss += float(np.dot(x, x))
            if x.size:
                lo, hi = min(lo, float(x.min())), max(hi, float(x.max()))
        mean = s / fin
        out[name] = {"count": n, "finite": fin, "nan": nan, "posinf": pinf, "neginf": ninf,
                     "zeros": zeros, "min": lo, "max": hi, "absmax": max(-lo, hi), "mean": mean,
                     "std": max(ss / fin - mean * mean, 0) ** 0.5, "l2norm": ss ** 0.5}
    return out


def run_child(argv):
    """(process, wall s, peak RSS MiB, cpu s). The peak is VmHWM of /proc/PID/status, read
    until the process exits: getrusage's maxrss would count the memory of this Python process,
    which a forked child holds until it execs."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, hwm = [], 0
    reader = threading.Thread(target=lambda: out.append(p.communicate()))
    reader.start()
    while reader.is_alive():
        try:
            with open("/proc/%d/status" % p.pid) as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        hwm = max(hwm, int(line.split()[1]))
        except OSError:
            pass
        time.sleep(0.005)
    reader.join()
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    p.stdout_data, p.stderr_data = out[0]
    return p, wall, hwm / 1024.0, (after.ru_utime + after.ru_stime) - (
        before.ru_utime + before.ru_stime)


def agree(got, want):
    bad = []
    for name, w in want.items():
        g = got.get(name, {})
        for k in ("count", "finite", "nan", "posinf", "neginf", "zeros", "min", "max", "absmax"):
            if g.get(k) != w[k]:
                bad.append("%s %s: %r vs %r" % (name, k, g.get(k), w[k]))
        for k in ("mean", "l2norm", "std"):
            if abs(g.get(k, 0) - w[k]) > 1e-9 * max(abs(w[k]), 1e-12) + (1e-12 if k == "mean" else 0):
                bad.append("%s %s: %r vs %r" % (name, k, g.get(k), w[k]))
    return bad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ckptfs")
    ap.add_argument("outdir")
    ap.add_argument("--gib", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    data = os.path.join(a.outdir, "stats-data")
    os.makedirs(data, exist_ok=True)
    path = os.path.join(data, "bf16-%dg.safetensors" % a.gib)
    if not os.path.exists(path):
        print("writing %s (%d GiB BF16) ..." % (path, a.gib), flush=True)
        write_checkpoint(path, a.gib)
    size = os.path.getsize(path)
    with open(path, "rb") as f:  # warm the page cache
        while f.read(64 << 20):
            pass

    status = 0
    ck_times, rss, cpu = [], [], []
    result = None
    for _ in range(a.runs):
        p, wall, maxrss, c = run_child([a.ckptfs, "stats", "--json", path])
        if p.returncode != 0:
            print("ckptfs stats failed: %s" % p.stderr_data.decode()[-500:])
            return 1
        ck_times.append(wall)
        rss.append(maxrss)
        cpu.append(c)
        result = {t["name"]: t for t in json.loads(p.stdout_data)["tensors"]}
    np_times, np_cpu = [], []
    want = None
    for _ in range(max(1, a.runs - 1)):
        t0, c0 = time.monotonic(), time.process_time()
        want = numpy_stats(path)
        np_times.append(time.monotonic() - t0)
        np_cpu.append(time.process_time() - c0)
    bad = agree(result, want)
    if bad:
        status = 1
    diff_times = []
    for _ in range(a.runs):
        p, wall, _, _ = run_child([a.ckptfs, "diff", path, path])
        diff_times.append(wall)
        if p.returncode != 0 or b"not read" not in p.stdout_data:
            print("ckptfs diff failed: %d %s" % (p.returncode, p.stderr_data.decode()[-300:]))
            status = 1
    ck, npy, df = min(ck_times), min(np_times), min(diff_times)
    gib = size / float(1 << 30)
    print("stats over %.2f GiB BF16 (%d tensors), %d CPUs" % (gib, len(want), os.cpu_count()))
    print("  ckptfs stats  %7.2f s  %6.2f GiB/s  cpu %6.2f s  peak RSS %5.1f MiB  (target < 64)"
          % (ck, gib / ck, min(cpu), max(rss), ))
    print("  numpy         %7.2f s  %6.2f GiB/s  cpu %6.2f s" % (npy, gib / npy, min(np_cpu)))
    print("  ratio         %7.2fx  (target >= 3x)  %s" % (npy / ck, "PASS" if npy / ck >= 3 else
                                                          "MISS"))
    print("  cpu ratio     %7.2fx  (numpy cpu / ckptfs cpu: the figure to trust on a busy machine)"
          % (min(np_cpu) / min(cpu)))
    print("  agree         %s" % ("yes" if not bad else "NO: " + "; ".join(bad[:5])))
    print("  diff A A      %7.3f s  (target < 1 s)  %s" % (df, "PASS" if df < 1 else "MISS"))
    with open(os.path.join(a.outdir, "bench-stats.json"), "w") as f:
        json.dump({"bytes": size, "ckptfs_s": ck_times, "ckptfs_cpu_s": cpu, "ckptfs_rss_mib": rss,
                   "numpy_s": np_times, "numpy_cpu_s": np_cpu, "ratio": npy / ck, "agree": not bad,
                   "diff_same_s": diff_times}, f, indent=1)
    return status


if __name__ == "__main__":
    sys.exit(main())
