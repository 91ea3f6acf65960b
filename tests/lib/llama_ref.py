"""A tiny Llama-shaped Hugging Face folder and a numpy forward pass of it, written from the
model's definition (no code shared with ckptfs or llama.cpp):

  h = embed[tokens]
  per layer:  x = rmsnorm(h) * w_in;  q, k, v = x Wq^T, x Wk^T, x Wv^T (k/v heads shared by
              n_head / n_kv query heads); RoPE as Hugging Face applies it (rotate_half: the
              first and second halves of each head are the pairs, angle pos * theta^(-2i/d));
              causal softmax(q k^T / sqrt(d)) v;  h += attn Wo^T
              x = rmsnorm(h) * w_post;  h += (silu(x Wg^T) * (x Wu^T)) Wd^T
  logits = rmsnorm(h) * w_norm  Wlm^T

rmsnorm(x) = x / sqrt(mean(x^2) + eps). Everything in float64.
"""

import json
import os
import struct

import numpy as np

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 160,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "vocab_size": 300,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
}


def bytes_to_unicode():
    """GPT-2's byte-level alphabet: every byte as a printable character."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def tokenizer_json():
    """A byte-level BPE tokenizer.json: 3 special tokens, the 256 bytes, a few merges."""
    byte_chars = bytes_to_unicode()
    vocab = {}
    for b in range(256):
        vocab[byte_chars[b]] = 3 + b
    merges = [("\u0120", "t"), ("h", "e"), ("\u0120t", "he"), ("i", "n")]
    for a, b in merges:
        vocab[a + b] = len(vocab) + 3
    added = [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, c in enumerate(["<unk>", "<s>", "</s>"])]
    return {
        "version": "1.0",
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel"},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False,
                  "vocab": vocab, "merges": ["%s %s" % m for m in merges]},
    }


def weights(cfg=CONFIG, seed=1234):
    rng = np.random.default_rng(seed)
    H, F, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = H // nh

    def mat(*shape, scale=None):
        scale = scale if scale is not None else 1.0 / np.sqrt(shape[-1])
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    w = {"model.embed_tokens.weight": mat(V, H, scale=1.0),
         "model.norm.weight": (1 + 0.1 * rng.standard_normal(H)).astype(np.float32),
         "lm_head.weight": mat(V, H)}
    for i in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % i
        w[p + "input_layernorm.weight"] = (1 + 0.1 * rng.standard_normal(H)).astype(np.float32)
        w[p + "post_attention_layernorm.weight"] = (1 + 0.1 * rng.standard_normal(H)).astype(
            np.float32)
        w[p + "self_attn.q_proj.weight"] = mat(nh * d, H)
        w[p + "self_attn.k_proj.weight"] = mat(nkv * d, H)
        w[p + "self_attn.v_proj.weight"] = mat(nkv * d, H)
        w[p + "self_attn.o_proj.weight"] = mat(H, nh * d)
        w[p + "mlp.gate_proj.weight"] = mat(F, H)
        w[p + "mlp.up_proj.weight"] = mat(F, H)
        w[p + "mlp.down_proj.weight"] = mat(H, F)
    return w


def write_safetensors(path, tensors):
    header, blob = {"__metadata__": {"format": "pt"}}, b""
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        raw = a.astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape),
                        "data_offsets": [len(blob), len(blob) + len(raw)]}
        blob += raw
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + blob)


def make_folder(d, cfg=CONFIG, seed=1234):
    os.makedirs(d, exist_ok=True)
    w = weights(cfg, seed)
    write_safetensors(os.path.join(d, "model.safetensors"), w)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    with open(os.path.join(d, "tokenizer.json"), "w") as f:
        json.dump(tokenizer_json(), f)
    return w


def rmsnorm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x, theta, interleaved=False):
    """x: [T, heads, d]; Hugging Face's rotate_half RoPE, or with interleaved the pairs
    (2i, 2i+1) of the original Llama code (a control: the wrong one for these weights)."""
    T, _, d = x.shape
    inv = theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    ang = np.arange(T, dtype=np.float64)[:, None] * inv[None, :]
    if interleaved:
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2], out[..., 1::2] = a * c - b * s, a * s + b * c
        return out
    cos = np.concatenate([np.cos(ang)] * 2, axis=-1)[:, None, :]
    sin = np.concatenate([np.sin(ang)] * 2, axis=-1)[:, None, :]
    half = d // 2
    rot = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rot * sin


def forward(w, tokens, cfg=CONFIG, interleaved=False):
    """Logits [T, vocab] in float64 (q/k/v biases, Qwen2's, where w has them)."""
    H = cfg["hidden_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d, eps, theta = H // nh, cfg["rms_norm_eps"], cfg["rope_theta"]
    W = {k: v.astype(np.float64) for k, v in w.items()}
    h = W["model.embed_tokens.weight"][np.asarray(tokens)]
    T = len(tokens)
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for i in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % i
        x = rmsnorm(h, W[p + "input_layernorm.weight"], eps)
        q = (x @ W[p + "self_attn.q_proj.weight"].T + W.get(p + "self_attn.q_proj.bias", 0.0))
        k = (x @ W[p + "self_attn.k_proj.weight"].T + W.get(p + "self_attn.k_proj.bias", 0.0))
        v = (x @ W[p + "self_attn.v_proj.weight"].T + W.get(p + "self_attn.v_proj.bias", 0.0))
        q, k, v = q.reshape(T, nh, d), k.reshape(T, nkv, d), v.reshape(T, nkv, d)
        q, k = rope(q, theta, interleaved), rope(k, theta, interleaved)
        rep = nh // nkv
        k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
        att = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(d) + mask
        att = np.exp(att - att.max(axis=-1, keepdims=True))
        att /= att.sum(axis=-1, keepdims=True)
        o = np.einsum("hqk,khd->qhd", att, v).reshape(T, nh * d)
        h = h + o @ W[p + "self_attn.o_proj.weight"].T
        x = rmsnorm(h, W[p + "post_attention_layernorm.weight"], eps)
        g = x @ W[p + "mlp.gate_proj.weight"].T
        u = x @ W[p + "mlp.up_proj.weight"].T
        h = h + ((g / (1 + np.exp(-g))) * u) @ W[p + "mlp.down_proj.weight"].T
    return rmsnorm(h, W["model.norm.weight"], eps) @ W["lm_head.weight"].T


def log_softmax(x):
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))
