#!/usr/bin/python3
"""Two `ckptfs serve` binaries side by side on one large file: the cost of streaming every
response through the checked read path (pread, check the source, send) instead of sendfile.

usage: serve_stream_bench.py OLD_CKPTFS NEW_CKPTFS WORKDIR [--gib N] [--runs N]

WORKDIR/stream.safetensors holds one U8 tensor of N GiB (default 1), written once. Each run
starts one server per binary in turn (same file, warm page cache: one untimed download
first) and times `curl -o /dev/null` of tensors/big (the whole tensor: one extent of one
plain file, which older builds sent with sendfile) over loopback, and the server's CPU time
for it (utime + stime from /proc). Runs alternate OLD and NEW, so drift on a shared machine
hits both. Prints each run and the median ratios NEW/OLD.
"""

import argparse
import os
import statistics
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from serve_util import Server  # noqa: E402


def make_file(path, nbytes):
    if os.path.exists(path) and os.path.getsize(path) > nbytes:
        return
    text = ('{"big":{"dtype":"U8","shape":[%d],"data_offsets":[0,%d]}}' % (nbytes, nbytes)).encode()
    text += b" " * (-len(text) % 8)
    block = bytes(range(256)) * 4096  # 1 MiB
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for _ in range(nbytes // len(block)):
            f.write(block)
    os.rename(path + ".tmp", path)


def download(srv, path, nbytes):
    url = "%s/ckptfs/%s/resolve/main/%s" % (srv.url, next(iter(srv.repos)), path)
    t0 = time.monotonic()
    out = subprocess.run(["curl", "-sS", "-o", "/dev/null", "-w", "%{size_download}", url],
                         capture_output=True, text=True, check=True)
    dt = time.monotonic() - t0
    if int(out.stdout) != nbytes:
        raise RuntimeError("short download: %s of %d bytes" % (out.stdout, nbytes))
    return nbytes / dt / 1e6


def cpu_seconds(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("work")
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    nbytes = int(a.gib * (1 << 30)) // (1 << 20) * (1 << 20)
    path = os.path.join(a.work, "stream.safetensors")
    make_file(path, nbytes)
    speeds = {"old": [], "new": []}
    cpu = {"old": [], "new": []}
    for run in range(a.runs + 1):
        for which in ("old", "new"):
            srv = Server(getattr(a, which), [path])
            try:
                c0 = cpu_seconds(srv.proc.pid)
                mbs = download(srv, "tensors/big", nbytes)
                secs = (cpu_seconds(srv.proc.pid) - c0) / (nbytes / (1 << 30))
                if run:  # the first round warms the page cache and is not counted
                    speeds[which].append(mbs)
                    cpu[which].append(secs)
                    print("run %d %s: %.0f MB/s, server CPU %.2f s/GiB" % (run, which, mbs, secs),
                          flush=True)
            finally:
                srv.stop()
    old, new = statistics.median(speeds["old"]), statistics.median(speeds["new"])
    print("median old %.0f MB/s, new %.0f MB/s, new/old %.2f" % (old, new, new / old))
    co, cn = statistics.median(cpu["old"]), statistics.median(cpu["new"])
    print("server CPU old %.2f s/GiB, new %.2f s/GiB, new/old %.2f" % (co, cn, cn / co if co else 0))


if __name__ == "__main__":
    main()
