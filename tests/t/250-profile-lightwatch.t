#!/usr/bin/python3
"""ckptfs convert --profile lightwatch-gpt2: an HF GPT-2 checkpoint becomes a LightwatchAI2 .lwt
with transformer.* names, Conv1D weights transposed to [out, in], no tied lm_head and no
attention-mask buffers, model_type "gpt2" and the config numbers; checked with the independent
strict .lwt reader (tests/lib/readers/lwt_reader.py) against numpy."""
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

here = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, os.path.join(here, "..", "lib"))
sys.path.insert(0, os.path.join(here, "..", "lib", "readers"))
from ckptfs_test import Tap  # noqa: E402
import lwt_reader  # noqa: E402

CKPTFS = os.environ.get("CKPTFS")
C, V, T, L = 64, 100, 32, 2
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def gpt2(prefix):
    rng = np.random.default_rng(7)
    r = lambda *s: rng.standard_normal(s, dtype=np.float32)  # noqa: E731
    t = {prefix + "wte.weight": r(V, C), prefix + "wpe.weight": r(T, C)}
    for i in range(L):
        p = "%sh.%d." % (prefix, i)
        for ln in ("ln_1", "ln_2"):
            t[p + ln + ".weight"], t[p + ln + ".bias"] = r(C), r(C)
        t[p + "attn.c_attn.weight"], t[p + "attn.c_attn.bias"] = r(C, 3 * C), r(3 * C)
        t[p + "attn.c_proj.weight"], t[p + "attn.c_proj.bias"] = r(C, C), r(C)
        t[p + "mlp.c_fc.weight"], t[p + "mlp.c_fc.bias"] = r(C, 4 * C), r(4 * C)
        t[p + "mlp.c_proj.weight"], t[p + "mlp.c_proj.bias"] = r(4 * C, C), r(C)
        t[p + "attn.bias"] = np.tril(np.ones((1, 1, T, T), np.float32))
        t[p + "attn.masked_bias"] = np.array(-1e4, np.float32)
    t[prefix + "ln_f.weight"], t[prefix + "ln_f.bias"] = r(C), r(C)
    t["lm_head.weight"] = t[prefix + "wte.weight"]
    return t


def write_hf(d, tensors):
    os.makedirs(d)
    header, blobs, off = {}, [], 0
    for k, v in tensors.items():
        b = v.tobytes()
        header[k] = {"dtype": "F32", "shape": list(v.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(os.path.join(d, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"model_type": "gpt2", "n_layer": L, "n_head": 2, "n_embd": C, "vocab_size": V,
                   "n_positions": T}, f)


def main():
    tap = Tap()
    if not CKPTFS or not os.access(CKPTFS, os.X_OK):
        print("1..0 # SKIP CKPTFS is not set")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        for prefix in ("transformer.", ""):
            label = "names with %r" % prefix
            src, out = os.path.join(tmp, "hf" + prefix), os.path.join(tmp, "gpt2%s.lwt" % prefix)
            tensors = gpt2(prefix)
            write_hf(src, tensors)
            r = subprocess.run([CKPTFS, "convert", src, out, "--profile", "lightwatch-gpt2"],
                               capture_output=True, text=True, timeout=60)
            if not tap.ok(r.returncode == 0, "%s: convert --profile lightwatch-gpt2" % label,
                          [r.stderr]):
                continue
            f = lwt_reader.read(out)
            got = {t.name: t for t in f.tensors}
            want = {}
            for k, v in tensors.items():
                rest = k[len(prefix):] if k.startswith(prefix) else k
                if k.startswith("lm_head.") or rest.endswith(("attn.bias", "attn.masked_bias")):
                    continue
                want["transformer." + rest] = np.ascontiguousarray(v.T) if rest.endswith(CONV1D) else v
            tap.ok(set(got) == set(want), "%s: exactly the GPT-2 parameters, transformer.* names, "
                   "no lm_head or mask buffers" % label,
                   ["extra %s" % sorted(set(got) - set(want)), "missing %s" % sorted(set(want) - set(got))])
            bad = [n for n in set(got) & set(want)
                   if list(got[n].shape) != list(want[n].shape) or
                   f.tensor_bytes(got[n]) != want[n].tobytes()]
            tap.ok(not bad, "%s: every tensor's shape and bytes (Conv1D weights as [out, in])" % label,
                   sorted(bad)[:5])
            cfg = f.header.get("config", {})
            tap.ok(f.header.get("model_type") == "gpt2" and cfg == {
                "n_layer": L, "n_head": 2, "n_embd": C, "vocab_size": V, "block_size": T},
                "%s: header model_type and config" % label, [json.dumps(f.header)])
        # No config.json: a clear refusal, nothing written.
        bare = os.path.join(tmp, "bare")
        os.makedirs(bare)
        os.link(os.path.join(tmp, "hftransformer.", "model.safetensors"),
                os.path.join(bare, "model.safetensors"))
        out = os.path.join(tmp, "bare.lwt")
        r = subprocess.run([CKPTFS, "convert", bare, out, "--profile", "lightwatch-gpt2"],
                           capture_output=True, text=True, timeout=60)
        tap.ok(r.returncode == 2 and "config.json" in r.stderr and not os.path.exists(out),
               "no config.json: refused, says so, no output", [r.stderr])
        r = subprocess.run([CKPTFS, "convert", bare, out, "--profile", "nope"],
                           capture_output=True, text=True, timeout=60)
        tap.ok(r.returncode == 1, "unknown profile: usage error", [r.stderr])
    tap.done()
    return 1 if tap.failed else 0


if __name__ == "__main__":
    sys.exit(main())
