#!/usr/bin/python3
"""A .zst source against the same checkpoint uncompressed, read through ckptfs.

usage: zstd_bench.py CKPTFS OUTDIR [--runs N] [--mib M] [--seconds S]   (`make bench` calls it)

One safetensors file holding a single BF16 tensor of M MiB (default 512; values of a normal
distribution, about as compressible as real weights) is written once under
OUTDIR/zstd-data/ with its seekable copy made by `ckptfs convert X.safetensors
X.safetensors.zst` (delete the directory to rebuild them; the conversion's time is reported).
Then, RUNS times (default 3) for each of the two sources, on a fresh mount (so the mount's page
cache is cold; the source files themselves stay in the page cache, so the figures are ckptfs's
cost, not the disk's):
  random    two threads pread 4 KiB at random 4 KiB-aligned offsets of the tensor file (opened
            with POSIX_FADV_RANDOM, so the kernel asks for 4 KiB, not a readahead window) for
            S seconds (default 5): reads/s of both together
  seq       `dd bs=1M` of the whole tensor file, its first read: MB/s
Medians of the runs, the ratio zst/plain of each, and every run's figures go to
OUTDIR/bench-zstd.json; a table goes to stdout. Every page a random read returns is compared
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


def make_data(ckptfs, d, mib):
    plain = os.path.join(d, "model.safetensors")
    zst = plain + ".zst"
    info_path = os.path.join(d, "info.json")
    if os.path.exists(info_path) and os.path.exists(zst):
        with open(info_path) as f:
            info = json.load(f)
        if info.get("mib") == mib:
            return plain, zst, info
    os.makedirs(d, exist_ok=True)
    n = mib * (1 << 20) // 2
    header = json.dumps({NAME: {"dtype": "BF16", "shape": [n // 4096, 4096],
                                "data_offsets": [0, n * 2]}}).encode()
    header += b" " * (-len(header) % 8)
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
    info = {"mib": mib, "plain_bytes": os.path.getsize(plain), "zst_bytes": os.path.getsize(zst),
            "convert_seconds": round(took, 3),
            "convert_mb_s": round(os.path.getsize(plain) / took / 1e6, 1)}
    with open(info_path, "w") as f:
        json.dump(info, f)
    return plain, zst, info


class Mount:
    def __init__(self, ckptfs, src):
        self.ckptfs, self.src = ckptfs, src

    def __enter__(self):
        self.mnt = tempfile.mkdtemp(prefix="ckptfs-zbench.")
        rc, _, err = run_capture([self.ckptfs, self.src, self.mnt], 120)
        if rc != 0 or not is_mounted(self.mnt):
            unmount(self.mnt)
            sys.exit("zstd_bench: mounting %s failed: %s" % (self.src, err.decode(errors="replace")))
        return os.path.join(self.mnt, NAME.replace(".", "/"))

    def __exit__(self, *exc):
        unmount(self.mnt)
        return False


def random_reads(path, seconds, seed, want):
    """Random 4 KiB preads per second from 2 threads; every page read is compared with want
    (the tensor's bytes in the plain file this script wrote): a wrong page raises."""
    size = os.path.getsize(path)
    pages = size // PAGE
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
                    if os.pread(fd, PAGE, at) != want[at:at + PAGE]:
                        errors.append("%s: wrong bytes at %d" % (path, at))
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


def seq_read(path, want_sha):
    """dd's MB/s; then the file is hashed (untimed) and must be the plain tensor's bytes."""
    size = os.path.getsize(path)
    start = time.monotonic()
    subprocess.run(["dd", "if=" + path, "of=/dev/null", "bs=1M"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rate = size / (time.monotonic() - start) / 1e6
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    if h.hexdigest() != want_sha:
        raise SystemExit("zstd_bench: FAIL, the timed sequential read of %s returned wrong "
                         "bytes" % path)
    return rate


def plain_tensor(plain):
    """The tensor's bytes in the plain file this script wrote (memory-mapped) and their sha256."""
    with open(plain, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        a, b = json.loads(f.read(n))[NAME]["data_offsets"]
        m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
    view = memoryview(m)[8 + n + a:8 + n + b]
    return view, hashlib.sha256(view).hexdigest()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ckptfs")
    ap.add_argument("outdir")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--seconds", type=float, default=5.0)
    a = ap.parse_args()
    ckptfs = os.path.abspath(a.ckptfs)
    os.makedirs(a.outdir, exist_ok=True)
    plain, zst, info = make_data(ckptfs, os.path.join(a.outdir, "zstd-data"), a.mib)
    # The sources in the page cache: the figures are ckptfs's cost, not the disk's.
    for src in (plain, zst):
        subprocess.run(["cat", src], stdout=subprocess.DEVNULL, check=True)
    want, want_sha = plain_tensor(plain)
    runs = {"plain": [], "zst": []}
    for r in range(a.runs):
        for label, src in (("plain", plain), ("zst", zst)):
            with Mount(ckptfs, src) as path:
                rand = random_reads(path, a.seconds, r, want)
            with Mount(ckptfs, src) as path:
                seq = seq_read(path, want_sha)
            runs[label].append({"random_4k_reads_s": round(rand, 1), "seq_mb_s": round(seq, 1)})
    med = {label: {k: statistics.median(x[k] for x in rs) for k in rs[0]}
           for label, rs in runs.items()}
    ratio = {k: round(med["zst"][k] / med["plain"][k], 4) for k in med["plain"]}
    doc = {"when": datetime.datetime.now().isoformat(timespec="seconds"),
           "tensor_mib": a.mib, "runs": a.runs, "random_seconds": a.seconds, "threads": 2,
           "source": info, "compressed_fraction": round(info["zst_bytes"] / info["plain_bytes"], 4),
           "median": med, "ratio_zst_over_plain": ratio, "every_run": runs}
    with open(os.path.join(a.outdir, "bench-zstd.json"), "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print("zstd bench: one BF16 tensor of %d MiB; .zst is %.1f%% of the file (convert %.0f MB/s)"
          % (a.mib, 100 * doc["compressed_fraction"], info["convert_mb_s"]))
    print("%-8s %16s %12s" % ("source", "random 4K/s", "seq MB/s"))
    for label in ("plain", "zst"):
        print("%-8s %16.0f %12.1f" % (label, med[label]["random_4k_reads_s"],
                                     med[label]["seq_mb_s"]))
    print("%-8s %16.3f %12.3f" % ("zst/plain", ratio["random_4k_reads_s"], ratio["seq_mb_s"]))
    print("every timed read was compared with the tensor's bytes in the plain file: all equal")
    return 0


if __name__ == "__main__":
    sys.exit(main())
