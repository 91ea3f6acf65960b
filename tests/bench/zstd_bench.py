#!/usr/bin/python3
"""A .zst source against the same checkpoint uncompressed, zstd -dc and squashfuse.

usage: zstd_bench.py CKPTFS OUTDIR [--runs N] [--mib M] [--seconds S]   (`make bench` calls it)

One safetensors file holding a single BF16 tensor of M MiB (default 512; values of a normal
distribution, about as compressible as real weights; the header is padded so the tensor starts
at byte 4096) is written once under OUTDIR/zstd-data/ with its seekable copy made by `ckptfs
convert X.safetensors X.safetensors.zst` and two squashfs images of the plain file made by
`mksquashfs -comp zstd` with the default 128 KiB blocks and with 1 MiB blocks (delete the
directory to rebuild them; the conversion's time is reported). squashfs-tools and squashfuse
come from Debian (tests/bench/peers.py DEB_PKGS, installed here too unless NO_INSTALL=1).
Then, RUNS times (default 3), for each system on a fresh mount (the mount's page cache is
cold; the source files stay in the page cache, so the figures are the daemon's cost, not the
disk's):
  plain     ckptfs over the .safetensors        zst     ckptfs over the .safetensors.zst
  sqfs128   squashfuse over the 128 KiB image   sqfs1m  squashfuse over the 1 MiB image
  (zstd -dc of the .zst to /dev/null, one thread, is timed in the same round: MB/s of content)
and the workloads
  random    two threads pread 4 KiB at random 4 KiB-aligned offsets of the tensor's bytes
            (opened with POSIX_FADV_RANDOM, so the kernel asks for 4 KiB, not a readahead
            window) for S seconds (default 5): reads/s of both together
  seq       `dd bs=1M` of the whole file, its first read: MB/s
Medians of the runs, the ratios the targets are stated in (zst/plain, zst seq / zstd -dc,
zst random / squashfuse) and every run's figures go to OUTDIR/bench-zstd.json, a bar chart to
OUTDIR/bench-zstd.png; a table goes to stdout. Every page a random read returns is compared
with the plain file's bytes, and each sequential read is hashed afterwards (untimed): wrong
bytes stop the bench with a failure, whatever the rate.
"""

import argparse
import datetime
import hashlib
import json
import mmap
import os
import random
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
from ckptfs_test import is_mounted, run_capture, unmount  # noqa: E402

NAME = "model.weight"
PAGE = 4096
DATA_VERSION = 2  # tensor at byte 4096; squashfs images
SYSTEMS = ["plain", "zst", "sqfs128", "sqfs1m"]


