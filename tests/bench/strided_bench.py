#!/usr/bin/python3
"""A strided tensor (a transposed view saved by torch.save) against its contiguous copy in the
same file, read through ckptfs.

usage: strided_bench.py CKPTFS OUTDIR [--runs N] [--side S]   (`make bench` calls it)

torch.save({"transposed": x.t(), "contiguous": x.t().contiguous()}) with x an F32 S x S matrix
(default 4096: 64 MiB per tensor) of random values is written once under OUTDIR/strided-data/
(real torch, /usr/bin/python3). Then RUNS times (default 5), on a fresh mount each (the mount's
page cache cold, the .pt file warm in the page cache): `dd bs=1M` of the file of each tensor,
first read, MB/s. Medians, the ratio transposed/contiguous (the target is >= 0.5) and every
run's figures go to OUTDIR/bench-strided.json, a bar chart to OUTDIR/bench-strided.png. Each
timed read is hashed afterwards (untimed) and must be numpy's row-major copy of x.T: wrong bytes
stop the bench with a failure.
"""

import argparse
import datetime
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
from ckptfs_test import is_mounted, run_capture, unmount  # noqa: E402

DATA_VERSION = 1
NAMES = ("transposed", "contiguous")


def make_data(d, side):
    pt = os.path.join(d, "strided.pt")
    info_path = os.path.join(d, "info.json")
    if os.path.exists(info_path) and os.path.exists(pt):
        with open(info_path) as f:
            info = json.load(f)
        if info.get("side") == side and info.get("version") == DATA_VERSION:
            return pt, info
    os.makedirs(d, exist_ok=True)
    code = ("import sys, torch, hashlib\n"
            "torch.manual_seed(0)\n"
            "x = torch.randn(%d, %d)\n"
            "torch.save({'transposed': x.t(), 'contiguous': x.t().contiguous()}, sys.argv[1])\n"
            "print(hashlib.sha256(x.t().contiguous().numpy().tobytes()).hexdigest())\n" % (side, side))
    r = subprocess.run(["/usr/bin/python3", "-c", code, pt + ".tmp"], capture_output=True,
                       text=True, timeout=600)
    if r.returncode != 0:
        sys.exit("strided_bench: torch.save failed: " + r.stderr[-400:])
    os.rename(pt + ".tmp", pt)
    info = {"side": side, "version": DATA_VERSION, "bytes": side * side * 4,
            "sha256": r.stdout.strip()}
    with open(info_path, "w") as f:
        json.dump(info, f)
    return pt, info


def read_once(ckptfs, pt, name, size, want_sha):
    mnt = tempfile.mkdtemp(prefix="ckptfs-sbench.")
    try:
        rc, _, err = run_capture([ckptfs, pt, mnt], 120)
        if rc != 0 or not is_mounted(mnt):
            sys.exit("strided_bench: mounting %s failed: %s" % (pt, err.decode(errors="replace")))
        path = os.path.join(mnt, name)
        if os.path.getsize(path) != size:
            sys.exit("strided_bench: FAIL, %s has %d bytes, not %d" % (path, os.path.getsize(path), size))
        start = time.monotonic()
        subprocess.run(["dd", "if=" + path, "of=/dev/null", "bs=1M"], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        rate = size / (time.monotonic() - start) / 1e6
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 22), b""):
                h.update(chunk)
        if h.hexdigest() != want_sha:
            sys.exit("strided_bench: FAIL, the timed read of %s returned wrong bytes" % path)
        return rate
    finally:
        unmount(mnt)


def plot(doc, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        print("strided bench: no matplotlib (%s); %s not written" % (e, path), file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for i, name in enumerate(NAMES):
        vals = doc["every_run"][name]
        m = statistics.median(vals)
        ax.bar(i, m, color=("#d62728", "#555555")[i], yerr=[[m - min(vals)], [max(vals) - m]],
               capsize=3)
        ax.text(i, m, "%.0f" % m, ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(NAMES)))
    ax.set_xticklabels(NAMES)
    ax.set_ylabel("MB/s, dd bs=1M, first read")
    ax.set_title("F32 %dx%d transposed view vs its contiguous copy: %.2fx (median of %d)"
                 % (doc["side"], doc["side"], doc["ratio_transposed_over_contiguous"],
                    doc["runs"]), fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ckptfs")
    ap.add_argument("outdir")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--side", type=int, default=4096)
    a = ap.parse_args()
    ckptfs = os.path.abspath(a.ckptfs)
    os.makedirs(a.outdir, exist_ok=True)
    pt, info = make_data(os.path.join(a.outdir, "strided-data"), a.side)
    subprocess.run(["cat", pt], stdout=subprocess.DEVNULL, check=True)
    runs = {name: [] for name in NAMES}
    for _ in range(a.runs):
        for name in NAMES:
            runs[name].append(round(read_once(ckptfs, pt, name, info["bytes"], info["sha256"]), 1))
    med = {name: statistics.median(v) for name, v in runs.items()}
    doc = {"when": datetime.datetime.now().isoformat(timespec="seconds"), "side": a.side,
           "tensor_bytes": info["bytes"], "runs": a.runs, "cpus": os.cpu_count(),
           "loadavg": os.getloadavg(), "median_mb_s": med,
           "ratio_transposed_over_contiguous": round(med["transposed"] / med["contiguous"], 4),
           "every_run": runs}
    with open(os.path.join(a.outdir, "bench-strided.json"), "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    plot(doc, os.path.join(a.outdir, "bench-strided.png"))
    print("strided bench: F32 %dx%d, dd bs=1M first read, median of %d" % (a.side, a.side, a.runs))
    for name in NAMES:
        print("%-12s %8.0f MB/s   %s" % (name, med[name], " ".join("%.0f" % x for x in runs[name])))
    print("transposed/contiguous %.3f" % doc["ratio_transposed_over_contiguous"])
    print("every timed read was hashed: numpy's row-major copy of x.T, both")
    return 0


if __name__ == "__main__":
    sys.exit(main())
