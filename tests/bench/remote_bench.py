#!/usr/bin/python3
"""Bench of remote sources on loopback, with latency added by a delaying TCP proxy of our own
(these kernels have no sch_netem): nginx serves the files, the proxy sits between ckptfs (or
curl) and nginx and holds every chunk for DELAY ms in each direction, so RTT = 2 * DELAY.

  rtt         measured round trip of a small GET through the proxy (keep-alive)
  mount       `ckptfs URL MNT` of a 64-shard HF index directory with 100,000 tensors
  sequential  cat of one SIZE_MIB tensor through the mount vs `curl -r` of the same byte range
  random      4 KiB preads at random offsets of that tensor with a warm block cache, vs the
              same preads on a local mount of the same file
  waste       bytes fetched (cache.json) vs bytes read by the sequential cat

usage: remote_bench.py CKPTFS OUTDIR   (env DELAYS_MS="0 10" one-way, SIZE_MIB=1024, RUNS=3)
Writes OUTDIR/bench-remote.json and prints a table.
"""
import json
import os
import queue
import random
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import http.client

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
import remote_servers  # noqa: E402
from shard_bench import make_hf_index  # noqa: E402

RUNS = int(os.environ.get("RUNS", "3"))
SIZE_MIB = int(os.environ.get("SIZE_MIB", "1024"))
DELAYS = [float(x) for x in os.environ.get("DELAYS_MS", "0 10").split()]


class DelayProxy:
    """Listens on a free port; every connection is relayed to upstream, each chunk delivered
    `delay` seconds after it was read (latency added, throughput kept)."""

    def __init__(self, upstream_port, delay):
        self.up, self.delay = upstream_port, delay
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            u = socket.create_connection(("127.0.0.1", self.up))
            for a, b in ((c, u), (u, c)):
                q = queue.Queue()
                threading.Thread(target=self.reader, args=(a, q), daemon=True).start()
                threading.Thread(target=self.writer, args=(b, q), daemon=True).start()

    def reader(self, s, q):
        while True:
            try:
                d = s.recv(1 << 20)
            except OSError:
                d = b""
            q.put((time.monotonic() + self.delay, d))
            if not d:
                return

    def writer(self, s, q):
        while True:
            t, d = q.get()
            wait = t - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            if not d:
                try:
                    s.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                return
            try:
                s.sendall(d)
            except OSError:
                return

    def close(self):
        self.sock.close()


def rtt_ms(port):
    c = http.client.HTTPConnection("127.0.0.1", port)
    xs = []
    for _ in range(6):
        t = time.monotonic()
        c.request("HEAD", "/")
        c.getresponse().read()
        xs.append((time.monotonic() - t) * 1000)
    c.close()
    return statistics.median(xs[1:])


def mount(ckptfs, src, opts=()):
    mnt = tempfile.mkdtemp(prefix="ckptfs-rbench.")
    t = time.monotonic()
    r = subprocess.run([ckptfs, src, mnt] + list(opts), capture_output=True)
    took = time.monotonic() - t
    if r.returncode != 0:
        raise RuntimeError("mount %s: %s" % (src, r.stderr.decode()))
    return mnt, took


def umount(mnt):
    subprocess.run(["fusermount3", "-u", mnt])
    os.rmdir(mnt)


def cat_time(path):
    t = time.monotonic()
    with open(path, "rb") as f:
        while f.read(1 << 20):
            pass
    return time.monotonic() - t


