#!/usr/bin/python3
"""The safetensors package itself (0.8, the pinned client venv) on every HF view ckptfs shows.

Environment: CKPTFS, FIXTURES; CLIENTS_PY (build/clients-venv/bin/python): the test re-execs
itself with it and fails naming the client if safetensors, numpy or torch do not import.

Sources: every fixture with a manifest under FIXTURES (single-file mounts of safetensors, GGUF,
gpt-rs, .lwt, Burnpack, .zst files; DCP-HF, NeMo, MLFramework directories), the committed
torch-written fixtures (tests/fixtures/dcp/*, meta_mp, deepspeed). Each is mounted with the
default tree and read through .ckptfs/hf/, and, when its tensors pass 16 KB, again with
-o view=hf,max_shard_size=16KB (shards and model.safetensors.index.json at the root). On every
view file:
  - safe_open(framework="numpy") and safe_open(framework="pt"): metadata {"format": "pt"},
    the keys, every tensor's dtype, shape and bytes (sha256) as the generator's manifest
    records them (for Meta: the converted checkpoint; for ZeRO: what zero_to_fp32 returns);
    get_slice of the first rows equal to the tensor's;
  - safetensors.torch.load_file (not of files with F4 or FP6 tensors, which it cannot load:
    LOAD_FILE_BROKEN) and, where numpy has the dtypes, safetensors.numpy.load_file;
  - the index's weight_map names each tensor's shard.
The tree's tensor files are raw bytes (no safetensors header): each must equal what safe_open
gives for that name, with the sidecar's dtype and shape (not for Meta and ZeRO, whose views are
converted tensors under other names or in F32).
"""

import hashlib
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
import clients_env as ce  # noqa: E402

HERE = os.path.dirname(os.path.realpath(__file__))
COMMITTED = os.path.join(HERE, "..", "fixtures")
CASE_SECONDS = 120
# The safetensors dtypes (format notes, section 1); numpy has no type for the rest of them.
ST_DTYPES = {"BOOL", "U8", "I8", "U16", "I16", "F16", "BF16", "U32", "I32", "F32", "F64",
             "U64", "I64", "C64", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F8_E4M3FNUZ",
             "F8_E5M2FNUZ", "F6_E2M3", "F6_E3M2", "F4"}
# safetensors.torch has no type for the FP6 dtypes ("Dtype not understood"): those tensors are
# checked through numpy's raw bytes... which numpy has no type for either, so only the tree's
# raw files (against the manifest) and the strict reader of 320-hfview.t cover them.
PT_MISSING = {"F6_E2M3", "F6_E3M2"}
# safetensors.torch.load/load_file reshape an F4 tensor's bytes, viewed as float4_e2m1fn_x2 (two
# values a byte), to the logical shape, which counts values: the reshape raises (safetensors
# 0.8.0 torch.py, _view2torch; safe_open's get_tensor halves the last dimension and is right,
# its get_slice does not and raises the same way). ckptfs(5), "Clients", records both; files
# holding F4 are not given to load_file, nor F4 tensors to get_slice.
LOAD_FILE_BROKEN = PT_MISSING | {"F4"}
NUMPY_DTYPES = {"BOOL", "U8", "I8", "U16", "I16", "F16", "U32", "I32", "F32", "F64", "U64",
                "I64", "C64"}


def sha(b):
    return hashlib.sha256(b).hexdigest()


