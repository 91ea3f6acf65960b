#!/usr/bin/python3
"""Quantized GGUF output: convert --dtype q8_0|q4_0 and -o view=gguf,gguf_type=... (issue 30
item 2; core/write/quant_ref.c, core/write/cast.c).

- Bit-exact against gguf-py 0.19's reference quantizers (gguf.quants.quantize, in
  $CLIENTS_PY): tensors stored as F32, F16 and BF16, with blocks that hold ties at .5, zeros
  only, one value, huge and tiny magnitudes, equal magnitudes of both signs, and subnormal
  scales; a matrix whose rows are not whole blocks becomes F16 and vectors stay as stored
  (convert_hf_to_gguf.py's choice), through a tensor container GGUF.
- The view of each type is convert's file byte for byte.
- llama.cpp (node-llama-cpp) maps the quantized views of the tiny Llama from the mount: its
  log-probabilities are within 0.15 of the numpy forward of gguf-py's dequantized weights (for
  Q4_0 within a quarter of that forward's distance from the float one: llama.cpp reads the
  blocks as gguf-py does; it also quantizes activations, hence not 1e-2), within the stated tolerance of the
  float reference (Q8_0 0.25, Q4_0 1.5), and greedy tokens equal the float model's for Q8_0.
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
from ckptfs_test import Tap, run_capture, skip_reason, unmount, is_mounted  # noqa: E402
import llama_layouts as Y  # noqa: E402
import llama_ref as L  # noqa: E402

CKPTFS = os.environ.get("CKPTFS")
FIXTURES = os.environ.get("FIXTURES")
CLIENTS_PY = os.environ.get("CLIENTS_PY")
TOKENS = [1, 50, 60, 70, 80, 262, 3, 299, 100]
# Largest |log-prob difference| over the prompt's positions and the 300 tokens allowed between
# llama.cpp on the quantized file and the float64 forward of the float weights. llama.cpp also
# quantizes the activations of each matmul (to Q8_0/Q8_1), so it is not held to the forward of
# the dequantized weights within float error but closer to it than the float model is.
TOL = {"q8_0": 0.25, "q4_0": 1.5}
DEQ_TOL = 0.15

# Compares a GGUF's tensors with gguf.quants.quantize of the stored values (argv: the GGUF, the
# .npz of the source values as float32, the type); prints one JSON report.
CHECK = r'''
import json, sys, numpy as np
from gguf import GGUFReader, GGMLQuantizationType as T
from gguf.quants import quantize, dequantize
qt = {"q8_0": T.Q8_0, "q4_0": T.Q4_0}[sys.argv[3]]
src = dict(np.load(sys.argv[2]))
r = GGUFReader(sys.argv[1])
out = {"types": {}, "bad": [], "deq": {}}
for t in r.tensors:
    a = src[t.name]
    out["types"][t.name] = t.tensor_type.name
    if t.tensor_type == qt:
        ok = quantize(a, qt).tobytes() == t.data.tobytes()
        out["deq"][t.name] = dequantize(t.data, qt).reshape(a.shape).tolist()
    elif t.tensor_type == T.F16:
        ok = a.astype(np.float16).tobytes() == t.data.tobytes()
    else:
        ok = a.astype(np.float32).tobytes() == t.data.tobytes()
    if not ok:
        out["bad"].append(t.name)
print(json.dumps(out))
'''


def bf16_bytes(a):
    """float32 values that are BF16 already, as BF16 bytes."""
    return (a.astype("<f4").view("<u4") >> 16).astype("<u2").tobytes()


def write_st(path, tensors):
    """tensors: {name: (dtype, float32 array whose values that dtype holds)}."""
    header, blob = {}, b""
    for name in sorted(tensors):
        dt, a = tensors[name]
        raw = {"F32": lambda x: x.astype("<f4").tobytes(),
               "F16": lambda x: x.astype("<f2").tobytes(), "BF16": bf16_bytes}[dt](a)
        header[name] = {"dtype": dt, "shape": list(a.shape),
                        "data_offsets": [len(blob), len(blob) + len(raw)]}
        blob += raw
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + blob)


def hard_blocks(rng):
    """Rows of 32-value blocks that probe the rounding rules."""
    rows = []
    rows.append(np.zeros(64))                                   # all zeros: d = 0
    one = np.zeros(32); one[5] = 3.0; rows.append(np.concatenate([one, -one]))
    # x / d lands on .5: d = 127/127 = 1 for Q8_0, so halves are ties
    rows.append(np.concatenate([np.arange(-15.5, 16.5, 1.0)[:32] * 1, [127.0] + [0.5] * 31]))
    rows.append(np.concatenate([[8.0, -8.0] * 16, [-8.0, 8.0] * 16]))  # equal |max| both signs
    rows.append(rng.standard_normal(64) * 1e30)                 # huge
    rows.append(rng.standard_normal(64) * 1e-38)                # scales subnormal in F16
    rows.append(rng.standard_normal(64) * 1e-6)
    rows.append(np.round(rng.standard_normal(64) * 16) / 2)     # many exact halves
    return np.array(rows, dtype=np.float32)


def stress_source(d, rng):
    hard = hard_blocks(rng)
    normal = rng.standard_normal((48, 256)).astype(np.float32)
    f16 = rng.standard_normal((16, 128)).astype(np.float16).astype(np.float32)
    bf = (rng.standard_normal((8, 96)).astype(np.float32).view(np.uint32) & 0xFFFF0000).view(
        np.float32)
    odd = rng.standard_normal((4, 40)).astype(np.float32)       # rows not whole blocks
    vec = rng.standard_normal(96).astype(np.float32)
    tensors = {"hard": ("F32", hard), "normal": ("F32", normal), "from_f16": ("F16", f16),
               "from_bf16": ("BF16", bf), "odd_rows": ("F32", odd), "vector": ("F32", vec)}
    os.makedirs(d)
    write_st(os.path.join(d, "model.safetensors"), tensors)
    np.savez(os.path.join(d, "..", "values.npz"), **{k: v for k, (_, v) in tensors.items()})
    return os.path.join(d, "..", "values.npz")


def run_check(gguf, npz, qtype):
    p = subprocess.run([CLIENTS_PY, "-c", CHECK, gguf, npz, qtype], capture_output=True,
                       timeout=300)
    if p.returncode != 0:
        return None, p.stderr.decode(errors="replace")[-600:]
    return json.loads(p.stdout), None


def mounted_view(src, mnt, opts):
    os.mkdir(mnt)
    rc, _, err = run_capture([CKPTFS, src, mnt, "-o", opts], 60)
    names = [n for n in os.listdir(mnt) if n.endswith(".gguf")] if rc == 0 else []
    return (os.path.join(mnt, names[0]) if len(names) == 1 else None), err


def same_bytes(a, b):
    with open(a, "rb") as f, open(b, "rb") as g:
        return f.read() == g.read()


def node_llama():
    mods = os.path.join(os.path.dirname(os.path.realpath(CKPTFS)), "node-llama", "node_modules")
    ok = os.path.exists(os.path.join(mods, "node-llama-cpp", "dist", "index.js"))
    return mods if ok and shutil.which("node") else None


def logprobs(mods, gguf):
    p = subprocess.run(["node", os.path.join(HERE, "..", "lib", "llama_logprobs.mjs"), mods, gguf,
                        ",".join(map(str, TOKENS)), "mmap"], capture_output=True, timeout=300)
    if p.returncode != 0:
        raise RuntimeError(p.stderr.decode(errors="replace")[-800:])
    d = json.loads(p.stdout)
    probs = np.array([[x if x is not None else 0.0 for x in row] for row in d["probs"]])
    return np.log(np.maximum(probs, 1e-30))


def from_llama_cpp_names(deq, w, cfg=L.CONFIG):
    """HF weights with the quantized ones replaced by gguf-py's dequantized values (q/k rows
    back in HF's order)."""
    inv = {v: k for k, v in Y.GG.items()}
    out = dict(w)
    top = {"token_embd.weight": "model.embed_tokens.weight", "output.weight": "lm_head.weight",
           "output_norm.weight": "model.norm.weight"}
    for name, vals in deq.items():
        a = np.array(vals, dtype=np.float32)
        if name in top:
            out[top[name]] = a
            continue
        _, layer, rest = name.split(".", 2)
        hf = "model.layers.%s.%s" % (layer, inv[rest])
        if rest in ("attn_q.weight", "attn_k.weight"):
            heads = cfg["num_attention_heads" if rest == "attn_q.weight" else "num_key_value_heads"]
            r, c = a.shape  # undo interleaved(): rows (h, i, j) -> (h, j, i)
            a = a.reshape(heads, r // heads // 2, 2, c).swapaxes(1, 2).reshape(r, c)
        out[hf] = a
    return out


def main():
    why = skip_reason(CKPTFS, FIXTURES)
    if why:
        print("1..0 # SKIP %s" % why)
        return 0
    if not CLIENTS_PY or not os.path.exists(CLIENTS_PY):
        print("1..0 # SKIP no CLIENTS_PY (gguf-py is the reference)")
        return 0
    tap = Tap()
    work = tempfile.mkdtemp(prefix="ckptfs-gguf-quant-")
    rng = np.random.default_rng(30)
    mods = node_llama()
    try:
        stress = os.path.join(work, "stress", "model")
        npz = stress_source(stress, rng)
        hf = os.path.join(work, "tiny-llama")
        w = L.make_folder(hf)
        llama_npz = os.path.join(work, "llama.npz")
        np.savez(llama_npz, **Y.llama_cpp_tensors(w))
        ref = L.log_softmax(L.forward(w, TOKENS))
        for qtype in ("q8_0", "q4_0"):
            out = os.path.join(work, "stress-%s.gguf" % qtype)
            rc, _, err = run_capture([CKPTFS, "convert", stress, out, "--dtype", qtype], 120)
            rep, why = run_check(out, npz, qtype) if rc == 0 else (None, err)
            want_types = {"hard": qtype.upper(), "normal": qtype.upper(),
                          "from_f16": qtype.upper(), "from_bf16": qtype.upper(),
                          "odd_rows": "F16", "vector": "F32"}
            tap.ok(rep is not None and not rep["bad"] and rep["types"] == want_types,
                   "%s: every block bit-exact with gguf.quants.quantize (F32, F16, BF16 sources, "
                   "hard blocks); odd rows F16, vectors kept" % qtype,
                   [why, rep and rep["bad"], rep and rep["types"]])

            conv = os.path.join(work, "llama-%s.gguf" % qtype)
            rc, _, err = run_capture([CKPTFS, "convert", hf, conv, "--dtype", qtype], 120)
            rep, why = run_check(conv, llama_npz, qtype) if rc == 0 else (None, err)
            tap.ok(rep is not None and not rep["bad"] and
                   all(t == (qtype.upper() if np.ndim(Y.llama_cpp_tensors(w)[n]) == 2 else "F32")
                       for n, t in rep["types"].items()),
                   "%s: the tiny Llama, matrices quantized bit-exactly, norms F32" % qtype,
                   [why, rep and rep["bad"]])
            mnt = os.path.join(work, "mnt-" + qtype)
            view, err = mounted_view(hf, mnt, "view=gguf,gguf_type=%s" % qtype)
            try:
                tap.ok(view is not None and same_bytes(view, conv),
                       "%s: the view (gguf_type=%s) is convert's file byte for byte"
                       % (qtype, qtype), [err])
                if view is None or rep is None:
                    continue
                if mods is None:
                    tap.skip("%s: llama.cpp runs the quantized view" % qtype, "no node-llama-cpp")
                    continue
                try:
                    lp = logprobs(mods, view)
                except (RuntimeError, ValueError, subprocess.TimeoutExpired) as e:
                    tap.ok(False, "%s: llama.cpp maps the quantized view" % qtype, [str(e)])
                    continue
                deq = L.log_softmax(L.forward(from_llama_cpp_names(rep["deq"], w), TOKENS))
                d_deq, d_ref = np.abs(lp - deq).max(), np.abs(lp - ref).max()
                d_q = np.abs(deq - ref).max()  # what the quantization alone moves
                greedy = (lp.argmax(1) == ref.argmax(1)).all()
                # Q4_0's own error is large enough to tell the two apart on any CPU's kernels
                tap.ok(d_deq < DEQ_TOL and (d_deq < d_q / 4 or qtype != "q4_0") and
                       d_ref < TOL[qtype] and
                       (greedy or qtype != "q8_0"),
                       "%s: llama.cpp maps the view: %.2e from the dequantized forward (which is "
                       "%.2e from the float one), %.2e from the float one (tolerance %g), greedy "
                       "tokens %s" % (qtype, d_deq, d_q, d_ref, TOL[qtype],
                                      "equal" if greedy else "differ"))
            finally:
                unmount(mnt)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    tap.done()
    return 0 if tap.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
