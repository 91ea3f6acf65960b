#!/usr/bin/python3
"""Write Meta model-parallel Llama checkpoints with REAL torch (python3-torch 1.13).

usage: meta_mp_fixtures.py            regenerate tests/fixtures/meta_mp/ (committed)
       meta_mp_fixtures.py --out DIR  write them somewhere else
       meta_mp_fixtures.py OUTDIR     what the Makefile runs: the files are committed (so
                                      `make check` needs no torch); writes nothing

Each case is a directory as Meta's llama code writes it: params.json and one
torch.save(model.state_dict()) per model-parallel rank, consolidated.NN.pth, holding that rank's
slices as fairscale's layers cut them (ColumnParallelLinear: rows; RowParallelLinear: columns;
ParallelEmbedding: embedding columns, Llama 3's VocabParallelEmbedding: vocabulary rows; norms
and rope.freqs whole on every rank). Names and shapes follow llama/model.py (FeedForward's
hidden size from multiple_of and ffn_dim_multiplier).

What each must show is computed here with torch, not ckptfs code (manifest.json): the full
tensors under Meta's names, and the checkpoint transformers' convert_llama_weights_to_hf.py
writes from them: Llama names, q/k rows permuted per head for rotary
(w.view(heads, rows // heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)), config.json
values from params.json and the tensors.

Hostile cases (hostile/): a rank whose wq slice has another shape, a rank whose replicated norm
differs.
"""

import hashlib
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
from fixture_lib import committed_torch_main  # noqa: E402

COMMITTED = os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "fixtures",
                         "meta_mp")

CASES = {
    # Llama 2 70B's shape of things, tiny: grouped-query attention, MP 2, bf16.
    "llama2_mp2": {"params": {"dim": 32, "multiple_of": 16, "ffn_dim_multiplier": 1.3,
                              "n_heads": 4, "n_kv_heads": 2, "n_layers": 2, "norm_eps": 1e-05,
                              "vocab_size": -1},
                   "vocab": 48, "mp": 2, "dtype": "bfloat16", "vocab_parallel": False,
                   "rope_freqs": False},
    # Llama 1: no n_kv_heads, rope.freqs in the checkpoint, MP 4, fp16.
    "llama1_mp4": {"params": {"dim": 64, "multiple_of": 32, "n_heads": 8, "n_layers": 1,
                              "norm_eps": 1e-06, "vocab_size": -1},
                   "vocab": 40, "mp": 4, "dtype": "float16", "vocab_parallel": False,
                   "rope_freqs": True},
    # Llama 3: the vocabulary split (VocabParallelEmbedding), rope_theta, MP 2.
    "llama3_mp2": {"params": {"dim": 32, "n_layers": 1, "n_heads": 4, "n_kv_heads": 2,
                              "vocab_size": 56, "multiple_of": 16, "ffn_dim_multiplier": 1.5,
                              "norm_eps": 1e-05, "rope_theta": 500000.0},
                   "vocab": 56, "mp": 2, "dtype": "bfloat16", "vocab_parallel": True,
                   "rope_freqs": False},
    # One file: the 7B layout.
    "llama2_mp1": {"params": {"dim": 32, "multiple_of": 16, "n_heads": 4, "n_layers": 1,
                              "norm_eps": 1e-05, "vocab_size": -1},
                   "vocab": 24, "mp": 1, "dtype": "bfloat16", "vocab_parallel": False,
                   "rope_freqs": False},
}


def ffn_hidden(p):
    """llama/model.py FeedForward: 4*dim -> 2/3 -> multiplier -> round up to multiple_of."""
    hidden = int(2 * (4 * p["dim"]) / 3)
    if p.get("ffn_dim_multiplier") is not None:
        hidden = int(p["ffn_dim_multiplier"] * hidden)
    m = p["multiple_of"]
    return m * ((hidden + m - 1) // m)


def record(torch, t):
    c = t.detach().contiguous()
    raw = (c.view(torch.int16) if c.dtype in (torch.bfloat16, torch.float16) else c).numpy().tobytes()
    name = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}[c.dtype]
    return {"dtype": name, "shape": list(c.shape), "nbytes": len(raw),
            "sha256": hashlib.sha256(raw).hexdigest()}