def fixture_sources(fixtures):
    """(label, source, expected, same_names): expected is name -> {dtype, shape, sha256};
    same_names says the view's tensors are the tree's."""
    out = []
    for root, base in ((fixtures, "FIXTURES"), (os.path.join(COMMITTED, "dcp"), "dcp")):
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d != "hostile")
            if "manifest.json" not in filenames:
                continue
            rel = os.path.relpath(dirpath, root)
            manifest = json.load(open(os.path.join(dirpath, "manifest.json"), encoding="utf-8"))
            if "skip" in manifest:
                continue
            src = manifest.get("source", manifest.get("sources"))
            if isinstance(src, list):
                src = src[0]
            if src is None:
                continue
            entries = manifest.get("tensors")
            if entries is None:  # MLFramework: the tensors of the mount without options
                entries = next(m["tensors"] for m in manifest["mounts"] if not m.get("options"))
            # What 320-hfview.t holds the view to: the complete model tensors of safetensors
            # dtypes (no optimizer state, nothing set aside).
            want = {t["name"]: t for t in entries
                    if t.get("dtype") in ST_DTYPES and not t.get("incomplete") and
                    not t.get("aside") and not str(t.get("path", "")).startswith("optim/")}
            label = rel if base == "FIXTURES" else "dcp/" + rel
            out.append((label, os.path.normpath(os.path.join(dirpath, src)), want, True))
    meta = json.load(open(os.path.join(COMMITTED, "meta_mp", "manifest.json")))
    for case, c in sorted(meta["cases"].items()):
        # The view is the converted checkpoint: other names, q/k permuted, so the tree's raw
        # files (Meta's tensors) are not the view's.
        out.append(("meta_mp/" + case, os.path.join(COMMITTED, "meta_mp", case), c["hf"],
                    False))
    ds = json.load(open(os.path.join(COMMITTED, "deepspeed", "manifest.json")))
    for case, c in sorted(ds["cases"].items()):
        # The view is zero_to_fp32's F32 master weights; the tree shows the module's weights.
        out.append(("deepspeed/" + case, os.path.join(COMMITTED, "deepspeed", case),
                    c["fp32"], False))
    return out


def pt_shape(w):
    """The shape safetensors.torch gives a tensor: F4 comes as float4_e2m1fn_x2, two values
    in each element, so its last dimension is halved."""
    shape = list(w["shape"])
    if w["dtype"] == "F4" and shape:
        shape[-1] //= 2
    return shape


def torch_bytes(t):
    import torch
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def view_files(d):
    """The view's safetensors files, and the index's weight_map (None for one file)."""
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx):
        wm = json.load(open(idx))["weight_map"]
        return sorted(set(wm.values())), wm
    return ["model.safetensors"], None


def check_view(tap, label, d, want):
    import numpy as np
    import safetensors.numpy
    import safetensors.torch
    from safetensors import safe_open
    files, wm = view_files(d)
    seen, problems = {}, []
    counts = {"numpy": 0, "pt": 0, "load_file": 0, "numpy.load_file": 0}
    for fn in files:
        path = os.path.join(d, fn)
        try:
            with safe_open(path, framework="numpy") as f:
                if f.metadata() != {"format": "pt"}:
                    problems.append("%s: metadata %r" % (fn, f.metadata()))
                keys = list(f.keys())
                for k in keys:
                    if wm is not None and wm.get(k) != fn:
                        problems.append("%s: index names %r for %s" % (fn, wm.get(k), k))
                    if k in seen:
                        problems.append("%s in %s and %s" % (k, seen[k], fn))
                    seen[k] = fn
                    w = want.get(k)
                    if w is None or w["dtype"] not in NUMPY_DTYPES:
                        continue
                    a = f.get_tensor(k)
                    if list(a.shape) != list(w["shape"]) or sha(a.tobytes()) != w["sha256"]:
                        problems.append("numpy %s: shape %s or sha256 differs" % (k, a.shape))
                    elif a.ndim and a.shape[0] > 1:
                        if not np.array_equal(f.get_slice(k)[0:1], a[0:1]):
                            problems.append("numpy get_slice(%s)[0:1] differs" % k)
                    counts["numpy"] += 1
            with safe_open(path, framework="pt") as f:
                for k in f.keys():
                    w = want.get(k)
                    if w is None or w["dtype"] in PT_MISSING:
                        continue
                    t = f.get_tensor(k)
                    if list(t.shape) != pt_shape(w) or sha(torch_bytes(t)) != w["sha256"]:
                        problems.append("pt %s: %s %s or sha256 differs" % (k, t.dtype,
                                                                            tuple(t.shape)))
                    elif t.ndim and t.shape[0] > 1 and w["dtype"] != "F4" and \
                            torch_bytes(f.get_slice(k)[0:1]) != torch_bytes(t[0:1]):
                        problems.append("pt get_slice(%s)[0:1] differs" % k)
                    counts["pt"] += 1
            if not any(want.get(k, {}).get("dtype") in LOAD_FILE_BROKEN for k in keys):
                for k, t in safetensors.torch.load_file(path).items():
                    if k in want and sha(torch_bytes(t)) != want[k]["sha256"]:
                        problems.append("load_file %s: sha256 differs" % k)
                    counts["load_file"] += 1
            if all(want.get(k, {}).get("dtype", "F32") in NUMPY_DTYPES for k in keys):
                for k, a in safetensors.numpy.load_file(path).items():
                    if k in want and sha(a.tobytes()) != want[k]["sha256"]:
                        problems.append("numpy.load_file %s: sha256 differs" % k)
                    counts["numpy.load_file"] += 1
        except Exception as e:
            problems.append("%s: %s: %s" % (fn, type(e).__name__, str(e)[:300]))
    problems += ["missing: %s" % k for k in sorted(set(want) - set(seen))]
    problems += ["extra: %s" % k for k in sorted(set(seen) - set(want))]
    tap.ok(not problems, "%s: safe_open numpy (%d) and pt (%d), load_file (%d), numpy "
           "load_file (%d) in %d file%s: the manifest's %d tensors" % (
               label, counts["numpy"], counts["pt"], counts["load_file"],
               counts["numpy.load_file"], len(files), "s" if len(files) > 1 else "",
               len(want)), problems[:10])
    return seen


