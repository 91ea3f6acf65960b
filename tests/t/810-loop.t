#!/usr/bin/python3
"""The request loop (fs/common/loop.c): it spins for the next request only while requests keep coming,
so an idle mount's daemon sleeps; it answers walks and parallel reads; signals end it cleanly.

For each loop: the default (several threads, spin_us=100), -s (one thread), spin_us=100000
(the longest window) and spin_us=0 (libfuse's own loop), a mount in the foreground (-f, so
the test knows the daemon's pid) of a safetensors file made here (300 F32 [4,4] tensors in
15 layers, 2 F32 tensors of 4 MiB) is walked with find (every tensor file listed, 64 bytes
each), the two big tensors are read by 4 threads at once (2 each, bytes equal to the numpy
arrays written), and then the daemon's CPU time (utime + stime from /proc/PID/stat) over 2
seconds of no requests must stay under 0.1 s: a loop that spins without sleeping would use
about 2 s. SIGTERM (SIGINT for -s) must unmount and exit 0. spin_us=abc and spin_us=100001
are refused with exit status 1.
"""
import json
import os
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from ckptfs_test import Watchdog, is_mounted, run_capture, unmount  # noqa: E402
from mount_checks import finish, mount_prefix, start  # noqa: E402

SMALL = 300
BIG = 1 << 20  # elements: 4 MiB of F32
IDLE_SECONDS = 2.0
IDLE_CPU_LIMIT = 0.1


def make_source(d):
    rng = np.random.default_rng(7)
    tensors = [("model.layers.%d.p%d.weight" % (i // 20, i % 20),
                np.full((4, 4), i, "<f4")) for i in range(SMALL)]
    big = [("big.a", rng.standard_normal(BIG).astype("<f4")),
           ("big.b", rng.standard_normal(BIG).astype("<f4"))]
    header, off = {}, 0
    for name, a in tensors + big:
        header[name] = {"dtype": "F32", "shape": list(a.shape),
                        "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path = os.path.join(d, "model.safetensors")
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for _, a in tensors + big:
            f.write(a.tobytes())
    return path, dict(big)


def cpu_seconds(pid):
    fields = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_mounted(mnt, proc, seconds=30):
    end = time.monotonic() + seconds
    while time.monotonic() < end and proc.poll() is None:
        if is_mounted(mnt):
            try:
                os.stat(os.path.join(mnt, "big"))
                return True
            except OSError:
                pass
        time.sleep(0.05)
    return False


def check_walk(tap, label, mnt):
    r = subprocess.run(["find", mnt, "-type", "f", "-name", "weight", "-printf", "%s\\n"],
                       stdout=subprocess.PIPE, text=True, timeout=120)
    sizes = r.stdout.split()
    tap.ok(r.returncode == 0 and len(sizes) == SMALL and set(sizes) == {"64"},
           "%s: find lists %d tensor files of 64 bytes" % (label, SMALL),
           ["find exit %d, %d files, sizes %s" % (r.returncode, len(sizes), sorted(set(sizes)))])


def check_parallel_reads(tap, label, mnt, big):
    results, threads = {}, []

    def read(key, name):
        with open(os.path.join(mnt, "big", name[4:]), "rb") as f:
            results[key] = f.read()

    for k in range(4):
        name = ("big.a", "big.b")[k % 2]
        threads.append(threading.Thread(target=read, args=((k, name), name)))
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    good = [key for key, data in results.items() if data == big[key[1]].tobytes()]
    tap.ok(len(good) == 4, "%s: 4 parallel reads of two 4 MiB tensors give their bytes" % label,
           ["reads with the right bytes: %d of 4 (%d done)" % (len(good), len(results))])


def check_idle(tap, label, pid):
    time.sleep(0.3)  # past any spin window (100 ms at most)
    before = cpu_seconds(pid)
    time.sleep(IDLE_SECONDS)
    used = cpu_seconds(pid) - before
    tap.ok(used < IDLE_CPU_LIMIT, "%s: idle for %.0f s, the daemon used %.2f s of CPU (< %.1f)"
           % (label, IDLE_SECONDS, used, IDLE_CPU_LIMIT))


def one_loop(tap, ckptfs, src, big, label, args, sig):
    mnt = tempfile.mkdtemp(prefix=mount_prefix())
    proc = subprocess.Popen([ckptfs, src, mnt, "-f"] + args, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        if not tap.ok(wait_mounted(mnt, proc), "%s: mounted" % label):
            return
        with Watchdog(mnt, 240):
            check_walk(tap, label, mnt)
            check_parallel_reads(tap, label, mnt, big)
            check_idle(tap, label, proc.pid)
        proc.send_signal(sig)
        try:
            rc = proc.wait(30)
        except subprocess.TimeoutExpired:
            rc = None
        tap.ok(rc == 0 and not is_mounted(mnt), "%s: %s unmounts, exit status 0"
               % (label, signal.Signals(sig).name),
               ["exit status %r, still mounted: %s" % (rc, is_mounted(mnt))])
    finally:
        if proc.poll() is None:
            unmount(mnt)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        unmount(mnt)


def main():
    started = start()
    if not started:
        return 0
    tap, ckptfs, _ = started
    with tempfile.TemporaryDirectory(prefix="ckptfs-t81.") as d:
        src, big = make_source(d)
        loops = [("default loop", [], signal.SIGTERM),
                 ("-s", ["-s"], signal.SIGINT),
                 ("spin_us=100000", ["-o", "spin_us=100000"], signal.SIGTERM),
                 ("spin_us=0 (libfuse's loop)", ["-o", "spin_us=0"], signal.SIGTERM)]
        for label, args, sig in loops:
            one_loop(tap, ckptfs, src, big, label, args, sig)
        for bad in ("abc", "100001"):
            mnt = tempfile.mkdtemp(prefix=mount_prefix())
            rc, _, err = run_capture([ckptfs, src, mnt, "-o", "spin_us=" + bad], 30)
            tap.ok(rc == 1 and b"spin_us=" + bad.encode() in err and not is_mounted(mnt),
                   "spin_us=%s is refused with exit status 1" % bad,
                   ["exit status %r, stderr %r" % (rc, err)])
            unmount(mnt)
    return finish(tap)


if __name__ == "__main__":
    sys.exit(main())
