"""Distributed checkpoints written by torch 2.x itself, for tests/t/903-clients-dcp.t and the
consolidation bench: WORLD processes (gloo on the CPU, torch.multiprocessing) build a 1-D
device mesh, shard a small model's parameters as DTensors (Shard(0), Shard(1), sizes that do
not divide by WORLD, a replicated one), take one Adam step so there is optimizer state, and
save the state dict with dcp.save through the writer LAYOUT names:

  fs          FileSystemWriter: .metadata + __R_0.distcp, model and optimizer state
  hf          HuggingFaceStorageWriter(save_distributed=True): shard-0000R-model-00001-of-00001
              .safetensors with DCP_SHARDING_INFO, the model only
  hf-consol   the same with enable_consolidation=True: shards in sharded/, torch's own
              consolidated model-00001-of-00001.safetensors + index beside them
  fsdp2       FSDP2: fully_shard of a small MLP (Shard(0) of every parameter, 5 and 3 rows over
              WORLD ranks: uneven, some ranks empty), AdamW state, FileSystemWriter
  nemo        a NeMo Automodel step directory: model/ as "hf" with model/.hf_metadata/config.json,
              optim/ as "fs" (optimizer state only), the training-state files beside them

usage: dcp_write.py [--scale N] LAYOUT WORLD OUTDIR [LAYOUT WORLD OUTDIR ...]
(N multiplies the model's dimensions: the bench); or import it and call write(...), so that
torch is imported once (10 s on a loaded machine) for all the checkpoints of a test.

Runs under $CLIENTS_PY (torch 2.x); nothing here knows how ckptfs reads the result.
"""

import json
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor


def full_params(scale):
    """The model's full parameters: the same on every rank (seeded), shapes chosen so that
    4 and 2 ranks split some of them unevenly and some dimension 1 of them."""
    g = torch.Generator().manual_seed(1234)
    s = scale
    shapes = {
        "embed.weight": ((37 * s, 16 * s), torch.float32, Shard(0)),      # 37 rows: uneven
        "layers.0.attn.weight": ((16 * s, 16 * s), torch.float32, Shard(1)),
        "layers.0.mlp.weight": ((24 * s, 10 * s + 1), torch.bfloat16, Shard(1)),  # uneven dim 1
        "layers.0.mlp.bias": ((3,), torch.float32, Shard(0)),             # fewer rows than ranks
        "norm.weight": ((16 * s,), torch.float16, Replicate()),
        "head.weight": ((5, 16 * s), torch.float64, Shard(0)),
    }
    out = {}
    for name, (shape, dtype, placement) in shapes.items():
        t = torch.randn(shape, generator=g, dtype=torch.float32).to(dtype)
        out[name] = (t, placement)
    return out


class Model(torch.nn.Module):
    def __init__(self, params):
        super().__init__()
        # Parameters in a flat ParameterDict would rename them; nest modules by dotted name.
        for name, p in params.items():
            mod = self
            parts = name.split(".")
            for part in parts[:-1]:
                if not hasattr(mod, part):
                    mod.add_module(part, torch.nn.Module())
                mod = getattr(mod, part)
            mod.register_parameter(parts[-1], p)


def fsdp2(mesh, outdir):
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(2)
    model = torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.GELU(), torch.nn.Linear(5, 3))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(4, 7, generator=torch.Generator().manual_seed(3))).sum().backward()
    opt.step()
    model_sd, optim_sd = get_state_dict(model, opt)
    dcp.save({"model": model_sd, "optim": optim_sd}, storage_writer=FileSystemWriter(outdir))


