#!/usr/bin/python3
"""Write the torch.save files of the layout fixtures with REAL torch (python3-torch 1.13).

usage: torch_layouts_fixtures.py            regenerate tests/fixtures/torch_layouts/ (committed)
       torch_layouts_fixtures.py --out DIR  write them somewhere else
       torch_layouts_fixtures.py OUTDIR     what the Makefile runs: the files are committed (so
                                            `make check` needs no torch); writes nothing

The files are written the way their producers write them (read from their sources):
  bin_single/pytorch_model.bin   transformers save_pretrained(safe_serialization=False) of an
                                 unsharded model: torch.save(state_dict) of the module, an
                                 OrderedDict with _metadata (the config unties lm_head)
  bin_sharded/pytorch_model-0000N-of-00002.bin + pytorch_model.bin.index.json
                                 a sharded save: each shard torch.save({name: t.contiguous()}),
                                 the index {"metadata": {"total_size": N}, "weight_map": {...}}
                                 with shards filled in state_dict order up to max_shard_size
  pt/step100.pt, pt/step200.pt   training checkpoints {"model": state_dict, "step": N}
  nemo/model_weights.ckpt        NeMo 1.x: torch.save(model.state_dict()) of a Megatron GPT with
                                 NeMo's key names (model.language_model.embedding...,
                                 model.language_model.encoder.layers.N...)
The generator computes with torch, not ckptfs code, what each must show: per tensor its name,
dtype, shape and the sha256 of its row-major bytes (manifest.json).
"""

import collections
import hashlib
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
from fixture_lib import committed_torch_main  # noqa: E402

COMMITTED = os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "fixtures",
                         "torch_layouts")

HIDDEN, INTER, VOCAB, LAYERS = 16, 24, 32, 2


def dtype_name(torch, dt):
    return {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
            torch.int64: "I64"}[dt]


def tensor_record(torch, t):
    c = t.detach().contiguous()
    raw = (c.view(torch.int16) if c.dtype == torch.bfloat16 else c).numpy().tobytes()
    return {"dtype": dtype_name(torch, c.dtype), "shape": list(c.shape),
            "nbytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest()}


def llama_module(torch, dtype):
    """A tiny LlamaForCausalLM-shaped module: the parameter names transformers' Llama has."""
    nn = torch.nn

    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            for p in ("q_proj", "k_proj", "v_proj", "o_proj"):
                setattr(self, p, nn.Linear(HIDDEN, HIDDEN, bias=False))

    class Mlp(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj = nn.Linear(HIDDEN, INTER, bias=False)
            self.up_proj = nn.Linear(HIDDEN, INTER, bias=False)
            self.down_proj = nn.Linear(INTER, HIDDEN, bias=False)

    class Norm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.rand(HIDDEN))

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.self_attn = Attn()
            self.mlp = Mlp()
            self.input_layernorm = Norm()
            self.post_attention_layernorm = Norm()

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = nn.Embedding(VOCAB, HIDDEN)
            self.layers = nn.ModuleList([Layer() for _ in range(LAYERS)])
            self.norm = Norm()

    class CausalLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = Model()
            self.lm_head = nn.Linear(HIDDEN, VOCAB, bias=False)

    return CausalLM().to(dtype)


def config(dtype):
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_size": HIDDEN, "intermediate_size": INTER, "vocab_size": VOCAB,
            "num_hidden_layers": LAYERS, "num_attention_heads": 4, "num_key_value_heads": 4,
            "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
            "torch_dtype": dtype}


def write_json(path, doc):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=2, sort_keys=True)
        f.write("\n")


def records(torch, sd):
    return {k: tensor_record(torch, v) for k, v in sd.items()}


def bin_single(torch, out):
    d = os.path.join(out, "bin_single")
    os.makedirs(d)
    torch.manual_seed(1)
    sd = llama_module(torch, torch.float32).state_dict()
    torch.save(sd, os.path.join(d, "pytorch_model.bin"))
    write_json(os.path.join(d, "config.json"), config("float32"))
    write_json(os.path.join(d, "generation_config.json"), {"bos_token_id": 1, "eos_token_id": 2})
    return {"tensors": records(torch, sd)}


