#!/usr/bin/python3
"""torch 2.x distributed checkpoints written by torch itself at test time
(tests/clients/dcp_write.py: 2 and 4 gloo ranks on the CPU, DTensor parameters sharded on dim 0
and dim 1 with uneven splits, a replicated one, Adam state; an FSDP2 fully_shard model with
AdamW state) with FileSystemWriter, the Hugging
Face storage writer (DCP_SHARDING_INFO shards; with enable_consolidation, torch's own
consolidated copy beside them) and as a NeMo Automodel step. ckptfs mounts each; every tensor
of the mount equals, byte for byte, what torch's dcp.load returns for that checkpoint, with
the same dtype and shape, no tensor missing and none extra; the model's tensors read through
safetensors' safe_open on .ckptfs/hf/model.safetensors equal them too."""

import json
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
from clients_env import under_clients  # noqa: E402

under_clients("torch", "safetensors")

sys.path.insert(0, os.path.join(HERE, "..", "clients"))
import torch  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from safetensors import safe_open  # noqa: E402
from torch.distributed.checkpoint import FileSystemReader, HuggingFaceStorageReader  # noqa: E402
from torch.distributed.checkpoint.metadata import TensorStorageMetadata  # noqa: E402

import dcp_write  # noqa: E402
import mount_checks as mc  # noqa: E402

# torch dtype -> the safetensors spelling ckptfs's sidecars use (ckptfs(5), Sidecars).
ST_DTYPE = {torch.float32: "F32", torch.float64: "F64", torch.float16: "F16",
            torch.bfloat16: "BF16", torch.int64: "I64", torch.int32: "I32"}


def dcp_load(reader_cls, path):
    """{fqn: tensor} of every tensor of the checkpoint, as torch's dcp.load fills it."""
    md = reader_cls(path).read_metadata()
    sd = {k: torch.empty(tuple(v.size), dtype=v.properties.dtype)
          for k, v in md.state_dict_metadata.items() if isinstance(v, TensorStorageMetadata)}
    dcp.load(sd, storage_reader=reader_cls(path))
    return sd


def raw(t):
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def compare_tree(tap, label, mnt, want):
    """want: {path under the mount: tensor}. Every path's bytes, sidecar dtype and shape; the
    tensors of tensors.tsv are exactly these paths."""
    with open(os.path.join(mnt, ".ckptfs", "tensors.tsv"), "rb") as f:
        rows = f.read().decode().splitlines()[1:]
    listed = {r.split("\t")[4] for r in rows}
    tap.ok(listed == set(want), "%s: the mount lists exactly the %d tensors dcp.load returns"
           % (label, len(want)),
           ["missing: %r" % sorted(set(want) - listed), "extra: %r" % sorted(listed - set(want))])
    bad = []
    for path, t in sorted(want.items()):
        try:
            with open(os.path.join(mnt, path), "rb") as f:
                got = f.read()
            with open(os.path.join(mnt, path + ".json")) as f:
                side = json.load(f)
        except OSError as e:
            bad.append("%s: %s" % (path, e))
            continue
        if side.get("dtype") != ST_DTYPE.get(t.dtype) or side.get("shape") != list(t.shape):
            bad.append("%s: sidecar %s %r, dcp.load %s %r" % (path, side.get("dtype"),
                                                               side.get("shape"), t.dtype,
                                                               list(t.shape)))
        elif got != raw(t):
            bad.append("%s: %d bytes differ from dcp.load's %d" % (path, len(got), len(raw(t))))
    tap.ok(not bad, "%s: every tensor's bytes, dtype and shape equal dcp.load's" % label, bad)


