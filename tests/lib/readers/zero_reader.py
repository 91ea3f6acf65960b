"""A DeepSpeed ZeRO checkpoint reader in Python + numpy, independent of ckptfs and of torch:
torch.save zips are read with zipfile and a pickle.Unpickler whose globals are stand-ins (torch
rebuild functions make numpy views of the storage records; DeepSpeed's classes and enums become
inert stubs), and the fp32 state dict is put together the way deepspeed/utils/zero_to_fp32.py
does it (its stage 1/2 and stage 3 protocols, padding checks, frozen parameters, buffers, shared
parameters), step for step.

Arrays keep the stored bytes: bf16 is numpy uint16 (of the subclass BF16, so it can be told
from an int16 or uint16 tensor), except the buffers, which zero_to_fp32 returns as `v.float()`
(float32 whatever their dtype, an int64 position_ids too). consolidate() returns an OrderedDict
name -> array (zero_to_fp32's order); it raises ValueError where zero_to_fp32 would.
"""

import collections
import glob
import math
import os
import pickle
import re
import zipfile

import numpy as np

DTYPES = {"FloatStorage": np.float32, "HalfStorage": np.float16, "BFloat16Storage": np.uint16,
          "DoubleStorage": np.float64, "LongStorage": np.int64, "IntStorage": np.int32,
          "ByteStorage": np.uint8, "BoolStorage": np.bool_}
STAGE_NAMES = {"disabled": 0, "optimizer_states": 1, "gradients": 2, "weights": 3,
               "max_stage": 3}


class Stub:
    """Any DeepSpeed object: keeps what was pickled, does nothing."""

    def __init__(self, *args, **kwargs):
        self.args = args

    def __setstate__(self, state):
        self.state = state


class BF16(np.ndarray):
    """bfloat16 elements as their uint16 bits."""


class StorageType:
    def __init__(self, name):
        self.dtype = DTYPES[name]
        self.bf16 = name == "BFloat16Storage"


def to_float(arr):
    """torch's Tensor.float() of a stored array: float32 values."""
    if isinstance(arr, BF16):
        bits = np.asarray(arr, dtype=np.uint16).astype(np.uint32) << 16
        return bits.view(np.float32)
    return np.asarray(arr).astype(np.float32)


def rebuild_tensor_v2(storage, offset, size, stride, *rest):
    itemsize = storage.dtype.itemsize
    if not size:
        return storage[offset:offset + 1].reshape(())
    return np.lib.stride_tricks.as_strided(storage[offset:], shape=tuple(size),
                                           strides=tuple(s * itemsize for s in stride),
                                           subok=True)


def rebuild_parameter(data, requires_grad, hooks, *rest):
    return data


def zero_stage_getattr(obj, name):
    if name in STAGE_NAMES:
        return STAGE_NAMES[name]
    return (obj, name)


class Unpickler(pickle.Unpickler):
    def __init__(self, f, zf, prefix):
        super().__init__(f)
        self.zf, self.prefix = zf, prefix

    def find_class(self, module, name):
        if module == "__builtin__":  # protocol 2 spells builtins so
            module = "builtins"
        if module == "torch._utils" and name == "_rebuild_tensor_v2":
            return rebuild_tensor_v2
        if module == "torch._utils" and name == "_rebuild_parameter":
            return rebuild_parameter
        if module == "torch" and name.endswith("Storage"):
            return StorageType(name)
        if module == "torch" and name == "Size":
            return tuple
        if module == "collections" and name == "OrderedDict":
            return collections.OrderedDict
        if module == "builtins" and name == "getattr":
            return zero_stage_getattr
        if module == "builtins" and name in ("set", "frozenset"):
            return set
        if module.startswith("deepspeed") or module == "torch":
            if name == "ZeroStageEnum":
                return lambda v: int(v)
            return Stub
        raise pickle.UnpicklingError("global %s.%s not expected" % (module, name))

    def persistent_load(self, pid):
        _, st, key, _location, numel = pid[:5]
        raw = self.zf.read("%sdata/%s" % (self.prefix, key))
        arr = np.frombuffer(raw, dtype=st.dtype)
        assert arr.size == numel, "storage %s: %d elements, want %d" % (key, arr.size, numel)
        return arr.view(BF16) if st.bf16 else arr


