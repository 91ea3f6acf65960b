#!/usr/bin/python3
"""Bench of remote sources on loopback, with latency added by tests/bench/delayproxy.c (these
kernels have no sch_netem): nginx serves the files, the proxy sits between ckptfs (or curl)
and nginx and holds every chunk ONE_WAY ms in each direction, so RTT = 2 * ONE_WAY, and lets
a connection have at most a TCP window (the kernel's autotuning maximum) in flight per round
trip, as a real path of that RTT would (see delayproxy.c). Every
figure is a ratio of runs side by side in this one script, the median of RUNS rounds.

  rtt         the proxy's own measurement (1-byte echo) and a keep-alive HTTP HEAD through it
  mount       `ckptfs URL MNT` of a 64-shard HF index directory with 100,000 tensors, vs the
              same mount of the local folder (the CPU part both pay); requests it took
  sequential  a reader of one SIZE_MIB tensor through the mount vs `curl -r` of the same byte
              range into a reader alike; both readers compare every chunk they get with the
              local file (the bytes are checked, not just counted); the daemon's resident size
              after the read
  two streams two readers of the two halves of that tensor at once, through one mount
  random      4 KiB preads at random offsets of that tensor with a warm block cache (every
              block fetched by a pread of its own first, in random order: a sequential read keeps
              only a 32nd of the cache of the blocks it moved past) vs the same preads on a
              local mount of the same file, each checked against the file
  waste       bytes fetched (cache.json) minus bytes read, per read stream: the sequential
              read, the two streams, and a 64 MiB tensor read whole out of a file of four
              (prefetch must stop at its end)

usage: remote_bench.py CKPTFS OUTDIR [DELAYPROXY]
env:   DELAYS_MS="0 10" (one way), SIZE_MIB=1024, RUNS=3
Writes OUTDIR/bench-remote.json, OUTDIR/bench-remote.png and prints a table.
"""
import datetime
import json
import os
import random
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
CHUNK = 1 << 20
PART_MIB = 64  # each tensor of the four-tensor file


def log(*a):
    print("remote bench:", *a, file=sys.stderr, flush=True)


class DelayProxy:
    """tests/bench/delayproxy in front of upstream_port, `one_way_ms` each direction."""

    def __init__(self, binary, upstream_port, one_way_ms):
        self.proc = subprocess.Popen([binary, str(upstream_port), "%g" % one_way_ms],
                                     stdout=subprocess.PIPE, text=True)
        self.port = int(self.proc.stdout.readline().split()[1])
        self.window = int(self.proc.stdout.readline().split()[1])
        self.rtt_ms = float(self.proc.stdout.readline().split()[1])

    def close(self):
        self.proc.kill()
        self.proc.wait()


def http_rtt_ms(port):
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
        os.rmdir(mnt)
        raise RuntimeError("mount %s: %s" % (src, r.stderr.decode()))
    return mnt, took


def umount(mnt):
    subprocess.run(["fusermount3", "-u", mnt], check=True)
    os.rmdir(mnt)


