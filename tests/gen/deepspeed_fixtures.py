#!/usr/bin/python3
"""Write DeepSpeed ZeRO 1/2/3 checkpoints with REAL torch (python3-torch 1.13).

usage: deepspeed_fixtures.py            regenerate tests/fixtures/deepspeed/ (committed)
       deepspeed_fixtures.py --out DIR  write them somewhere else
       deepspeed_fixtures.py OUTDIR     what the Makefile runs: the files are committed (so
                                        `make check` needs no torch); writes nothing

Each case is what DeepSpeed's engine.save_checkpoint(save_dir) leaves (read from
deepspeed/runtime/engine.py, zero/stage_1_and_2.py, zero/stage3.py): `latest` holding the tag,
and global_stepN/ with
  mp_rank_00_model_states.pt (stage 1/2) or zero_pp_rank_R_mp_rank_00_model_states.pt (stage 3):
    dict(module=, buffer_names=, optimizer=None, param_shapes=[OrderedDict(name: torch.Size)],
         frozen_param_shapes=, shared_params=, frozen_param_fragments=, lr_scheduler=,
         data_sampler=, random_ltd=, sparse_tensor_module_names=, skipped_steps=,
         global_steps=, global_samples=, dp_world_size=, mp_world_size=, ds_config=,
         ds_version=)
  [bf16_]zero_pp_rank_R_mp_rank_00_optim_states.pt:
    dict(optimizer_state_dict=, ds_config=, ds_version=) where the optimizer's state_dict is,
    stage 1/2: loss_scaler, dynamic_loss_scale, overflow, clip_grad, base_optimizer_state
      (the torch optimizer's state_dict over the flat partition, or the elastic per-group list),
      single_partition_of_fp32_groups (padding stripped), zero_stage (ZeroStageEnum),
      group_paddings, partition_count (a list), ds_version, param_slice_mappings;
    stage 3: zero_stage, loss_scaler, dynamic_loss_scale, overflow, partition_count (an int),
      optimizer_state_dict (the torch optimizer's), fp32_flat_groups.
DeepSpeed's own classes (ZeroStageEnum, the loss scaler, the config, fragment_address) are
stand-ins defined here under their deepspeed.* module names, so the pickles name them exactly
as DeepSpeed's do (Python 3.11 pickles an enum member as builtins.getattr(cls, name)).

The flat partitions are built as ZeRO builds them: stage 1/2 flattens each group's fp32 master
weights, pads to a multiple of 2 * world_size and gives rank r the r-th equal slice; stage 3
pads every parameter to world_size * ceil(numel / world_size) and gives rank r its r-th slice.
manifest.json has, per case, the sha256 of every tensor zero_to_fp32 returns, computed from the
master weights themselves (not by re-reading the files), and of every optimizer moment.

Hostile cases (hostile/): a rank's partition cut short, param_shapes naming a parameter past
the partitions.
"""

import collections
import dataclasses
import enum
import hashlib
import json
import math
import os
import sys
import types

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
from fixture_lib import committed_torch_main  # noqa: E402

COMMITTED = os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "fixtures",
                         "deepspeed")
DS_VERSION = "0.16.4"


def deepspeed_standins():
    """Classes named as DeepSpeed's, registered so pickle writes their real module paths."""
    def module(name):
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            n = ".".join(parts[:i])
            if n not in sys.modules:
                sys.modules[n] = types.ModuleType(n)
        return sys.modules[name]

    zc = module("deepspeed.runtime.zero.config")

    class ZeroStageEnum(int, enum.Enum):
        disabled = 0
        optimizer_states = 1
        gradients = 2
        weights = 3
        max_stage = 3
    ZeroStageEnum.__module__ = zc.__name__
    zc.ZeroStageEnum = ZeroStageEnum

    class DeepSpeedZeroConfig:
        pass
    DeepSpeedZeroConfig.__module__ = zc.__name__
    zc.DeepSpeedZeroConfig = DeepSpeedZeroConfig

    ls = module("deepspeed.runtime.fp16.loss_scaler")

    class DynamicLossScaler:
        def __init__(self):
            self.cur_scale = 65536.0
            self.cur_iter = 100
            self.last_overflow_iter = -1
            self.scale_factor = 2.0
            self.scale_window = 1000
    DynamicLossScaler.__module__ = ls.__name__
    ls.DynamicLossScaler = DynamicLossScaler

    cfg = module("deepspeed.runtime.config")

    class DeepSpeedConfig:
        pass
    DeepSpeedConfig.__module__ = cfg.__name__
    cfg.DeepSpeedConfig = DeepSpeedConfig

    tf = module("deepspeed.utils.tensor_fragment")

    @dataclasses.dataclass
    class fragment_address:
        numel: int
        start: int
    fragment_address.__module__ = tf.__name__
    tf.fragment_address = fragment_address
    for cls in (ZeroStageEnum, DeepSpeedZeroConfig, DynamicLossScaler, DeepSpeedConfig,
                fragment_address):
        cls.__qualname__ = cls.__name__
    return types.SimpleNamespace(ZeroStageEnum=ZeroStageEnum, DeepSpeedZeroConfig=DeepSpeedZeroConfig,
                                 DynamicLossScaler=DynamicLossScaler,
                                 DeepSpeedConfig=DeepSpeedConfig,
                                 fragment_address=fragment_address)


