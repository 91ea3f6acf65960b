#!/usr/bin/python3
"""convert HF-folder -> .gguf that llama.cpp runs (core/write/profile_llamacpp.c, core/write/gguf_vocab.c).

Environment: CKPTFS, FIXTURES. llama.cpp comes from the npm package node-llama-cpp 3.21.1
with its prebuilt linux-x64 binaries, installed on first use into build/node-llama (next to
CKPTFS; never globally) with `npm i -E node-llama-cpp@3.21.1 @node-llama-cpp/linux-x64@3.21.1
--omit=optional`; without node >= 20 and npm (Debian bookworm's nodejs is 18, so make deps
does not provide them) or the registry those checks are skipped, saying why.

- A tiny Llama-shaped folder (tests/lib/llama_ref.py: 2 layers, 4 heads, 2 KV heads, BPE
  tokenizer.json of 300 ids) converted to GGUF: general.architecture, every hyper-parameter
  from config.json, the tokenizer (tokens, types, merges, bos/eos), llama.cpp tensor names,
  and attn_q/attn_k rows in llama.cpp's rope order (checked against a numpy permutation).
- llama.cpp loads it and its next-token log-probabilities after every position match the
  numpy forward pass within 1e-2 (a reference with the other rope layout is off by far more,
  so the check can tell); the same after --dtype f16 against the forward of f16 weights.
- A GPT-2-shaped folder: gpt2 names (Conv1D weights transposed), KVs; llama.cpp loads it.
- Another family (no llama/gpt2 config): a tensor container, said on stderr.
"""

import json
import os
import shutil
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
NPM_ARGS = ["i", "-E", "node-llama-cpp@3.21.1", "@node-llama-cpp/linux-x64@3.21.1",
            "--omit=optional", "--no-audit", "--no-fund"]
TOKENS = [1, 50, 60, 70, 80, 262, 3, 299, 100]


def node_llama():
    """(node_modules dir, None) or (None, why not)."""
    base = os.path.join(os.path.dirname(os.path.realpath(CKPTFS)), "node-llama")
    mods = os.path.join(base, "node_modules")
    if os.path.exists(os.path.join(mods, "node-llama-cpp", "dist", "index.js")) and \
            os.path.isdir(os.path.join(mods, "@node-llama-cpp", "linux-x64")):
        return mods, None
    for tool in ("node", "npm"):
        if not shutil.which(tool):
            return None, "%s is not installed" % tool
    v = subprocess.run(["node", "--version"], capture_output=True, text=True).stdout.strip()
    try:
        major = int(v.lstrip("v").split(".")[0])
    except ValueError:
        major = 0
    if major < 20:
        return None, "node %s is older than the 20 node-llama-cpp 3.21.1 needs" % (v or "?")
    os.makedirs(base, exist_ok=True)
    if not os.path.exists(os.path.join(base, "package.json")):
        with open(os.path.join(base, "package.json"), "w") as f:
            json.dump({"name": "ckptfs-node-llama", "private": True}, f)
    p = subprocess.run(["npm"] + NPM_ARGS, cwd=base, capture_output=True, timeout=900)
    if p.returncode != 0:
        return None, "npm install failed: %s" % p.stderr.decode(errors="replace")[-300:]
    return mods, None


def logprobs(mods, gguf, tokens):
    p = subprocess.run(["node", os.path.join(HERE, "..", "lib", "llama_logprobs.mjs"), mods, gguf,
                        ",".join(map(str, tokens))], capture_output=True, timeout=300)
    if p.returncode != 0:
        raise RuntimeError(p.stderr.decode(errors="replace")[-800:])
    d = json.loads(p.stdout)
    probs = np.array([[x if x is not None else 0.0 for x in row] for row in d["probs"]])
    return d, np.log(np.maximum(probs, 1e-30))


def kvs(g):
    return {k.key: k.value for k in g.kvs}


