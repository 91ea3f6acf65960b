#!/usr/bin/python3
"""peft 0.21: PeftModel.from_pretrained loads the NeMo Automodel PEFT adapter
(tests/gen/nemo_fixtures.py: LoRA A/B of q_proj and v_proj, r 4) from a ckptfs mount, and the
model's logits for a fixed prompt equal, exactly (torch.equal), those of the same base model
with the adapter loaded from the original files; the adapter's weights in the model equal the
original ones, and the adapter changes the base model's logits (so the check can tell).

Mounted: the step directory (.ckptfs/hf/ and, with -o view=hf, the mountpoint itself) and the
bare adapter directory. The base model is a tiny Llama made here from a seed (hidden size 8,
so q_proj and v_proj are the 8 x 8 the adapter targets)."""

import os
import sys

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
from clients_env import under_clients  # noqa: E402

under_clients("torch", "transformers", "peft")

import torch  # noqa: E402
from peft import PeftModel  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

import mount_checks as mc  # noqa: E402

PROMPT = torch.tensor([[1, 5, 9, 3, 7, 2]])


def base_model():
    torch.manual_seed(92)
    cfg = LlamaConfig(hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, vocab_size=32,
                      max_position_embeddings=16)
    return LlamaForCausalLM(cfg).eval()


def with_adapter(path):
    """(logits, {lora weight name: tensor}) of the base model with the adapter at path."""
    model = PeftModel.from_pretrained(base_model(), path).eval()
    with torch.no_grad():
        logits = model(PROMPT).logits
    lora = {k: v.detach().clone() for k, v in model.state_dict().items() if "lora_" in k}
    return logits, lora


def compare(tap, label, path, want_logits, want_lora):
    try:
        logits, lora = with_adapter(path)
    except Exception as e:
        tap.ok(False, "%s: PeftModel.from_pretrained loads it" % label,
               ["%s: %s" % (type(e).__name__, e)])
        return
    tap.ok(set(lora) == set(want_lora) and all(torch.equal(lora[k], want_lora[k]) for k in lora),
           "%s: the %d LoRA weights loaded equal the original files'" % (label, len(lora)),
           [sorted(set(lora) ^ set(want_lora))])
    tap.ok(torch.equal(logits, want_logits),
           "%s: logits equal the adapter loaded from the original files" % label,
           ["max |diff| %g" % (logits - want_logits).abs().max().item()])


def main():
    started = mc.start("nemo", "nemo_fixtures.py")
    if not started:
        return 0
    tap, ckptfs, root = started
    step = os.path.join(root, "step_peft", "epoch_0_step_20")
    bare = os.path.join(root, "peft_only", "adapter")
    want_logits, want_lora = with_adapter(os.path.join(step, "model"))
    with torch.no_grad():
        plain = base_model()(PROMPT).logits
    tap.ok(len(want_lora) == 4 and not torch.equal(plain, want_logits),
           "the original adapter loads (4 LoRA weights) and changes the base model's logits")
    bare_logits, bare_lora = with_adapter(bare)

    mc.mounted(tap, ckptfs, step, "step_peft",
               lambda mnt: compare(tap, "step_peft .ckptfs/hf", os.path.join(mnt, ".ckptfs", "hf"),
                                   want_logits, want_lora))
    mc.mounted(tap, ckptfs, step, "step_peft -o view=hf",
               lambda mnt: compare(tap, "step_peft -o view=hf", mnt, want_logits, want_lora),
               options=["-o", "view=hf"])
    mc.mounted(tap, ckptfs, bare, "peft_only",
               lambda mnt: compare(tap, "peft_only .ckptfs/hf", os.path.join(mnt, ".ckptfs", "hf"),
                                   bare_logits, bare_lora))
    return mc.finish(tap)


if __name__ == "__main__":
    sys.exit(main())
