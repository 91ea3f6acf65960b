#!/usr/bin/python3
"""What mounting saves over the tools people run today (issue 13's figures).

usage: layouts_bench.py CKPTFS OUTDIR

1. DeepSpeed ZeRO-2, 2 ranks, 1 GiB of fp32 master weights (16 tensors of 4096 x 4096) plus the
   module's fp16 copy: the consolidated fp32 state dict read through the mount (mount, read every
   tensor file, unmount) vs tests/lib/readers/zero_reader.py, a Python + numpy re-implementation
   of deepspeed/utils/zero_to_fp32.py (torch.load's reading of the records into memory, then its
   concatenation per group), reading every tensor's bytes. Time and peak RSS of both (the
   daemon's VmHWM; the re-implementation's ru_maxrss).
2. Meta MP-2 Llama (dim 2048, 4 layers, 32000 vocabulary, bf16, ~0.7 GB): the HF view's
   model.safetensors read through the mount vs a copy-based conversion (load both rank files,
   concatenate and permute as convert_llama_weights_to_hf.py does, write model.safetensors).

The checkpoints are written with torch (python3-torch) into OUTDIR/layouts-data once; without
torch the bench says so and stops. Results: OUTDIR/layouts.json and a table on stdout.
"""

import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, HERE)
from mount_bench import daemon_pid, vm_hwm_kib  # noqa: E402

READER = os.path.join(HERE, "..", "lib", "readers")
sys.path.insert(0, os.path.join(HERE, "..", "gen"))


def make_zero2(d):
    import collections
    import torch
    import deepspeed_fixtures as gen
    ds = gen.deepspeed_standins()
    step = os.path.join(d, "global_step1")
    os.makedirs(step)
    with open(os.path.join(d, "latest"), "w") as f:
        f.write("global_step1")
    g = torch.Generator().manual_seed(5)
    names = ["layers.%d.weight" % i for i in range(16)]
    shape = (4096, 4096)
    world = 2
    master = [torch.randn(shape, generator=g) for _ in names]
    flat = torch.cat([m.reshape(-1) for m in master])
    part = flat.numel() // world
    for r in range(world):
        osd = {"loss_scaler": ds.DynamicLossScaler(), "dynamic_loss_scale": True,
               "overflow": False, "clip_grad": 1.0, "base_optimizer_state": [],
               "single_partition_of_fp32_groups": [flat[r * part:(r + 1) * part].clone()],
               "zero_stage": ds.ZeroStageEnum.gradients, "group_paddings": [0],
               "partition_count": [world], "ds_version": gen.DS_VERSION}
        torch.save({"optimizer_state_dict": osd, "ds_version": gen.DS_VERSION},
                   os.path.join(step, "zero_pp_rank_%d_mp_rank_00_optim_states.pt" % r))
        del osd
    module = collections.OrderedDict((n, m.half()) for n, m in zip(names, master))
    torch.save({"module": module, "buffer_names": [], "optimizer": None,
                "param_shapes": [collections.OrderedDict((n, torch.Size(shape)) for n in names)],
                "frozen_param_shapes": collections.OrderedDict(), "shared_params": {},
                "frozen_param_fragments": collections.OrderedDict(),
                "ds_version": gen.DS_VERSION},
               os.path.join(step, "mp_rank_00_model_states.pt"))
    return names


def make_meta(d):
    import meta_mp_fixtures as gen
    import torch
    case = {"params": {"dim": 2048, "multiple_of": 256, "n_heads": 16, "n_layers": 4,
                       "norm_eps": 1e-05, "vocab_size": -1},
            "vocab": 32000, "mp": 2, "dtype": "bfloat16", "vocab_parallel": False,
            "rope_freqs": False}
    sd = gen.full_model(torch, case)
    gen.write_case(torch, d, case, gen.rank_dicts(torch, case, sd))


ZERO_CHILD = r"""
import os, sys, time
sys.path.insert(0, %r)
import zero_reader
t0 = time.perf_counter()
sd = zero_reader.consolidate(zero_reader.step_dir(%r))
n = 0
with open(os.devnull, "wb") as out:
    for k, v in sd.items():
        n += out.write(memoryview(v.reshape(-1)).cast("B"))
print(n)
print([l.split()[1] for l in open("/proc/self/status") if l.startswith("VmHWM:")][0])
"""