def load(path):
    """torch.load(path) without torch: tensors as numpy views of the records' bytes."""
    with zipfile.ZipFile(path) as zf:
        pkl = [n for n in zf.namelist() if n.endswith("/data.pkl") and n.count("/") == 1]
        if len(pkl) != 1:
            raise ValueError("%s: not a torch.save zip" % path)
        prefix = pkl[0][:-len("data.pkl")]
        with zf.open(pkl[0]) as f:
            return Unpickler(f, zf, prefix).load()


def natural_keys(text):
    return [int(c) if c.isdigit() else c for c in re.split(r"(\d+)", text)]


def files(step, pattern):
    found = sorted(glob.glob(os.path.join(step, pattern)), key=natural_keys)
    if not found:
        raise ValueError("can't find %s files in directory %s" % (pattern, step))
    return found


def consolidate(step):
    """zero_to_fp32's _get_fp32_state_dict_from_zero_checkpoint(step)."""
    optim = [load(f)["optimizer_state_dict"] for f in files(step, "*_optim_states.pt")]
    if "zero_stage" not in optim[0]:
        raise ValueError("not a zero checkpoint")
    stage = optim[0]["zero_stage"]
    world = optim[0]["partition_count"]
    if isinstance(world, list):
        world = max(world)
    if world != len(optim):
        raise ValueError("Expected %d of '*_optim_states.pt' but found %d files"
                         % (world, len(optim)))
    key = "single_partition_of_fp32_groups" if stage <= 2 else "fp32_flat_groups"
    flat = [o[key] for o in optim]
    models = [load(f) for f in files(step, "*_model_states.pt")]
    m0 = models[0]
    sd = collections.OrderedDict()
    # parse_model_states: "recover just the buffers while restoring them to fp32"
    buffers = {k: to_float(v) for k, v in m0["module"].items() if k in m0["buffer_names"]}
    sd.update(buffers)
    frozen = m0.get("frozen_param_shapes") or {}
    for name, shape in frozen.items():
        n = math.prod(shape)
        if stage <= 2:
            sd[name] = m0["frozen_param_fragments"][name]
        else:
            frags = [m["frozen_param_fragments"][name].reshape(-1) for m in models]
            sd[name] = np.concatenate(frags)[:n].reshape(shape)
    shapes = m0["param_shapes"]
    if stage <= 2:
        merged = [np.concatenate([f[g] for f in flat]) for g in range(len(flat[0]))]
        for group, vec in zip(shapes, merged):
            offset = 0
            for name, shape in group.items():
                n = math.prod(shape)
                sd[name] = vec[offset:offset + n].reshape(shape)
                offset += n
            align = 2 * world

            def aligned(x):
                return align * math.ceil(x / align)
            if aligned(offset) != aligned(vec.size):
                raise ValueError("consumed %d numels out of %d" % (offset, vec.size))
    else:
        all_shapes = collections.OrderedDict((k, v) for g in shapes for k, v in g.items())
        per_rank = [np.concatenate([g.reshape(-1) for g in f]) for f in flat]
        avail = per_rank[0].size * world
        offset = 0
        for name, shape in all_shapes.items():
            n = math.prod(shape)
            part = math.ceil(n / world)
            sd[name] = np.concatenate([r[offset:offset + part] for r in per_rank])[:n] \
                .reshape(shape)
            offset += part
        if offset * world != avail:
            raise ValueError("consumed %d numels out of %d" % (offset * world, avail))
    for alias, source in m0["shared_params"].items():
        if source in sd:
            sd[alias] = sd[source]
    return sd


def step_dir(root):
    """The directory `latest` names (as DeepSpeed's loader reads it), or root itself."""
    latest = os.path.join(root, "latest")
    if os.path.isfile(latest):
        with open(latest) as f:
            return os.path.join(root, f.read().strip())
    return root