def compare_hf_view(tap, label, mnt, model):
    """safe_open (torch) of the HF view: the model's tensors, by name, equal to dcp.load's."""
    view = os.path.join(mnt, ".ckptfs", "hf", "model.safetensors")
    bad = []
    try:
        with safe_open(view, "pt") as f:
            keys = set(f.keys())
            if keys != set(model):
                bad.append("keys %r, want %r" % (sorted(keys), sorted(model)))
            for name in sorted(keys & set(model)):
                t = f.get_tensor(name)
                if t.dtype != model[name].dtype or not torch.equal(t, model[name]):
                    bad.append("%s differs" % name)
    except Exception as e:
        bad.append("%s: %s" % (type(e).__name__, e))
    tap.ok(not bad, "%s: safe_open of .ckptfs/hf/model.safetensors equals dcp.load" % label, bad)


def paths(sd, model_prefix="", optim_dir="optim/"):
    """Where ckptfs(5) puts each fqn: dots are directories; optimizer state ("optim." or
    "state."-rooted keys) under optim/, the model under model_prefix."""
    out = {}
    for fqn, t in sd.items():
        if fqn.startswith("optim."):
            out[optim_dir + fqn[len("optim."):].replace(".", "/")] = t
        elif fqn.startswith("state."):
            out[optim_dir + fqn.replace(".", "/")] = t
        else:
            out[model_prefix + fqn.replace(".", "/")] = t
    return out


def model_of(sd):
    """The model's tensors of a loaded state dict: all but the optimizer state."""
    return {k: v for k, v in sd.items() if not k.startswith(("optim.", "state."))}


def main():
    started = mc.start()
    if not started:
        return 0
    tap, ckptfs, _ = started
    work = tempfile.mkdtemp(prefix="ckptfs-t90.")
    try:
        cases = []  # (label, source to mount, {path: tensor}, {hf name: tensor})
        # 2 ranks: fs and nemo (HF storage for its model); 4: the rest. Each save costs a
        # few seconds of forked ranks, so no layout is written twice.
        for layout, world in (("fs", 2), ("fs", 4), ("fsdp2", 4), ("hf", 4), ("hf-consol", 4),
                              ("nemo", 2)):
            out = os.path.join(work, "%s-%d" % (layout, world))
            label = "%s, %d ranks" % (layout, world)
            try:
                dcp_write.write(layout, world, out)
            except Exception as e:
                tap.ok(False, "%s: torch saves the checkpoint" % label, [repr(e)])
                continue
            if layout in ("fs", "fsdp2"):
                sd = dcp_load(FileSystemReader, out)
                # The state dict was {"model": ..., "optim": ...}: the model's fqns start with
                # "model.", and ckptfs keeps them whole (the HF view too).
                cases.append((label, out, paths(sd), model_of(sd)))
            elif layout == "hf":
                sd = dcp_load(HuggingFaceStorageReader, out)
                cases.append((label, out, paths(sd), sd))
            elif layout == "hf-consol":
                sharded = dcp_load(HuggingFaceStorageReader, os.path.join(out, "sharded"))
                consol = dcp_load(HuggingFaceStorageReader, out)
                tap.ok(set(sharded) == set(consol) and
                       all(torch.equal(sharded[k], consol[k]) for k in sharded),
                       "%s: torch's consolidated copy loads as its shards do" % label)
                cases.append((label, out, paths(sharded), sharded))
                cases.append((label + ", sharded/ alone", os.path.join(out, "sharded"),
                              paths(sharded), sharded))
                cases.append((label + ", torch's consolidated file",
                              os.path.join(out, "model-00001-of-00001.safetensors"),
                              paths(consol), consol))
            else:
                step = os.path.join(out, "epoch_0_step_3")
                model = dcp_load(HuggingFaceStorageReader, os.path.join(step, "model"))
                optim = dcp_load(FileSystemReader, os.path.join(step, "optim"))
                want = paths(model, model_prefix="model/")
                want.update(paths(optim))
                cases.append((label, step, want, model))
        for label, src, want, model in cases:
            def checks(mnt, label=label, want=want, model=model):
                compare_tree(tap, label, mnt, want)
                compare_hf_view(tap, label, mnt, model)
            mc.mounted(tap, ckptfs, src, label, checks)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return mc.finish(tap)


if __name__ == "__main__":
    sys.exit(main())
