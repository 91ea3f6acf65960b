#!/usr/bin/python3
"""convert of any layout to a llama.cpp GGUF, and tensor names in either spelling (issue 28
item 4).

- A NeMo Automodel step (model/ as DCP-HF shards of 2 ranks, q_proj split by rows and k_proj by
  columns, model/.hf_metadata/ with config.json and tokenizer.json) converts to .gguf: every
  tensor equals what the test computes from the full weights with numpy (llama.cpp's names,
  q/k rows permuted to its rope order), i.e. the same as converting the HF folder itself. The
  shards are written here (safetensors + DCP_SHARDING_INFO, from the DCP-HF notes), not by
  ckptfs.
- A torch pytorch_model.bin whose q_proj is saved as a transposed view (a strided piece)
  converts the same way.
- --include/--exclude take the name (model.norm.weight), the name as `ckptfs ls` prints it
  (model/model.norm.weight) and the tree path (model/model/norm/weight); so do `ckptfs ls GLOB`
  and `ckptfs stats GLOB`.
- Optimizer state is selectable: --include 'optim/*' writes the optim/ tensors of a ZeRO
  checkpoint into a .safetensors (by the names `ckptfs ls` prints); without it they stay out.
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
sys.path.insert(0, os.path.join(HERE, "..", "lib", "readers"))
from ckptfs_test import Tap, run_capture, skip_reason  # noqa: E402
import gguf_reader  # noqa: E402
import llama_ref as L  # noqa: E402

CKPTFS = os.environ.get("CKPTFS")
FIXTURES = os.environ.get("FIXTURES")
ZERO = os.path.join(HERE, "..", "fixtures", "deepspeed", "zero2_fp16_ws2")

GG = {"input_layernorm.weight": "attn_norm.weight",
      "post_attention_layernorm.weight": "ffn_norm.weight",
      "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
      "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
      "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
      "mlp.down_proj.weight": "ffn_down.weight"}


def permuted(w, heads):
    rows, cols = w.shape
    return w.reshape(heads, 2, rows // heads // 2, cols).swapaxes(1, 2).reshape(rows, cols)


def expected(w, cfg=L.CONFIG):
    """{llama.cpp name: array} from the HF weights, computed here."""
    out = {"token_embd.weight": w["model.embed_tokens.weight"],
           "output_norm.weight": w["model.norm.weight"], "output.weight": w["lm_head.weight"]}
    for name, a in w.items():
        if not name.startswith("model.layers."):
            continue
        layer, rest = name[len("model.layers."):].split(".", 1)
        if rest == "self_attn.q_proj.weight":
            a = permuted(a, cfg["num_attention_heads"])
        elif rest == "self_attn.k_proj.weight":
            a = permuted(a, cfg["num_key_value_heads"])
        out["blk.%s.%s" % (layer, GG[rest])] = a
    return out


def gguf_problems(path, want):
    g = gguf_reader.read(path)
    got = {t.name: t for t in g.tensors}
    bad = ["names: %s" % sorted(set(got) ^ set(want))] if set(got) != set(want) else []
    for name, a in want.items():
        t = got.get(name)
        if t is None:
            continue
        arr = np.frombuffer(bytes(g.tensor_bytes(t)), "<f4").reshape(a.shape)
        if not np.array_equal(arr, a):
            bad.append("%s: other values" % name)
    return bad


def write_dcphf_shard(path, entries):
    """entries: [(name, full shape, offsets, chunk array)] -> a DCP-HF shard file."""
    header, blob, info = {}, b"", {}
    for name, _, offs, chunk in entries:
        raw = np.ascontiguousarray(chunk).astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(chunk.shape),
                        "data_offsets": [len(blob), len(blob) + len(raw)]}
        info[name] = {"saved_offsets": offs}
        blob += raw
    header["__metadata__"] = {"DCP_SHARDING_INFO": json.dumps(info), "DCP_VERSION": "1.0",
                              "format": "pt"}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + blob)


def nemo_step(root, w):
    model = os.path.join(root, "epoch_0_step_5", "model")
    os.makedirs(os.path.join(model, ".hf_metadata"))
    ranks = [[], []]
    for name, a in sorted(w.items()):
        if name.endswith("q_proj.weight"):  # by rows
            h = a.shape[0] // 2
            ranks[0].append((name, a.shape, [0, 0], a[:h]))
            ranks[1].append((name, a.shape, [h, 0], a[h:]))
        elif name.endswith("k_proj.weight"):  # by columns
            h = a.shape[1] // 2
            ranks[0].append((name, a.shape, [0, 0], a[:, :h]))
            ranks[1].append((name, a.shape, [0, h], a[:, h:]))
        else:
            ranks[len(name) % 2].append((name, a.shape, [0] * a.ndim, a))
    for r, entries in enumerate(ranks):
        write_dcphf_shard(os.path.join(model, "shard-%05d-model-00001-of-00001.safetensors"
                                       % (r + 1)), entries)
    with open(os.path.join(model, ".hf_metadata", "config.json"), "w") as f:
        json.dump(L.CONFIG, f)
    with open(os.path.join(model, ".hf_metadata", "tokenizer.json"), "w") as f:
        json.dump(L.tokenizer_json(), f)
    return os.path.join(root, "epoch_0_step_5")


def torch_strided(root, w):
    """pytorch_model.bin with q_proj saved as the transpose of a stored [in, out] tensor."""
    code = r'''
import sys, json, numpy as np, torch
w = dict(np.load(sys.argv[1]))
sd = {}
for k, v in w.items():
    t = torch.from_numpy(v.copy())
    if k.endswith("q_proj.weight"):
        t = torch.from_numpy(v.T.copy()).t()  # a view: strides (1, rows)
    sd[k] = t
torch.save(sd, sys.argv[2])
'''
    os.makedirs(root)
    np.savez(os.path.join(root, "w.npz"), **w)
    p = subprocess.run(["/usr/bin/python3", "-c", code, os.path.join(root, "w.npz"),
                        os.path.join(root, "pytorch_model.bin")], capture_output=True, timeout=120)
    os.unlink(os.path.join(root, "w.npz"))
    with open(os.path.join(root, "config.json"), "w") as f:
        json.dump(L.CONFIG, f)
    with open(os.path.join(root, "tokenizer.json"), "w") as f:
        json.dump(L.tokenizer_json(), f)
    return p.returncode == 0, p.stderr.decode(errors="replace")[-300:]


def names_of(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return sorted(k for k in json.loads(f.read(n)) if k != "__metadata__")


def spelling_cases(tap, work, step):
    rc, out, _ = run_capture([CKPTFS, "ls", step], 60)
    printed = out.decode().split()
    tap.ok("model/model.norm.weight" in printed, "ls prints model/ tensors as model/NAME",
           [printed[:5]])
    for spelling in ("model.norm.weight", "model/model.norm.weight", "model/model/norm/weight",
                     "model/model/norm/*"):
        dst = os.path.join(work, "one.safetensors")
        rc, _, err = run_capture([CKPTFS, "convert", step, dst, "--force", "--include", spelling],
                                 60)
        got = names_of(dst) if rc == 0 else []
        tap.ok(rc == 0 and got == ["model.norm.weight"],
               "convert --include %s picks model.norm.weight" % spelling, [err, got])
        rc, out, err = run_capture([CKPTFS, "ls", step, spelling], 60)
        tap.ok(rc == 0 and out.decode().split() == ["model/model.norm.weight"],
               "ls %s finds it" % spelling, [out, err])
        rc, out, err = run_capture([CKPTFS, "stats", step, spelling, "--json"], 60)
        tap.ok(rc == 0 and b"model.norm.weight" in out, "stats %s finds it" % spelling, [err])
    dst = os.path.join(work, "rest.safetensors")
    rc, _, err = run_capture([CKPTFS, "convert", step, dst, "--exclude", "model/model/layers/*"],
                             60)
    got = names_of(dst) if rc == 0 else []
    tap.ok(rc == 0 and got == ["lm_head.weight", "model.embed_tokens.weight", "model.norm.weight"],
           "convert --exclude in the tree spelling leaves the layers out", [err, got])


def optim_cases(tap, work):
    rc, out, _ = run_capture([CKPTFS, "ls", ZERO], 60)
    optim = sorted(n for n in out.decode().split() if n.startswith("optim/"))
    dst = os.path.join(work, "optim.safetensors")
    rc, _, err = run_capture([CKPTFS, "convert", ZERO, dst, "--include", "optim/*"], 60)
    got = names_of(dst) if rc == 0 else []
    tap.ok(rc == 0 and optim and got == sorted(n[len("optim/"):] for n in optim),
           "convert --include 'optim/*' writes the %d optimizer moments" % len(optim),
           [err, got[:4], optim[:4]])
    dst2 = os.path.join(work, "model.safetensors")
    rc, _, err = run_capture([CKPTFS, "convert", ZERO, dst2], 60)
    got = names_of(dst2) if rc == 0 else []
    tap.ok(rc == 0 and got and not any(n.endswith((".exp_avg", ".exp_avg_sq")) for n in got),
           "without it the optimizer state stays out", [err])


def main():
    why = skip_reason(CKPTFS, FIXTURES)
    if why:
        print("1..0 # SKIP %s" % why)
        return 0
    tap = Tap()
    work = tempfile.mkdtemp(prefix="ckptfs-t87.")
    try:
        w = L.weights()
        want = expected(w)
        step = nemo_step(os.path.join(work, "nemo"), w)
        out = os.path.join(work, "nemo.gguf")
        rc, _, err = run_capture([CKPTFS, "convert", step, out], 120)
        if tap.ok(rc == 0, "convert a NeMo step of 2 ranks' DCP-HF shards -> .gguf", [err]):
            bad = gguf_problems(out, want)
            tap.ok(not bad, "every tensor assembled from the chunks, q/k in llama.cpp's order",
                   bad)
        tdir = os.path.join(work, "torch")
        made, why = torch_strided(tdir, w)
        if tap.ok(made, "torch 1.13 wrote a pytorch_model.bin with a transposed view", [why]):
            out = os.path.join(work, "torch.gguf")
            rc, _, err = run_capture([CKPTFS, "convert", tdir, out], 120)
            bad = gguf_problems(out, want) if rc == 0 else ["exit %r" % rc]
            tap.ok(not bad, "convert the strided torch q_proj -> .gguf, same tensors", bad + [err])
        spelling_cases(tap, work, step)
        optim_cases(tap, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    tap.done()
    return 0 if tap.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
