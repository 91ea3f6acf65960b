#!/usr/bin/python3
"""The GGUF view against convert, and quantization against gguf-py's numpy quantizers.

usage: gguf_view_bench.py CKPTFS OUTDIR [--runs N] [--mib M] [--quant-mib Q]
(`make bench` calls it with the clients venv's python, which has gguf-py 0.19 and numpy.)

Data (written once under OUTDIR/gguf-view-data/; delete it to rebuild):
  a Llama-shaped HF folder of about M MiB of F32 weights (default 1024: hidden 1024, 16 heads,
  vocabulary 32000, as many layers as fit), with llama_ref.py's tokenizer.json padded to the
  vocabulary; and one safetensors tensor of Q MiB of normal F32 values (default 256).
Then RUNS times (default 3), in the same round:
  view        mount -o view=gguf, then llama.cpp (node-llama-cpp, tests/lib/llama_logprobs.mjs,
              mmap) loads NAME.gguf from the fresh mount and evaluates 2 tokens; unmount
  convert     ckptfs convert DIR x.gguf, then the same llama.cpp run on x.gguf
  q8_0, q4_0  ckptfs convert --dtype T of the tensor into a .gguf, against gguf-py's
              gguf.quants.quantize(x, T) on the same array (its own process: reading the file
              and writing the bytes out are timed on both sides)
Every ckptfs output is checked (untimed): the view must be convert's file byte for byte, and
the quantized bytes gguf-py's, or the bench fails. Sources are in the page cache (a first load
of the view is the mount's first: its own page cache is empty). Medians, the ratios
(convert + load) / view and numpy / ckptfs, and MB/s of F32 input per core (both sides use one
thread) go to OUTDIR/bench-gguf-view.json and a table to stdout.
"""
import argparse
import datetime
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
from ckptfs_test import is_mounted, run_capture, unmount  # noqa: E402
import llama_ref as L  # noqa: E402

DATA_VERSION = 1

NUMPY_QUANT = r"""
import json, struct, sys
import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import quantize
src, out, t = sys.argv[1:4]
with open(src, "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    head = json.loads(f.read(n))
    x = np.fromfile(f, dtype="<f4")
shape = next(v["shape"] for k, v in head.items() if k != "__metadata__")
q = quantize(x.reshape(shape), {"q8_0": T.Q8_0, "q4_0": T.Q4_0}[t])
with open(out, "wb") as f:
    q.tofile(f)
"""