def worker(rank, world, layout, outdir, port, scale):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        if layout == "fsdp2":
            fsdp2(mesh, outdir)
            dist.barrier()
            return
        params = {}
        for name, (t, placement) in full_params(scale).items():
            params[name] = torch.nn.Parameter(distribute_tensor(t, mesh, [placement]))
        if world == 4:
            # 2-D boxes: a 2 x 2 mesh sharding rows on one axis and columns on the other,
            # both uneven (9 x 7).
            mesh2 = init_device_mesh("cpu", (2, 2))
            g = torch.Generator().manual_seed(99)
            grid = torch.randn((9, 7 * scale), generator=g)
            params["layers.0.grid.weight"] = torch.nn.Parameter(
                distribute_tensor(grid, mesh2, [Shard(0), Shard(1)]))
        model = Model(params)
        # The optimizer steps the f32/f64 parameters but mlp.bias (with more ranks than rows,
        # DTensor's Adam (lerp_) refuses the shard its gradient gets, torch 2.15) and the 2-D
        # grid (another mesh than the other parameters').
        trainable = [p for n, p in model.named_parameters()
                     if p.dtype in (torch.float32, torch.float64) and n not in ("layers.0.mlp.bias", "layers.0.grid.weight")]
        opt = torch.optim.Adam(trainable, lr=1e-3)
        loss = sum((p.float() ** 2).sum() for p in trainable)
        loss.backward()
        opt.step()
        model_sd, optim_sd = get_state_dict(model, opt)
        save(layout, outdir, model_sd, optim_sd, rank)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def save(layout, outdir, model_sd, optim_sd, rank):
    from torch.distributed.checkpoint import FileSystemWriter, HuggingFaceStorageWriter

    if layout == "fs":
        dcp.save({"model": model_sd, "optim": optim_sd}, storage_writer=FileSystemWriter(outdir))
    elif layout == "hf":
        dcp.save(model_sd, storage_writer=HuggingFaceStorageWriter(outdir, save_distributed=True))
    elif layout == "hf-consol":
        w = HuggingFaceStorageWriter(outdir, save_distributed=True, enable_consolidation=True)
        dcp.save(model_sd, storage_writer=w)
    elif layout == "nemo":
        step = os.path.join(outdir, "epoch_0_step_3")
        dcp.save(model_sd, storage_writer=HuggingFaceStorageWriter(
            os.path.join(step, "model"), save_distributed=True))
        dcp.save(optim_sd, storage_writer=FileSystemWriter(os.path.join(step, "optim")))
        if rank == 0:
            nemo_extras(step)
    else:
        raise SystemExit("unknown layout " + layout)


def nemo_extras(step):
    """What NeMo Automodel writes beside model/ and optim/ (nemo_automodel's checkpointing:
    .hf_metadata/ with the HF config, config.yaml, losses.json, step_scheduler.pt)."""
    meta = os.path.join(step, "model", ".hf_metadata")
    os.makedirs(meta, exist_ok=True)
    with open(os.path.join(meta, "config.json"), "w") as f:
        json.dump({"architectures": ["TinyModel"], "model_type": "tiny"}, f)
    with open(os.path.join(step, "config.yaml"), "w") as f:
        f.write("step_scheduler:\n  max_steps: 3\n")
    with open(os.path.join(step, "losses.json"), "w") as f:
        json.dump({"0": 1.5, "1": 1.25, "2": 1.0}, f)
    torch.save({"step": 3, "epoch": 0}, os.path.join(step, "step_scheduler.pt"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write(layout, world, outdir, scale=1):
    """Save one checkpoint from world forked ranks; returns when every rank has finished."""
    torch.set_num_threads(1)
    mp.start_processes(worker, args=(world, layout, outdir, free_port(), scale), nprocs=world,
                       join=True, start_method="fork")


def main():
    args = sys.argv[1:]
    scale = 1
    if args[:1] == ["--scale"]:
        scale = int(args[1])
        args = args[2:]
    if not args or len(args) % 3:
        raise SystemExit(__doc__)
    for i in range(0, len(args), 3):
        write(args[i], int(args[i + 1]), args[i + 2], scale)


if __name__ == "__main__":
    main()
