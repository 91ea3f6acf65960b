#!/usr/bin/python3
"""Casting: `ckptfs convert --dtype` and `-o as_dtype=f32` against numpy doing the same work.

usage: cast_bench.py CKPTFS OUTDIR [--runs N] [--mib M]        (`make bench` calls it)

One safetensors file holding a single F32 tensor of M MiB (default 512; normal values) is
written once under OUTDIR/cast-data/, with the same values as F16 in a second file (delete the
directory to rebuild). Then RUNS times (default 3), in the same round:
  bf16      ckptfs convert --dtype bf16 F32-FILE OUT   numpy: read, round to nearest even on the
                                                       bits, write the same safetensors file
  f16       ckptfs convert --dtype f16 F32-FILE OUT    numpy: read, astype(float16), write
  as_f32    dd of the tensor from a fresh mount of      numpy: read the F16 file, astype(float32),
            the F16 file with -o as_dtype=f32          write to /dev/null
Each ckptfs output is compared with numpy's, byte for byte (untimed): wrong bytes stop the bench
with a failure, whatever the time. Medians and the ratio numpy/ckptfs (above 1: ckptfs is
faster) go to OUTDIR/bench-cast.json; a table goes to stdout. Both sides run one thread; the
source files are in the page cache, the outputs go to OUTDIR's file system.
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

import numpy as np

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
from ckptfs_test import is_mounted, run_capture, unmount  # noqa: E402
from staging import file_sha  # noqa: E402

NAME = "model.weight"
DATA_VERSION = 1

# The numpy side, run as its own process so that its start-up is timed as ckptfs's is.
NUMPY_CAST = r"""
import json, struct, sys
import numpy as np
src, out, to = sys.argv[1:4]
with open(src, "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    head = json.loads(f.read(n))
    x = np.fromfile(f, dtype="<f4")
if to == "bf16":
    u = x.view(np.uint32)
    y = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")
else:
    y = x.astype("<f2")
name = next(k for k in head if k != "__metadata__")
text = json.dumps({name: {"dtype": to.upper(), "shape": head[name]["shape"],
                          "data_offsets": [0, y.nbytes]}}).encode()
with open(out, "wb") as f:
    f.write(struct.pack("<Q", len(text)) + text)
    y.tofile(f)
"""
NUMPY_WIDEN = r"""
import json, struct, sys
import numpy as np
with open(sys.argv[1], "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    f.seek(8 + n)
    x = np.fromfile(f, dtype="<f2")
with open(sys.argv[2], "wb") as out:
    x.astype("<f4").tofile(out)
"""


def write_st(path, dtype, arr):
    text = json.dumps({NAME: {"dtype": dtype, "shape": list(arr.shape),
                              "data_offsets": [0, arr.nbytes]}}).encode()
    text += b" " * (-(8 + len(text)) % 64)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        arr.tofile(f)


def make_data(d, mib):
    stamp = os.path.join(d, "version")
    if os.path.exists(stamp) and open(stamp).read() == "%d %d" % (DATA_VERSION, mib):
        return
    os.makedirs(d, exist_ok=True)
    x = np.random.default_rng(5).standard_normal(mib << 18).astype("<f4")
    write_st(os.path.join(d, "f32.safetensors"), "F32", x)
    write_st(os.path.join(d, "f16.safetensors"), "F16", x.astype("<f2"))
    with open(stamp, "w") as f:
        f.write("%d %d" % (DATA_VERSION, mib))


def data_digest(path):
    """sha256 of a safetensors file's data section."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
    return file_sha(path, 8 + n)


def timed(argv):
    t = time.monotonic()
    r = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    took = time.monotonic() - t
    if r.returncode != 0:
        sys.exit("cast bench: %s failed: %s" % (" ".join(argv[:3]), r.stderr.decode()[-300:]))
    return took


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ckptfs")
    ap.add_argument("outdir")
    ap.add_argument("--runs", type=int, default=int(os.environ.get("RUNS", "3")))
    ap.add_argument("--mib", type=int, default=512)
    a = ap.parse_args()
    d = os.path.join(os.path.abspath(a.outdir), "cast-data")
    make_data(d, a.mib)
    f32, f16 = os.path.join(d, "f32.safetensors"), os.path.join(d, "f16.safetensors")
    for p in (f32, f16):
        file_sha(p)  # in the page cache before the first round
    py = "/usr/bin/python3"
    work = tempfile.mkdtemp(prefix="cast-bench.", dir=d)
    mnt = os.path.join(work, "mnt")
    times = {k: {"ckptfs": [], "numpy": []} for k in ("bf16", "f16", "as_f32")}
    try:
        for r in range(a.runs):
            print("cast bench: round %d/%d" % (r + 1, a.runs), file=sys.stderr)
            for to in ("bf16", "f16"):
                ours, theirs = os.path.join(work, "c.st"), os.path.join(work, "n.st")
                for p in (ours, theirs):
                    if os.path.exists(p):
                        os.unlink(p)
                times[to]["ckptfs"].append(timed([a.ckptfs, "convert", "--dtype", to, f32,
                                                  ours + ".safetensors"]))
                os.rename(ours + ".safetensors", ours)
                times[to]["numpy"].append(timed([py, "-c", NUMPY_CAST, f32, theirs, to]))
                if data_digest(ours) != data_digest(theirs):
                    sys.exit("cast bench: --dtype %s differs from numpy's bytes" % to)
            os.makedirs(mnt, exist_ok=True)  # unmount() may take the directory away
            rc, _, err = run_capture([a.ckptfs, f16, mnt, "-o", "as_dtype=f32"], 60)
            if rc != 0 or not is_mounted(mnt):
                sys.exit("cast bench: mount failed: %s" % err.decode()[-300:])
            try:
                t = time.monotonic()
                subprocess.run(["dd", "if=" + os.path.join(mnt, NAME.replace(".", "/")),
                                "of=/dev/null", "bs=1M"], check=True, capture_output=True)
                times["as_f32"]["ckptfs"].append(time.monotonic() - t)
                got = file_sha(os.path.join(mnt, NAME.replace(".", "/")))
            finally:
                unmount(mnt)
            widened = os.path.join(work, "w.raw")
            times["as_f32"]["numpy"].append(timed([py, "-c", NUMPY_WIDEN, f16, widened]))
            if file_sha(widened) != got:
                sys.exit("cast bench: as_dtype=f32 differs from numpy's astype(float32)")
            os.unlink(widened)
    finally:
        if is_mounted(mnt):
            unmount(mnt)
        subprocess.run(["rm", "-rf", work])
    result = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
              "mib_f32": a.mib, "runs": a.runs, "workloads": {}}
    print("workload   ckptfs s   numpy s   numpy/ckptfs")
    for k, v in times.items():
        c, n = statistics.median(v["ckptfs"]), statistics.median(v["numpy"])
        result["workloads"][k] = {"ckptfs_s": c, "numpy_s": n, "ratio": n / c, "raw": v}
        print("%-9s %8.2f %9.2f %12.2fx" % (k, c, n, n / c))
    with open(os.path.join(a.outdir, "bench-cast.json"), "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