def full_model(torch, case):
    """The whole model's state_dict in llama/model.py's order."""
    p = case["params"]
    dt = getattr(torch, case["dtype"])
    dim, heads = p["dim"], p["n_heads"]
    kv = p.get("n_kv_heads") or heads
    hd = dim // heads
    hidden = ffn_hidden(p)
    g = torch.Generator().manual_seed(sum(map(ord, json.dumps(p, sort_keys=True))))

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(dt)

    sd = {"tok_embeddings.weight": rnd(case["vocab"], dim)}
    for i in range(p["n_layers"]):
        lp = "layers.%d." % i
        sd[lp + "attention.wq.weight"] = rnd(heads * hd, dim)
        sd[lp + "attention.wk.weight"] = rnd(kv * hd, dim)
        sd[lp + "attention.wv.weight"] = rnd(kv * hd, dim)
        sd[lp + "attention.wo.weight"] = rnd(dim, heads * hd)
        sd[lp + "feed_forward.w1.weight"] = rnd(hidden, dim)
        sd[lp + "feed_forward.w2.weight"] = rnd(dim, hidden)
        sd[lp + "feed_forward.w3.weight"] = rnd(hidden, dim)
        sd[lp + "attention_norm.weight"] = rnd(dim)
        sd[lp + "ffn_norm.weight"] = rnd(dim)
    sd["norm.weight"] = rnd(dim)
    sd["output.weight"] = rnd(case["vocab"], dim)
    if case["rope_freqs"]:
        sd["rope.freqs"] = (1.0 / (10000.0 ** (torch.arange(0, hd, 2).float() / hd))).to(dt)
    return sd


COLUMN = ("attention.wq.weight", "attention.wk.weight", "attention.wv.weight",
          "feed_forward.w1.weight", "feed_forward.w3.weight", "output.weight")
ROW = ("attention.wo.weight", "feed_forward.w2.weight")


def split_dim(name, case):
    if name == "tok_embeddings.weight":
        return 0 if case["vocab_parallel"] else 1
    if name.endswith(COLUMN):
        return 0
    if name.endswith(ROW):
        return 1
    return None


def rank_dicts(torch, case, sd):
    mp = case["mp"]
    ranks = [dict() for _ in range(mp)]
    for name, t in sd.items():
        d = split_dim(name, case)
        parts = [t] * mp if d is None else list(torch.chunk(t, mp, dim=d))
        for r in range(mp):
            # A rank's parameters are its own tensors (clone: not views of the full one).
            ranks[r][name] = parts[r].clone()
    return ranks