CASES = {
    "zero2_fp16_ws2": {"stage": 2, "world": 2, "dtype": "float16", "elastic": False, "step": 100},
    "zero1_bf16_ws3": {"stage": 1, "world": 3, "dtype": "bfloat16", "elastic": True, "step": 40},
    "zero3_bf16_ws2": {"stage": 3, "world": 2, "dtype": "bfloat16", "elastic": False, "step": 7},
}


def make_model(torch):
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = nn.Linear(12, 12)
            self.mlp = nn.Linear(12, 20, bias=False)
            self.norm = nn.LayerNorm(12)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(23, 12)
            self.blocks = nn.ModuleList([Block(), Block()])
            self.frozen_proj = nn.Linear(12, 5, bias=False)
            self.lm_head = nn.Linear(12, 23, bias=False)
            self.lm_head.weight = self.embed.weight  # tied: shared_params
            self.register_buffer("position_ids", torch.arange(7))
            # a float buffer: the engine's module.half() / .bfloat16() casts it with the weights
            self.register_buffer("rotary_inv_freq", 1.0 / 10000 ** (torch.arange(0, 6, 2).float() / 6))
            self.register_buffer("scratch", torch.zeros(3), persistent=False)

    torch.manual_seed(1234)
    m = Model()
    m.frozen_proj.weight.requires_grad_(False)
    return m


def param_names(model):
    names = {}
    for n, p in model.named_parameters():
        names.setdefault(p, n)
    return names


def shared_params(model):
    index, shared = {}, {}

    def walk(mod, prefix):
        for n, p in mod.named_parameters(recurse=False):
            key = prefix + n
            if p.data_ptr() in index:
                shared[key] = index[p.data_ptr()]
            else:
                index[p.data_ptr()] = key
        for n, c in mod.named_children():
            walk(c, prefix + n + ".")
    walk(model, "")
    return shared


def buffer_names(model):
    out = []

    def walk(mod, prefix):
        for n, b in mod.named_buffers(recurse=False):
            if b is not None and n not in mod._non_persistent_buffers_set:
                out.append(prefix + n)
        for n, c in mod.named_children():
            walk(c, prefix + n + ".")
    walk(model, "")
    return out


def ds_config(ds, torch, case):
    c = ds.DeepSpeedConfig()
    z = ds.DeepSpeedZeroConfig()
    z.stage = ds.ZeroStageEnum(case["stage"])
    z.contiguous_gradients = True
    z.reduce_bucket_size = 500000000
    c.zero_config = z
    c.zero_optimization_stage = case["stage"]
    c.train_batch_size = 8
    c.bfloat16_enabled = case["dtype"] == "bfloat16"
    c.fp16_enabled = case["dtype"] == "float16"
    c.gradient_clipping = 1.0
    c._param_dict = {"train_batch_size": 8, "zero_optimization": {"stage": case["stage"]}}
    return c


def sha(torch, t):
    c = t.detach().contiguous()
    raw = (c.view(torch.int16) if c.dtype in (torch.bfloat16, torch.float16) else c).numpy().tobytes()
    return {"dtype": {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
                      torch.int64: "I64"}[c.dtype],
            "shape": list(c.shape), "nbytes": len(raw),
            "sha256": hashlib.sha256(raw).hexdigest()}


def adam_moments(torch, flat, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(flat.numel(), generator=g) * 1e-3,
            torch.rand(flat.numel(), generator=g) * 1e-6)