def bin_sharded(torch, out):
    d = os.path.join(out, "bin_sharded")
    os.makedirs(d)
    torch.manual_seed(2)
    sd = llama_module(torch, torch.bfloat16).state_dict()
    # transformers' sharding: fill shards in state_dict order up to max_shard_size.
    limit = sum(v.numel() * v.element_size() for v in sd.values()) // 2
    shards, cur, size = [], collections.OrderedDict(), 0
    for k, v in sd.items():
        n = v.numel() * v.element_size()
        if cur and size + n > limit:
            shards.append(cur)
            cur, size = collections.OrderedDict(), 0
        cur[k] = v
        size += n
    shards.append(cur)
    weight_map, total = {}, 0
    for i, shard in enumerate(shards):
        name = "pytorch_model-%05d-of-%05d.bin" % (i + 1, len(shards))
        torch.save({k: v.contiguous() for k, v in shard.items()}, os.path.join(d, name))
        for k, v in shard.items():
            weight_map[k] = name
            total += v.numel() * v.element_size()
    write_json(os.path.join(d, "pytorch_model.bin.index.json"),
               {"metadata": {"total_size": total}, "weight_map": weight_map})
    write_json(os.path.join(d, "config.json"), config("bfloat16"))
    write_json(os.path.join(d, "tokenizer_config.json"), {"model_max_length": 64})
    return {"tensors": records(torch, sd), "weight_map": weight_map}


def pt_files(torch, out):
    d = os.path.join(out, "pt")
    os.makedirs(d)
    files = {}
    for step in (100, 200):
        torch.manual_seed(step)
        sd = llama_module(torch, torch.float32).state_dict()
        name = "step%d.pt" % step
        torch.save({"model": sd, "step": step}, os.path.join(d, name))
        files[name] = {"model." + k: r for k, r in records(torch, sd).items()}
    return {"files": files}


def nemo_weights(torch, out):
    """NeMo 1.x Megatron GPT state_dict key names (MegatronGPTModel.state_dict())."""
    d = os.path.join(out, "nemo")
    os.makedirs(d)
    torch.manual_seed(3)
    p = "model.language_model."
    sd = collections.OrderedDict()
    sd[p + "embedding.word_embeddings.weight"] = torch.randn(VOCAB, HIDDEN, dtype=torch.float16)
    for i in range(LAYERS):
        lp = "%sencoder.layers.%d." % (p, i)
        sd[lp + "input_layernorm.weight"] = torch.rand(HIDDEN, dtype=torch.float16)
        sd[lp + "input_layernorm.bias"] = torch.rand(HIDDEN, dtype=torch.float16)
        sd[lp + "self_attention.query_key_value.weight"] = torch.randn(3 * HIDDEN, HIDDEN,
                                                                       dtype=torch.float16)
        sd[lp + "self_attention.dense.weight"] = torch.randn(HIDDEN, HIDDEN, dtype=torch.float16)
        sd[lp + "mlp.dense_h_to_4h.weight"] = torch.randn(INTER, HIDDEN, dtype=torch.float16)
        sd[lp + "mlp.dense_4h_to_h.weight"] = torch.randn(HIDDEN, INTER, dtype=torch.float16)
    sd[p + "encoder.final_layernorm.weight"] = torch.rand(HIDDEN, dtype=torch.float16)
    sd[p + "output_layer.weight"] = torch.randn(VOCAB, HIDDEN, dtype=torch.float16)
    torch.save(sd, os.path.join(d, "model_weights.ckpt"))
    return {"tensors": records(torch, sd)}


def build(torch, out):
    manifest = {"torch_version": torch.__version__,
                "bin_single": bin_single(torch, out),
                "bin_sharded": bin_sharded(torch, out),
                "pt": pt_files(torch, out),
                "nemo": nemo_weights(torch, out)}
    write_json(os.path.join(out, "manifest.json"), manifest)


def main(argv):
    out = committed_torch_main(argv, "torch layout", COMMITTED, __doc__, build)
    if not isinstance(out, str):
        return out
    print("wrote %s" % out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
