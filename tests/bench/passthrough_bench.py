#!/usr/bin/python3
"""FUSE passthrough and the mmap loader, 1 GiB, page cache warm, every figure a ratio to the
same read of the source file in the same run (issue 31 items 1-2; target >= 0.9x passed through).

usage: passthrough_bench.py CKPTFS BARE MMAPLOAD OUTDIR [--runs N]     (`make bench` calls this)

The source is OUTDIR/pt-data/model.safetensors: the HF view's model.safetensors of the 1 GiB
file bench.sh reads (OUTDIR/data/big/model.safetensors, written here if missing), copied out
once, so that its header is the one the view writes and the view serves it unchanged (the file
ckptfs passes through). Every mount is fresh (its page cache empty; the source stays cached):
  read         sequential read in 1 MiB pieces of the view's model.safetensors
  mmap T       MMAPLOAD (tests/bench/mmapload.c): map the file, copy it out in 16 MiB pieces
               from T = 1, 4, 16 threads
for: the source file itself; ckptfs -o passthrough=on ("passthrough"); ckptfs -o
passthrough=off (the daemon path); BARE (tests/bench/passthrough.c, the bare FUSE daemon, over
the source's directory). mmapload's checksums must agree with the source's (else the row says
WRONG). Writes OUTDIR/bench-passthrough.json; exit status 1 if a configuration failed.
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

SIZE = 1 << 30
THREADS = (1, 4, 16)


def mounted(mnt):
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == mnt for line in f)


def unmount(mnt):
    for _ in range(50):
        if not mounted(mnt):
            return
        subprocess.run(["fusermount3", "-u", mnt], stderr=subprocess.DEVNULL)
        if mounted(mnt):
            time.sleep(0.1)
    subprocess.run(["fusermount3", "-u", "-z", mnt], stderr=subprocess.DEVNULL)


def make_big(path):
    """bench.sh's file: one F32 tensor of 1 GiB of random bytes."""
    if os.path.exists(path) and os.path.getsize(path) > SIZE:
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    header = json.dumps({"weight": {"dtype": "F32", "shape": [SIZE // 4],
                                    "data_offsets": [0, SIZE]}}, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)
    with open(path + ".tmp", "wb") as f:
        f.write(len(header).to_bytes(8, "little") + header)
        with open("/dev/urandom", "rb") as r:
            for _ in range(SIZE >> 24):
                f.write(r.read(1 << 24))
    os.rename(path + ".tmp", path)


def read_mbps(path):
    buf = bytearray(1 << 20)
    t0 = time.monotonic()
    total = 0
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(buf)
            if not n:
                break
            total += n
    return total / (time.monotonic() - t0) / 1e6, total


def mmap_mbps(mmapload, path, threads):
    out = subprocess.run([mmapload, path, str(threads)], capture_output=True, text=True,
                         timeout=300, check=True).stdout.split()
    return float(out[0]), out[1]


class Mount:
    def __init__(self, argv, mnt):
        self.argv, self.mnt = argv, mnt

    def __enter__(self):
        p = subprocess.run(self.argv, capture_output=True, text=True, timeout=120)
        if p.returncode != 0 or not mounted(self.mnt):
            unmount(self.mnt)
            raise RuntimeError("%s: %s" % (" ".join(self.argv), p.stderr.strip()[:300]))
        return self

    def __exit__(self, *exc):
        unmount(self.mnt)
        return False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ckptfs")
    ap.add_argument("bare")
    ap.add_argument("mmapload")
    ap.add_argument("outdir")
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    out = os.path.abspath(a.outdir)
    big = os.path.join(out, "data", "big", "model.safetensors")
    make_big(big)
    src_dir = os.path.join(out, "pt-data")
    src = os.path.join(src_dir, "model.safetensors")
    mnt = tempfile.mkdtemp(prefix="ckptfs-ptbench.")
    failed = []
    try:
        if not os.path.exists(src):
            os.makedirs(src_dir, exist_ok=True)
            with Mount([a.ckptfs, big, mnt, "-o", "passthrough=off"], mnt):
                subprocess.run(["cp", os.path.join(mnt, ".ckptfs", "hf", "model.safetensors"),
                                src + ".tmp"], check=True)
            os.rename(src + ".tmp", src)
        subprocess.run(["cat", src], stdout=subprocess.DEVNULL, check=True)  # warm
        view = os.path.join(mnt, ".ckptfs", "hf", "model.safetensors")
        configs = [
            ("passthrough", [a.ckptfs, src_dir, mnt, "-o", "passthrough=on"], view),
            ("daemon", [a.ckptfs, src_dir, mnt, "-o", "passthrough=off"], view),
            ("bare", [a.bare, src_dir, mnt], os.path.join(mnt, "model.safetensors")),
        ]
        results = {}  # (config, workload) -> [MB/s]
        sums = {}

        def put(cfg, work, fn):
            try:
                mbps, check = fn()
                results.setdefault((cfg, work), []).append(mbps)
                sums.setdefault(work, {})[cfg] = check
            except (RuntimeError, subprocess.SubprocessError, OSError) as e:
                results.setdefault((cfg, work), []).append(None)
                if (cfg, work) not in failed:
                    failed.append((cfg, work))
                    print("passthrough_bench: %s %s: %s" % (cfg, work, e), file=sys.stderr)

        for r in range(a.runs):
            print("passthrough_bench: round %d/%d" % (r + 1, a.runs), file=sys.stderr)
            put("source", "read", lambda: read_mbps(src))
            for name, argv, path in configs:
                if name == "bare":
                    continue

                def first(argv=argv, path=path):
                    with Mount(argv, mnt):
                        return read_mbps(path)
                put(name, "read", first)
            for t in THREADS:
                work = "mmap %d" % t
                put("source", work, lambda t=t: mmap_mbps(a.mmapload, src, t))
                for name, argv, path in configs:
                    def load(argv=argv, path=path, t=t):
                        with Mount(argv, mnt):
                            return mmap_mbps(a.mmapload, path, t)
                    put(name, work, load)
    finally:
        unmount(mnt)
        os.rmdir(mnt)

    rows = []
    print("%-24s %10s %15s %10s %8s" % ("1 GiB, page cache warm", "median MB/s", "min-max",
                                         "vs source", "vs bare"))
    for work in ["read"] + ["mmap %d" % t for t in THREADS]:
        base = results.get(("source", work), [])
        base_med = statistics.median([x for x in base if x]) if any(base) else None
        bare = [x for x in results.get(("bare", work), []) if x]
        bare_med = statistics.median(bare) if bare else None
        for cfg in ("source", "passthrough", "daemon", "bare"):
            vals = results.get((cfg, work))
            if vals is None:
                continue
            ok = [x for x in vals if x]
            med = statistics.median(ok) if ok else None
            right = work == "read" or sums.get(work, {}).get(cfg) == sums.get(work, {}).get("source")
            vs = med / base_med if med and base_med else None
            vb = med / bare_med if med and bare_med and cfg not in ("source", "bare") else None
            rows.append({"config": cfg, "workload": work, "mbps": vals, "median_mbps": med,
                         "vs_source": vs, "vs_bare": vb, "bytes_match": right})
            print("%-24s %10s %15s %10s %8s%s" % (
                "%s %s" % (cfg, work), "%.0f" % med if med else "n/a",
                "%.0f-%.0f" % (min(ok), max(ok)) if ok else "",
                "%.2fx" % vs if vs else "-", "%.2fx" % vb if vb else "-",
                "" if right else "  WRONG (checksum differs from the source's)"))
            if not right:
                failed.append((cfg, work))
    with open(os.path.join(out, "bench-passthrough.json"), "w") as f:
        json.dump({"benchmark": "passthrough", "bytes": os.path.getsize(src), "runs": a.runs,
                   "unit": "MB/s (1e6 bytes/s)", "kernel": platform.release(),
                   "cpus": os.cpu_count(),
                   "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                   "target": "passthrough read and mmap >= 0.9x source", "results": rows}, f,
                  indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
