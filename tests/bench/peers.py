#!/usr/bin/python3
"""ckptfs against the FUSE filesystems a user could mount the same bytes with, in one run.

usage: tests/bench/peers.py CKPTFS PASSTHROUGH OUTDIR        (as root; `make bench` calls this)

Systems, side by side on the same bytes (every FUSE one started fresh for each measurement, the
source files warm in the page cache):
  native        the source file / directory itself: the page-cache limit
  bare          tests/bench/passthrough -o readahead_kb=1024: the FUSE ceiling (ckptfs's default
                readahead is 1024 KiB too). It serves one flat directory with a linear lookup,
                so it has no 100k-tensor tree figures.
  ckptfs        CKPTFS SRC MNT with its defaults (a safetensors file)
  squashfuse    squashfuse IMG MNT, over an uncompressed squashfs image
  squashfuse_ll squashfuse_ll IMG MNT, the same image
                (mksquashfs -noI -noD -noF -noX -no-xattrs: inodes, directories, data, fragments
                and xattrs stored uncompressed; `unsquashfs -s` is recorded as proof)
  fuse-zip      fuse-zip -r ZIP MNT, a stored zip (zip -0)
  archivemount  archivemount -o readonly TAR MNT, a plain tar
The peers run with their shipped defaults (their own readahead; PEER_RA_KB=N sets the BDI
read_ahead_kb of their mounts to N after mounting, for a tuned comparison).

Workloads (RUNS rounds, default 3; medians and min-max):
  seq       dd if=MNT/weight of=/dev/null bs=1M of a 1 GiB F32 tensor (random bytes): "first"
            on a fresh mount, then "reread" (MB/s = 1e6 bytes/s, as dd reports it). Peak RSS
            (VmHWM) of the daemon after both reads. Checked once with cmp against the source.
  rand      4 KiB preads of the pages of that tensor in one random order (each page at most
            once) from THREADS threads (default 2) for SECS seconds (default 5), or until every
            page was read: reads/s. Before the run the file's page cache is dropped with
            posix_fadvise(DONTNEED) on the mounted file and POSIX_FADV_RANDOM is set, so every
            read is a 4 KiB miss that reaches the daemon (native keeps its cache warm and goes
            round the same order again for the whole SECS).
            (Sampling pages with repeats would not do: in 5 s a fast daemon brings most of the
            1 GiB into the cache and the figure drifts toward the page cache's.) The JSON keeps
            the pages still resident after the drop (expected 0) and the fault counts.
  mmap      the same through a shared read-only mmap with MADV_RANDOM (no read-around): one
            byte touched per page, touches/s; each touch on a mount is a major fault.
  tree      a tree of 100,000 tensors: ckptfs mounts a safetensors file of 100,000 F32 [4,4]
            tensors named model.layers.{i//20}.mod.p{i%20}.weight; the peers mount the same raw
            bytes as files model/layers/{i//20}/mod/p{i%20}/weight packed into a squashfs image /
            stored zip / tar; native is that directory. "mount" is the time from starting the
            mount command until it has returned and the root has been listed; "find" is
            `find MNT -printf '%s\\n'` (a stat of every entry) on the fresh mount, "find again"
            a second pass. find is reported in entries/s because the trees differ in size
            (ckptfs also shows weight.json and weight.npy for every tensor, and .ckptfs/).
Any command that takes longer than BOUND seconds (default 60) is stopped; that system's
workload is reported as skipped (with how far it got) and not run again in later rounds.
archivemount serves a read at offset N of a tar member by decoding the member from its start
(a read costs O(N): a whole-file read is quadratic, ~6 random reads/s on 1 GiB here), so its
sequential read of the 1 GiB tensor is expected to hit this bound.

env: RUNS=3 SECS=5 THREADS=2 BOUND=60 PEER_RA_KB= SYSTEMS=a,b,... (subset, for debugging)
     NO_INSTALL=1 (never apt-get)
Data is cached under OUTDIR/peers-data/ (delete it to rebuild); the 1 GiB tensor is hard-linked
from OUTDIR/data/raw/weight when bench.sh has written it.
Writes OUTDIR/bench-peers.json (every run's numbers) and OUTDIR/bench-peers.png (a grouped bar
chart per workload with min-max whiskers); prints a table with ratios against native, the bare
daemon and, for ckptfs, against each peer. Exit status 1 when native, bare or ckptfs failed a
workload or a system served wrong bytes; a peer that is missing or too slow does not fail it.
"""

import datetime
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

RUNS = int(os.environ.get("RUNS", "3"))
SECS = float(os.environ.get("SECS", "5"))
THREADS = int(os.environ.get("THREADS", "2"))
BOUND = float(os.environ.get("BOUND", "60"))
PEER_RA_KB = os.environ.get("PEER_RA_KB", "")
ONLY = [s for s in os.environ.get("SYSTEMS", "").split(",") if s]
NO_INSTALL = os.environ.get("NO_INSTALL", "") not in ("", "0")
BARE_RA_KB = 1024

BIG = 1 << 30  # the 1 GiB tensor, F32 [268435456]
NTREE = 100_000
TREE_SHAPE = (4, 4)  # F32: 64 bytes per tensor
DATA_VERSION = 1

SYSTEMS = ["native", "bare", "ckptfs", "squashfuse", "squashfuse_ll", "fuse-zip", "archivemount"]
PEERS = ["squashfuse", "squashfuse_ll", "fuse-zip", "archivemount"]
DEB_PKGS = ["squashfuse", "squashfs-tools", "fuse-zip", "archivemount", "zip", "tar", "fuse3",
            "gcc", "python3-matplotlib"]

