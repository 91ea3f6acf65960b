#!/usr/bin/python3
"""The HF view leaves out a tied lm_head as save_pretrained does (issue 28 item 10).

A .bin repo written here with real torch (/usr/bin/python3, torch.save of a state dict whose
lm_head.weight and model.embed_tokens.weight share one storage) and a config.json with
"tie_word_embeddings": true: the view's model.safetensors (its header read here, not by
ckptfs) holds the embedding once and no lm_head.weight, its size is one copy smaller, and
transformers ($CLIENTS_PY, when present) loads it with lm_head tied to the embedding. The
mount's tensor tree still shows both names. Without the config's tie, or with a head stored
apart, lm_head.weight stays in the view.
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from ckptfs_test import Tap, is_mounted, run_capture, unmount  # noqa: E402

ROOT = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", ".."))
CKPTFS = os.environ.get("CKPTFS") or os.path.join(ROOT, "build", "ckptfs")
CLIENTS_PY = os.environ.get("CLIENTS_PY", "")
VOCAB, HIDDEN = 64, 16

MAKE = r"""
import sys, torch
out, tied = sys.argv[1], sys.argv[2] == "tied"
g = torch.Generator().manual_seed(7)
emb = torch.randn(%d, %d, generator=g)
sd = {"model.embed_tokens.weight": emb,
      "model.norm.weight": torch.ones(%d),
      "lm_head.weight": emb if tied else emb.clone() * 2}
torch.save(sd, out)
""" % (VOCAB, HIDDEN, HIDDEN)

CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": VOCAB,
          "hidden_size": HIDDEN, "intermediate_size": 32, "num_hidden_layers": 0,
          "num_attention_heads": 2, "num_key_value_heads": 2, "max_position_embeddings": 64,
          "rms_norm_eps": 1e-6, "torch_dtype": "float32"}

LOAD = r"""
import sys, torch, transformers
m = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1])
sd = torch.load(sys.argv[2])
ok = torch.equal(m.lm_head.weight, sd["model.embed_tokens.weight"]) and \
     m.lm_head.weight.data_ptr() == m.model.embed_tokens.weight.data_ptr()
print("tied-ok" if ok else "tied-wrong")
"""


def st_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n)), os.path.getsize(path)


def repo(t, name, tied_storage, tie_config):
    d = os.path.join(t, name)
    os.makedirs(d)
    subprocess.run(["/usr/bin/python3", "-c", MAKE, os.path.join(d, "pytorch_model.bin"),
                    "tied" if tied_storage else "apart"], check=True, timeout=120)
    cfg = dict(CONFIG)
    if tie_config is not None:
        cfg["tie_word_embeddings"] = tie_config
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    return d


def mounted_view(tap, src, mnt, fn):
    os.makedirs(mnt, exist_ok=True)  # unmount() removes it
    rc, _, err = run_capture([CKPTFS, src, mnt, "-o", "view=hf"], 60)
    if not tap.ok(rc == 0 and is_mounted(mnt), "mount %s -o view=hf" % os.path.basename(src),
                  [err]):
        return
    try:
        fn()
    finally:
        unmount(mnt)


def main():
    tap = Tap()
    if not os.path.exists("/dev/fuse"):
        print("1..0 # SKIP no /dev/fuse")
        return 0
    with tempfile.TemporaryDirectory() as t:
        mnt = os.path.join(t, "mnt")
        os.makedirs(mnt)
        tied = repo(t, "tied", True, True)
        rc, out, _ = run_capture([CKPTFS, "ls", tied], 60)
        tap.ok(rc == 0 and b"lm_head.weight" in out.split(),
               "the tensor list still names lm_head.weight", [out])

        def check_tied():
            h, size = st_header(os.path.join(mnt, "model.safetensors"))
            names = sorted(k for k in h if k != "__metadata__")
            tap.ok(names == ["model.embed_tokens.weight", "model.norm.weight"],
                   "tied: the view holds the embedding once and no lm_head.weight", names)
            data = VOCAB * HIDDEN * 4 + HIDDEN * 4
            tap.ok(size - 8 - struct.unpack("<Q", open(os.path.join(mnt, "model.safetensors"),
                                                       "rb").read(8))[0] == data,
                   "tied: model.safetensors holds one copy of the embedding (%d data bytes)"
                   % data, [size])
            if CLIENTS_PY and os.path.exists(CLIENTS_PY):
                p = subprocess.run([CLIENTS_PY, "-c", LOAD, mnt,
                                    os.path.join(tied, "pytorch_model.bin")],
                                   capture_output=True, text=True, timeout=300)
                tap.ok(p.returncode == 0 and "tied-ok" in p.stdout,
                       "transformers loads the view with lm_head tied to the embedding",
                       [p.stdout, p.stderr[-2000:]])
            else:
                tap.skip("transformers loads the view", "no CLIENTS_PY (make deps-clients)")
        mounted_view(tap, tied, mnt, check_tied)

        for name, storage, config, why in (("untied-config", True, False, "config says false"),
                                           ("no-config-key", True, None, "config is silent"),
                                           ("apart", False, True, "head stored apart")):
            src = repo(t, name, storage, config)

            def check_kept(why=why):
                h, _ = st_header(os.path.join(mnt, "model.safetensors"))
                tap.ok("lm_head.weight" in h, "%s: lm_head.weight stays in the view" % why,
                       sorted(h))
            mounted_view(tap, src, mnt, check_kept)
    tap.done()
    return 1 if tap.failed else 0


if __name__ == "__main__":
    sys.exit(main())
