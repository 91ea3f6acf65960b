#!/usr/bin/python3
"""A tensor named "__metadata__" (a torch state dict may have one: torch.save takes any string
key) is a name no safetensors header can hold, since the header keeps that key for its own
metadata. Found by fuzzing the DeepSpeed decoder: the Hugging Face view then served a header
with the key twice, and `convert` wrote such a file with exit status 0.

- `convert` to .safetensors and to an HF directory refuses, naming the tensor and the way out,
  and writes nothing; with --exclude __metadata__ it converts the rest; a .gguf carries it.
- A stage into a .safetensors OUT with a staged file named __metadata__: the commit refuses
  it by name (exit 2) and OUT is not written; the stage keeps the file.
- The mount shows the tensor in the tree (its bytes as torch stored them), leaves it out of
  .ckptfs/hf/model.safetensors, whose header is valid JSON with one "__metadata__" (parsed
  with duplicate keys detected), and summary.json warns about it.
- A GGUF file whose tensors include dtypes safetensors lacks (ggml block types): the HF view
  holds exactly the others, and summary.json says how many it leaves out, by dtype, as the
  fixture's manifest (written by tests/gen, not by ckptfs) counts them.

The .pt file is written by real torch (/usr/bin/python3); expected bytes come from numpy.
Environment: CKPTFS, FIXTURES.
"""

import json
import os
import struct
import subprocess
import sys

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
sys.path.insert(0, os.path.join(HERE, "..", "lib", "readers"))
import gguf_reader  # noqa: E402
from ckptfs_test import run_capture, run_cases, unmount, is_mounted  # noqa: E402
from staging import StageSession, put  # noqa: E402

CKPTFS = os.environ.get("CKPTFS")
TORCH_PY = "/usr/bin/python3"
MAKE_PT = r"""
import sys, torch
torch.save({"__metadata__": torch.arange(6, dtype=torch.float32),
            "w": torch.full((2, 3), 0.5, dtype=torch.float32)}, sys.argv[1])
"""


def no_duplicates(pairs):
    keys = [k for k, _ in pairs]
    if len(keys) != len(set(keys)):
        raise ValueError("duplicate keys: %r" % keys)
    return dict(pairs)


def reserved_names(tap, work):
    pt = os.path.join(work, "meta.pt")
    r = subprocess.run([TORCH_PY, "-c", MAKE_PT, pt], capture_output=True, timeout=120)
    if r.returncode != 0:
        tap.skip("a tensor named __metadata__", "torch is not importable from %s: %s"
                 % (TORCH_PY, r.stderr.decode(errors="replace").strip()[-200:]))
        return
    meta = struct.pack("<6f", *range(6))
    w = struct.pack("<6f", *([0.5] * 6))

    for out in ("meta.safetensors", "metadir/"):
        path = os.path.join(work, out)
        rc, _, err = run_capture([CKPTFS, "convert", pt, path], 120)
        text = err.decode(errors="replace")
        tap.ok(rc == 2 and 'tensor "__metadata__"' in text and "--exclude" in text and
               not os.path.exists(path.rstrip("/")),
               "convert to %s: refused naming the tensor and the way out, nothing written" % out,
               ["exit %r: %s" % (rc, text.strip())])
    path = os.path.join(work, "rest.safetensors")
    rc, _, err = run_capture([CKPTFS, "convert", pt, path, "--exclude", "__metadata__"], 120)
    try:
        with open(path, "rb") as f:
            data = f.read()
        (n,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8:8 + n], object_pairs_hook=no_duplicates)
        good = (sorted(header) == ["__metadata__", "w"] and "dtype" not in header["__metadata__"]
                and data[8 + n + header["w"]["data_offsets"][0]:][:24] == w)
    except (OSError, ValueError, KeyError, struct.error) as e:
        good, err = False, str(e).encode()
    tap.ok(rc == 0 and good, "convert --exclude __metadata__: the other tensor, a valid header",
           ["exit %r: %s" % (rc, err.decode(errors="replace").strip())])
    path = os.path.join(work, "meta.gguf")
    rc, _, err = run_capture([CKPTFS, "convert", "--profile", "container", pt, path], 120)
    try:
        g = gguf_reader.read(path)
        got = {t.name: gguf_reader.tensor_bytes(g, t) for t in g.tensors}
    except (OSError, ValueError) as e:
        got = {"error": str(e)}
    tap.ok(rc == 0 and got == {"__metadata__": meta, "w": w},
           "convert to .gguf carries the tensor named __metadata__",
           ["exit %r: %s" % (rc, err.decode(errors="replace").strip()), sorted(got)])

    mnt = os.path.join(work, "mnt")
    os.mkdir(mnt)
    rc, _, err = run_capture([CKPTFS, pt, mnt], 60)
    if not tap.ok(rc == 0 and is_mounted(mnt), "mount of the .pt", [err]):
        return
    try:
        with open(os.path.join(mnt, "__metadata__"), "rb") as f:
            tap.ok(f.read() == meta, "the tree shows the tensor named __metadata__, its bytes")
        with open(os.path.join(mnt, ".ckptfs", "hf", "model.safetensors"), "rb") as f:
            data = f.read()
        try:
            (n,) = struct.unpack("<Q", data[:8])
            header = json.loads(data[8:8 + n], object_pairs_hook=no_duplicates)
            good = sorted(header) == ["__metadata__", "w"] and header["__metadata__"] == {
                "format": "pt"}
            why = sorted(header)
        except (ValueError, struct.error) as e:
            good, why = False, str(e)
        tap.ok(good, "the HF view leaves it out: one __metadata__ key, the metadata", [why])
        with open(os.path.join(mnt, ".ckptfs", "summary.json")) as f:
            warnings = json.load(f)["warnings"]
        tap.ok(any("__metadata__" in w and "Hugging Face view" in w for w in warnings),
               "summary.json warns that the HF view leaves it out", warnings)
    finally:
        unmount(mnt)


