"""The tiny Llama of llama_ref.py stored the ways training writes it, for tests of what ckptfs
assembles on read. Each writer follows the format's own notes (DCP-HF sharding info; Meta's
fairscale model-parallel cuts), never ckptfs: the tests compare ckptfs against these.

- nemo_step(root, w): a NeMo Automodel step, model/ as DCP-HF shards of 2 ranks (q_proj cut by
  rows, k_proj by columns) with .hf_metadata/config.json and tokenizer.json.
- meta_mp(root, w, ranks): consolidated.NN.pth per model-parallel rank + params.json (and a
  tokenizer.json beside them), Meta's names and its interleaved q/k rows; torch 1.13 saves it.
- llama_cpp_tensors(w): {llama.cpp name: array} computed from the HF weights with numpy.
"""
import json
import os
import struct
import subprocess

import numpy as np

import llama_ref as L

GG = {"input_layernorm.weight": "attn_norm.weight",
      "post_attention_layernorm.weight": "ffn_norm.weight",
      "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
      "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
      "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
      "mlp.down_proj.weight": "ffn_down.weight"}


def interleaved(w, heads):
    """q/k rows from HF's rotate-half order to the interleaved pairs of Meta and llama.cpp."""
    rows, cols = w.shape
    return w.reshape(heads, 2, rows // heads // 2, cols).swapaxes(1, 2).reshape(rows, cols)


def llama_cpp_tensors(w, cfg=L.CONFIG):
    out = {"token_embd.weight": w["model.embed_tokens.weight"],
           "output_norm.weight": w["model.norm.weight"], "output.weight": w["lm_head.weight"]}
    for name, a in w.items():
        if not name.startswith("model.layers."):
            continue
        layer, rest = name[len("model.layers."):].split(".", 1)
        if rest == "self_attn.q_proj.weight":
            a = interleaved(a, cfg["num_attention_heads"])
        elif rest == "self_attn.k_proj.weight":
            a = interleaved(a, cfg["num_key_value_heads"])
        out["blk.%s.%s" % (layer, GG[rest])] = a
    return out


def _dcphf_shard(path, entries):
    header, blob, info = {}, b"", {}
    for name, offs, chunk in entries:
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
    step = os.path.join(root, "epoch_0_step_5")
    model = os.path.join(step, "model")
    os.makedirs(os.path.join(model, ".hf_metadata"))
    ranks = [[], []]
    for name, a in sorted(w.items()):
        if name.endswith("q_proj.weight"):
            h = a.shape[0] // 2
            ranks[0].append((name, [0, 0], a[:h]))
            ranks[1].append((name, [h, 0], a[h:]))
        elif name.endswith("k_proj.weight"):
            h = a.shape[1] // 2
            ranks[0].append((name, [0, 0], a[:, :h]))
            ranks[1].append((name, [0, h], a[:, h:]))
        else:
            ranks[len(name) % 2].append((name, [0] * a.ndim, a))
    for r, entries in enumerate(ranks):
        _dcphf_shard(os.path.join(model, "shard-%05d-model-00001-of-00001.safetensors" % (r + 1)),
                     entries)
    with open(os.path.join(model, ".hf_metadata", "config.json"), "w") as f:
        json.dump(L.CONFIG, f)
    with open(os.path.join(model, ".hf_metadata", "tokenizer.json"), "w") as f:
        json.dump(L.tokenizer_json(), f)
    return step


# Meta's names of the HF weights, and the dim fairscale cuts each along (None: replicated).
META = {"self_attn.q_proj.weight": ("attention.wq.weight", 0),
        "self_attn.k_proj.weight": ("attention.wk.weight", 0),
        "self_attn.v_proj.weight": ("attention.wv.weight", 0),
        "self_attn.o_proj.weight": ("attention.wo.weight", 1),
        "mlp.gate_proj.weight": ("feed_forward.w1.weight", 0),
        "mlp.down_proj.weight": ("feed_forward.w2.weight", 1),
        "mlp.up_proj.weight": ("feed_forward.w3.weight", 0),
        "input_layernorm.weight": ("attention_norm.weight", None),
        "post_attention_layernorm.weight": ("ffn_norm.weight", None)}

_SAVE = r'''
import sys, numpy as np, torch
d = np.load(sys.argv[1])
torch.save({k: torch.from_numpy(d[k].copy()) for k in d.files}, sys.argv[2])
'''


def meta_mp(root, w, ranks=2, cfg=L.CONFIG):
    """(path, None) or (None, why torch could not save it)."""
    os.makedirs(root)
    full = {"tok_embeddings.weight": (w["model.embed_tokens.weight"], 1),
            "norm.weight": (w["model.norm.weight"], None),
            "output.weight": (w["lm_head.weight"], 0)}
    for name, a in w.items():
        if not name.startswith("model.layers."):
            continue
        layer, rest = name[len("model.layers."):].split(".", 1)
        meta_name, dim = META[rest]
        if rest == "self_attn.q_proj.weight":
            a = interleaved(a, cfg["num_attention_heads"])
        elif rest == "self_attn.k_proj.weight":
            a = interleaved(a, cfg["num_key_value_heads"])
        full["layers.%s.%s" % (layer, meta_name)] = (a, dim)
    for r in range(ranks):
        part = {}
        for name, (a, dim) in full.items():
            part[name] = a if dim is None else np.split(a, ranks, axis=dim)[r]
        npz = os.path.join(root, "rank%d.npz" % r)
        np.savez(npz, **{k: np.ascontiguousarray(v, dtype=np.float32) for k, v in part.items()})
        p = subprocess.run(["/usr/bin/python3", "-c", _SAVE, npz,
                            os.path.join(root, "consolidated.%02d.pth" % r)],
                           capture_output=True, timeout=120)
        os.unlink(npz)
        if p.returncode != 0:
            return None, p.stderr.decode(errors="replace")[-300:]
    params = {"dim": cfg["hidden_size"], "n_layers": cfg["num_hidden_layers"],
              "n_heads": cfg["num_attention_heads"], "n_kv_heads": cfg["num_key_value_heads"],
              "vocab_size": cfg["vocab_size"], "multiple_of": 32, "norm_eps": cfg["rms_norm_eps"],
              "rope_theta": cfg["rope_theta"]}
    with open(os.path.join(root, "params.json"), "w") as f:
        json.dump(params, f)
    with open(os.path.join(root, "tokenizer.json"), "w") as f:
        json.dump(L.tokenizer_json(), f)
    return root, None
