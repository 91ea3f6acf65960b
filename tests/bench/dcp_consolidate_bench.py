#!/usr/bin/env python3
"""torch's own DCP consolidation against a ckptfs mount (issue 27's `make bench` figure).

usage: dcp_consolidate_bench.py CKPTFS OUTDIR [--runs N]    (run under $CLIENTS_PY: torch 2.x)

The checkpoint: 16 tensors of 4096 x 4096 float32 (1 GiB), DTensors of 4 gloo ranks on the CPU
(even layers Shard(0), odd layers Shard(1)), saved by torch's dcp.save twice, with
FileSystemWriter (.metadata + __R_0.distcp) and with HuggingFaceStorageWriter(save_distributed)
(shard-0000R-model-00001-of-00001.safetensors with DCP_SHARDING_INFO); written once under
OUTDIR/dcp-consolidate-data/ (delete it to rebuild). Then RUNS times (default 2), each peer a
fresh process that ends holding every tensor in memory:

  torch_save      format_utils.dcp_to_torch_save(FS, model.pt) + torch.load(model.pt)
  torch_hf        consolidate_safetensors_files(HF, OUT) + safetensors load_file(OUT/...)
  ckptfs_fs       ckptfs FS MNT + load_file(MNT/.ckptfs/hf/model.safetensors)
  ckptfs_hf       ckptfs HF MNT + the same

Timed: from the peer's first step to the last tensor in memory, every page touched (after the
imports, which every peer pays alike), the source files in the page cache; the consolidated outputs go to OUTDIR's
file system and are deleted after each run. Peak RSS: the peer's VmHWM, plus the daemon's for
ckptfs (both are resident at once). Untimed, every peer's tensors are hashed in name order and
must equal torch_save's, or the bench fails. Medians and the ratios torch/ckptfs (above 1:
ckptfs is faster or smaller) go to OUTDIR/bench-dcp-consolidate.json; a table to stdout.
"""

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.realpath(__file__))
WORLD, N_TENSORS, DIM = 4, 16, 4096
DATA_VERSION = 1

PEER = r"""
import gc, hashlib, json, os, subprocess, sys, time
sys.path.insert(0, %(here)r)
import torch
from safetensors.torch import load_file
kind, src, work, ckptfs = sys.argv[1:5]


def touched(sd):
    # load_file maps the file: a tensor is in memory once its pages are, so touch each page.
    for t in sd.values():
        t.reshape(-1).view(torch.uint8)[::4096].sum()
    return sd


def digest(sd):
    h = hashlib.sha256()
    for name in sorted(sd):
        h.update(name.encode() + b"\0")
        h.update(sd[name].contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


daemon_kib = 0
t0 = time.perf_counter()
if kind == "torch_save":
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    out = os.path.join(work, "model.pt")
    dcp_to_torch_save(src, out)
    sd = touched(torch.load(out, weights_only=True))
elif kind == "torch_hf":
    from torch.distributed.checkpoint._consolidate_hf_safetensors import (
        consolidate_safetensors_files)
    from torch.distributed.checkpoint import HuggingFaceStorageReader
    fqns = HuggingFaceStorageReader(src).read_metadata().state_dict_metadata
    consolidate_safetensors_files(src, work, dict.fromkeys(fqns, 1))
    sd = touched(load_file(os.path.join(work, "model-00001-of-00001.safetensors")))
else:
    from mount_bench import daemon_pid, vm_hwm_kib
    mnt = os.path.join(work, "mnt")
    os.mkdir(mnt)
    subprocess.run([ckptfs, src, mnt], check=True)
    try:
        sd = touched(load_file(os.path.join(mnt, ".ckptfs", "hf", "model.safetensors")))
        took = time.perf_counter() - t0
        hwm = int([l.split()[1] for l in open("/proc/self/status") if l.startswith("VmHWM:")][0])
        daemon_kib = vm_hwm_kib(daemon_pid(ckptfs, mnt))
        sha, n = digest(sd), len(sd)
        del sd
        gc.collect()
    finally:
        # A peer that died holding a mapping of the view leaves the mount busy: detach it.
        if subprocess.run(["fusermount3", "-u", mnt]).returncode != 0:
            subprocess.run(["fusermount3", "-u", "-z", mnt])
if kind.startswith("torch"):
    took = time.perf_counter() - t0
    hwm = int([l.split()[1] for l in open("/proc/self/status") if l.startswith("VmHWM:")][0])
    sha, n = digest(sd), len(sd)
print(json.dumps({"seconds": took, "peak_rss_kib": hwm + daemon_kib, "peer_rss_kib": hwm,
                  "daemon_rss_kib": daemon_kib, "tensors": n, "sha256": sha}))
"""