def staged_name(tap, work):
    out = os.path.join(work, "staged.safetensors")
    s = StageSession(CKPTFS, out, prefix="ckptfs-t83.")
    if not tap.ok(s.ok, "stage into a .safetensors OUT", [s.err]):
        return
    try:
        put(s.mnt, "__metadata__", struct.pack("<4f", 1, 2, 3, 4))
        put(s.mnt, "a", struct.pack("<4f", 5, 6, 7, 8))
        rc, text = s.commit()
        tap.ok(rc == 2 and 'tensor "__metadata__"' in text and not os.path.exists(out) and
               os.path.exists(s.path("__metadata__")),
               "a staged tensor named __metadata__: the commit refuses it by name, no OUT",
               ["exit %r: %s" % (rc, text.strip())])
    finally:
        s.close()


SAFETENSORS_DTYPES = {"BOOL", "U8", "I8", "I16", "U16", "F16", "BF16", "I32", "U32", "F32",
                      "F64", "I64", "U64", "F8_E4M3", "F8_E5M2"}


def dtypes_view_lacks(tap, work):
    fixture = os.path.join(os.environ.get("FIXTURES", ""), "gguf", "v3")
    with open(os.path.join(fixture, "manifest.json")) as f:
        tensors = json.load(f)["tensors"]
    lacking = {}
    for t in tensors:
        if t["dtype"] not in SAFETENSORS_DTYPES:
            lacking[t["dtype"]] = lacking.get(t["dtype"], 0) + 1
    kept = sorted(t["name"] for t in tensors if t["dtype"] in SAFETENSORS_DTYPES)
    mnt = os.path.join(work, "mnt-gguf")
    os.mkdir(mnt)
    rc, _, err = run_capture([CKPTFS, os.path.join(fixture, "model.gguf"), mnt], 60)
    if not tap.ok(rc == 0 and is_mounted(mnt) and len(lacking) >= 3,
                  "mount of a GGUF file with %d dtypes safetensors lacks" % len(lacking), [err]):
        return
    try:
        with open(os.path.join(mnt, ".ckptfs", "hf", "model.safetensors"), "rb") as f:
            data = f.read()
        (n,) = struct.unpack("<Q", data[:8])
        names = sorted(k for k in json.loads(data[8:8 + n]) if k != "__metadata__")
        tap.ok(names == kept, "the HF view holds the %d tensors of safetensors dtypes" % len(kept),
               [names, kept])
        with open(os.path.join(mnt, ".ckptfs", "summary.json")) as f:
            warnings = json.load(f)["warnings"]
        said = [w for w in warnings if "Hugging Face view leaves" in w and "dtypes" in w]
        want = ["%s %d" % kv for kv in lacking.items()]
        tap.ok(len(said) == 1 and said[0].startswith("%d tensors " % sum(lacking.values())) and
               all(w in said[0] for w in want),
               "summary.json: how many tensors the HF view leaves out, by dtype", [warnings, want])
    finally:
        unmount(mnt)


def main():
    return run_cases("ckptfs-t83.", reserved_names, staged_name, dtypes_view_lacks)


if __name__ == "__main__":
    sys.exit(main())
