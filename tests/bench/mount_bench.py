#!/usr/bin/python3
"""Mount time of a 10,000-tensor checkpoint of every format ckptfs reads (target < 1 s).

usage: mount_bench.py CKPTFS OUTDIR [--runs N]        (`make bench` calls this)

For each format a checkpoint of 10,000 small tensors named model.layers.{i//10}.mlp.p{i%10}.weight
is written once and cached under OUTDIR/mount-data/ (delete that directory to rebuild it). The
files are written by the writers of tests/gen/*_fixtures.py, imported as modules, so the bench
mounts what the fixture tests already prove ckptfs reads correctly:

  safetensors      one file, F32 [4,4]
  gguf             v3, F32 [4,4] / F16 [4,4] / Q8_0 [4,32] / Q4_K [2,256] in turn
  torch-zip        pytorch_model.bin as torch.save writes it: one storage record per tensor
  gptrs-chk        GPTRSCHK v2 with a GPT config and real BLAKE3 base ids
  gptrs-ten        GPTRSTEN v2
  lwt              LightwatchAI2 .lwt with its CRC-32 (header + trailer)
  burnpack         aligned layout, BurnpackStore metadata, param ids
  mlfw-central     MLFramework centralized file (one shard)
  mlfw-dir2        MLFramework directory, 2 ranks, every tensor split on dim 0
  dcp-hf-8         DCP-HF directory, 8 ranks, every [8,4] tensor split on dim 0 (80,000 chunks)
  hf-sharded-8     HF directory: 8 safetensors shards + model.safetensors.index.json

Every run is a fresh mount (the source files stay in the page cache):
  mount    wall time of `ckptfs SRC MNT` until it returns (the mount is live then)
  cpu      user+sys time of that command, which reads the checkpoint before it forks the
           daemon: the figure to trust when the machine is busy
  ls -R    `ls -R MNT > /dev/null`, the first listing (LC_ALL=C, so ls sorts by bytes)
  RSS      the daemon's VmHWM after the listing (pid: pgrep -f on the mount point)
then `fusermount3 -u`. Once per format an extra first mount is checked: .ckptfs/tensors.tsv must
list 10,000 tensors outside .ckptfs/ (the per-rank copies of a tensor-parallel checkpoint are
rows under .ckptfs/ranks/, counted apart) and summary.json name the expected format; a format that
fails the check is not timed. PASS means the median mount time is under 1 s.

Prints a table and writes OUTDIR/bench-mount.json (every run's numbers). Exit status 0, or 1 when
a format could not be mounted or checked; a missed target alone does not fail the run.
"""

import argparse
import datetime
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "gen"))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))

import burnpack_fixtures as burnpack  # noqa: E402
import dcphf_fixtures as dcphf  # noqa: E402
import gguf_fixtures as gguf  # noqa: E402
import gptrs_fixtures as gptrs  # noqa: E402
import lwt_fixtures as lwt  # noqa: E402
import mlfw_fixtures as mlfw  # noqa: E402
import safetensors_fixtures as st  # noqa: E402
import torch_hostile_fixtures as torchzip  # noqa: E402
from ckptfs_test import unmount  # noqa: E402

N = 10000
TARGET_S = 1.0
# Part of the cache path: bump it when a writer below changes what it writes.
DATA_VERSION = 1
MOUNT_TIMEOUT = 60
LS_TIMEOUT = 120
SEED = 20251121