def build_case(torch, ds, out, name, case, hostile=None):
    model = make_model(torch)
    world, stage = case["world"], case["stage"]
    dt = getattr(torch, case["dtype"])
    names = param_names(model)
    trainable = [p for p in model.parameters() if p.requires_grad]
    # Two param groups: weights with decay, biases and norms without (a usual split).
    decay = [p for p in trainable if p.dim() >= 2]
    no_decay = [p for p in trainable if p.dim() < 2]
    groups = [decay, no_decay]
    # fp32 master weights: the module's values in fp32, perturbed (training moved them on from
    # the fp16/bf16 copies, which are rounded from them).
    g = torch.Generator().manual_seed(99)
    master = {p: (p.detach().float() + torch.randn(p.shape, generator=g) * 1e-2) for p in trainable}
    with torch.no_grad():
        for p in trainable:
            p.copy_(master[p])
    model = model.to(dt)  # the engine's module.half() / .bfloat16(); keeps ties and buffers
    # (.to() made new parameter objects: map masters by name)
    by_name = {names[p]: master[p] for p in master}
    names = param_names(model)
    trainable = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in trainable if p.dim() >= 2]
    no_decay = [p for p in trainable if p.dim() < 2]
    groups = [decay, no_decay]
    frozen = [p for p in model.parameters() if not p.requires_grad]

    tag = "global_step%d" % case["step"]
    step = os.path.join(out, name, tag)
    os.makedirs(step)
    with open(os.path.join(out, name, "latest"), "w") as f:
        f.write(tag)
    expect = collections.OrderedDict()
    moments = {}
    param_shapes = [collections.OrderedDict((names[p], p.shape) for p in grp) for grp in groups]
    rank_flats, rank_states, paddings = [[] for _ in range(world)], [[] for _ in range(world)], []
    for gi, grp in enumerate(groups):
        if stage <= 2:
            flat = torch.cat([by_name[names[p]].reshape(-1) for p in grp])
            align = 2 * world
            padded = align * math.ceil(flat.numel() / align)
            padding = padded - flat.numel()
            flat = torch.cat([flat, torch.zeros(padding)])
            part = padded // world
            paddings.append(padding)
            ea, eas = adam_moments(torch, flat, 7 + gi)
            for r in range(world):
                sl = slice(r * part, (r + 1) * part)
                lean = part - (padding if r == world - 1 else 0)
                rank_flats[r].append(flat[sl][:lean].clone())
                st = {"step": torch.tensor(float(case["step"])),
                      "exp_avg": ea[sl].clone(), "exp_avg_sq": eas[sl].clone()}
                if case["elastic"]:
                    st = {k: (v[:lean] if v.dim() else v) for k, v in st.items()}
                rank_states[r].append(st)
            off = 0
            for p in grp:
                n = p.numel()
                moments[names[p]] = (ea[off:off + n].reshape(p.shape), eas[off:off + n].reshape(p.shape))
                off += n
        else:
            parts_r = [[] for _ in range(world)]
            eas_r = [[] for _ in range(world)]
            for p in grp:
                n = p.numel()
                sz = math.ceil(n / world)
                full = torch.cat([by_name[names[p]].reshape(-1), torch.zeros(sz * world - n)])
                ea, eas = adam_moments(torch, full, sum(map(ord, names[p])))
                for r in range(world):
                    parts_r[r].append(full[r * sz:(r + 1) * sz])
                    eas_r[r].append((ea[r * sz:(r + 1) * sz], eas[r * sz:(r + 1) * sz]))
                moments[names[p]] = (ea[:n].reshape(p.shape), eas[:n].reshape(p.shape))
            for r in range(world):
                rank_flats[r].append(torch.cat(parts_r[r]))
                rank_states[r].append({"step": torch.tensor(float(case["step"])),
                                       "exp_avg": torch.cat([a for a, _ in eas_r[r]]),
                                       "exp_avg_sq": torch.cat([b for _, b in eas_r[r]])})
    # What zero_to_fp32 returns, from the masters: buffers, frozen, trainable, shared.
    # zero_to_fp32's parse_model_states: buffers = {k: v.float() ...}, whatever their dtype.
    for bname in buffer_names(model):
        expect[bname] = dict(model.named_buffers())[bname].float()
    for p in frozen:
        expect[names[p]] = p.detach()
    for grp in groups:
        for p in grp:
            expect[names[p]] = by_name[names[p]]
    shared = shared_params(model)
    for alias, src in shared.items():
        expect[alias] = expect[src]

    if hostile == "short_partition":
        rank_flats[world - 1][0] = rank_flats[world - 1][0][:-(2 * world + 1)].clone()
    if hostile == "shapes_past":
        param_shapes[0]["extra.weight"] = torch.Size([4, 4])

    cfg = ds_config(ds, torch, case)
    sd_module = model.state_dict()
    if stage == 3:  # partitioned weights leave empty placeholders in the module's state_dict
        sd_module = collections.OrderedDict(
            (k, v if k in buffer_names(model) else torch.empty(0, dtype=v.dtype))
            for k, v in sd_module.items())
    prefix = "bf16_" if dt == torch.bfloat16 else ""
    for r in range(world):
        base = {"state": {gi: rank_states[r][gi] for gi in range(len(groups))},
                "param_groups": [{"lr": 1e-4, "betas": (0.9, 0.999), "eps": 1e-8,
                                  "weight_decay": wd, "amsgrad": False, "params": [gi]}
                                 for gi, wd in enumerate((0.01, 0.0))]}
        if stage <= 2:
            osd = {"loss_scaler": ds.DynamicLossScaler(), "dynamic_loss_scale": True,
                   "overflow": False, "clip_grad": 1.0,
                   "base_optimizer_state": rank_states[r] if case["elastic"] else base,
                   "single_partition_of_fp32_groups": rank_flats[r],
                   "zero_stage": ds.ZeroStageEnum(stage), "group_paddings": paddings,
                   "partition_count": [world] * len(groups), "ds_version": DS_VERSION,
                   "param_slice_mappings": [collections.OrderedDict(
                       (names[p], ds.fragment_address(numel=p.numel(), start=0)) for p in grp)
                       for grp in groups]}
            if case["elastic"]:
                osd["base_optimizer_state_step"] = case["step"]
        else:
            osd = {"zero_stage": ds.ZeroStageEnum.weights, "loss_scaler": ds.DynamicLossScaler(),
                   "dynamic_loss_scale": True, "overflow": False, "partition_count": world,
                   "optimizer_state_dict": base, "fp32_flat_groups": rank_flats[r]}
        torch.save({"optimizer_state_dict": osd, "ds_config": cfg, "ds_version": DS_VERSION},
                   os.path.join(step, "%szero_pp_rank_%d_mp_rank_00_optim_states.pt" % (prefix, r)))
    save_frozen = stage >= 2
    for r in range(world if stage == 3 else 1):
        if stage == 3:
            frags = collections.OrderedDict()
            for p in frozen:
                n = p.numel()
                sz = math.ceil(n / world)
                full = torch.cat([p.detach().reshape(-1), torch.zeros(sz * world - n, dtype=p.dtype)])
                frags[names[p]] = full[r * sz:(r + 1) * sz].clone()
        else:
            frags = collections.OrderedDict((names[p], p.detach().cpu()) for p in frozen)
        state = dict(module=sd_module, buffer_names=buffer_names(model), optimizer=None,
                     param_shapes=param_shapes,
                     frozen_param_shapes=collections.OrderedDict((names[p], p.shape) for p in frozen)
                     if save_frozen else None,
                     shared_params=shared,
                     frozen_param_fragments=frags if save_frozen else None,
                     lr_scheduler={"last_epoch": case["step"], "base_lrs": [1e-4, 1e-4]},
                     data_sampler=None, random_ltd=None, sparse_tensor_module_names=set(),
                     skipped_steps=0, global_steps=case["step"], global_samples=8 * case["step"],
                     dp_world_size=world, mp_world_size=1, ds_config=cfg, ds_version=DS_VERSION)
        fname = ("zero_pp_rank_%d_mp_rank_00_model_states.pt" % r if stage == 3
                 else "mp_rank_00_model_states.pt")
        torch.save(state, os.path.join(step, fname))
    if not save_frozen:
        # ZeRO-1 saves no frozen_param_*: zero_to_fp32 never sees frozen weights there.
        for p in frozen:
            expect.pop(names[p])
    return {"stage": stage, "world": world, "tag": tag,
            "fp32": {k: sha(torch, v) for k, v in expect.items()},
            "module": {k: sha(torch, v) for k, v in model.state_dict().items()
                       if k not in buffer_names(model) and stage <= 2},
            "optim": {"%s.%s" % (k, m): sha(torch, v[i])
                      for k, v in moments.items() for i, m in enumerate(("exp_avg", "exp_avg_sq"))}}


def build(torch, out):
    ds = deepspeed_standins()
    manifest = {"torch_version": torch.__version__, "cases": {}, "hostile": {}}
    for name, case in CASES.items():
        manifest["cases"][name] = build_case(torch, ds, out, name, case)
    hostile = os.path.join(out, "hostile")
    build_case(torch, ds, hostile, "short_partition", CASES["zero2_fp16_ws2"], "short_partition")
    manifest["hostile"]["short_partition"] = {"error": ["mp_rank_00_model_states.pt",
                                                        "partitions"]}
    build_case(torch, ds, hostile, "shapes_past", CASES["zero2_fp16_ws2"], "shapes_past")
    manifest["hostile"]["shapes_past"] = {"error": ["mp_rank_00_model_states.pt",
                                                    "extra.weight", "past"]}
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)


def main(argv):
    out = committed_torch_main(argv, "DeepSpeed", COMMITTED, __doc__, build)
    if not isinstance(out, str):
        return out
    print("wrote %s" % out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
