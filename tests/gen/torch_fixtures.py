#!/usr/bin/python3
"""Write torch.save fixtures for ckptfs with REAL torch (Debian's python3-torch 1.13).

usage: torch_fixtures.py            regenerate tests/fixtures/torch/ (committed)
       torch_fixtures.py --out DIR  write them somewhere else
       torch_fixtures.py OUTDIR     what the Makefile runs for every generator: the torch
                                    fixtures are committed (so `make check` needs no torch), so
                                    this only says where they are and writes nothing

Everything the test compares against is computed here with torch itself, not with ckptfs code:
per tensor the sha256 of its logical row-major bytes (t.contiguous(), bf16 through an int16
view), dtype, shape, stride, storage_offset, requires_grad and which other tensors share its
storage; per file the non-tensor values keyed by dotted path, as ckptfs's metadata.json
"pickle" document must show them.  The output is deterministic (fixed seeds; torch 1.13 writes
zip times of 0 and storage keys 0, 1, ...).

Files:
  state_dict.pt      a module state_dict (OrderedDict with _metadata) plus one tensor of each
                     dtype: f32 f64 f16 bf16 i8 i16 i32 i64 u8 bool c64 c128
  training.pt        {"model": state_dict, "optimizer": Adam state (0-d step tensors),
                      "epoch": 3, ...scalars, strings, lists, None, bools, Parameters}
  tied.pt            tied weights (one tensor object under two names) and distinct views of
                     one storage (slice with offset, transposed view)
  views.pt           transposed / permuted / sliced / expanded tensors, 0-d and empty tensors
  renamed.pt         saved as other_name.pt, so its archive folder is "other_name"
  proto4.pt          pickle_protocol=4 (FRAME, SHORT_BINUNICODE, MEMOIZE ...), a list of tensors
  single.pt          one tensor saved on its own: named after the archive
  legacy.pt          _use_new_zipfile_serialization=False: the pre-1.6 sequence of pickles
                     (tied and viewed storages, several dtypes, 0-d and empty tensors)
  legacy_single.pt   one transposed tensor in the legacy format: named after the file
  manifest.json      what each file must show
"""

import collections
import hashlib
import json
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.realpath(__file__))
COMMITTED = os.path.normpath(os.path.join(HERE, "..", "fixtures", "torch"))
sys.path.insert(0, HERE)
from fixture_lib import committed_torch_main  # noqa: E402


def dtype_name(torch, dt):
    return {
        torch.float32: "F32", torch.float64: "F64", torch.float16: "F16",
        torch.bfloat16: "BF16", torch.int8: "I8", torch.int16: "I16", torch.int32: "I32",
        torch.int64: "I64", torch.uint8: "U8", torch.bool: "BOOL", torch.complex64: "C64",
        torch.complex128: "C128",
    }[dt]


def logical_bytes(torch, t):
    c = t.detach().contiguous()
    if c.dtype == torch.bfloat16:
        c = c.view(torch.int16)
    return c.numpy().tobytes()


def is_tensor(torch, v):
    return isinstance(v, torch.Tensor)


def has_structure(torch, seq):
    for x in seq:
        if isinstance(x, dict) or is_tensor(torch, x):
            return True
        if isinstance(x, (list, tuple)) and has_structure(torch, x):
            return True
    return False