def make_data(ckptfs, d, mib):
    plain = os.path.join(d, "model.safetensors")
    zst = plain + ".zst"
    sqfs = {"sqfs128": os.path.join(d, "model-128k.sqfs"), "sqfs1m": os.path.join(d, "model-1m.sqfs")}
    info_path = os.path.join(d, "info.json")
    if os.path.exists(info_path) and os.path.exists(zst):
        with open(info_path) as f:
            info = json.load(f)
        if info.get("mib") == mib and info.get("version") == DATA_VERSION:
            return plain, zst, sqfs, info
    os.makedirs(d, exist_ok=True)
    n = mib * (1 << 20) // 2
    header = json.dumps({NAME: {"dtype": "BF16", "shape": [n // 4096, 4096],
                                "data_offsets": [0, n * 2]}}).encode()
    header += b" " * (PAGE - 8 - len(header))  # the tensor at byte 4096: pages line up
    rng = np.random.default_rng(0)
    with open(plain + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        chunk = 1 << 22
        for at in range(0, n, chunk):
            x = (rng.standard_normal(min(chunk, n - at), dtype=np.float32) * 0.02)
            f.write((x.view(np.uint32) >> 16).astype("<u2").tobytes())
    os.rename(plain + ".tmp", plain)
    start = time.monotonic()
    rc, _, err = run_capture([ckptfs, "convert", plain, zst], 3600)
    took = time.monotonic() - start
    if rc != 0:
        sys.exit("zstd_bench: ckptfs convert failed: %s" % err.decode(errors="replace"))
    info = {"mib": mib, "version": DATA_VERSION, "plain_bytes": os.path.getsize(plain),
            "zst_bytes": os.path.getsize(zst), "convert_seconds": round(took, 3),
            "convert_mb_s": round(os.path.getsize(plain) / took / 1e6, 1)}
    if shutil.which("mksquashfs"):
        for label, block in (("sqfs128", "128K"), ("sqfs1m", "1M")):
            img = sqfs[label]
            if os.path.exists(img):
                os.unlink(img)
            rc, _, err = run_capture(["mksquashfs", plain, img, "-comp", "zstd", "-b", block,
                                      "-noappend", "-no-progress", "-quiet"], 3600)
            if rc != 0:
                sys.exit("zstd_bench: mksquashfs failed: %s" % err.decode(errors="replace"))
            info[label + "_bytes"] = os.path.getsize(img)
    with open(info_path, "w") as f:
        json.dump(info, f)
    return plain, zst, sqfs, info


class Mount:
    """A fresh mount of one system; entering gives (path of the file, offset of the tensor)."""

    def __init__(self, ckptfs, system, src):
        self.ckptfs, self.system, self.src = ckptfs, system, src

    def __enter__(self):
        self.mnt = tempfile.mkdtemp(prefix="ckptfs-zbench.")
        if self.system.startswith("sqfs"):
            cmd = ["squashfuse", self.src, self.mnt]
        else:
            cmd = [self.ckptfs, self.src, self.mnt]
        rc, _, err = run_capture(cmd, 120)
        if rc != 0 or not is_mounted(self.mnt):
            unmount(self.mnt)
            sys.exit("zstd_bench: mounting %s failed: %s" % (self.src, err.decode(errors="replace")))
        if self.system.startswith("sqfs"):
            return os.path.join(self.mnt, "model.safetensors"), PAGE
        return os.path.join(self.mnt, NAME.replace(".", "/")), 0

    def __exit__(self, *exc):
        unmount(self.mnt)
        return False


def random_reads(path, base, seconds, seed, want):
    """Random 4 KiB preads per second from 2 threads over the tensor's len(want) bytes at base
    in path; every page read is compared with want (the tensor's bytes in the plain file this
    script wrote): a wrong page raises."""
    pages = len(want) // PAGE
    counts = [0, 0]
    stop = time.monotonic() + seconds
    errors = []

    def worker(k):
        rng = random.Random(seed * 2 + k)
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        try:
            n = 0
            while True:
                for _ in range(64):
                    at = rng.randrange(pages) * PAGE
                    if os.pread(fd, PAGE, base + at) != want[at:at + PAGE]:
                        errors.append("%s: wrong bytes at %d" % (path, base + at))
                        return
                n += 64
                if time.monotonic() >= stop:
                    break
            counts[k] = n
        finally:
            os.close(fd)

    start = time.monotonic()
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise SystemExit("zstd_bench: FAIL, a timed read returned wrong bytes: " + errors[0])
    return sum(counts) / (time.monotonic() - start)


def sha_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def seq_read(path, want_sha):
    """dd's MB/s; then the file is hashed (untimed) and must be the bytes expected."""
    size = os.path.getsize(path)
    start = time.monotonic()
    subprocess.run(["dd", "if=" + path, "of=/dev/null", "bs=1M"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rate = size / (time.monotonic() - start) / 1e6
    if sha_of(path) != want_sha:
        raise SystemExit("zstd_bench: FAIL, the timed sequential read of %s returned wrong "
                         "bytes" % path)
    return rate


def zstd_dc(zst, want_sha):
    """zstd -dc of the .zst (one thread) to /dev/null: MB/s of its content; its output, hashed
    untimed, must hold the tensor's bytes."""
    p = subprocess.run(["zstd", "-dcq", zst], check=True, stdout=subprocess.PIPE)
    out = p.stdout
    (n,) = struct.unpack("<Q", out[:8])
    a, b = json.loads(out[8:8 + n])[NAME]["data_offsets"]
    if hashlib.sha256(out[8 + n + a:8 + n + b]).digest().hex() != want_sha:
        raise SystemExit("zstd_bench: FAIL, zstd -dc of %s does not hold the tensor" % zst)
    del p, out
    start = time.monotonic()
    subprocess.run(["zstd", "-dcq", zst], check=True, stdout=subprocess.DEVNULL)
    return (8 + n + b) / (time.monotonic() - start) / 1e6


def plain_tensor(plain):
    """The tensor's bytes in the plain file this script wrote (memory-mapped) and their sha256."""
    with open(plain, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        a, b = json.loads(f.read(n))[NAME]["data_offsets"]
        m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
    view = memoryview(m)[8 + n + a:8 + n + b]
    return view, hashlib.sha256(view).hexdigest()


def plot(doc, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        print("zstd bench: no matplotlib (%s); %s not written" % (e, path), file=sys.stderr)
        return
    med, runs = doc["median"], doc["every_run"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    colors = {"plain": "#555555", "zst": "#d62728", "sqfs128": "#1f77b4", "sqfs1m": "#6baed6",
              "zstd -dc": "#2ca02c"}
    for ax, (key, title) in zip(axes, (("random_4k_reads_s", "random 4 KiB pread, 2 threads (reads/s)"),
                                       ("seq_mb_s", "sequential first read, dd bs=1M (MB/s)"))):
        labels = [s for s in SYSTEMS if s in med]
        if key == "seq_mb_s":
            labels.append("zstd -dc")
        for i, s in enumerate(labels):
            vals = [r[key] for r in runs[s]] if s != "zstd -dc" else runs["zstd_dc_mb_s"]
            m = statistics.median(vals)
            ax.bar(i, m, color=colors[s], yerr=[[m - min(vals)], [max(vals) - m]], capsize=3)
            ax.text(i, m, "%.0f" % m, ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels)
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    r = doc["ratios"]
    fig.suptitle("%d MiB BF16 tensor, median of %d runs: zst/squashfs-128K random %.2fx, "
                 "zst seq / zstd -dc %.2fx" % (doc["tensor_mib"], doc["runs"],
                                               r.get("zst_random_over_sqfs128", float("nan")),
                                               r["zst_seq_over_zstd_dc"]), fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ckptfs")
    ap.add_argument("outdir")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    a = ap.parse_args()
    ckptfs = os.path.abspath(a.ckptfs)
    os.makedirs(a.outdir, exist_ok=True)
    if os.environ.get("NO_INSTALL", "") in ("", "0"):
        sys.path.insert(0, HERE)
        import peers  # its DEB_PKGS hold squashfs-tools and squashfuse
        peers.install_peers()
    plain, zst, sqfs, info = make_data(ckptfs, os.path.join(a.outdir, "zstd-data"), a.mib)
    systems = [s for s in a.systems.split(",") if s in SYSTEMS]
    if not (shutil.which("squashfuse") and all(os.path.exists(p) for p in sqfs.values())):
        print("zstd bench: no squashfuse or squashfs images: squashfs figures n/a", file=sys.stderr)
        systems = [s for s in systems if not s.startswith("sqfs")]
    src = {"plain": plain, "zst": zst, **sqfs}
    # The sources in the page cache: the figures are the daemons' cost, not the disk's.
    for label in systems:
        subprocess.run(["cat", src[label]], stdout=subprocess.DEVNULL, check=True)
    want, want_sha = plain_tensor(plain)
    plain_sha = sha_of(plain)
    runs = {label: [] for label in systems}
    runs["zstd_dc_mb_s"] = []
    for r in range(a.runs):
        runs["zstd_dc_mb_s"].append(round(zstd_dc(zst, want_sha), 1))
        for label in systems:
            with Mount(ckptfs, label, src[label]) as (path, base):
                rand = random_reads(path, base, a.seconds, r, want)
            with Mount(ckptfs, label, src[label]) as (path, base):
                seq = seq_read(path, plain_sha if base else want_sha)
            runs[label].append({"random_4k_reads_s": round(rand, 1), "seq_mb_s": round(seq, 1)})
    med = {label: {k: statistics.median(x[k] for x in runs[label]) for k in runs[label][0]}
           for label in systems}
    dc = statistics.median(runs["zstd_dc_mb_s"])
    ratios = {}
    if "zst" in med and "plain" in med:
        for k in med["plain"]:
            ratios["zst_over_plain_" + k] = round(med["zst"][k] / med["plain"][k], 4)
    if "zst" in med:
        ratios["zst_seq_over_zstd_dc"] = round(med["zst"]["seq_mb_s"] / dc, 4)
        for s in ("sqfs128", "sqfs1m"):
            if s in med:
                ratios["zst_random_over_" + s] = round(
                    med["zst"]["random_4k_reads_s"] / med[s]["random_4k_reads_s"], 4)
                ratios["zst_seq_over_" + s] = round(med["zst"]["seq_mb_s"] / med[s]["seq_mb_s"], 4)
    doc = {"when": datetime.datetime.now().isoformat(timespec="seconds"),
           "tensor_mib": a.mib, "runs": a.runs, "random_seconds": a.seconds, "threads": 2,
           "cpus": os.cpu_count(), "loadavg": os.getloadavg(),
           "source": info, "compressed_fraction": round(info["zst_bytes"] / info["plain_bytes"], 4),
           "median": med, "zstd_dc_mb_s": dc, "ratios": ratios, "every_run": runs}
    with open(os.path.join(a.outdir, "bench-zstd.json"), "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    if "zst" in med:
        plot(doc, os.path.join(a.outdir, "bench-zstd.png"))
    print("zstd bench: one BF16 tensor of %d MiB; .zst is %.1f%% of the file (convert %.0f MB/s)"
          % (a.mib, 100 * doc["compressed_fraction"], info["convert_mb_s"]))
    print("%-8s %16s %12s" % ("system", "random 4K/s", "seq MB/s"))
    for label in systems:
        print("%-8s %16.0f %12.1f" % (label, med[label]["random_4k_reads_s"],
                                     med[label]["seq_mb_s"]))
    print("%-8s %16s %12.1f" % ("zstd -dc", "", dc))
    for k, v in ratios.items():
        print("%-34s %.3f" % (k, v))
    print("every timed read was compared with the plain file's bytes: all equal")
    return 0


if __name__ == "__main__":
    sys.exit(main())