META_CHILD = r"""
import json, os, struct, sys
import numpy as np
sys.path.insert(0, %r)
import zero_reader
src, dst = %r, %r
params = json.load(open(os.path.join(src, "params.json")))
ranks = [zero_reader.load(os.path.join(src, "consolidated.%%02d.pth" %% r)) for r in range(2)]
dim, heads = params["dim"], params["n_heads"]
def permute(w, n):
    rows, cols = w.shape
    return w.reshape(n, rows // n // 2, 2, cols).transpose(0, 2, 1, 3).reshape(rows, cols)
out = {}
for i in range(params["n_layers"]):
    l, h = "layers.%%d." %% i, "model.layers.%%d." %% i
    cat0 = lambda k: np.concatenate([r[l + k] for r in ranks], 0)
    cat1 = lambda k: np.concatenate([r[l + k] for r in ranks], 1)
    out[h + "self_attn.q_proj.weight"] = permute(cat0("attention.wq.weight"), heads)
    out[h + "self_attn.k_proj.weight"] = permute(cat0("attention.wk.weight"), heads)
    out[h + "self_attn.v_proj.weight"] = cat0("attention.wv.weight")
    out[h + "self_attn.o_proj.weight"] = cat1("attention.wo.weight")
    out[h + "mlp.gate_proj.weight"] = cat0("feed_forward.w1.weight")
    out[h + "mlp.down_proj.weight"] = cat1("feed_forward.w2.weight")
    out[h + "mlp.up_proj.weight"] = cat0("feed_forward.w3.weight")
    out[h + "input_layernorm.weight"] = ranks[0][l + "attention_norm.weight"]
    out[h + "post_attention_layernorm.weight"] = ranks[0][l + "ffn_norm.weight"]
out["model.norm.weight"] = ranks[0]["norm.weight"]
out["model.embed_tokens.weight"] = np.concatenate([r["tok_embeddings.weight"] for r in ranks], 1)
out["lm_head.weight"] = np.concatenate([r["output.weight"] for r in ranks], 0)
header, at = {"__metadata__": {"format": "pt"}}, 0
for k in sorted(out):
    n = out[k].nbytes
    header[k] = {"dtype": "BF16", "shape": list(out[k].shape), "data_offsets": [at, at + n]}
    at += n
h = json.dumps(header, separators=(",", ":")).encode()
h += b" " * (-len(h) %% 8)
with open(dst, "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h)
    for k in sorted(out):
        f.write(np.ascontiguousarray(out[k]).tobytes())
print(at)
print([l.split()[1] for l in open("/proc/self/status") if l.startswith("VmHWM:")][0])
"""


def run_child(code):
    """(seconds, peak RSS KiB, first output line) of a Python child. The child reports its own
    VmHWM: ru_maxrss would carry this (torch-importing) parent's peak across fork and exec."""
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, check=True)
    took = time.perf_counter() - t0
    out, hwm = p.stdout.decode().split()
    return took, int(hwm), out


def drop_caches():
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3")
        return True
    except OSError:
        return False


def read_all(paths):
    n = 0
    for p in paths:
        with open(p, "rb") as f:
            while True:
                b = f.read(1 << 22)
                if not b:
                    break
                n += len(b)
    return n


def mounted_read(ckptfs, src, paths_of):
    mnt = tempfile.mkdtemp(prefix="ckptfs-layouts.")
    try:
        t0 = time.perf_counter()
        subprocess.run([ckptfs, src, mnt], check=True)
        pid = daemon_pid(ckptfs, mnt)
        n = read_all(paths_of(mnt))
        took = time.perf_counter() - t0
        return took, vm_hwm_kib(pid), n
    finally:
        subprocess.run(["fusermount3", "-u", mnt])
        os.rmdir(mnt)


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    ckptfs, outdir = os.path.abspath(argv[1]), os.path.abspath(argv[2])
    try:
        import torch  # noqa: F401
    except ImportError:
        print("layouts_bench: python3-torch is not installed; it writes the checkpoints. Skipped.")
        return 0
    data = os.path.join(outdir, "layouts-data")
    zero, meta = os.path.join(data, "zero2"), os.path.join(data, "meta_mp2")
    if not os.path.isdir(zero):
        os.makedirs(data, exist_ok=True)
        make_zero2(zero + ".tmp")
        os.rename(zero + ".tmp", zero)
    if not os.path.isdir(meta):
        make_meta(meta + ".tmp")
        os.rename(meta + ".tmp", meta)
    results = {"cold_cache": drop_caches()}
    names = ["layers.%d.weight" % i for i in range(16)]

    drop_caches()
    t, rss, n = mounted_read(ckptfs, zero, lambda m: [os.path.join(m, *k.split(".")) for k in names])
    results["zero2_mount"] = {"seconds": t, "peak_rss_kib": rss, "bytes": n}
    drop_caches()
    t, rss, out = run_child(ZERO_CHILD % (READER, zero))
    results["zero2_python_zero_to_fp32"] = {"seconds": t, "peak_rss_kib": rss, "bytes": int(out)}

    drop_caches()
    t, rss, n = mounted_read(ckptfs, meta,
                             lambda m: [os.path.join(m, ".ckptfs", "hf", "model.safetensors")])
    results["meta_hf_view_mount"] = {"seconds": t, "peak_rss_kib": rss, "bytes": n}
    drop_caches()
    with tempfile.TemporaryDirectory(dir=outdir) as tmp:
        t, rss, out = run_child(META_CHILD % (READER, meta, os.path.join(tmp, "model.safetensors")))
    results["meta_copy_conversion"] = {"seconds": t, "peak_rss_kib": rss, "tensor_bytes": int(out)}

    with open(os.path.join(outdir, "layouts.json"), "w") as f:
        json.dump(results, f, indent=2)
    print("%-34s %10s %14s" % ("", "seconds", "peak RSS MiB"))
    for k, v in results.items():
        if isinstance(v, dict):
            print("%-34s %10.2f %14.1f" % (k, v["seconds"], v["peak_rss_kib"] / 1024))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