def jsonable(v):
    if isinstance(v, tuple):
        return [jsonable(x) for x in v]
    if isinstance(v, list):
        return [jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    return v


def flatten(torch, obj, root_name):
    """(tensors [(name, tensor)], values {dotted path: JSON value}) by ckptfs(5)'s naming."""
    tensors, values = [], {}

    def walk(v, path):
        if is_tensor(torch, v):
            tensors.append((path if path else root_name, v))
        elif isinstance(v, dict):
            for k, x in v.items():
                walk(x, (path + "." if path else "") + str(k))
        elif isinstance(v, (list, tuple)) and has_structure(torch, v):
            for i, x in enumerate(v):
                walk(x, (path + "." if path else "") + str(i))
        else:
            values[path] = jsonable(v)

    walk(obj, "")
    return tensors, values


def describe(torch, fname, obj, root_name):
    tensors, values = flatten(torch, obj, root_name)
    by_storage = collections.defaultdict(list)
    for name, t in tensors:
        by_storage[t.storage().data_ptr() if t.numel() else ("empty", name)].append(name)
    out = []
    for name, t in tensors:
        key = t.storage().data_ptr() if t.numel() else ("empty", name)
        data = logical_bytes(torch, t)
        out.append({
            "name": name,
            "path": name.replace(".", "/"),
            "dtype": dtype_name(torch, t.dtype),
            "shape": list(t.shape),
            "stride": list(t.stride()),
            "storage_offset": t.storage_offset(),
            "nbytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
            "requires_grad": bool(t.requires_grad),
            "shared_with": sorted(n for n in by_storage[key] if n != name),
        })
    return {"file": fname, "expect": "mount", "tensors": out, "pickle": values}


def renumber_legacy_keys(torch, path):
    """The legacy writer names storages by their address (str(storage._cdata)), which differs
    from run to run.  Rename each key to a counter of the same length, in the pickles only, so
    no offset moves and the file stays a valid legacy file; then check torch still loads it."""
    import io
    import pickle
    import pickletools
    with open(path, "rb") as f:
        data = f.read()
    before = torch.load(io.BytesIO(data))
    stream = io.BytesIO(data)
    for _ in range(4):  # magic, protocol version, sys_info, the object
        for _op, _arg, _pos in pickletools.genops(stream):
            pass
    keys = pickle.load(stream)
    pickles_end = stream.tell()
    head = data[:pickles_end]
    for i, key in enumerate(keys):
        new = str(i).zfill(len(key))
        if len(new) != len(key) or head.count(key.encode()) == 0:
            raise SystemExit("cannot renumber legacy storage key %r" % key)
        head = head.replace(key.encode(), new.encode())
    data = head + data[pickles_end:]
    after = torch.load(io.BytesIO(data))

    def same(a, b):
        if isinstance(a, torch.Tensor):
            return (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
                    and a.stride() == b.stride() and torch.equal(a, b))
        if isinstance(a, dict):
            return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
        return a == b

    if not same(before, after):
        raise SystemExit("renumbering the legacy storage keys changed what torch loads")
    with open(path, "wb") as f:
        f.write(data)


def build(torch, out):
    torch.manual_seed(1234)
    fixtures = []

    def save(obj, fname, **kw):
        torch.save(obj, os.path.join(out, fname), **kw)
        fixtures.append(describe(torch, fname, obj, os.path.splitext(fname)[0]))

    # --- state_dict.pt: a real module state dict plus every dtype -----------------------------
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3),
                                torch.nn.Linear(3, 2, bias=False))
    sd = model.state_dict()
    sd["dtypes.f32"] = torch.randn(3, 5)
    sd["dtypes.f64"] = torch.randn(2, 3, dtype=torch.float64)
    sd["dtypes.f16"] = torch.randn(7, dtype=torch.float16)
    sd["dtypes.bf16"] = torch.randn(2, 4).to(torch.bfloat16)
    sd["dtypes.i8"] = torch.tensor([-128, -1, 0, 1, 127], dtype=torch.int8)
    sd["dtypes.i16"] = torch.tensor([[-32768, 7], [32767, 0]], dtype=torch.int16)
    sd["dtypes.i32"] = torch.arange(-3, 3, dtype=torch.int32)
    sd["dtypes.i64"] = torch.tensor([2 ** 40, -(2 ** 62), 5], dtype=torch.int64)
    sd["dtypes.u8"] = torch.arange(250, 256, dtype=torch.uint8)
    sd["dtypes.bool"] = torch.tensor([True, False, True, True])
    sd["dtypes.c64"] = torch.randn(3, dtype=torch.complex64)
    sd["dtypes.c128"] = torch.randn(2, 2, dtype=torch.complex128)
    save(sd, "state_dict.pt")

    # --- training.pt: nested model / optimizer / scalars ---------------------------------------
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    for _ in range(2):
        opt.zero_grad()
        net(torch.randn(5, 3)).pow(2).sum().backward()
        opt.step()
    trainable = torch.nn.Parameter(torch.randn(3))
    frozen = torch.nn.Parameter(torch.randn(2), requires_grad=False)
    save({
        "model": net.state_dict(),
        "optimizer": opt.state_dict(),
        "epoch": 3,
        "global_step": 2 ** 40 + 1,
        "loss": 0.25,
        "best_metric": -1.5e-7,
        "run": "run-1 \u00e9\u00e8 \"quoted\"",
        "flags": [True, False],
        "nothing": None,
        "schedule": {"warmup": 10, "milestones": [30, 60], "gamma": 0.1},
        "betas": (0.9, 0.999),
        "params": {"trainable": trainable, "frozen": frozen},
    }, "training.pt")

    # --- tied.pt: one tensor under two names, views of one storage -----------------------------
    emb = torch.nn.Embedding(6, 4)
    head = torch.nn.Linear(4, 6, bias=False)
    head.weight = emb.weight
    base = torch.arange(20, dtype=torch.float32)
    tied = collections.OrderedDict()
    tied["embed.weight"] = emb.weight.detach()
    tied["lm_head.weight"] = tied["embed.weight"]
    tied["view.window"] = base[2:8].view(2, 3)
    tied["view.transposed"] = base[:6].view(2, 3).t()
    tied["view.tail"] = base[5:]
    save(tied, "tied.pt")

    # --- views.pt: strides, offsets, 0-d and empty tensors -------------------------------------
    m = torch.randn(4, 6)
    img = torch.randn(2, 3, 4, 5)
    save({
        "transposed": m.t(),
        "sliced_rows": m[1:3],
        "sliced_cols": m[:, 2:5],
        "stepped": m[::2, ::3],
        "channels_last": img.contiguous(memory_format=torch.channels_last),
        "permuted": img.permute(3, 1, 0, 2),
        "expanded": torch.randn(3, 1).expand(3, 4),
        "scalar_f32": torch.tensor(2.5),
        "scalar_i64": torch.tensor(-7),
        "scalar_bool": torch.tensor(True),
        "empty": torch.empty(0),
        "empty_2d": torch.empty(3, 0, dtype=torch.float16),
        "one": torch.ones(1, 1, 1),
    }, "views.pt")

    # --- renamed.pt: archive folder differs from the file name ---------------------------------
    tmp = tempfile.mkdtemp()
    try:
        obj = {"w": torch.randn(2, 2), "b": torch.zeros(2, dtype=torch.float64)}
        torch.save(obj, os.path.join(tmp, "other_name.pt"))
        shutil.copyfile(os.path.join(tmp, "other_name.pt"), os.path.join(out, "renamed.pt"))
        fixtures.append(describe(torch, "renamed.pt", obj, "other_name"))
    finally:
        shutil.rmtree(tmp)

    # --- proto4.pt: protocol 4 opcodes, a list of tensors --------------------------------------
    save({"layers": [torch.randn(2, 3), torch.randn(3).to(torch.bfloat16)],
          "config": {"hidden": 3, "act": "gelu", "scale": 1.0}}, "proto4.pt", pickle_protocol=4)

    # --- single.pt: a tensor saved on its own ---------------------------------------------------
    save(torch.arange(12, dtype=torch.int16).view(3, 4), "single.pt")

    # --- legacy.pt: the pre-1.6 sequence-of-pickles format -------------------------------------
    shared = torch.randn(3, 4)
    lin = torch.nn.Linear(2, 3)
    save({
        "model": lin.state_dict(),
        "tied_a": shared,
        "tied_b": shared,
        "transposed": shared.t(),
        "tail": shared.view(-1)[5:],
        "half": torch.randn(5, dtype=torch.float16),
        "bf16": torch.randn(2, 2).to(torch.bfloat16),
        "ids": torch.tensor([[1, 2], [3, 4]], dtype=torch.int64),
        "scalar": torch.tensor(4.0),
        "empty": torch.empty(0, 3),
        "step": 7,
        "note": "legacy format",
    }, "legacy.pt", _use_new_zipfile_serialization=False)
    renumber_legacy_keys(torch, os.path.join(out, "legacy.pt"))
    save(torch.randn(2, 3, dtype=torch.float64).t(), "legacy_single.pt",
         _use_new_zipfile_serialization=False)
    renumber_legacy_keys(torch, os.path.join(out, "legacy_single.pt"))

    with open(os.path.join(out, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump({"torch_version": torch.__version__, "fixtures": fixtures}, f, indent=1,
                  sort_keys=True, ensure_ascii=False)
        f.write("\n")


def main(argv):
    out = committed_torch_main(argv, "torch", COMMITTED, __doc__, build)
    if not isinstance(out, str):
        return out
    total = sum(os.path.getsize(os.path.join(out, n)) for n in os.listdir(out))
    print("wrote %s (%d bytes)" % (out, total))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