def tensor_name(i):
    return "model.layers.%d.mlp.p%d.weight" % (i // 10, i % 10)


def f32_payloads(shape, seed=SEED):
    """N deterministic float32 payloads of one shape, as bytes."""
    n = int(np.prod(shape))
    values = np.random.default_rng(seed).standard_normal((N, n)).astype("<f4")
    return [values[i].tobytes() for i in range(N)]


def write_bytes(path, data):
    with open(path, "wb") as f:
        f.write(data)


# ---------------------------------------------------------------------------
# Checkpoint writers: each fills directory d and returns the mount source relative to d
# ("." for a directory checkpoint).

def make_safetensors(d):
    ts = [st.T(tensor_name(i), "F32", [4, 4], p) for i, p in enumerate(f32_payloads([4, 4]))]
    st.write_safetensors(os.path.join(d, "model.safetensors"), ts, metadata={"format": "pt"})
    return "model.safetensors"


GGUF_MIX = [("F32", [4, 4]), ("F16", [4, 4]), ("Q8_0", [4, 32]), ("Q4_K", [2, 256])]


def make_gguf(d):
    rng = np.random.default_rng(SEED)
    tensors = []
    for i in range(N):
        ggml_type, shape = GGUF_MIX[i % len(GGUF_MIX)]
        tensors.append(gguf.rand_tensor(rng, tensor_name(i), ggml_type, list(reversed(shape))))
    kvs = [("general.architecture", gguf.STRING, "llama"),
           ("general.name", gguf.STRING, "ckptfs mount bench"),
           ("llama.block_count", gguf.U32, N // 10)]
    gguf.write_gguf(os.path.join(d, "model.gguf"), kvs, tensors)
    return "model.gguf"


def make_torch_zip(d):
    # torch.save's layout: the pickle, then one storage record per tensor, then "version".
    pickle = torchzip.state_dict(
        [(tensor_name(i), torchzip.rebuild("FloatStorage", str(i), 16, 0, [4, 4], [4, 1]))
         for i in range(N)])
    records = [("data.pkl", pickle), ("byteorder", b"little")]
    records += [("data/%d" % i, p) for i, p in enumerate(f32_payloads([4, 4]))]
    records.append(("version", b"3\n"))
    data, _ = torchzip.torch_zip(records, archive="pytorch_model")
    write_bytes(os.path.join(d, "pytorch_model.bin"), data)
    return "pytorch_model.bin"


def gptrs_tensors():
    # stored_id "real": every entry carries BLAKE3(name)[:16], as gpt-rs writes it.
    return [gptrs.T(tensor_name(i), "F32", [4, 4], p) for i, p in enumerate(f32_payloads([4, 4]))]


def make_gptrs_chk(d):
    config = gptrs.compact({"kind": "gpt", "config": gptrs.GPT_CONFIG})
    data, _, _ = gptrs.write_v2(gptrs_tensors(), checkpoint=True, config=config)
    write_bytes(os.path.join(d, "model.bin"), data)
    return "model.bin"


def make_gptrs_ten(d):
    data, _, _ = gptrs.write_v2(gptrs_tensors(), checkpoint=False)
    write_bytes(os.path.join(d, "tensors.bin"), data)
    return "tensors.bin"


def make_lwt(d):
    ts = [lwt.T(tensor_name(i), [4, 4], p) for i, p in enumerate(f32_payloads([4, 4]))]
    data, _, _, meta = lwt.write_lwt(ts, header={"config": lwt.CONFIG}, crc="both")
    assert meta["layout"]["crc32"]["stored_in"] == "header+trailer"
    write_bytes(os.path.join(d, "model.lwt"), data)
    return "model.lwt"


def make_burnpack(d):
    ts = [burnpack.T(tensor_name(i), "F32", [4, 4], p, param_id=(0x83EB859ADFFB2071 + i) % 2 ** 64)
          for i, p in enumerate(f32_payloads([4, 4]))]
    data, _, _, _ = burnpack.build(ts, metadata=burnpack.BURN_STORE_METADATA, aligned=True)
    write_bytes(os.path.join(d, "model.bpk"), data)
    return "model.bpk"


MLFW_SAVED_AT = datetime.datetime(2025, 1, 1)


def mlfw_arrays():
    return [np.frombuffer(p, dtype="<f4").reshape(4, 4) for p in f32_payloads([4, 4])]


def make_mlfw_central(d):
    meta = mlfw.metadata_bytes("mount-bench", MLFW_SAVED_AT, 1, [], 1)
    shard, _ = mlfw.shard_bytes([(tensor_name(i), mlfw.F32, a, False)
                                 for i, a in enumerate(mlfw_arrays())])
    data, _ = mlfw.centralized_bytes(meta, [shard], 1)
    write_bytes(os.path.join(d, "model.ckpt"), data)
    return "model.ckpt"


def make_mlfw_dir2(d):
    # The names match no layer rule, so every tensor is split on dim 0 ("guessed").
    ranks = [[], []]
    for i, a in enumerate(mlfw_arrays()):
        for r, part in enumerate(mlfw.split(a, 0, 2)):
            ranks[r].append((tensor_name(i), mlfw.F32, np.ascontiguousarray(part), False))
    write_bytes(os.path.join(d, "metadata.bin"),
                mlfw.metadata_bytes("mount-bench-tp2", MLFW_SAVED_AT, 2, [], 1))
    for r, entries in enumerate(ranks):
        write_bytes(os.path.join(d, "shard_rank%d.pt" % r), mlfw.shard_bytes(entries)[0])
    return "."


def make_dcp_hf8(d):
    # FSDP-style: every tensor sharded on dim 0 over the 8 ranks.
    rng = np.random.default_rng(SEED)
    plans = []
    for i in range(N):
        t = dcphf.Tensor(tensor_name(i), "F32", [8, 4], rng)
        plans.append((t, dcphf.plan_split(t, 8, [(0, 8)])))
    dcphf.write_ranks(d, plans, 8)
    return "."


def make_hf_sharded8(d):
    ts = [st.T(tensor_name(i), "F32", [4, 4], p) for i, p in enumerate(f32_payloads([4, 4]))]
    per = N // 8
    st.write_hf_index(d, [(st.shard_name(s + 1, 8), ts[s * per:(s + 1) * per]) for s in range(8)])
    return "."


# key, label, writer, format summary.json must show
FORMATS = [
    ("safetensors", "safetensors", make_safetensors, "safetensors"),
    ("gguf", "GGUF v3 (F32/F16/Q8_0/Q4_K)", make_gguf, "gguf"),
    ("torch-zip", "torch zip (.bin)", make_torch_zip, "torch-zip"),
    ("gptrs-chk", "gpt-rs GPTRSCHK", make_gptrs_chk, "gpt-rs"),
    ("gptrs-ten", "gpt-rs GPTRSTEN", make_gptrs_ten, "gpt-rs"),
    ("lwt", "LightwatchAI2 .lwt (CRC)", make_lwt, "lightwatch-lwt"),
    ("burnpack", "Burnpack (aligned)", make_burnpack, "burnpack"),
    ("mlfw-central", "MLFramework centralized", make_mlfw_central, "mlframework-tp"),
    ("mlfw-dir2", "MLFramework dir, 2 ranks", make_mlfw_dir2, "mlframework-tp"),
    ("dcp-hf-8", "DCP-HF dir, 8 ranks", make_dcp_hf8, "dcp-hf"),
    ("hf-sharded-8", "HF sharded dir, 8 shards", make_hf_sharded8, "safetensors-sharded"),
]


def prepare(data_root, key, writer):
    """The cached checkpoint of one format: (mount source, bytes on disk, seconds to write)."""
    d = os.path.join(data_root, key)
    src_file = os.path.join(d, ".source")
    took = 0.0
    if not os.path.exists(src_file):
        # Written aside and renamed, so an interrupted run never leaves a half cache behind.
        tmp = d + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(tmp)
        t0 = time.perf_counter()
        rel = writer(tmp)
        took = time.perf_counter() - t0
        write_bytes(os.path.join(tmp, ".source"), rel.encode())
        os.rename(tmp, d)
    with open(src_file) as f:
        src = os.path.normpath(os.path.join(d, f.read()))
    if os.path.isdir(src):
        files = [os.path.join(src, x) for x in os.listdir(src) if not x.startswith(".")]
    else:
        files = [src]
    return src, sum(os.path.getsize(x) for x in files), took


# ---------------------------------------------------------------------------
# Measuring

class BenchError(Exception):
    pass


def timed_run(argv, timeout, env=None):
    """Run argv to its exit: (status or None on timeout, seconds, CPU seconds, stderr text).

    subprocess's own timeouts poll the child with sleeps of up to 50 ms, which would round every
    time measured here up to the next poll; a plain blocking wait with a kill timer beside it
    measures the exit itself. CPU is the child's user+sys time (not its daemon's: that one is
    never waited for). Output goes to files, so a daemon holding an inherited pipe open cannot
    stall us; the child has its own session so a hang is killed with its children.
    """
    with tempfile.TemporaryFile() as err:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=err, start_new_session=True, env=env)
        fired = []

        def kill():
            fired.append(True)
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        timer = threading.Timer(timeout, kill)
        timer.start()
        try:
            rc = p.wait()
        finally:
            timer.cancel()
        took = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        err.seek(0)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        return (None if fired else rc), took, cpu, err.read().decode(errors="replace").strip()


def daemon_pid(ckptfs, mnt):
    """The daemon serving mnt: pgrep -f on the (unique) mount point, confirmed by its argv."""
    out = subprocess.run(["pgrep", "-f", mnt], capture_output=True, text=True).stdout
    for pid in out.split():
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if os.fsencode(mnt) in argv and os.path.basename(argv[0]) == os.path.basename(
                os.fsencode(ckptfs)):
            return int(pid)
    raise BenchError("no ckptfs process found for %s" % mnt)


def vm_hwm_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise BenchError("no VmHWM in /proc/%d/status" % pid)


def check_mount(mnt, want_format):
    """The mount must be the whole checkpoint in the expected format, or timing it is moot."""
    # tensors.tsv also lists the per-rank copies of a tensor-parallel checkpoint (paths under
    # .ckptfs/ranks/); the checkpoint's own tensors are the rows with any other path.
    count = rank_rows = 0
    with open(os.path.join(mnt, ".ckptfs", "tensors.tsv"), "rb") as f:
        if f.readline() != b"name\tdtype\tshape\tnbytes\tpath\n":
            raise BenchError("tensors.tsv has an unexpected header")
        for line in f:
            if line.rstrip(b"\n").rsplit(b"\t", 1)[-1].startswith(b".ckptfs/"):
                rank_rows += 1
            else:
                count += 1
    with open(os.path.join(mnt, ".ckptfs", "summary.json")) as f:
        summary = json.load(f)
    fmt = summary.get("format")
    if count != N:
        raise BenchError("tensors.tsv lists %d tensors, not %d" % (count, N))
    if fmt != want_format:
        raise BenchError("summary.json says format %r, not %r" % (fmt, want_format))
    return {"tensors": count, "rank_tree_tensors": rank_rows, "format": fmt,
            "warnings": summary.get("warnings", [])}


def one_mount(ckptfs, src, want_format, check):
    mnt = tempfile.mkdtemp(prefix="ckptfs-mount-bench.")
    try:
        # The CPU time of the mount command covers reading the checkpoint (done before it
        # forks the daemon): on a busy machine it moves far less than the wall time.
        rc, mount_s, mount_cpu_s, err = timed_run([ckptfs, src, mnt], MOUNT_TIMEOUT)
        if rc != 0:
            raise BenchError("ckptfs exited with %s: %s" % (
                "a timeout" if rc is None else "status %d" % rc, err.replace("\n", " | ")))
        pid = daemon_pid(ckptfs, mnt)
        rss_after_mount = vm_hwm_kib(pid)
        checked = check_mount(mnt, want_format) if check else None
        rc, ls_s, _, err = timed_run(["ls", "-R", mnt], LS_TIMEOUT,
                                     env=dict(os.environ, LC_ALL="C"))
        if rc != 0:
            raise BenchError("ls -R exited with %s: %s" % (
                "a timeout" if rc is None else "status %d" % rc, err[:200]))
        return {"mount_s": mount_s, "mount_cpu_s": mount_cpu_s, "ls_s": ls_s,
                "rss_after_mount_kib": rss_after_mount, "peak_rss_kib": vm_hwm_kib(pid)}, checked
    finally:
        unmount(mnt)


def summary(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "runs": xs}


def bench_format(ckptfs, src, want_format, runs):
    rows, checked = [], None
    for run in range(runs):
        # The check (reading tensors.tsv) runs on an extra first mount, so no timed run
        # pays for building tensors.tsv and every timed listing is a first listing.
        if run == 0:
            _, checked = one_mount(ckptfs, src, want_format, check=True)
        rows.append(one_mount(ckptfs, src, want_format, check=False)[0])
    return dict(checked, **{
        "mount_s": summary([r["mount_s"] for r in rows]),
        "mount_cpu_s": summary([r["mount_cpu_s"] for r in rows]),
        "ls_s": summary([r["ls_s"] for r in rows]),
        "rss_after_mount_kib": max(r["rss_after_mount_kib"] for r in rows),
        "peak_rss_kib": max(r["peak_rss_kib"] for r in rows),
    })


def human_size(n):
    return "%.1f MiB" % (n / 2 ** 20) if n >= 2 ** 20 else "%.0f KiB" % (n / 1024)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("ckptfs")
    ap.add_argument("outdir")
    ap.add_argument("--runs", type=int, default=int(os.environ.get("RUNS", "5")))
    args = ap.parse_args()
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    ckptfs, outdir = os.path.abspath(args.ckptfs), os.path.abspath(args.outdir)
    data_root = os.path.join(outdir, "mount-data", "v%d" % DATA_VERSION)
    os.makedirs(data_root, exist_ok=True)

    results = {"tensors_per_checkpoint": N, "runs": args.runs, "target_s": TARGET_S,
               "criterion": "median mount_s < target_s", "ckptfs": ckptfs,
               "loadavg_at_start": os.getloadavg(), "cpus": os.cpu_count(), "formats": {}}
    failed = False
    for key, label, writer, want_format in FORMATS:
        src, size, took = prepare(data_root, key, writer)
        if took:
            print("wrote %s checkpoint in %.1f s" % (key, took), file=sys.stderr, flush=True)
        entry = {"label": label, "source": src, "bytes": size}
        try:
            entry.update(bench_format(ckptfs, src, want_format, args.runs))
            entry["verdict"] = "PASS" if entry["mount_s"]["median"] < TARGET_S else "FAIL"
        except (BenchError, OSError, ValueError) as e:
            entry.update({"verdict": "BROKEN", "error": str(e)})
            failed = True
            print("%s: %s" % (key, e), file=sys.stderr, flush=True)
        results["formats"][key] = entry

    results["loadavg_at_end"] = os.getloadavg()
    with open(os.path.join(outdir, "bench-mount.json"), "w") as f:
        json.dump(results, f, indent=2)
        f.write("\n")

    print("mount of a %d-tensor checkpoint, %d fresh mounts each (target: median < %.0f ms)"
          % (N, args.runs, TARGET_S * 1e3))
    row = "%-28s %7s %9s %25s %8s %9s %8s  %s"
    head = row % ("format", "tensors", "size", "mount ms median (min-max)", "cpu ms",
                  "ls -R ms", "RSS MiB", "target")
    print(head)
    print("-" * len(head))
    for e in results["formats"].values():
        if e["verdict"] == "BROKEN":
            print(row % (e["label"], "-", human_size(e["bytes"]), "-", "-", "-", "-",
                         "BROKEN: " + e["error"]))
            continue
        m = e["mount_s"]
        print(row % (e["label"], e["tensors"], human_size(e["bytes"]),
                     "%.1f (%.1f-%.1f)" % (m["median"] * 1e3, m["min"] * 1e3, m["max"] * 1e3),
                     "%.1f" % (e["mount_cpu_s"]["median"] * 1e3),
                     "%.1f" % (e["ls_s"]["median"] * 1e3), "%.1f" % (e["peak_rss_kib"] / 1024),
                     e["verdict"]))
    print("cpu ms: user+sys time of the mount command; ls -R: first listing of the fresh mount; "
          "RSS: daemon VmHWM after it")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
