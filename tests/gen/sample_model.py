#!/usr/bin/python3
"""Writes the demo checkpoint: a tiny two-layer decoder as a Hugging Face directory with two
safetensors shards, an index and a config. Standard library only, deterministic."""
import json
import math
import os
import struct
import sys

HIDDEN, VOCAB, LAYERS = 8, 16, 2


def values(name, count):
    # Smooth, recognisable numbers: easy to spot in `od` output.
    seed = sum(name.encode()) % 97
    return [round(math.sin(seed + i * 0.37), 4) for i in range(count)]


def tensors():
    out = [("model.embed_tokens.weight", [VOCAB, HIDDEN])]
    for layer in range(LAYERS):
        p = f"model.layers.{layer}."
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            out.append((p + f"self_attn.{proj}.weight", [HIDDEN, HIDDEN]))
        out.append((p + "mlp.up_proj.weight", [2 * HIDDEN, HIDDEN]))
        out.append((p + "mlp.down_proj.weight", [HIDDEN, 2 * HIDDEN]))
        out.append((p + "input_layernorm.weight", [HIDDEN]))
    out.append(("model.norm.weight", [HIDDEN]))
    out.append(("lm_head.weight", [VOCAB, HIDDEN]))
    return out


def write_shard(path, items):
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, shape in items:
        data = struct.pack(f"<{math.prod(shape)}f", *values(name, math.prod(shape)))
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    return offset


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    items = tensors()
    half = len(items) // 2
    shards = {"model-00001-of-00002.safetensors": items[:half],
              "model-00002-of-00002.safetensors": items[half:]}
    total, weight_map = 0, {}
    for fname, part in shards.items():
        total += write_shard(os.path.join(out, fname), part)
        weight_map.update({name: fname for name, _ in part})
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        f.write(json.dumps(index, indent=2, sort_keys=True) + "\n")
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HIDDEN,
              "num_hidden_layers": LAYERS, "vocab_size": VOCAB, "torch_dtype": "float32"}
    with open(os.path.join(out, "config.json"), "w") as f:
        f.write(json.dumps(config, indent=2) + "\n")


if __name__ == "__main__":
    main()