def daemon_rss_mib(mnt):
    """VmRSS of the daemon serving mnt (its command line names the mountpoint), or None."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                args = f.read().split(b"\0")
            if mnt.encode() not in args:
                continue
            with open("/proc/%s/status" % pid) as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) / 1024
        except OSError:
            continue
    return None


def warm_blocks(path, nbytes, block):
    """One 4 KiB pread in every block of the file, in random order, eight at a time: each block
    is fetched into the cache by a reader that is no sequential stream."""
    fd = os.open(path, os.O_RDONLY)
    step = max(4096, block // 2)
    offs = list(range(0, nbytes - 4096, step))
    random.Random(2).shuffle(offs)

    def part(xs):
        for o in xs:
            os.pread(fd, 4096, o)

    ts = [threading.Thread(target=part, args=(offs[i::8],)) for i in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    os.close(fd)


def cache_stats(mnt):
    with open(os.path.join(mnt, ".ckptfs", "cache.json")) as f:
        return json.load(f)


class Checker:
    """Compares what a reader got with the local file, chunk by chunk (same cost for every
    reader measured)."""

    def __init__(self, path, base):
        self.fd = os.open(path, os.O_RDONLY)
        self.base = base

    def check(self, off, data):
        if os.pread(self.fd, len(data), self.base + off) != data:
            raise RuntimeError("bytes differ at tensor offset %d" % off)


def read_checked(f, checker, start, nbytes):
    """Reads nbytes from file object f (positioned at tensor offset start), checking them."""
    got = 0
    while got < nbytes:
        b = f.read(min(CHUNK, nbytes - got))
        if not b:
            raise RuntimeError("short read: %d of %d bytes" % (got, nbytes))
        checker.check(start + got, b)
        got += len(b)
    return got


def seq_mount(path, checker, nbytes):
    t = time.monotonic()
    with open(path, "rb", buffering=0) as f:
        read_checked(f, checker, 0, nbytes)
    return time.monotonic() - t


def seq_curl(url, first, checker, nbytes):
    t = time.monotonic()
    p = subprocess.Popen(["curl", "-s", "-f", "-r", "%d-%d" % (first, first + nbytes - 1), url],
                         stdout=subprocess.PIPE, bufsize=0)
    read_checked(p.stdout, checker, 0, nbytes)
    if p.stdout.read(1) or p.wait() != 0:
        raise RuntimeError("curl: more bytes than asked or exit %s" % p.returncode)
    return time.monotonic() - t


def two_streams(path, checker, nbytes):
    """Two readers of the two halves at once; seconds until both are done."""
    half = nbytes // 2
    errors = []

    def one(start, n):
        try:
            with open(path, "rb", buffering=0) as f:
                f.seek(start)
                read_checked(f, checker, start, n)
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    t = time.monotonic()
    ts = [threading.Thread(target=one, args=a) for a in ((0, half), (half, nbytes - half))]
    for x in ts:
        x.start()
    for x in ts:
        x.join()
    if errors:
        raise errors[0]
    return time.monotonic() - t


def random_reads(path, checker, offs, warm):
    """Microseconds per 4 KiB pread at offs (page cache of the mount dropped first), after
    preads at `warm` (the first reads after a mount and a 1 GiB read run slower, whoever makes
    them)."""
    fd = os.open(path, os.O_RDONLY)
    for o in warm:
        os.pread(fd, 4096, o)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    got = []
    t = time.monotonic()
    for o in offs:
        got.append(os.pread(fd, 4096, o))
    took = time.monotonic() - t
    os.close(fd)
    for o, b in zip(offs, got):
        checker.check(o, b)
    return took / len(offs) * 1e6


def write_safetensors(path, tensors, chunk_src):
    """tensors: [(name, nbytes)]; data from chunk_src (random bytes), tensor after tensor."""
    header, off = {}, 0
    for name, n in tensors:
        header[name] = {"dtype": "U8", "shape": [n], "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(header)
    h += " " * (-len(h) % 8)
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h.encode())
        for _, n in tensors:
            for _ in range(n // len(chunk_src)):
                f.write(chunk_src)
    os.rename(path + ".tmp", path)
    return 8 + len(h)


def make_data(data):
    shards = os.path.join(data, "sharded64")
    if not os.path.exists(os.path.join(shards, "model.safetensors.index.json")):
        make_hf_index(shards, 64, 100000)
    nbytes = SIZE_MIB << 20
    big = os.path.join(data, "big.safetensors")
    chunk = os.urandom(CHUNK)
    if not os.path.exists(big) or os.path.getsize(big) < nbytes:
        write_safetensors(big, [("w", nbytes)], chunk)
    four = os.path.join(data, "four.safetensors")
    if not os.path.exists(four):
        write_safetensors(four, [("t%d" % i, PART_MIB << 20) for i in range(4)], os.urandom(CHUNK))
    return shards, big, four


def median(xs):
    return statistics.median(xs) if xs else None


def main():
    if len(sys.argv) not in (3, 4):
        print(__doc__.split("\n\n")[-1], file=sys.stderr)
        return 2
    ckptfs, out = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    proxy_bin = os.path.abspath(sys.argv[3]) if len(sys.argv) == 4 else \
        os.path.join(os.path.dirname(ckptfs), "bench", "delayproxy")
    os.makedirs(out, exist_ok=True)
    data = os.path.join(out, "remote-data")
    shards, big, four = make_data(data)
    nbytes = SIZE_MIB << 20
    base = 8 + struct.unpack("<Q", open(big, "rb").read(8))[0]
    base4 = 8 + struct.unpack("<Q", open(four, "rb").read(8))[0]
    part = PART_MIB << 20
    t_start = time.monotonic()
    results = {"benchmark": "remote", "size_mib": SIZE_MIB, "runs": RUNS,
               "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
               "cpus": os.cpu_count(), "loadavg_start": os.getloadavg()[0], "delays": []}
    checker = Checker(big, base)
    checker4 = Checker(four, base4 + part)  # tensor t1
    rnd = random.Random(1)
    offs = [rnd.randrange(0, nbytes - 4096) for _ in range(5000)]
    warm = [rnd.randrange(0, nbytes - 4096) for _ in range(1000)]
    # nginx's own redirects (a directory without its slash) name a relative Location, so they
    # come back through the proxy too.
    with remote_servers.Nginx(data, extra="absolute_redirect off;") as server:
        for d in DELAYS:
            proxy = DelayProxy(proxy_bin, server.port, d)
            url = "http://127.0.0.1:%d" % proxy.port
            row = {"one_way_ms": d, "rtt_ms": proxy.rtt_ms, "http_rtt_ms": http_rtt_ms(proxy.port),
                   "proxy_window_bytes": proxy.window}
            log("one way %g ms: proxy rtt %.2f ms, HTTP HEAD %.2f ms"
                % (d, row["rtt_ms"], row["http_rtt_ms"]))
            v = {k: [] for k in ("mount", "mount_local", "mount_requests", "seq", "curl",
                                 "waste_seq", "rss_seq", "two", "waste_two", "waste_part",
                                 "rnd_remote", "rnd_local")}
            for r in range(RUNS):
                # Mount: remote and local side by side.
                n0 = len(server.requests())
                mnt, took = mount(ckptfs, url + "/sharded64")
                v["mount"].append(took)
                v["mount_requests"].append(len(server.requests()) - n0)
                umount(mnt)
                mnt, took = mount(ckptfs, shards)
                v["mount_local"].append(took)
                umount(mnt)
                # Sequential: the mount and curl, who goes first alternating.
                if r % 2:
                    v["curl"].append(seq_curl(url + "/big.safetensors", base, checker, nbytes))
                mnt, _ = mount(ckptfs, url + "/big.safetensors")
                v["seq"].append(seq_mount(os.path.join(mnt, "w"), checker, nbytes))
                v["rss_seq"].append(daemon_rss_mib(mnt) or 0)
                st = cache_stats(mnt)
                v["waste_seq"].append(st["bytes_fetched"] - nbytes)
                umount(mnt)
                if r % 2 == 0:
                    v["curl"].append(seq_curl(url + "/big.safetensors", base, checker, nbytes))
                # Two streams in one mount.
                mnt, _ = mount(ckptfs, url + "/big.safetensors")
                v["two"].append(two_streams(os.path.join(mnt, "w"), checker, nbytes))
                st = cache_stats(mnt)
                v["waste_two"].append((st["bytes_fetched"] - nbytes) / 2)
                umount(mnt)
                # One tensor of four read whole: what prefetch fetched past its end.
                mnt, _ = mount(ckptfs, url + "/four.safetensors")
                with open(os.path.join(mnt, "t1"), "rb", buffering=0) as f:
                    read_checked(f, checker4, 0, part)
                st = cache_stats(mnt)
                v["waste_part"].append(st["bytes_fetched"] - part)
                block = st["block_size"]
                umount(mnt)
                log("round %d/%d: mount %.3f s (local %.3f), seq %.2f s, curl %.2f s, two "
                    "streams %.2f s" % (r + 1, RUNS, v["mount"][-1], v["mount_local"][-1],
                                        v["seq"][-1], v["curl"][-1], v["two"][-1]))
            # Random 4 KiB reads with the whole tensor in a warm block cache, vs local.
            for r in range(RUNS):
                local_mnt, _ = mount(ckptfs, big)
                mnt, _ = mount(ckptfs, url + "/big.safetensors",
                               ["-o", "cache_ram=%dMiB" % (SIZE_MIB + 64)])
                warm_blocks(os.path.join(mnt, "w"), nbytes, block)
                pair = [("rnd_remote", mnt), ("rnd_local", local_mnt)]
                for key, where in pair if r % 2 == 0 else pair[::-1]:  # who goes first alternates
                    v[key].append(random_reads(os.path.join(where, "w"), checker, offs, warm))
                umount(mnt)
                umount(local_mnt)
            m = {k: median(x) for k, x in v.items()}
            row.update({
                "raw": v,
                "mount_64x100k_s": m["mount"], "mount_local_s": m["mount_local"],
                "mount_requests": m["mount_requests"],
                "mount_vs_local": m["mount"] / m["mount_local"],
                "seq_MBps": nbytes / 1e6 / m["seq"], "curl_MBps": nbytes / 1e6 / m["curl"],
                "seq_vs_curl": m["curl"] / m["seq"],
                "daemon_rss_after_seq_mib": m["rss_seq"],
                "two_streams_MBps": nbytes / 1e6 / m["two"],
                "two_streams_vs_curl": m["curl"] / m["two"],
                "block_size": block,
                "waste_seq_bytes": max(v["waste_seq"]),
                "waste_two_streams_bytes_per_stream": max(v["waste_two"]),
                "waste_one_of_four_bytes": max(v["waste_part"]),
                "random4k_remote_us": m["rnd_remote"], "random4k_local_us": m["rnd_local"],
                "random4k_remote_vs_local": m["rnd_remote"] / m["rnd_local"],
            })
            proxy.close()
            results["delays"].append(row)
    results["elapsed_s"] = round(time.monotonic() - t_start, 1)
    results["loadavg_end"] = os.getloadavg()[0]
    with open(os.path.join(out, "bench-remote.json"), "w") as f:
        json.dump(results, f, indent=1)
    print("remote sources (median of %d; ratios of runs side by side; every byte checked; load "
          "%.1f -> %.1f)" % (RUNS, results["loadavg_start"], results["loadavg_end"]))
    print("%-6s %-6s %-18s %-9s %-22s %-17s %-22s %-20s" % (
        "1-way", "rtt", "mount 64x100k", "requests", "seq MB/s (vs curl)", "2 streams MB/s",
        "waste B: seq/2str/1of4", "rnd4k us rem/loc"))
    for r in results["delays"]:
        print("%-6g %-6.1f %-18s %-9d %-22s %-17s %-22s %-20s" % (
            r["one_way_ms"], r["rtt_ms"],
            "%.3f s (%.2fx loc)" % (r["mount_64x100k_s"], r["mount_vs_local"]),
            r["mount_requests"], "%.0f (%.2fx, curl %.0f)" % (r["seq_MBps"], r["seq_vs_curl"],
                                                               r["curl_MBps"]),
            "%.0f (%.2fx)" % (r["two_streams_MBps"], r["two_streams_vs_curl"]),
            "%d/%d/%d" % (r["waste_seq_bytes"], r["waste_two_streams_bytes_per_stream"],
                          r["waste_one_of_four_bytes"]),
            "%.1f/%.1f (%.2fx)" % (r["random4k_remote_us"], r["random4k_local_us"],
                                   r["random4k_remote_vs_local"])))
    print("daemon RSS after the sequential read: " + ", ".join(
        "%.0f MiB (rtt %.0f ms)" % (r["daemon_rss_after_seq_mib"], r["rtt_ms"])
        for r in results["delays"]))
    plot(results, os.path.join(out, "bench-remote.png"))
    return 0


def plot(results, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        log("warning: no matplotlib (%s); %s not written" % (e, path))
        return
    rows = results["delays"]
    labels = ["RTT %.0f ms" % r["rtt_ms"] for r in rows]
    fig, axes = plt.subplots(1, 4, figsize=(18, 4.8))
    panels = [
        ("mount, 64 shards / 100k tensors (s)", [("remote", "mount"), ("local", "mount_local")],
         lambda x: x, 1.0, "target < 1 s"),
        ("sequential read of %d MiB (MB/s)" % results["size_mib"],
         [("ckptfs", "seq"), ("ckptfs 2 streams", "two"), ("curl", "curl")],
         lambda x: results["size_mib"] * 1.048576 / x, None, None),
        ("random 4 KiB pread, warm cache (us)", [("remote", "rnd_remote"), ("local", "rnd_local")],
         lambda x: x, None, None),
        ("bytes fetched - bytes read (MiB)",
         [("seq", "waste_seq"), ("per stream of 2", "waste_two"), ("1 of 4 tensors", "waste_part")],
         lambda x: x / 1048576, None, None),
    ]
    for ax, (title, series, f, line, line_label) in zip(axes, panels):
        width = 0.8 / len(series)
        for si, (name, key) in enumerate(series):
            meds, los, his = [], [], []
            for r in rows:
                xs = [f(x) for x in r["raw"][key]]
                meds.append(statistics.median(xs))
                los.append(statistics.median(xs) - min(xs))
                his.append(max(xs) - statistics.median(xs))
            pos = [i + (si - (len(series) - 1) / 2) * width for i in range(len(rows))]
            ax.bar(pos, meds, width, yerr=[los, his], capsize=2, label=name)
        if line:
            ax.axhline(line, color="red", linestyle="--", linewidth=1, label=line_label)
        if "waste" in title or "bytes fetched" in title:
            ax.axhline(rows[0]["block_size"] / 1048576, color="red", linestyle="--", linewidth=1,
                       label="one block")
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels(labels)
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("ckptfs remote sources over a delaying proxy on loopback: median of %d runs, "
                 "whiskers min-max (%s, %d CPUs, load %.1f -> %.1f)"
                 % (results["runs"], results["date"], results["cpus"], results["loadavg_start"],
                    results["loadavg_end"]))
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
