#!/usr/bin/python3
"""The first walk of a big tree: a mount of 100k tensors in 64 shards against the same names as
plain files.

usage: tree_bench.py CKPTFS OUTDIR [--runs N] [--tensors T] [--shards S] [-o OPTS]
                    [--also 'ARGS']... [--floor WALKFLOOR]     (`make bench` calls it)

T tensors (default 100,000) of F32 [4,4] named model.layers.{i//20}.mod.p{i%20}.weight are
written once, round robin, into S safetensors shards (default 64) under OUTDIR/tree-data/ with
a model.safetensors.index.json (delete the directory to rebuild). The first mount's listing
(`find MNT`) is copied as empty files and directories under OUTDIR/tree-data/plain/ on the
local disk (its page and dentry caches warmed by a walk first): the plain-file tree of the same
names. Then RUNS times (default 3), in the same round: `find DIR -printf '%s\\n'` (a stat of
every entry) over the plain tree, warm; over a fresh mount of the shards ("first walk"); and
again over the same mount ("second walk"); then the same two walks for each --also variant
(extra mount arguments, e.g. --also='-o spin_us=0' for libfuse's loop, --also=-s), so that
variants are compared in the same rounds. With --floor, the first and second walks of
tests/bench/walkfloor (a bare FUSE daemon answering the plain tree's names and attributes from
memory with libfuse's loop) over the plain tree are timed in the same rounds too: the floor of
a first walk over FUSE on this machine. Medians and the ratio plain/first (the target is
>= 0.5: a first walk at most twice the plain tree's time) go to OUTDIR/bench-tree.json with
the mount options and loop of each variant, a bar chart to OUTDIR/bench-tree.png. Every walk
must list as many entries as the plain tree, and every file size the mount shows is checked
against the tensor's 64 bytes once (untimed). The FUSE requests of a first and a second walk
are counted by opcode once per variant, untimed, with `perf stat` on the kernel's
fuse:fuse_request_send tracepoint (counted in find's own context, so other mounts do not
count); without perf or the tracepoint the JSON says why instead.
"""

import argparse
import datetime
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
from ckptfs_test import is_mounted, run_capture, unmount  # noqa: E402

DATA_VERSION = 1


