#!/usr/bin/python3
"""convert HF-folder -> .gguf writes the key-values llama.cpp's own converter writes (issue 28
item 2), read back by gguf-py's GGUFReader and compared with what gguf-py's SpecialVocab
(the code convert_hf_to_gguf.py runs over tokenizer.json, tokenizer_config.json and
config.json) takes from the same folder: special token ids, add_bos_token / add_eos_token,
chat_template, merges. Both come from the real client environment ($CLIENTS_PY, gguf 0.19);
nothing here shares code with core/.

- llama, tokenizer_config.json with add_bos_token true / add_eos_token false, bos, eos, unk
  and pad tokens and a chat template; general.type, general.name, general.size_label (gguf-py's
  model_weight_count_rounded_notation of the parameters written), general.quantization_version,
  general.file_type 0 (all F32), and 1 after --dtype f16, 32 after --dtype bf16.
- llama 3 style: no add_bos_token in tokenizer_config.json, a TemplateProcessing
  post-processor in tokenizer.json that puts bos first: add_bos_token true, as SpecialVocab says.
- gpt2 with a RobertaProcessing-free tokenizer and only config.json ids.
- rope_scaling linear: llama.rope.scaling.type / factor.
- a llama folder without tokenizer.json, and one whose tokenizer.json is not BPE: refused with
  exit 2 naming tokenizer.json, no OUT written (llama.cpp aborts on a GGUF without a vocabulary).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
from ckptfs_test import Tap, run_capture, skip_reason  # noqa: E402
import llama_ref as L  # noqa: E402

CKPTFS = os.environ.get("CKPTFS")
FIXTURES = os.environ.get("FIXTURES")
CLIENTS_PY = os.environ.get("CLIENTS_PY", "")

# Runs under $CLIENTS_PY: the GGUF's KVs and tensor element count by GGUFReader, and what
# SpecialVocab and model_weight_count_rounded_notation make of the folder.
READ = r'''
import json, sys
import numpy as np
import gguf
from gguf.utility import model_weight_count_rounded_notation
folder, path = sys.argv[1], sys.argv[2]
r = gguf.GGUFReader(path)
kv = {}
for name, field in r.fields.items():
    if name.startswith("GGUF."):
        continue
    v = field.contents()
    kv[name] = v.decode() if isinstance(v, bytes) else v
params = int(sum(int(np.prod(t.shape)) for t in r.tensors))
n_vocab = len(kv.get("tokenizer.ggml.tokens", [])) or None
sv = gguf.SpecialVocab(folder, load_merges=True, n_vocab=n_vocab)
print(json.dumps({"kv": kv, "params": params, "label": model_weight_count_rounded_notation(params),
                  "special": sv.special_token_ids, "add": sv.add_special_token,
                  "chat_template": sv.chat_template, "merges": sv.merges}, default=str))
'''

SPECIAL_KEY = {"bos": "bos_token_id", "eos": "eos_token_id", "unk": "unknown_token_id",
               "sep": "seperator_token_id", "pad": "padding_token_id", "cls": "cls_token_id",
               "mask": "mask_token_id"}


def read(folder, path):
    p = subprocess.run([CLIENTS_PY, "-c", READ, folder, path], capture_output=True, timeout=120)
    if p.returncode:
        raise RuntimeError(p.stderr.decode(errors="replace")[-600:])
    return json.loads(p.stdout)


def upstream_problems(d):
    """KVs that differ from what SpecialVocab.add_to_gguf would have written."""
    kv, bad = d["kv"], []
    for typ, tid in d["special"].items():
        key = "tokenizer.ggml." + SPECIAL_KEY[typ]
        if kv.get(key) != tid:
            bad.append("%s: %r, SpecialVocab %r" % (key, kv.get(key), tid))
    for typ in SPECIAL_KEY:
        key = "tokenizer.ggml." + SPECIAL_KEY[typ]
        if typ not in d["special"] and key in kv:
            bad.append("%s written, SpecialVocab has none" % key)
    for typ, value in d["add"].items():
        key = "tokenizer.ggml.add_%s_token" % typ
        if kv.get(key) != value:
            bad.append("%s: %r, SpecialVocab %r" % (key, kv.get(key), value))
    for key in kv:
        if key.startswith("tokenizer.ggml.add_") and key[19:-6] not in d["add"]:
            bad.append("%s written, SpecialVocab has none" % key)
    if kv.get("tokenizer.chat_template") != d["chat_template"]:
        bad.append("chat_template %r, SpecialVocab %r" % (kv.get("tokenizer.chat_template"),
                                                         d["chat_template"]))
    if kv.get("tokenizer.ggml.merges") != d["merges"]:
        bad.append("merges differ")
    return bad


def general_problems(d, name, ftype):
    kv, bad = d["kv"], []
    want = {"general.type": "model", "general.name": name, "general.size_label": d["label"],
            "general.quantization_version": 2, "general.file_type": ftype}
    for k, v in want.items():
        if kv.get(k) != v:
            bad.append("%s: %r, want %r" % (k, kv.get(k), v))
    return bad


def convert(src, out, *extra):
    return run_capture([CKPTFS, "convert", src, out] + list(extra), 120)


def llama_case(tap, work):
    hf = os.path.join(work, "Tiny-Llama")
    L.make_folder(hf)
    cfg = dict(L.CONFIG, pad_token_id=0)
    with open(os.path.join(hf, "config.json"), "w") as f:
        json.dump(cfg, f)
    tc = {"add_bos_token": True, "add_eos_token": False, "bos_token": "<s>",
          "eos_token": {"content": "</s>", "special": True}, "unk_token": "<unk>",
          "pad_token": None, "chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}"}
    with open(os.path.join(hf, "tokenizer_config.json"), "w") as f:
        json.dump(tc, f)
    for dtype, ftype in ((None, 0), ("f16", 1), ("bf16", 32)):
        out = os.path.join(work, "llama-%s.gguf" % (dtype or "f32"))
        rc, _, err = convert(hf, out, *(["--dtype", dtype] if dtype else []))
        if not tap.ok(rc == 0, "llama %s: convert" % (dtype or "as stored"), [err]):
            continue
        d = read(hf, out)
        bad = general_problems(d, "Tiny-Llama", ftype)
        tap.ok(not bad, "llama %s: general.type/name/size_label/quantization_version, "
               "file_type %d" % (dtype or "as stored", ftype), bad)
        if dtype:
            continue
        bad = upstream_problems(d)
        kv = d["kv"]
        tap.ok(not bad and kv.get("tokenizer.ggml.add_bos_token") is True and
               kv.get("tokenizer.ggml.add_eos_token") is False and
               kv.get("tokenizer.ggml.unknown_token_id") == 0,
               "llama: special ids, add_bos_token true, add_eos_token false, chat_template, "
               "merges as SpecialVocab takes them", bad + [d["add"], d["special"]])


def llama3_case(tap, work):
    hf = os.path.join(work, "llama3")
    L.make_folder(hf)
    tok = L.tokenizer_json()
    tok["post_processor"] = {"type": "Sequence", "processors": [
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        {"type": "TemplateProcessing",
         "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                    {"Sequence": {"id": "A", "type_id": 0}}],
         "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                  {"SpecialToken": {"id": "<s>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
         "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}}]}
    with open(os.path.join(hf, "tokenizer.json"), "w") as f:
        json.dump(tok, f)
    with open(os.path.join(hf, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<s>", "eos_token": "</s>"}, f)
    out = os.path.join(work, "llama3.gguf")
    rc, _, err = convert(hf, out)
    if not tap.ok(rc == 0, "llama 3 style: convert", [err]):
        return
    d = read(hf, out)
    bad = upstream_problems(d)
    tap.ok(not bad and d["kv"].get("tokenizer.ggml.add_bos_token") is True,
           "llama 3 style: add_bos_token from tokenizer.json's TemplateProcessing, as SpecialVocab",
           bad + [d["add"]])


def gpt2_case(tap, work):
    import numpy as np
    hf = os.path.join(work, "gpt2")
    os.makedirs(hf)
    E, V, P = 16, 300, 32
    cfg = {"model_type": "gpt2", "n_embd": E, "n_layer": 1, "n_head": 2, "n_positions": P,
           "vocab_size": V, "bos_token_id": 1, "eos_token_id": 2}
    rng = np.random.default_rng(3)
    w = {"wte.weight": rng.standard_normal((V, E)), "wpe.weight": rng.standard_normal((P, E)),
         "ln_f.weight": np.ones(E), "ln_f.bias": np.zeros(E)}
    for n, shape in (("ln_1.weight", (E,)), ("ln_1.bias", (E,)), ("ln_2.weight", (E,)),
                     ("ln_2.bias", (E,)), ("attn.c_attn.weight", (E, 3 * E)),
                     ("attn.c_attn.bias", (3 * E,)), ("attn.c_proj.weight", (E, E)),
                     ("attn.c_proj.bias", (E,)), ("mlp.c_fc.weight", (E, 4 * E)),
                     ("mlp.c_fc.bias", (4 * E,)), ("mlp.c_proj.weight", (4 * E, E)),
                     ("mlp.c_proj.bias", (E,))):
        w["h.0." + n] = rng.standard_normal(shape)
    L.write_safetensors(os.path.join(hf, "model.safetensors"), w)
    with open(os.path.join(hf, "config.json"), "w") as f:
        json.dump(cfg, f)
    with open(os.path.join(hf, "tokenizer.json"), "w") as f:
        json.dump(L.tokenizer_json(), f)
    out = os.path.join(work, "gpt2.gguf")
    rc, _, err = convert(hf, out, "--dtype", "f16")
    if not tap.ok(rc == 0, "gpt2: convert --dtype f16", [err]):
        return
    d = read(hf, out)
    bad = upstream_problems(d) + general_problems(d, "gpt2", 1)
    tap.ok(not bad and d["kv"].get("tokenizer.ggml.bos_token_id") == 1,
           "gpt2: bos/eos ids from config.json, general.* and file_type 1, as upstream", bad)


def rope_scaling_case(tap, work):
    hf = os.path.join(work, "scaled")
    L.make_folder(hf, dict(L.CONFIG, rope_scaling={"type": "linear", "factor": 4.0}))
    out = os.path.join(work, "scaled.gguf")
    rc, _, err = convert(hf, out)
    kv = read(hf, out)["kv"] if rc == 0 else {}
    tap.ok(kv.get("llama.rope.scaling.type") == "linear" and
           kv.get("llama.rope.scaling.factor") == 4.0,
           "rope_scaling linear: llama.rope.scaling.type and factor", [err, sorted(kv)])


def refused_cases(tap, work):
    for what, change in (("without tokenizer.json", lambda d: os.unlink(os.path.join(d, "tokenizer.json"))),
                         ("with a WordPiece tokenizer.json", lambda d: open(
                             os.path.join(d, "tokenizer.json"), "w").write(json.dumps(
                                 {"model": {"type": "WordPiece", "vocab": {"a": 0}}})))):
        hf = os.path.join(work, "novocab-%d" % len(what))
        L.make_folder(hf)
        change(hf)
        out = os.path.join(work, "novocab.gguf")
        rc, _, err = convert(hf, out)
        e = err.decode(errors="replace")
        tap.ok(rc == 2 and "tokenizer.json" in e and "vocabulary" in e and len(e.splitlines()) == 1
               and not os.path.exists(out),
               "a llama folder %s is refused (exit 2, the reason on one line, no OUT)" % what,
               [rc, e])


def main():
    why = skip_reason(CKPTFS, FIXTURES)
    if not why and not os.access(CLIENTS_PY, os.X_OK):
        why = "CLIENTS_PY (%r) is not set: make deps-clients" % CLIENTS_PY
    if why:
        print("1..0 # SKIP %s" % why)
        return 0
    tap = Tap()
    work = tempfile.mkdtemp(prefix="ckptfs-t86.")
    try:
        llama_case(tap, work)
        llama3_case(tap, work)
        gpt2_case(tap, work)
        rope_scaling_case(tap, work)
        refused_cases(tap, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    tap.done()
    return 0 if tap.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