# (key, workload, phase, unit, higher is better, label)
METRICS = [
    ("seq/first", "seq", "first", "MB/s", True, "seq 1 MiB, first read"),
    ("seq/reread", "seq", "reread", "MB/s", True, "seq 1 MiB, re-read"),
    ("rand", "rand", "-", "reads/s", True, "random 4 KiB pread"),
    ("mmap", "mmap", "-", "touches/s", True, "mmap random page touch"),
    ("tree/mount", "tree", "mount", "ms", False, "mount, 100k-tensor tree"),
    ("tree/find", "tree", "find", "entries/s", True, "find -printf %s, fresh"),
    ("tree/find2", "tree", "find again", "entries/s", True, "find -printf %s, again"),
    ("rss", "seq", "rss", "MiB", False, "daemon VmHWM after seq"),
]

HELPER_C = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Pages are visited in one shared random order (a permutation): no page is read twice, so on a
 * mount whose cache was dropped every read / touch is a miss that reaches the daemon. Threads
 * take the next 64 positions at a time. The run ends at the deadline or, after a drop, when every
 * page has been read once; without a drop (native: all hits) the order repeats until the deadline. */
static uint32_t *perm;
static uint64_t next_pos, npages, limit; /* limit: npages, or no limit when the cache is kept */

struct targ {
    int fd, mmap_mode, err;
    const volatile unsigned char *map;
    uint64_t ops;
    double deadline, end;
    long majflt, minflt;
};

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void *worker(void *p) {
    struct targ *a = p;
    static __thread unsigned char buf[4096] __attribute__((aligned(4096)));
    uint64_t n = 0;
    unsigned sink = 0;
    struct rusage r0, r1;
    getrusage(RUSAGE_THREAD, &r0);
    for (;;) {
        uint64_t i = __atomic_fetch_add(&next_pos, 64, __ATOMIC_RELAXED), e = i + 64;
        if (i >= limit) break;
        if (e > limit) e = limit;
        for (; i < e; i++) {
            if (now() >= a->deadline) goto done;
            uint64_t pg = perm[i % npages];
            if (a->mmap_mode) {
                sink += a->map[pg * 4096];
            } else {
                ssize_t r = pread(a->fd, buf, 4096, (off_t)(pg * 4096));
                if (r <= 0) {
                    a->err = r < 0 ? errno : EIO;
                    goto done;
                }
            }
            n++;
        }
    }
done:
    a->end = now();
    getrusage(RUSAGE_THREAD, &r1);
    a->ops = n + (sink & 0);
    a->majflt = r1.ru_majflt - r0.ru_majflt;
    a->minflt = r1.ru_minflt - r0.ru_minflt;
    return NULL;
}