def permuted(w, heads):
    """llama.cpp's row order for q/k: rows of each head's halves interleaved."""
    rows, cols = w.shape
    return w.reshape(heads, 2, rows // heads // 2, cols).swapaxes(1, 2).reshape(rows, cols)


def llama_checks(tap, work, mods):
    hf = os.path.join(work, "llama")
    w = L.make_folder(hf)
    cfg = L.CONFIG
    out = os.path.join(work, "llama.gguf")
    rc, _, err = run_capture([CKPTFS, "convert", hf, out], 120)
    if not tap.ok(rc == 0, "convert tiny Llama folder -> .gguf", [err]):
        return
    g = gguf_reader.read(out)
    kv = kvs(g)
    want = {"general.architecture": "llama", "llama.block_count": cfg["num_hidden_layers"],
            "llama.embedding_length": cfg["hidden_size"],
            "llama.feed_forward_length": cfg["intermediate_size"],
            "llama.attention.head_count": cfg["num_attention_heads"],
            "llama.attention.head_count_kv": cfg["num_key_value_heads"],
            "llama.context_length": cfg["max_position_embeddings"],
            "llama.rope.dimension_count": cfg["hidden_size"] // cfg["num_attention_heads"],
            "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.bos_token_id": 1,
            "tokenizer.ggml.eos_token_id": 2}
    bad = ["%s: %r, want %r" % (k, kv.get(k), v) for k, v in want.items() if kv.get(k) != v]
    eps = kv.get("llama.attention.layer_norm_rms_epsilon")
    if eps is None or abs(eps - cfg["rms_norm_eps"]) > 1e-9:
        bad.append("rms eps %r" % eps)
    if kv.get("llama.rope.freq_base") != cfg["rope_theta"]:
        bad.append("rope theta %r" % kv.get("llama.rope.freq_base"))
    tap.ok(not bad, "architecture and every hyper-parameter from config.json", bad)
    tok = json.load(open(os.path.join(hf, "tokenizer.json")))
    tokens = kv.get("tokenizer.ggml.tokens", (None, []))[1]
    types = kv.get("tokenizer.ggml.token_type", (None, []))[1]
    merges = kv.get("tokenizer.ggml.merges", (None, []))[1]
    expect = ["[PAD%d]" % i for i in range(cfg["vocab_size"])]
    for s, i in tok["model"]["vocab"].items():
        expect[i] = s
    for a in tok["added_tokens"]:
        expect[a["id"]] = a["content"]
    tap.ok(tokens == expect and types[:3] == [3, 3, 3] and types[3] == 1 and types[-1] == 5
           and merges == tok["model"]["merges"],
           "tokenizer: %d tokens by id, control/normal/unused types, merges" % len(tokens),
           [len(tokens), types[:5], merges])
    names = {t.name for t in g.tensors}
    want_names = {"token_embd.weight", "output_norm.weight", "output.weight"} | {
        "blk.%d.%s.weight" % (i, n) for i in range(cfg["num_hidden_layers"])
        for n in ("attn_norm", "ffn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                  "ffn_gate", "ffn_up", "ffn_down")}
    tap.ok(names == want_names, "llama.cpp tensor names", [sorted(names ^ want_names)])
    by = {t.name: t for t in g.tensors}
    q = np.frombuffer(bytes(g.tensor_bytes(by["blk.1.attn_q.weight"])), "<f4").reshape(64, 64)
    k = np.frombuffer(bytes(g.tensor_bytes(by["blk.1.attn_k.weight"])), "<f4").reshape(32, 64)
    v = np.frombuffer(bytes(g.tensor_bytes(by["blk.1.attn_v.weight"])), "<f4").reshape(32, 64)
    tap.ok(np.array_equal(q, permuted(w["model.layers.1.self_attn.q_proj.weight"], 4)) and
           np.array_equal(k, permuted(w["model.layers.1.self_attn.k_proj.weight"], 2)) and
           np.array_equal(v, w["model.layers.1.self_attn.v_proj.weight"]),
           "attn_q / attn_k rows in llama.cpp's rope order, attn_v as it was")

    if mods is None:
        return
    ref = L.log_softmax(L.forward(w, TOKENS))
    wrong = L.log_softmax(L.forward(w, TOKENS, interleaved=True))
    try:
        d, lp = logprobs(mods, out, TOKENS)
    except (RuntimeError, ValueError, subprocess.TimeoutExpired) as e:
        tap.ok(False, "llama.cpp loads and runs the converted model", [str(e)])
        return
    ok_shape = lp.shape == ref.shape
    diff = np.abs(lp - ref).max() if ok_shape else np.inf
    control = np.abs(wrong - ref).max()
    tap.ok(d["arch"] == "llama" and d["vocabulary"] == "bpe" and ok_shape,
           "llama.cpp loads it: arch llama, BPE vocabulary, %d positions x %d tokens" % lp.shape,
           [d["arch"], d["vocabulary"], lp.shape])
    tap.ok(diff < 1e-2 and control > 0.05 and (lp.argmax(1) == ref.argmax(1)).all(),
           "llama.cpp's log-probabilities match the numpy forward pass: max |diff| %.2e "
           "(the other rope layout would be off by %.2f)" % (diff, control))

    out16 = os.path.join(work, "llama-f16.gguf")
    rc, _, err = run_capture([CKPTFS, "convert", hf, out16, "--dtype", "f16"], 120)
    g16 = gguf_reader.read(out16) if rc == 0 else None
    tap.ok(g16 is not None and all(t.type_name == ("F16" if len(t.shape) == 2 else "F32")
                                   for t in g16.tensors),
           "--dtype f16 into a llama.cpp GGUF: matrices F16, norms kept F32", [err])
    if g16 is None:
        return
    w16 = {n: a.astype(np.float16).astype(np.float32) if a.ndim == 2 else a
           for n, a in w.items()}
    ref16 = L.log_softmax(L.forward(w16, TOKENS))
    try:
        _, lp16 = logprobs(mods, out16, TOKENS)
        diff16 = np.abs(lp16 - ref16).max()
    except (RuntimeError, ValueError, subprocess.TimeoutExpired) as e:
        diff16 = str(e)
    tap.ok(isinstance(diff16, float) and diff16 < 1e-2,
           "llama.cpp runs the F16 model: matches the forward of the f16-rounded weights "
           "(max |diff| %s)" % (("%.2e" % diff16) if isinstance(diff16, float) else "-"),
           [diff16])


def gpt2_folder(d):
    rng = np.random.default_rng(5)
    E, V, P, nl = 32, 300, 64, 2
    cfg = {"model_type": "gpt2", "n_embd": E, "n_layer": nl, "n_head": 4, "n_positions": P,
           "vocab_size": V, "layer_norm_epsilon": 1e-5, "bos_token_id": 1, "eos_token_id": 2}
    w = {"wte.weight": rng.standard_normal((V, E)), "wpe.weight": rng.standard_normal((P, E)) * .1,
         "ln_f.weight": 1 + .1 * rng.standard_normal(E), "ln_f.bias": .1 * rng.standard_normal(E)}
    for i in range(nl):
        p = "h.%d." % i
        for n, shape in (("ln_1.weight", (E,)), ("ln_1.bias", (E,)), ("ln_2.weight", (E,)),
                         ("ln_2.bias", (E,)), ("attn.c_attn.weight", (E, 3 * E)),
                         ("attn.c_attn.bias", (3 * E,)), ("attn.c_proj.weight", (E, E)),
                         ("attn.c_proj.bias", (E,)), ("mlp.c_fc.weight", (E, 4 * E)),
                         ("mlp.c_fc.bias", (4 * E,)), ("mlp.c_proj.weight", (4 * E, E)),
                         ("mlp.c_proj.bias", (E,))):
            w[p + n] = rng.standard_normal(shape) * 0.1 + (1 if n.startswith("ln") and
                                                           n.endswith("weight") else 0)
        w[p + "attn.bias"] = np.tril(np.ones((P, P)))[None, None]  # a buffer, left out
    w = {k: v.astype(np.float32) for k, v in w.items()}
    os.makedirs(d)
    L.write_safetensors(os.path.join(d, "model.safetensors"), w)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    with open(os.path.join(d, "tokenizer.json"), "w") as f:
        json.dump(L.tokenizer_json(), f)
    return w, cfg


def gpt2_checks(tap, work, mods):
    hf = os.path.join(work, "gpt2")
    w, cfg = gpt2_folder(hf)
    out = os.path.join(work, "gpt2.gguf")
    rc, _, err = run_capture([CKPTFS, "convert", hf, out], 120)
    if not tap.ok(rc == 0, "convert tiny GPT-2 folder -> .gguf", [err]):
        return
    g = gguf_reader.read(out)
    kv = kvs(g)
    tap.ok(kv.get("general.architecture") == "gpt2" and kv.get("gpt2.block_count") == 2 and
           kv.get("gpt2.embedding_length") == 32 and kv.get("gpt2.attention.head_count") == 4 and
           kv.get("gpt2.context_length") == 64 and kv.get("gpt2.feed_forward_length") == 128 and
           kv.get("tokenizer.ggml.pre") == "gpt-2",
           "gpt2: architecture, hyper-parameters, tokenizer", [sorted(kv)])
    by = {t.name: t for t in g.tensors}
    qkv = by.get("blk.0.attn_qkv.weight")
    got = np.frombuffer(bytes(g.tensor_bytes(qkv)), "<f4").reshape(96, 32) if qkv else None
    tap.ok(got is not None and np.array_equal(got, w["h.0.attn.c_attn.weight"].T) and
           "position_embd.weight" in by and not any("attn.bias" in n for n in by),
           "gpt2: Conv1D weights transposed to [out, in], mask buffers left out",
           [sorted(by)])
    if mods is None:
        return
    try:
        d, lp = logprobs(mods, out, TOKENS[:5])
        fine = d["arch"] == "gpt2" and lp.shape == (5, 300) and np.isfinite(lp).all() and \
            abs(np.exp(lp).sum(1) - 1).max() < 1e-3
        why = [d["arch"], lp.shape]
    except (RuntimeError, ValueError, subprocess.TimeoutExpired) as e:
        fine, why = False, [str(e)]
    tap.ok(fine, "llama.cpp loads and runs the GPT-2 GGUF (finite, normalized predictions)", why)


def other_family(tap, work):
    out = os.path.join(work, "other.gguf")
    d = os.path.join(work, "bert")
    os.makedirs(d)
    L.write_safetensors(os.path.join(d, "model.safetensors"),
                        {"encoder.w": np.ones((2, 2), np.float32)})
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"model_type": "bert"}, f)
    rc, _, err = run_capture([CKPTFS, "convert", d, out], 60)
    e = err.decode(errors="replace")
    kv = kvs(gguf_reader.read(out)) if rc == 0 else {}
    tap.ok(rc == 0 and "tensor container" in e and "general.architecture" not in kv,
           "another family: a tensor container, said on stderr, no architecture invented", [e])
    rc, help_text, _ = run_capture([CKPTFS, "convert", "--help"], 30)
    tap.ok(rc == 0 and b"tensor" in help_text and b"container" in help_text,
           "convert --help says what other families get", [help_text])


def main():
    tap = Tap()
    why = skip_reason(CKPTFS, FIXTURES)
    if why:
        print("1..0 # SKIP %s" % why)
        return 0
    mods, why_not = node_llama()
    work = tempfile.mkdtemp(prefix="ckptfs-t78.")
    try:
        if why_not:
            tap.skip_unless_ci("llama.cpp runs the converted models", why_not)
        llama_checks(tap, work, mods)
        gpt2_checks(tap, work, mods)
        other_family(tap, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    tap.done()
    return 0 if tap.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