def name_of(i):
    return "model.layers.%d.mod.p%d.weight" % (i // 20, i % 20)


def make_data(d, tensors, shards):
    info_path = os.path.join(d, "info.json")
    if os.path.exists(info_path):
        with open(info_path) as f:
            info = json.load(f)
        if info == {"tensors": tensors, "shards": shards, "version": DATA_VERSION}:
            return os.path.join(d, "shards")
    sd = os.path.join(d, "shards")
    os.makedirs(sd, exist_ok=True)
    weight_map = {}
    for k in range(shards):
        fname = "model-%05d-of-%05d.safetensors" % (k + 1, shards)
        names = [name_of(i) for i in range(k, tensors, shards)]
        header = {n: {"dtype": "F32", "shape": [4, 4], "data_offsets": [64 * j, 64 * j + 64]}
                  for j, n in enumerate(names)}
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)
        with open(os.path.join(sd, fname), "wb") as f:
            f.write(struct.pack("<Q", len(text)) + text)
            for j in range(len(names)):
                f.write(struct.pack("<16f", *([float(j)] * 16)))
        for n in names:
            weight_map[n] = fname
    with open(os.path.join(sd, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    with open(info_path, "w") as f:
        json.dump({"tensors": tensors, "shards": shards, "version": DATA_VERSION}, f)
    return sd


class Mount:
    def __init__(self, ckptfs, src, args):
        self.ckptfs, self.src, self.args = ckptfs, src, args

    def __enter__(self):
        self.mnt = tempfile.mkdtemp(prefix="ckptfs-tbench.")
        cmd = [self.ckptfs, self.src, self.mnt] + self.args
        rc, _, err = run_capture(cmd, 300)
        if rc != 0 or not is_mounted(self.mnt):
            unmount(self.mnt)
            sys.exit("tree_bench: mounting %s failed: %s" % (self.src, err.decode(errors="replace")))
        return self.mnt

    def __exit__(self, *exc):
        unmount(self.mnt)
        return False


def walk(path):
    """find -printf %s over path: (seconds, entries)."""
    start = time.monotonic()
    r = subprocess.run(["find", path, "-printf", "%s\\n"], stdout=subprocess.PIPE, check=True)
    took = time.monotonic() - start
    return took, r.stdout.count(b"\n")


OPCODES = {1: "LOOKUP", 2: "FORGET", 3: "GETATTR", 27: "OPENDIR", 28: "READDIR",
           29: "RELEASEDIR", 42: "BATCH_FORGET", 44: "READDIRPLUS", 52: "STATX"}


def count_requests(path):
    """The FUSE requests a find over path sends, by opcode ({"total": n, name: n...}), or a
    string saying why they could not be counted."""
    events = ["-e", "fuse:fuse_request_send"]
    for op in OPCODES:
        events += ["-e", "fuse:fuse_request_send", "--filter", "opcode == %d" % op]
    try:
        r = subprocess.run(["perf", "stat", "-x,"] + events + ["--", "find", path, "-printf",
                                                             "%s\\n"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                           timeout=600)
    except (OSError, subprocess.TimeoutExpired) as e:
        return "perf stat failed: %s" % e
    counts = [line.split(",")[0] for line in r.stderr.splitlines() if "fuse_request_send" in line]
    if r.returncode != 0 or len(counts) != len(OPCODES) + 1 or not all(c.isdigit() for c in counts):
        return "perf stat: %s" % r.stderr.strip()[-300:]
    out = {"total": int(counts[0])}
    for name, c in zip(OPCODES.values(), counts[1:]):
        if int(c):
            out[name] = int(c)
    return out


def loop_of(args):
    """What the mount arguments say about the request loop (ckptfs(1), -o spin_us=, -s)."""
    spin, threads = 100, 8
    for i, a in enumerate(args):
        opts = args[i + 1] if a == "-o" and i + 1 < len(args) else ""
        for o in opts.split(","):
            if o.startswith("spin_us="):
                spin = int(o[8:])
            elif o.startswith("max_threads="):
                threads = int(o[12:])
        if a == "-s":
            threads = 1
    return {"spin_us": spin, "threads": threads,
            "loop": "libfuse's" if spin == 0 else "ckptfs (spin %d us)" % spin}


def make_plain(mnt, plain):
    """The mount's names as empty files and directories under plain (rebuilt each run of the
    bench, so a change of what the mount lists is followed)."""
    if os.path.exists(plain):
        subprocess.run(["rm", "-rf", plain], check=True)
    r = subprocess.run(["find", mnt, "-mindepth", "1", "-printf", "%y %P\\n"],
                       stdout=subprocess.PIPE, check=True, text=True)
    os.makedirs(plain)
    for line in r.stdout.splitlines():
        kind, rel = line.split(" ", 1)
        p = os.path.join(plain, rel)
        if kind == "d":
            os.makedirs(p, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(p), exist_ok=True)
            open(p, "wb").close()


def check_sizes(mnt, tensors):
    """Every tensor file holds 64 bytes; every .npy is 64 bytes plus its header (untimed)."""
    r = subprocess.run(["find", mnt, "-type", "f", "-printf", "%s %P\\n"], stdout=subprocess.PIPE,
                       check=True, text=True)
    n = 0
    for line in r.stdout.splitlines():
        size, rel = line.split(" ", 1)
        if rel.endswith("/weight"):
            n += 1
            if int(size) != 64:
                sys.exit("tree_bench: FAIL, %s shows %s bytes, not 64" % (rel, size))
    if n != tensors:
        sys.exit("tree_bench: FAIL, the mount shows %d tensor files, not %d" % (n, tensors))


def plot(doc, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        print("tree bench: no matplotlib (%s); %s not written" % (e, path), file=sys.stderr)
        return
    keys = ("plain", "first", "second")
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for i, k in enumerate(keys):
        vals = doc["every_run"][k]
        m = statistics.median(vals)
        ax.bar(i, m, color=("#555555", "#d62728", "#ff9896")[i],
               yerr=[[m - min(vals)], [max(vals) - m]], capsize=3)
        ax.text(i, m, "%.2f s" % m, ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(keys)))
    ax.set_xticklabels(["plain files (ext4, warm)", "mount, first walk", "mount, again"],
                       fontsize=8)
    ax.set_ylabel("seconds, find -printf %s")
    ax.set_title("%d tensors in %d shards, %d entries: plain/first %.2fx (median of %d)"
                 % (doc["tensors"], doc["shards"], doc["entries"], doc["ratio_plain_over_first"],
                    doc["runs"]), fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ckptfs")
    ap.add_argument("outdir")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tensors", type=int, default=100000)
    ap.add_argument("--shards", type=int, default=64)
    ap.add_argument("-o", dest="opts", default="")
    ap.add_argument("--also", action="append", default=[],
                    help="mount arguments of another variant, measured in the same rounds")
    ap.add_argument("--floor", help="tests/bench/walkfloor, built")
    a = ap.parse_args()
    variants = {"first": ["-o", a.opts] if a.opts else []}
    for extra in a.also:
        variants[extra] = extra.split()
    ckptfs = os.path.abspath(a.ckptfs)
    d = os.path.join(os.path.abspath(a.outdir), "tree-data")
    src = make_data(d, a.tensors, a.shards)
    plain = os.path.join(d, "plain")
    subprocess.run(["cat"] + [os.path.join(src, f) for f in os.listdir(src)],
                   stdout=subprocess.DEVNULL, check=True)
    with Mount(ckptfs, src, variants["first"]) as mnt:
        make_plain(mnt, plain)
        check_sizes(mnt, a.tensors)
    requests = {}
    for key, args in variants.items():
        with Mount(ckptfs, src, args) as mnt:
            requests[key] = {"first_walk": count_requests(mnt), "second_walk": count_requests(mnt)}
    walk(plain)  # warm: the plain tree's dentries and inodes in memory, as the mount's will be
    runs = {"plain": [], "first": [], "second": []}
    for key in variants:
        if key != "first":
            runs[key] = []
            runs[key + " (second)"] = []
    if a.floor:
        runs["floor"], runs["floor (second)"] = [], []
    entries = None
    for _ in range(a.runs):
        t, n = walk(plain)
        runs["plain"].append(round(t, 3))
        entries = n
        for key, args in variants.items():
            with Mount(ckptfs, src, args) as mnt:
                for k in (key, "second" if key == "first" else key + " (second)"):
                    t, m = walk(mnt)
                    if m != n:
                        sys.exit("tree_bench: FAIL, a walk of the mount listed %d entries, the "
                                 "plain tree %d" % (m, n))
                    runs[k].append(round(t, 3))
        if a.floor:
            with Mount(os.path.abspath(a.floor), plain, []) as mnt:
                for k in ("floor", "floor (second)"):
                    t, m = walk(mnt)
                    if m != n:
                        sys.exit("tree_bench: FAIL, a walk of walkfloor listed %d entries, the "
                                 "plain tree %d" % (m, n))
                    runs[k].append(round(t, 3))
    med = {k: statistics.median(v) for k, v in runs.items()}
    version = subprocess.run([ckptfs, "--version"], stdout=subprocess.PIPE, text=True).stdout
    doc = {"when": datetime.datetime.now().isoformat(timespec="seconds"), "tensors": a.tensors,
           "shards": a.shards, "mount_options": a.opts, "version": version.strip(),
           "loop": loop_of(variants["first"]), "entries": entries, "runs": a.runs,
           "cpus": os.cpu_count(), "loadavg": os.getloadavg(), "median_s": med,
           "ratio_plain_over_first": round(med["plain"] / med["first"], 4),
           "ratio_plain_over_second": round(med["plain"] / med["second"], 4), "every_run": runs,
           "requests": requests,
           "ratio_plain_over_floor": round(med["plain"] / med["floor"], 4) if a.floor else None,
           "variants": {k: dict(loop_of(v), args=v,
                                ratio_plain_over_first=round(med["plain"] / med[k], 4))
                        for k, v in variants.items() if k != "first"}}
    with open(os.path.join(a.outdir, "bench-tree.json"), "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    plot(doc, os.path.join(a.outdir, "bench-tree.png"))
    print("tree bench: %d tensors in %d shards, %d entries, median of %d"
          % (a.tensors, a.shards, entries, a.runs))
    for k in runs:
        print("%-8s %7.3f s   %s" % (k, med[k], " ".join("%.3f" % x for x in runs[k])))
    for k, r in requests.items():
        print("requests %s: %s" % (k, r))
    print("plain/first %.3f   plain/second %.3f" % (doc["ratio_plain_over_first"],
                                                   doc["ratio_plain_over_second"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