def main():
    ckptfs, out = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    os.makedirs(out, exist_ok=True)
    data = os.path.join(out, "remote-data")
    shards = os.path.join(data, "sharded64")
    if not os.path.exists(os.path.join(shards, "model.safetensors.index.json")):
        make_hf_index(shards, 64, 100000)
    big = os.path.join(data, "big.safetensors")
    nbytes = SIZE_MIB << 20
    if not os.path.exists(big) or os.path.getsize(big) < nbytes:
        header = json.dumps({"w": {"dtype": "U8", "shape": [nbytes], "data_offsets": [0, nbytes]}})
        header += " " * (-len(header) % 8)
        with open(big, "wb") as f:
            f.write(struct.pack("<Q", len(header)) + header.encode())
            chunk = os.urandom(1 << 20)
            for _ in range(SIZE_MIB):
                f.write(chunk)
    base = 8 + struct.unpack("<Q", open(big, "rb").read(8))[0]
    results = {"size_mib": SIZE_MIB, "runs": RUNS, "delays": []}
    local_mnt, _ = mount(ckptfs, big)
    with remote_servers.Nginx(data) as server:
        for d in DELAYS:
            proxy = DelayProxy(server.port, d / 1000.0)
            url = "http://127.0.0.1:%d" % proxy.port
            row = {"one_way_ms": d, "rtt_ms": rtt_ms(proxy.port)}
            mounts = []
            for _ in range(RUNS):
                mnt, took = mount(ckptfs, url + "/sharded64")
                mounts.append(took)
                umount(mnt)
            row["mount_64x100k_s"] = statistics.median(mounts)
            seq, curl, waste = [], [], []
            for _ in range(RUNS):
                mnt, _ = mount(ckptfs, url + "/big.safetensors", ["-o", "cache_ram=64MiB"])
                seq.append(cat_time(os.path.join(mnt, "w")))
                st = json.load(open(os.path.join(mnt, ".ckptfs", "cache.json")))
                waste.append(st["bytes_fetched"] - nbytes)
                umount(mnt)
                t = time.monotonic()
                subprocess.run(["curl", "-s", "-o", "/dev/null", "-r",
                                "%d-%d" % (base, base + nbytes - 1), url + "/big.safetensors"],
                               check=True)
                curl.append(time.monotonic() - t)
            row["seq_MBps"] = nbytes / 1e6 / statistics.median(seq)
            row["curl_MBps"] = nbytes / 1e6 / statistics.median(curl)
            row["seq_vs_curl"] = row["seq_MBps"] / row["curl_MBps"]
            row["fetched_minus_read_bytes"] = max(waste)
            # Random 4 KiB reads, block cache warm (the whole tensor fits in cache_ram).
            mnt, _ = mount(ckptfs, url + "/big.safetensors",
                           ["-o", "cache_ram=%dMiB" % (SIZE_MIB + 64)])
            cat_time(os.path.join(mnt, "w"))
            rnd = random.Random(1)
            offs = [rnd.randrange(0, nbytes - 4096) for _ in range(5000)]
            for label, path in (("remote", os.path.join(mnt, "w")),
                                ("local", os.path.join(local_mnt, "w"))):
                fd = os.open(path, os.O_RDONLY)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                t = time.monotonic()
                for o in offs:
                    os.pread(fd, 4096, o)
                row["random4k_%s_us" % label] = (time.monotonic() - t) / len(offs) * 1e6
                os.close(fd)
            umount(mnt)
            proxy.close()
            results["delays"].append(row)
            print(json.dumps(row))
    umount(local_mnt)
    with open(os.path.join(out, "bench-remote.json"), "w") as f:
        json.dump(results, f, indent=1)
    print("%-8s %-7s %-10s %-9s %-9s %-8s %-12s %-10s %-10s" % (
        "one-way", "rtt", "mount 64", "seq MB/s", "curl MB/s", "ratio", "waste bytes",
        "rnd4k rem", "rnd4k loc"))
    for r in results["delays"]:
        print("%-8g %-7.1f %-10.3f %-9.0f %-9.0f %-8.2f %-12d %-10.1f %-10.1f" % (
            r["one_way_ms"], r["rtt_ms"], r["mount_64x100k_s"], r["seq_MBps"], r["curl_MBps"],
            r["seq_vs_curl"], r["fetched_minus_read_bytes"], r["random4k_remote_us"],
            r["random4k_local_us"]))


if __name__ == "__main__":
    main()