def worker(rank, fs_dir, hf_dir, port):
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter, HuggingFaceStorageWriter
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        mesh = init_device_mesh("cpu", (WORLD,))
        sd = {}
        for i in range(N_TENSORS):
            dim = i % 2
            shape = [DIM, DIM]
            shape[dim] //= WORLD
            g = torch.Generator().manual_seed(1000 * i + rank)
            local = torch.randn(shape, generator=g)
            # Each rank makes only its own shard: the full tensors never exist anywhere.
            sd["layers.%d.weight" % i] = DTensor.from_local(local, mesh, [Shard(dim)],
                                                           run_check=False)
        dcp.save(sd, storage_writer=FileSystemWriter(fs_dir))
        dcp.save(sd, storage_writer=HuggingFaceStorageWriter(hf_dir, save_distributed=True))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def make_data(data):
    import torch.multiprocessing as mp
    fs_dir, hf_dir = os.path.join(data, "fs"), os.path.join(data, "hf")
    stamp = os.path.join(data, "version")
    if os.path.exists(stamp) and open(stamp).read() == str(DATA_VERSION):
        return fs_dir, hf_dir
    shutil.rmtree(data, ignore_errors=True)
    os.makedirs(data)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(worker, args=(fs_dir, hf_dir, port), nprocs=WORLD, join=True,
                       start_method="spawn")
    with open(stamp, "w") as f:
        f.write(str(DATA_VERSION))
    return fs_dir, hf_dir


def warm(d):
    for name in os.listdir(d):
        p = os.path.join(d, name)
        if os.path.isfile(p):
            with open(p, "rb") as f:
                while f.read(1 << 24):
                    pass


def run_peer(kind, src, outdir, ckptfs):
    warm(src)
    work = tempfile.mkdtemp(prefix="dcp-consolidate.", dir=outdir)
    try:
        p = subprocess.run([sys.executable, "-c", PEER % {"here": HERE}, kind, src, work, ckptfs],
                           stdout=subprocess.PIPE, check=True)
        return json.loads(p.stdout.decode().strip().splitlines()[-1])
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(usage=__doc__)
    ap.add_argument("ckptfs")
    ap.add_argument("outdir")
    ap.add_argument("--runs", type=int, default=2)
    a = ap.parse_args()
    ckptfs, outdir = os.path.abspath(a.ckptfs), os.path.abspath(a.outdir)
    os.makedirs(outdir, exist_ok=True)
    fs_dir, hf_dir = make_data(os.path.join(outdir, "dcp-consolidate-data"))
    peers = [("torch_save", fs_dir), ("torch_hf", hf_dir), ("ckptfs_fs", fs_dir),
             ("ckptfs_hf", hf_dir)]
    runs = {k: [] for k, _ in peers}
    for _ in range(a.runs):
        for kind, src in peers:
            runs[kind].append(run_peer(kind, src, outdir, ckptfs))
    want = runs["torch_save"][0]["sha256"]
    wrong = [k for k, rs in runs.items() for r in rs
             if r["sha256"] != want or r["tensors"] != N_TENSORS]
    if wrong:
        print("dcp_consolidate_bench: tensors differ from dcp_to_torch_save's: %s" % wrong,
              file=sys.stderr)
        return 1
    med = {k: {"seconds": statistics.median(r["seconds"] for r in rs),
               "peak_rss_kib": statistics.median(r["peak_rss_kib"] for r in rs),
               "daemon_rss_kib": statistics.median(r["daemon_rss_kib"] for r in rs),
               "runs": rs} for k, rs in runs.items()}
    ratios = {}
    for torch_k, ck_k in (("torch_save", "ckptfs_fs"), ("torch_hf", "ckptfs_hf")):
        ratios["%s/%s_seconds" % (torch_k, ck_k)] = med[torch_k]["seconds"] / med[ck_k]["seconds"]
        ratios["%s/%s_peak_rss" % (torch_k, ck_k)] = (med[torch_k]["peak_rss_kib"] /
                                                     med[ck_k]["peak_rss_kib"])
    doc = {"checkpoint": {"ranks": WORLD, "tensors": N_TENSORS, "shape": [DIM, DIM],
                          "dtype": "F32", "bytes": N_TENSORS * DIM * DIM * 4},
           "torch": __import__("torch").__version__, "peers": med, "ratios": ratios}
    with open(os.path.join(outdir, "bench-dcp-consolidate.json"), "w") as f:
        json.dump(doc, f, indent=2)
    print("%-12s %10s %14s %14s" % ("dcp 4 ranks", "seconds", "peak RSS MiB", "daemon MiB"))
    for k, v in med.items():
        print("%-12s %10.2f %14.1f %14.1f" % (k, v["seconds"], v["peak_rss_kib"] / 1024,
                                              v["daemon_rss_kib"] / 1024))
    for k, v in ratios.items():
        print("%-40s %6.2f" % (k, v))
    return 0


if __name__ == "__main__":
    sys.exit(main())