/* usage: helper read|mmap FILE THREADS SECS DROP SEED  ->  one JSON line */
int main(int argc, char **argv) {
    if (argc != 7) return 2;
    int mmap_mode = strcmp(argv[1], "mmap") == 0, nt = atoi(argv[3]), drop = atoi(argv[5]);
    double secs = atof(argv[4]), t0 = now();
    uint64_t x = strtoull(argv[6], NULL, 0) * 0x9E3779B97F4A7C15ull | 1;
    int fd = open(argv[2], O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || st.st_size < 4096 || nt < 1) {
        fprintf(stderr, "helper: %s: %s\n", argv[2], strerror(errno));
        return 1;
    }
    double open_s = now() - t0;
    npages = (uint64_t)st.st_size / 4096;
    if (!(perm = malloc(npages * sizeof *perm))) return 1;
    for (uint64_t i = 0; i < npages; i++) perm[i] = (uint32_t)i;
    for (uint64_t i = npages - 1; i > 0; i--) { /* Fisher-Yates with xorshift64 */
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        uint64_t j = x % (i + 1);
        uint32_t t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    limit = drop ? npages : UINT64_MAX;
    if (drop) posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    unsigned char *map = mmap(NULL, npages * 4096, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        fprintf(stderr, "helper: mmap %s: %s\n", argv[2], strerror(errno));
        return 1;
    }
    unsigned char *vec = malloc(npages);
    uint64_t resident = 0;
    if (vec && mincore(map, npages * 4096, vec) == 0)
        for (uint64_t i = 0; i < npages; i++) resident += vec[i] & 1;
    free(vec);
    if (mmap_mode)
        madvise(map, npages * 4096, MADV_RANDOM);
    else
        posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
    struct targ *a = calloc((size_t)nt, sizeof *a);
    pthread_t *th = calloc((size_t)nt, sizeof *th);
    if (!a || !th) return 1;
    double start = now();
    for (int i = 0; i < nt; i++) {
        a[i] = (struct targ){.fd = fd, .mmap_mode = mmap_mode, .map = map, .deadline = start + secs};
        if (pthread_create(&th[i], NULL, worker, &a[i]) != 0) return 1;
    }
    uint64_t ops = 0;
    long maj = 0, min = 0;
    int err = 0;
    double end = start;
    for (int i = 0; i < nt; i++) {
        pthread_join(th[i], NULL);
        ops += a[i].ops, maj += a[i].majflt, min += a[i].minflt;
        if (a[i].err) err = a[i].err;
        if (a[i].end > end) end = a[i].end;
    }
    printf("{\"ops\": %llu, \"secs\": %.6f, \"npages\": %llu, \"all_pages_read\": %s, "
           "\"resident_before\": %llu, \"majflt\": %ld, \"minflt\": %ld, \"open_s\": %.6f, "
           "\"error\": %s%s%s}\n",
           (unsigned long long)ops, end - start, (unsigned long long)npages,
           ops >= npages ? "true" : "false", (unsigned long long)resident, maj, min, open_s,
           err ? "\"" : "", err ? strerror(err) : "null", err ? "\"" : "");
    return err ? 1 : 0;
}
"""


def log(*a):
    print("peers:", *a, file=sys.stderr, flush=True)


def loadavg():
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


class Skip(Exception):
    """A workload that hit the time bound or could not run: value n/a, with a note."""


# ---- packages ------------------------------------------------------------------------------
def pkg_version(p):
    r = subprocess.run(["dpkg-query", "-W", "-f=${Status}|${Version}", p], capture_output=True,
                       text=True)
    st, _, ver = r.stdout.partition("|")
    return ver if r.returncode == 0 and st.endswith("ok installed") else None


def install_peers():
    missing = [p for p in DEB_PKGS if pkg_version(p) is None]
    if not missing:
        return
    if NO_INSTALL or os.geteuid() != 0:
        log("warning: missing Debian packages (not installing):", " ".join(missing))
        return
    log("installing:", " ".join(missing))
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = ["timeout", "900", "apt-get", "install", "-y", "-qq", "--no-install-recommends"] + missing

    def attempt():
        return subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True).returncode == 0

    if not attempt():
        log("apt-get install failed; running apt-get update first")
        subprocess.run(["timeout", "600", "apt-get", "update", "-qq"], env=env,
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        if not attempt():
            still = [p for p in missing if pkg_version(p) is None]
            log("warning: could not install:", " ".join(still))


# ---- data ----------------------------------------------------------------------------------
def run(cmd, timeout, **kw):
    """Run a command with a time bound; raise on failure with its stderr."""
    r = subprocess.run(cmd, timeout=timeout, stdin=subprocess.DEVNULL, capture_output=True,
                       text=True, **kw)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))}: exit {r.returncode}: {r.stderr.strip()[-400:]}")
    return r.stdout


def st_header(entries):
    text = json.dumps(entries, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text


def make_data(out):
    """Build (or reuse) every source under OUT/peers-data; return a dict of paths."""
    d = os.path.join(out, "peers-data")
    p = {
        "big_raw": os.path.join(d, "big", "raw"),  # directory with weight only
        "weight": os.path.join(d, "big", "raw", "weight"),
        "big_st": os.path.join(d, "big", "model.safetensors"),
        "big_sqfs": os.path.join(d, "big", "big.sqfs"),
        "big_zip": os.path.join(d, "big", "big.zip"),
        "big_tar": os.path.join(d, "big", "big.tar"),
        "tree_raw": os.path.join(d, "tree", "raw"),  # model/layers/...
        "tree_st": os.path.join(d, "tree", "model.safetensors"),
        "tree_sqfs": os.path.join(d, "tree", "tree.sqfs"),
        "tree_zip": os.path.join(d, "tree", "tree.zip"),
        "tree_tar": os.path.join(d, "tree", "tree.tar"),
    }
    stamp = os.path.join(d, "stamp.json")
    want = {"version": DATA_VERSION, "big": BIG, "ntree": NTREE}
    try:
        with open(stamp) as f:
            if json.load(f) == want and all(os.path.exists(v) for v in p.values()):
                return p
    except (OSError, ValueError):
        pass
    log(f"building the data under {d} (once)")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(p["big_raw"])
    os.makedirs(os.path.dirname(p["tree_raw"]))

    # 1 GiB tensor: reuse bench.sh's bytes when they are there
    shared = os.path.join(out, "data", "raw", "weight")
    try:
        if os.stat(shared).st_size != BIG:
            raise OSError
        os.link(shared, p["weight"])
    except OSError:
        rng = np.random.default_rng(20240531)
        with open(p["weight"] + ".tmp", "wb") as f:
            for _ in range(BIG // (64 << 20)):
                f.write(rng.bytes(64 << 20))
        os.rename(p["weight"] + ".tmp", p["weight"])
    with open(p["big_st"] + ".tmp", "wb") as f, open(p["weight"], "rb") as src:
        f.write(st_header({"weight": {"dtype": "F32", "shape": [BIG // 4], "data_offsets": [0, BIG]}}))
        shutil.copyfileobj(src, f, 16 << 20)
    os.rename(p["big_st"] + ".tmp", p["big_st"])

    # 100k-tensor tree: safetensors file + the same bytes as raw files
    nb = 4 * TREE_SHAPE[0] * TREE_SHAPE[1]
    payload = np.random.default_rng(7).standard_normal(NTREE * nb // 4, dtype=np.float32).tobytes()
    hdr, names = {}, []
    for i in range(NTREE):
        name = f"model.layers.{i // 20}.mod.p{i % 20}.weight"
        names.append(name)
        hdr[name] = {"dtype": "F32", "shape": list(TREE_SHAPE), "data_offsets": [i * nb, (i + 1) * nb]}
    with open(p["tree_st"], "wb") as f:
        f.write(st_header(hdr))
        f.write(payload)
    for i, name in enumerate(names):
        path = os.path.join(p["tree_raw"], *name.split("."))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(payload[i * nb:(i + 1) * nb])

    # the peers' images; every one stores the bytes uncompressed
    sq = ["-noI", "-noD", "-noF", "-noX", "-no-xattrs", "-all-root", "-quiet", "-no-progress"]
    run(["mksquashfs", p["big_raw"], p["big_sqfs"]] + sq, 600)
    run(["mksquashfs", p["tree_raw"], p["tree_sqfs"]] + sq, 600)
    run(["zip", "-0", "-X", "-q", os.path.abspath(p["big_zip"]), "weight"], 600, cwd=p["big_raw"])
    run(["zip", "-0", "-X", "-q", "-r", os.path.abspath(p["tree_zip"]), "model"], 900,
        cwd=p["tree_raw"])
    run(["tar", "-C", p["big_raw"], "-cf", p["big_tar"], "weight"], 600)
    run(["tar", "-C", p["tree_raw"], "-cf", p["tree_tar"], "model"], 600)
    with open(stamp, "w") as f:
        json.dump(want, f)
    return p


def warm(paths):
    """Read files (and walk directories) so the sources sit in the page / dentry cache."""
    for path in paths:
        if os.path.isdir(path):
            subprocess.run(["timeout", "120", "find", path, "-printf", ""], stdout=subprocess.DEVNULL)
        else:
            subprocess.run(["timeout", "120", "cat", path], stdout=subprocess.DEVNULL)


# ---- mounts --------------------------------------------------------------------------------
class Mount:
    """One mount point, reused: mount() a command on it, unmount() always in finally."""

    def __init__(self, work):
        self.dir = tempfile.mkdtemp(prefix="ckptfs-peers.", dir="/tmp")
        self.log = os.path.join(work, "mount.log")
        self.pid = None

    def entry(self):
        with open("/proc/self/mountinfo") as f:
            for line in f:
                fld = line.split()
                mp = fld[4].encode().decode("unicode_escape")
                if mp == self.dir:
                    return fld[2]  # major:minor
        return None

    def daemon_pid(self):
        me = os.getpid()
        for e in os.listdir("/proc"):
            if not e.isdigit() or int(e) == me:
                continue
            try:
                with open(f"/proc/{e}/cmdline", "rb") as f:
                    args = f.read().split(b"\0")
            except OSError:
                continue
            if self.dir.encode() in args:
                return int(e)
        return None

    def mount(self, cmd, ra_kb=None):
        """Start cmd (which must return once the mount is live); return seconds until the
        mount is listed and its root read. Raises Skip on failure or timeout."""
        self.unmount()
        t0 = time.monotonic()
        try:
            with open(self.log, "w") as lf:
                r = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=lf, stderr=lf,
                                   timeout=BOUND)
        except subprocess.TimeoutExpired:
            self.pid = self.daemon_pid()
            self.unmount()
            raise Skip(f"mount took > {BOUND:.0f} s")
        self.pid = self.daemon_pid()
        if r.returncode != 0 or self.entry() is None:
            with open(self.log) as f:
                msg = f.read().strip()[:300]
            self.unmount()
            raise Skip(f"mount failed (exit {r.returncode}): {msg}")
        try:
            os.stat(self.dir)
            os.listdir(self.dir)
        except OSError as e:
            self.unmount()
            raise Skip(f"mount not usable: {e}")
        secs = time.monotonic() - t0
        dev = self.entry()
        if ra_kb:
            try:
                with open(f"/sys/class/bdi/{dev}/read_ahead_kb", "w") as f:
                    f.write(f"{ra_kb}\n")
            except OSError as e:
                log(f"warning: cannot set read_ahead_kb of {dev}: {e}")
        return secs

    def readahead_kb(self):
        try:
            with open(f"/sys/class/bdi/{self.entry()}/read_ahead_kb") as f:
                return int(f.read())
        except (OSError, ValueError):
            return None

    def vmhwm_kib(self):
        try:
            with open(f"/proc/{self.pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1])
        except (OSError, TypeError):
            pass
        return None

    def unmount(self):
        dev = self.entry()
        if dev is not None:
            for _ in range(5):
                try:
                    subprocess.run(["fusermount3", "-u", self.dir], timeout=10,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                except subprocess.TimeoutExpired:
                    pass
                if self.entry() is None:
                    break
                time.sleep(0.2)
            else:
                log(f"warning: {self.dir} busy, aborting FUSE connection {dev}")
                try:
                    with open(f"/sys/fs/fuse/connections/{dev.split(':')[1]}/abort", "w") as f:
                        f.write("1")
                except OSError:
                    pass
                for c in (["fusermount3", "-uz", self.dir], ["umount", "-l", self.dir]):
                    try:
                        subprocess.run(c, timeout=10, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL)
                    except subprocess.TimeoutExpired:
                        pass
                    if self.entry() is None:
                        break
        # wait for the daemon we started to exit (fuse-zip frees its buffers, ...)
        if self.pid:
            deadline = time.monotonic() + 15
            while os.path.exists(f"/proc/{self.pid}") and time.monotonic() < deadline:
                try:
                    with open(f"/proc/{self.pid}/stat") as f:
                        if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                            break
                except OSError:
                    break
                time.sleep(0.05)
            else:
                if os.path.exists(f"/proc/{self.pid}"):
                    log(f"warning: daemon {self.pid} still running after unmount; killing it")
                    try:
                        os.kill(self.pid, signal.SIGKILL)
                    except OSError:
                        pass
            self.pid = None

    def close(self):
        self.unmount()
        if self.entry() is None:
            try:
                os.rmdir(self.dir)
            except OSError:
                pass
        else:
            log(f"ERROR: could not unmount {self.dir}")


# ---- workloads -----------------------------------------------------------------------------
def dd(path):
    """MB/s of dd bs=1M of path to /dev/null; Skip (with how far it got) past BOUND."""
    r = subprocess.run(["timeout", "-s", "INT", "-k", "5", str(int(BOUND)), "dd", f"if={path}",
                        "of=/dev/null", "bs=1M"], stdin=subprocess.DEVNULL, capture_output=True,
                       text=True, env=dict(os.environ, LC_ALL="C"))
    lines = [x for x in r.stderr.splitlines() if "copied" in x]
    nbytes = int(lines[-1].split()[0]) if lines else 0
    secs = float(lines[-1].split(", ")[-2].split()[0]) if lines else 0.0
    if r.returncode == 124 or (r.returncode != 0 and nbytes < BIG and secs >= BOUND - 1):
        raise Skip(f"> {BOUND:.0f} s (read {nbytes / 2**20:.0f} MiB of 1024 in {secs:.0f} s)")
    if r.returncode != 0 or nbytes != BIG or secs <= 0:
        raise Skip(f"dd failed: exit {r.returncode}: {r.stderr.strip()[-200:]}")
    return nbytes / secs / 1e6


def helper_run(helper, mode, path, drop, seed):
    try:
        r = subprocess.run([helper, mode, path, str(THREADS), str(SECS), "1" if drop else "0",
                            str(seed)], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=SECS + BOUND)
    except subprocess.TimeoutExpired:
        raise Skip(f"> {BOUND:.0f} s past the {SECS:g} s run (a request never returned)")
    if r.returncode != 0 or not r.stdout.strip():
        raise Skip(f"{mode} failed: exit {r.returncode}: {(r.stdout + r.stderr).strip()[-200:]}")
    res = json.loads(r.stdout)
    res["rate"] = res["ops"] / res["secs"]
    return res


def find_entries(path):
    """(seconds, entries) of find PATH -printf '%s\\n'; Skip past BOUND."""
    t0 = time.monotonic()
    try:
        r = subprocess.run(["find", path, "-printf", "%s\n"], stdin=subprocess.DEVNULL,
                           capture_output=True, timeout=BOUND)
    except subprocess.TimeoutExpired:
        raise Skip(f"find took > {BOUND:.0f} s")
    secs = time.monotonic() - t0
    if r.returncode != 0:
        raise Skip(f"find failed: {r.stderr.decode(errors='replace').strip()[-200:]}")
    return secs, r.stdout.count(b"\n")


def same_bytes(a, b):
    try:
        return subprocess.run(["cmp", "-s", a, b], timeout=BOUND).returncode == 0
    except subprocess.TimeoutExpired:
        return None


# ---- the run -------------------------------------------------------------------------------
class Bench:
    def __init__(self, ckptfs, passthrough, out, work):
        self.out, self.work = out, work
        self.values = {}  # (system, metric) -> list of numbers (None = failed that round)
        self.extra = {}  # (system, metric) -> list of dicts (helper details, entries, ...)
        self.notes = {}  # (system, metric) -> note (skip reason)
        self.skipped = set()  # (system, workload) not run again
        self.info = {}  # system -> dict (command, readahead, verified, ...)
        self.failures = []
        self.ckptfs, self.passthrough = ckptfs, passthrough
        self.mnt = Mount(work)

    def record(self, sys_, key, value, extra=None):
        self.values.setdefault((sys_, key), []).append(value)
        self.extra.setdefault((sys_, key), []).append(extra)

    def skip(self, sys_, workload, keys, reason):
        for k in keys:
            self.record(sys_, k, None)
            self.notes.setdefault((sys_, k), reason)
        if reason.startswith(">") or "took >" in reason:
            self.skipped.add((sys_, workload))
        log(f"{sys_}/{workload}: {reason}")

    def commands(self, p):
        """system -> (big source for warming, big mount cmd, tree source, tree mount cmd)."""
        m = self.mnt.dir
        c = {
            "native": (p["weight"], None, p["tree_raw"], None),
            "bare": (p["weight"], [self.passthrough, p["big_raw"], m, "-o", f"readahead_kb={BARE_RA_KB}"],
                     None, None),
            "ckptfs": (p["big_st"], [self.ckptfs, p["big_st"], m], p["tree_st"], [self.ckptfs, p["tree_st"], m]),
            "squashfuse": (p["big_sqfs"], ["squashfuse", p["big_sqfs"], m], p["tree_sqfs"],
                           ["squashfuse", p["tree_sqfs"], m]),
            "squashfuse_ll": (p["big_sqfs"], ["squashfuse_ll", p["big_sqfs"], m], p["tree_sqfs"],
                              ["squashfuse_ll", p["tree_sqfs"], m]),
            "fuse-zip": (p["big_zip"], ["fuse-zip", "-r", p["big_zip"], m], p["tree_zip"],
                         ["fuse-zip", "-r", p["tree_zip"], m]),
            "archivemount": (p["big_tar"], ["archivemount", "-o", "readonly", p["big_tar"], m],
                             p["tree_tar"], ["archivemount", "-o", "readonly", p["tree_tar"], m]),
        }
        return c

    def available(self, sys_):
        binary = {"bare": self.passthrough, "ckptfs": self.ckptfs}.get(sys_, sys_)
        if sys_ == "native":
            return True
        return shutil.which(binary) is not None or os.access(binary, os.X_OK)

    def ra(self, sys_):
        return int(PEER_RA_KB) if PEER_RA_KB and sys_ in PEERS else None

    def big_workload(self, sys_, wl, keys, rnd, fn):
        """Mount the 1 GiB source fresh (unless native), run fn(path), unmount."""
        src, cmd, _, _ = self.cmds[sys_]
        if (sys_, wl) in self.skipped:
            for k in keys:
                self.record(sys_, k, None)
            return
        warm([src])
        try:
            if cmd is None:
                return fn(self.p["weight"])
            self.mnt.mount(cmd, self.ra(sys_))
            inf = self.info.setdefault(sys_, {})
            inf.setdefault("readahead_kb", self.mnt.readahead_kb())
            inf.setdefault("command", " ".join(map(str, cmd)).replace(self.mnt.dir, "MNT"))
            return fn(os.path.join(self.mnt.dir, "weight"))
        except Skip as e:
            self.skip(sys_, wl, keys, str(e))
        finally:
            self.mnt.unmount()

    def do_seq(self, sys_, rnd):
        keys = ["seq/first", "seq/reread", "rss"]

        def fn(path):
            first = dd(path)
            self.record(sys_, "seq/first", first)
            try:
                reread = dd(path)
            except Skip as e:
                self.skip(sys_, "seq-reread", ["seq/reread"], str(e))
                reread = None
            else:
                self.record(sys_, "seq/reread", reread)
            if sys_ == "native":
                self.record(sys_, "rss", None)
            else:
                hwm = self.mnt.vmhwm_kib()
                self.record(sys_, "rss", hwm / 1024 if hwm else None)
                if hwm is None:
                    self.notes.setdefault((sys_, "rss"), "daemon pid not found")
            if rnd == 1 and sys_ != "native":
                ok = same_bytes(path, self.p["weight"])
                self.info.setdefault(sys_, {})["verified_big"] = ok
                if ok is False:
                    log(f"WARNING: {sys_}: MNT/weight differs from the source bytes")
                    self.failures.append(f"{sys_}: wrong bytes in weight")
            log(f"  {sys_:13s} seq first {first:8.0f} MB/s  reread "
                + (f"{reread:8.0f}" if reread else "     n/a") + " MB/s")

        self.big_workload(sys_, "seq", keys, rnd, fn)

    def do_helper(self, sys_, mode, rnd):
        key = "rand" if mode == "read" else "mmap"

        def fn(path):
            res = helper_run(self.helper, mode, path, sys_ != "native", 1000 * rnd + len(key))
            self.record(sys_, key, res["rate"], res)
            log(f"  {sys_:13s} {key} {res['rate']:10.0f}/s  ({res['ops']} pages in {res['secs']:.2f} s,"
                f" resident after drop {res['resident_before']}, majflt {res['majflt']})")

        self.big_workload(sys_, key, [key], rnd, fn)

    def do_tree(self, sys_, rnd):
        keys = ["tree/mount", "tree/find", "tree/find2"]
        _, _, src, cmd = self.cmds[sys_]
        if src is None:
            for k in keys:
                self.record(sys_, k, None)
                self.notes.setdefault((sys_, k), "flat-directory daemon: no tree")
            return
        if (sys_, "tree") in self.skipped:
            for k in keys:
                self.record(sys_, k, None)
            return
        warm([src])
        got = {}  # key -> (value, extra)
        reason = None
        try:
            if cmd is None:
                root = src
                self.notes.setdefault((sys_, "tree/mount"), "-")
            else:
                mount_s = self.mnt.mount(cmd, self.ra(sys_))
                root = self.mnt.dir
                got["tree/mount"] = (mount_s * 1000, None)
            s1, n1 = find_entries(root)
            got["tree/find"] = (n1 / s1, {"secs": s1, "entries": n1})
            s2, n2 = find_entries(root)
            got["tree/find2"] = (n2 / s2, {"secs": s2, "entries": n2})
            if rnd == 1:
                rel = os.path.join("model", "layers", str((NTREE - 1) // 20), "mod",
                                   f"p{(NTREE - 1) % 20}", "weight")
                ok = n1 >= NTREE and same_bytes(os.path.join(root, rel),
                                                os.path.join(self.p["tree_raw"], rel))
                self.info.setdefault(sys_, {})["verified_tree"] = ok
                self.info[sys_]["tree_entries"] = n1
                if not ok:
                    log(f"WARNING: {sys_}: tree has {n1} entries or wrong bytes in {rel}")
                    self.failures.append(f"{sys_}: tree check failed")
            log(f"  {sys_:13s} tree mount "
                + (f"{got['tree/mount'][0]:7.0f} ms" if "tree/mount" in got else "      -   ")
                + f"  find {s1:6.2f} s ({n1} entries)  again {s2:6.2f} s")
        except Skip as e:
            reason = str(e)
        finally:
            self.mnt.unmount()
        for k in keys:
            if k in got:
                self.record(sys_, k, got[k][0], got[k][1] if got[k][1] is not None else None)
            else:
                self.record(sys_, k, None)
                if reason:
                    self.notes.setdefault((sys_, k), reason)
        if reason:
            log(f"{sys_}/tree: {reason}")
            if reason.startswith(">") or "took >" in reason:
                self.skipped.add((sys_, "tree"))

    def main(self, p):
        self.p = p
        self.cmds = self.commands(p)
        self.helper = os.path.join(self.work, "helper")
        with open(self.helper + ".c", "w") as f:
            f.write(HELPER_C)
        run(["cc", "-O2", "-pthread", "-o", self.helper, self.helper + ".c"], 120)
        systems = [s for s in SYSTEMS if not ONLY or s in ONLY]
        for s in systems:
            if not self.available(s):
                log(f"{s}: not installed; n/a")
                for m in METRICS:
                    self.values[(s, m[0])] = [None] * RUNS
                    self.notes[(s, m[0])] = "not installed"
        todo = [s for s in systems if self.available(s)]
        for rnd in range(1, RUNS + 1):
            log(f"round {rnd}/{RUNS} (load {' '.join(map(str, loadavg()))})")
            for s in todo:
                self.do_seq(s, rnd)
                self.do_helper(s, "read", rnd)
                self.do_helper(s, "mmap", rnd)
                self.do_tree(s, rnd)
        return systems


# ---- summary -------------------------------------------------------------------------------
def stats(vals):
    ok = [v for v in vals if v is not None]
    if not ok:
        return None
    return {"median": statistics.median(ok), "min": min(ok), "max": max(ok), "ok_runs": len(ok)}


def fmt(v):
    if v is None:
        return "n/a"
    a = abs(v)
    return f"{v:.0f}" if a >= 100 else f"{v:.1f}" if a >= 10 else f"{v:.2f}"


def xfmt(r, empty):
    """A ratio with 3 significant digits (0.00123x, 0.456x, 12.3x, 3430x)."""
    if not r:
        return empty
    return f"{r:.0f}x" if r >= 1000 else f"{r:.3g}x"


def ratio(a, b, higher):
    """How many times a is better than b (>1 = a better)."""
    if a is None or b is None or a == 0 or b == 0:
        return None
    return a / b if higher else b / a


def summarize(bench, systems, meta, out):
    table = {}  # (system, key) -> stats
    for s in systems:
        for key, *_ in METRICS:
            table[(s, key)] = stats(bench.values.get((s, key), []))
    lines = []
    w = max(len(s) for s in systems)
    head = f"  {'system':{w}s} {'median':>10s} {'min-max':>21s} {'vs native':>9s} {'vs bare':>8s}  note"
    for key, wl, ph, unit, higher, label in METRICS:
        lines.append(f"{label} ({unit}, {'higher' if higher else 'lower'} is better)")
        lines.append(head)
        for s in systems:
            st = table[(s, key)]
            note = bench.notes.get((s, key), "")
            if st and st["ok_runs"] < RUNS:
                note = (note + "; " if note else "") + f"{st['ok_runs']}/{RUNS} runs"
            if st is None:
                lines.append(f"  {s:{w}s} {'n/a':>10s} {'':>21s} {'':>9s} {'':>8s}  {note}")
                continue
            nat = table.get(("native", key))
            bare = table.get(("bare", key))
            # "vs" columns: the plain ratio of medians (value / reference)
            vn = st["median"] / nat["median"] if nat and s != "native" and nat["median"] else None
            vb = st["median"] / bare["median"] if bare and s not in ("bare", "native") and bare["median"] else None
            lines.append(f"  {s:{w}s} {fmt(st['median']):>10s} "
                         f"{fmt(st['min']) + '-' + fmt(st['max']):>21s} "
                         f"{xfmt(vn, '-'):>9s} {xfmt(vb, '-'):>8s}  {note}")
        lines.append("")
    peers = [s for s in systems if s in PEERS]
    if "ckptfs" in systems and peers:
        lines.append("ckptfs against each peer: how many times better ckptfs is (median / median,")
        lines.append("inverted for time and memory; > 1 = ckptfs ahead)")
        lw = max(len(m[5]) for m in METRICS)
        lines.append(f"  {'':{lw}s} " + " ".join(f"{s:>13s}" for s in peers))
        for key, wl, ph, unit, higher, label in METRICS:
            c = table[("ckptfs", key)]
            cells = []
            for s in peers:
                pst = table[(s, key)]
                r = ratio(c["median"] if c else None, pst["median"] if pst else None, higher)
                cells.append(xfmt(r, "n/a"))
            lines.append(f"  {label:{lw}s} " + " ".join(f"{x:>13s}" for x in cells))
        lines.append("")

    results = []
    for key, wl, ph, unit, higher, label in METRICS:
        for s in systems:
            st = table[(s, key)]
            ref = {}
            for r in ["native", "bare"] + peers:
                rs = table.get((r, key))
                if r != s and st and rs and rs["median"]:
                    ref[r] = st["median"] / rs["median"]
            results.append({
                "workload": wl, "phase": ph, "metric": key, "label": label, "unit": unit,
                "higher_is_better": higher, "system": s, "values": bench.values.get((s, key), []),
                "median": st["median"] if st else None, "min": st["min"] if st else None,
                "max": st["max"] if st else None, "ok_runs": st["ok_runs"] if st else 0,
                "ratio_of_medians": ref, "note": bench.notes.get((s, key)),
                "details": bench.extra.get((s, key)) if any(bench.extra.get((s, key), [])) else None,
            })
    doc = dict(meta, results=results, systems={s: bench.info.get(s, {}) for s in systems})
    with open(os.path.join(out, "bench-peers.json"), "w") as f:
        json.dump(doc, f, indent=1)
    plot(table, systems, bench, os.path.join(out, "bench-peers.png"), meta)
    return "\n".join(lines)


def plot(table, systems, bench, path, meta):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        log(f"warning: no matplotlib ({e}); {path} not written")
        return
    panels = [
        ("sequential dd bs=1M of a 1 GiB tensor (MB/s)", ["seq/first", "seq/reread"], ["first", "re-read"]),
        (f"random 4 KiB pread, {THREADS} threads (reads/s)", ["rand"], [""]),
        (f"mmap random page touches, {THREADS} threads (/s)", ["mmap"], [""]),
        ("find -printf %s of the 100k-tensor tree (entries/s)", ["tree/find", "tree/find2"], ["fresh mount", "again"]),
        ("mount time of the 100k-tensor tree (ms)", ["tree/mount"], [""]),
        ("daemon peak RSS (VmHWM) after seq (MiB)", ["rss"], [""]),
    ]
    colors = dict(zip(SYSTEMS, ["#555555", "#999999", "#d62728", "#1f77b4", "#6baed6", "#2ca02c",
                                "#ff7f0e"]))
    fig, axes = plt.subplots(2, 3, figsize=(18, 9.5))
    for ax, (title, keys, groups) in zip(axes.flat, panels):
        n = len(systems)
        width = 0.8 / n
        vals = []
        for gi, key in enumerate(keys):
            for si, s in enumerate(systems):
                st = table[(s, key)]
                x = gi + (si - (n - 1) / 2) * width
                if st is None:
                    note = bench.notes.get((s, key), "")
                    txt = "skip" if note.startswith(">") or "took >" in note else "n/a"
                    if s == "native" and key in ("rss", "tree/mount"):
                        txt = "-"
                    ax.text(x, 0.01, txt, rotation=90, ha="center", va="bottom", fontsize=7,
                            transform=ax.get_xaxis_transform(), color=colors.get(s, "k"))
                    continue
                vals += [st["min"], st["max"]]
                ax.bar(x, st["median"], width, color=colors.get(s, "k"),
                       yerr=[[st["median"] - st["min"]], [st["max"] - st["median"]]], capsize=2,
                       ecolor="black", linewidth=0)
        pos = [v for v in vals if v > 0]
        if pos and max(pos) / min(pos) > 50:
            ax.set_yscale("log")
        ax.set_title(title, fontsize=10)
        ax.set_xticks(range(len(keys)))
        ax.set_xticklabels(groups)
        ax.grid(axis="y", alpha=0.3)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colors.get(s, "k")) for s in systems]
    fig.legend(handles, systems, loc="lower center", ncol=len(systems))
    fig.suptitle(f"ckptfs and its peers: median of {RUNS} runs, whiskers min-max "
                 f"({meta['date']}, {meta['cpus']} CPUs, load {meta['loadavg_start'][0]:.1f}"
                 f" -> {meta['loadavg_end'][0]:.1f}); 'skip' = over {BOUND:.0f} s")
    fig.tight_layout(rect=(0, 0.05, 1, 0.96))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    if len(sys.argv) != 4:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    ckptfs, passthrough, out = (os.path.abspath(a) for a in sys.argv[1:])
    if os.geteuid() != 0:
        log("warning: not root: packages cannot be installed, read_ahead_kb cannot be set")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    os.makedirs(out, exist_ok=True)
    load0 = loadavg()
    log(f"load average at start: {' '.join(map(str, load0))}")
    install_peers()
    t0 = time.monotonic()
    p = make_data(out)
    work = tempfile.mkdtemp(prefix="ckptfs-peers-work.")
    bench = Bench(ckptfs, passthrough, out, work)
    try:
        systems = bench.main(p)
    finally:
        bench.mnt.close()
        shutil.rmtree(work, ignore_errors=True)
    load1 = loadavg()
    sq = subprocess.run(["unsquashfs", "-s", p["big_sqfs"]], capture_output=True, text=True).stdout
    ckv = subprocess.run([ckptfs, "--version"], capture_output=True, text=True).stdout.strip()
    meta = {
        "benchmark": "peers", "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "kernel": os.uname().release, "cpus": os.cpu_count(), "runs": RUNS, "secs": SECS,
        "threads": THREADS, "bound_s": BOUND, "peer_readahead_kb": int(PEER_RA_KB) if PEER_RA_KB else None,
        "bare_readahead_kb": BARE_RA_KB, "loadavg_start": load0, "loadavg_end": load1,
        "elapsed_s": round(time.monotonic() - t0, 1), "ckptfs": ckptfs, "ckptfs_version": ckv,
        "passthrough": passthrough,
        "packages": {k: pkg_version(k) for k in DEB_PKGS},
        "squashfs_image": [x for x in sq.splitlines() if "ompress" in x],
        "tree": {"tensors": NTREE, "dtype": "F32", "shape": list(TREE_SHAPE)},
        "big_bytes": BIG,
    }
    text = summarize(bench, systems, meta, out)
    print(f"ckptfs peers bench: {RUNS} runs, {THREADS} threads x {SECS:g} s, bound {BOUND:.0f} s, "
          f"{os.cpu_count()} CPUs; load average {' '.join(map(str, load0))} at start, "
          f"{' '.join(map(str, load1))} at end")
    print("readahead_kb: " + ", ".join(f"{s} {bench.info.get(s, {}).get('readahead_kb')}"
                                         for s in systems if s != "native"))
    print(text)
    log(f"wrote {out}/bench-peers.json and {out}/bench-peers.png ({meta['elapsed_s']:.0f} s)")
    bad = [f for f in bench.failures]
    for s in ("native", "bare", "ckptfs"):
        for key, wl, *_ in METRICS:
            if s in systems and any(v is None for v in bench.values.get((s, key), [])) and \
                    bench.notes.get((s, key)) not in (None, "-", "flat-directory daemon: no tree") and \
                    not (s == "native" and key == "rss"):
                bad.append(f"{s}: {key}: {bench.notes.get((s, key))}")
    for b in bad:
        log("FAILED:", b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