def check_tree_raw(tap, label, mnt, view_dir, in_view, want):
    """The tree's raw tensor files against safe_open(pt) of the view, dtype and shape from the
    sidecar."""
    from safetensors import safe_open
    problems, n = [], 0
    handles = {}
    for dirpath, dirnames, filenames in os.walk(mnt):
        if dirpath == mnt:
            dirnames[:] = [x for x in dirnames if x != ".ckptfs"]
        for fn in filenames:
            if not fn.endswith(".json"):
                continue
            sc = json.load(open(os.path.join(dirpath, fn), encoding="utf-8"))
            name = sc.get("name")
            if name not in in_view:
                continue
            base = os.path.join(dirpath, fn[:-5])
            raw_path = base if os.path.isfile(base) else base + ".raw"
            f = handles.get(in_view[name])
            if f is None:
                f = handles[in_view[name]] = safe_open(
                    os.path.join(view_dir, in_view[name]), framework="pt")
            got = open(raw_path, "rb").read()
            n += 1
            if sc.get("dtype") in PT_MISSING:
                if sha(got) != want.get(name, {}).get("sha256"):
                    problems.append("%s: raw bytes differ from the manifest's" % name)
                continue
            t = f.get_tensor(name)
            if got != torch_bytes(t) or list(t.shape) != pt_shape(sc):
                problems.append("%s: raw %d bytes, sidecar %s %s; view %s %s" % (
                    name, len(got), sc.get("dtype"), sc.get("shape"), t.dtype, tuple(t.shape)))
    tap.ok(not problems and n == len(in_view), "%s: the tree's %d raw tensor files equal "
           "safe_open's tensors, with the sidecars' shapes" % (label, n),
           problems[:10] + ([] if n == len(in_view) else
                            ["%d view tensors, %d raw files found" % (len(in_view), n)]))


def main():
    tap, ckptfs = ce.reexec_in_clients(["numpy", "torch", "safetensors"])
    fixtures = os.path.abspath(os.environ["FIXTURES"])
    sources = fixture_sources(fixtures)
    tap.ok(len(sources) >= 90, "%d fixture sources with manifests" % len(sources))
    try:
        check_all(tap, ckptfs, sources)
    except Exception as e:
        import traceback
        tap.ok(False, "the checks ran to the end: %s: %s" % (type(e).__name__, e),
               traceback.format_exc().splitlines()[-12:])
    finally:
        for mnt in list(ce.Deadline.mounts):
            ce.release(tap, mnt, mnt)
    tap.done()
    return 1 if tap.failed else 0


def check_all(tap, ckptfs, sources):
    for label, src, want, same_names in sources:
        with ce.Deadline(tap, label, CASE_SECONDS):
            mnt = ce.mount(tap, ckptfs, src, label)
            if mnt is not None:
                in_view = check_view(tap, label + " .ckptfs/hf", os.path.join(mnt, ".ckptfs",
                                                                             "hf"), want)
                if same_names:
                    check_tree_raw(tap, label, mnt, os.path.join(mnt, ".ckptfs", "hf"),
                                   in_view, want)
                ce.release(tap, mnt, label)
            # Shards only where there is more than one shard's worth.
            if sum(w.get("nbytes", 0) for w in want.values()) <= 16 * 1024:
                continue
            mnt = ce.mount(tap, ckptfs, src, label, ["-o", "view=hf,max_shard_size=16KB"])
            if mnt is not None:
                check_view(tap, label + " view=hf,max_shard_size=16KB", mnt, want)
                ce.release(tap, mnt, label)


if __name__ == "__main__":
    sys.exit(main())