def hf_checkpoint(torch, case, ranks):
    """What convert_llama_weights_to_hf.py's write_model builds from the rank files (its
    sharded branch), followed step by step."""
    p = case["params"]
    n = len(ranks)
    dim, heads = p["dim"], p["n_heads"]
    hd = dim // heads
    kv = p.get("n_kv_heads") or heads
    kv_dim = hd * kv

    def permute(w, n_heads, dim1=dim, dim2=dim):
        return w.view(n_heads, dim1 // n_heads // 2, 2, dim2).transpose(1, 2).reshape(dim1, dim2)

    out = {}
    for i in range(p["n_layers"]):
        lp = "layers.%d." % i
        hp = "model.layers.%d." % i
        if n == 1:
            r = ranks[0]
            out[hp + "self_attn.q_proj.weight"] = permute(r[lp + "attention.wq.weight"], heads)
            out[hp + "self_attn.k_proj.weight"] = permute(r[lp + "attention.wk.weight"], kv,
                                                          kv_dim)
            out[hp + "self_attn.v_proj.weight"] = r[lp + "attention.wv.weight"]
            out[hp + "self_attn.o_proj.weight"] = r[lp + "attention.wo.weight"]
            out[hp + "mlp.gate_proj.weight"] = r[lp + "feed_forward.w1.weight"]
            out[hp + "mlp.down_proj.weight"] = r[lp + "feed_forward.w2.weight"]
            out[hp + "mlp.up_proj.weight"] = r[lp + "feed_forward.w3.weight"]
        else:
            out[hp + "self_attn.q_proj.weight"] = permute(torch.cat(
                [r[lp + "attention.wq.weight"].view(heads // n, hd, dim) for r in ranks],
                dim=0).reshape(dim, dim), n_heads=heads)
            out[hp + "self_attn.k_proj.weight"] = permute(torch.cat(
                [r[lp + "attention.wk.weight"].view(kv // n, hd, dim) for r in ranks],
                dim=0).reshape(kv_dim, dim), kv, kv_dim, dim)
            out[hp + "self_attn.v_proj.weight"] = torch.cat(
                [r[lp + "attention.wv.weight"].view(kv // n, hd, dim) for r in ranks],
                dim=0).reshape(kv_dim, dim)
            out[hp + "self_attn.o_proj.weight"] = torch.cat(
                [r[lp + "attention.wo.weight"] for r in ranks], dim=1)
            out[hp + "mlp.gate_proj.weight"] = torch.cat(
                [r[lp + "feed_forward.w1.weight"] for r in ranks], dim=0)
            out[hp + "mlp.down_proj.weight"] = torch.cat(
                [r[lp + "feed_forward.w2.weight"] for r in ranks], dim=1)
            out[hp + "mlp.up_proj.weight"] = torch.cat(
                [r[lp + "feed_forward.w3.weight"] for r in ranks], dim=0)
        out[hp + "input_layernorm.weight"] = ranks[0][lp + "attention_norm.weight"]
        out[hp + "post_attention_layernorm.weight"] = ranks[0][lp + "ffn_norm.weight"]
    out["model.norm.weight"] = ranks[0]["norm.weight"]
    concat = 0 if case["vocab_parallel"] else 1
    out["model.embed_tokens.weight"] = torch.cat([r["tok_embeddings.weight"] for r in ranks],
                                                 dim=concat)
    out["lm_head.weight"] = torch.cat([r["output.weight"] for r in ranks], dim=0)
    return out


def expected_config(case, hf):
    p = case["params"]
    mult = p.get("ffn_dim_multiplier", 1)
    multiple_of = p.get("multiple_of", 256)
    inter = multiple_of * ((int(mult * int(8 * p["dim"] / 3)) + multiple_of - 1) // multiple_of)
    assert inter == hf["model.layers.0.mlp.gate_proj.weight"].shape[0]
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_size": p["dim"], "intermediate_size": inter,
            "num_attention_heads": p["n_heads"], "num_hidden_layers": p["n_layers"],
            "num_key_value_heads": p.get("n_kv_heads") or p["n_heads"],
            "rms_norm_eps": p["norm_eps"], "rope_theta": p.get("rope_theta", 10000.0),
            "vocab_size": hf["model.embed_tokens.weight"].shape[0],
            "tie_word_embeddings": False}


def write_case(torch, d, case, ranks):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "params.json"), "w") as f:
        json.dump(case["params"], f)
    for r, sd in enumerate(ranks):
        torch.save(sd, os.path.join(d, "consolidated.%02d.pth" % r))


def build(torch, out):
    manifest = {"torch_version": torch.__version__, "cases": {}, "hostile": {}}
    for name, case in CASES.items():
        sd = full_model(torch, case)
        ranks = rank_dicts(torch, case, sd)
        write_case(torch, os.path.join(out, name), case, ranks)
        hf = hf_checkpoint(torch, case, ranks)
        manifest["cases"][name] = {
            "mp": case["mp"],
            "meta": {k: record(torch, v) for k, v in sd.items()},
            "hf": {k: record(torch, v) for k, v in hf.items()},
            "config": expected_config(case, hf)}
    base = CASES["llama2_mp2"]
    sd = full_model(torch, base)
    ranks = rank_dicts(torch, base, sd)
    ranks[1]["layers.1.attention.wq.weight"] = ranks[1]["layers.1.attention.wq.weight"][:8].clone()
    write_case(torch, os.path.join(out, "hostile", "bad_shape"), base, ranks)
    manifest["hostile"]["bad_shape"] = {"error": ["consolidated.01.pth",
                                                  "layers.1.attention.wq.weight"]}
    ranks = rank_dicts(torch, base, sd)
    ranks[1]["norm.weight"] = ranks[1]["norm.weight"] + 1
    write_case(torch, os.path.join(out, "hostile", "norm_differs"), base, ranks)
    manifest["hostile"]["norm_differs"] = {"error": ["consolidated.01.pth", "norm.weight",
                                                     "replicate"]}
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)


def main(argv):
    out = committed_torch_main(argv, "Meta MP", COMMITTED, __doc__, build)
    if not isinstance(out, str):
        return out
    print("wrote %s" % out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