def config_for(mib):
    H, F, V = 1024, 2816, 32000
    per_layer = (4 * H * H + 3 * H * F + 2 * H) * 4
    fixed = (2 * V * H + H) * 4
    layers = max(1, ((mib << 20) - fixed) // per_layer)
    return dict(L.CONFIG, hidden_size=H, intermediate_size=F, num_hidden_layers=int(layers),
                num_attention_heads=16, num_key_value_heads=16, vocab_size=V,
                max_position_embeddings=256)


def write_st(path, tensors):
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for name, a in tensors:
        header[name] = {"dtype": "F32", "shape": list(a.shape),
                        "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for _, a in tensors:
            a.astype("<f4").tofile(f)


def make_data(d, mib, qmib):
    stamp = os.path.join(d, "version")
    want = "%d %d %d" % (DATA_VERSION, mib, qmib)
    if os.path.exists(stamp) and open(stamp).read() == want:
        return
    shutil.rmtree(d, ignore_errors=True)
    hf = os.path.join(d, "llama")
    os.makedirs(hf)
    cfg = config_for(mib)
    rng = np.random.default_rng(3)
    H, F, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]

    def mat(*shape):
        return (rng.standard_normal(shape, dtype=np.float32) / np.sqrt(shape[-1])).astype("<f4")

    tensors = [("model.embed_tokens.weight", mat(V, H)), ("model.norm.weight", np.ones(H, "<f4")),
               ("lm_head.weight", mat(V, H))]
    for i in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % i
        tensors += [(p + "input_layernorm.weight", np.ones(H, "<f4")),
                    (p + "post_attention_layernorm.weight", np.ones(H, "<f4"))]
        tensors += [(p + "self_attn.%s_proj.weight" % n, mat(H, H)) for n in "qkvo"]
        tensors += [(p + "mlp.gate_proj.weight", mat(F, H)), (p + "mlp.up_proj.weight", mat(F, H)),
                    (p + "mlp.down_proj.weight", mat(H, F))]
    write_st(os.path.join(hf, "model.safetensors"), tensors)
    with open(os.path.join(hf, "config.json"), "w") as f:
        json.dump(cfg, f)
    with open(os.path.join(hf, "tokenizer.json"), "w") as f:
        json.dump(L.tokenizer_json(), f)
    q = os.path.join(d, "quant")
    os.makedirs(q)
    x = rng.standard_normal(qmib << 18, dtype=np.float32).reshape(-1, 4096)
    write_st(os.path.join(q, "model.safetensors"), [("weight", x)])
    with open(stamp, "w") as f:
        f.write(want)


def timed(argv, env=None):
    t = time.monotonic()
    r = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    took = time.monotonic() - t
    if r.returncode != 0:
        sys.exit("gguf view bench: %s failed: %s" % (" ".join(argv[:3]),
                                                     r.stderr.decode(errors="replace")[-400:]))
    return took


def llama_run(mods, gguf):
    return timed(["node", os.path.join(HERE, "..", "lib", "llama_logprobs.mjs"), mods, gguf,
                  "1,50", "mmap"])


def same_file(a, b):
    with open(a, "rb") as f, open(b, "rb") as g:
        while True:
            x, y = f.read(1 << 22), g.read(1 << 22)
            if x != y:
                return False
            if not x:
                return True


def gguf_tensor_bytes(path):
    """The one tensor's bytes of a GGUF (gguf-py's reader)."""
    from gguf import GGUFReader
    return GGUFReader(path).tensors[0].data.tobytes()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ckptfs")
    ap.add_argument("outdir")
    ap.add_argument("--runs", type=int, default=int(os.environ.get("RUNS", "3")))
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--quant-mib", type=int, default=256)
    a = ap.parse_args()
    out = os.path.abspath(a.outdir)
    d = os.path.join(out, "gguf-view-data")
    make_data(d, a.mib, a.quant_mib)
    hf, quant = os.path.join(d, "llama"), os.path.join(d, "quant")
    mods = os.path.join(os.path.dirname(os.path.realpath(a.ckptfs)), "node-llama",
                        "node_modules")
    have_llama = os.path.exists(os.path.join(mods, "node-llama-cpp", "dist", "index.js"))
    model_mib = os.path.getsize(os.path.join(hf, "model.safetensors")) / (1 << 20)
    qbytes = os.path.getsize(os.path.join(quant, "model.safetensors"))
    times = {k: [] for k in ("view", "convert", "convert_only", "q8_0", "np_q8_0", "q4_0",
                             "np_q4_0")}
    work = tempfile.mkdtemp(prefix="gguf-view-bench-", dir=out)
    try:
        for _ in range(a.runs):
            conv = os.path.join(work, "x.gguf")
            if os.path.exists(conv):
                os.unlink(conv)
            c = timed([a.ckptfs, "convert", hf, conv])
            times["convert_only"].append(c)
            if have_llama:
                times["convert"].append(c + llama_run(mods, conv))
                mnt = os.path.join(work, "mnt")
                os.mkdir(mnt)
                t = time.monotonic()
                rc, _, err = run_capture([a.ckptfs, hf, mnt, "-o", "view=gguf"], 120)
                if rc != 0 or not is_mounted(mnt):
                    sys.exit("gguf view bench: mount failed: %s" % err)
                view = os.path.join(mnt, "llama.gguf")
                t_mount = time.monotonic() - t
                times["view"].append(t_mount + llama_run(mods, view))
                ok = same_file(view, conv)
                unmount(mnt)
                if not ok:
                    sys.exit("gguf view bench: the view is not convert's file")
            for t in ("q8_0", "q4_0"):
                g = os.path.join(work, "q.gguf")
                times[t].append(timed([a.ckptfs, "convert", quant, g, "--dtype", t, "-f"]))
                ref = os.path.join(work, "ref.bin")
                times["np_" + t].append(timed([sys.executable, "-c", NUMPY_QUANT,
                                               os.path.join(quant, "model.safetensors"), ref, t]))
                with open(ref, "rb") as f:
                    if f.read() != gguf_tensor_bytes(g):
                        sys.exit("gguf view bench: %s bytes differ from gguf-py's" % t)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = {k: statistics.median(v) if v else None for k, v in times.items()}
    mb = qbytes / 1e6
    res = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "runs": a.runs,
           "model_mib": round(model_mib), "quant_input_mb": round(mb), "median_s": med}
    if med["view"]:
        res["first_load_ratio_convert_plus_load_over_view"] = med["convert"] / med["view"]
    for t in ("q8_0", "q4_0"):
        res["%s_mb_per_s_per_core" % t] = {"ckptfs": mb / med[t], "gguf_py": mb / med["np_" + t]}
        res["%s_ratio_numpy_over_ckptfs" % t] = med["np_" + t] / med[t]
    with open(os.path.join(out, "bench-gguf-view.json"), "w") as f:
        json.dump(res, f, indent=1)
    print("gguf view bench (%d runs, %d MiB model, %d MB quantized)" % (a.runs, model_mib, mb))
    if med["view"]:
        print("  llama.cpp first load: view %.2fs   convert %.2fs + load = %.2fs   ratio %.2f"
              % (med["view"], med["convert_only"], med["convert"],
                 res["first_load_ratio_convert_plus_load_over_view"]))
    else:
        print("  llama.cpp first load: skipped (node-llama-cpp not in build/node-llama)")
    for t in ("q8_0", "q4_0"):
        r = res["%s_mb_per_s_per_core" % t]
        print("  %s: ckptfs %.0f MB/s, gguf-py numpy %.0f MB/s per core (ratio %.1f)"
              % (t, r["ckptfs"], r["gguf_py"], res["%s_ratio_numpy_over_ckptfs" % t]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
