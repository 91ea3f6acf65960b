#!/usr/bin/python3
"""NeMo Automodel step-directory fixtures for ckptfs.

usage: nemo_fixtures.py OUTDIR

A step directory (epoch_0_step_20/) as NeMo Automodel writes it: model/ (DCP-HF shards
shard-0000R-model-00001-of-00001.safetensors, or native DCP, or a PEFT adapter),
model/.hf_metadata/ (config, generation config, fqn_to_file_index_mapping, tokenizer files),
optionally model/consolidated/ (model-00001-of-00001.safetensors + index + config), optim/
(native DCP), and the training state beside them (config.yaml, losses.json, step_scheduler.pt,
dataloader/, rng/).

Standard library + numpy only, deterministic.  The shards and consolidated files come from the
writer of tests/gen/dcphf_fixtures.py (imported); the native DCP parts (optim/, a torch_save
model/) are copied from the committed torch fixtures tests/fixtures/dcp/nemo_optim and
nemo_model_dcp (written with real torch by tests/gen/dcp_fixtures.py), whose manifests give
their tensors.

Cases (OUTDIR/<case>/manifest.json; "source" is the directory to mount, relative to the case):
  step_dcphf             shards + .hf_metadata + optim/ + training state
  step_consolidated      ... + model/consolidated/ agreeing with the shards (the shards back model/)
  step_consolidated_differs  a consolidated copy with one tensor missing and one of another shape
  step_consolidated_damaged  a consolidated copy with a damaged header (a warning, still mounts)
  step_consolidated_only model/ holds only consolidated/: it backs model/
  step_torch_save        model/ is native DCP (model_save_format torch_save)
  step_peft              model/ is a PEFT adapter (adapter_model.safetensors + adapter_config.json)
  peft_only              a bare adapter directory: its tensors at the root
  model_dir              model/ of a step mounted on its own (shards + .hf_metadata)
  optim_only             a step directory with optim/ only
  hostile/               refused inputs, cases.tsv: path <TAB> needle <TAB> description

manifest.json: {"source", "format", "warnings": [substrings], "nemo": {expected members of
metadata.json's "nemo"}, "tensors": [{"name", "path", "dtype", "shape", "nbytes", "sha256",
"aside", "source_prefix" (the relative path every sidecar source starts with)}],
"hf_tensors": [names the HF view's model.safetensors holds], "hf_files": {name: sha256 of the
file .ckptfs/hf/ shows as it is}}
"""

import hashlib
import json
import os
import pickle
import shutil
import sys

import numpy as np

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, HERE)
import dcphf_fixtures as hf  # noqa: E402
import fixture_lib  # noqa: E402
from fixture_lib import fresh_out, write_cases  # noqa: E402

COMMITTED_DCP = os.path.normpath(os.path.join(HERE, "..", "fixtures", "dcp"))
STEP = "epoch_0_step_20"
SEED = 20250707

CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8,
          "intermediate_size": 12, "num_attention_heads": 2, "num_hidden_layers": 1,
          "vocab_size": 32, "torch_dtype": "bfloat16"}
MODEL = [("model.embed_tokens.weight", [32, 8]),
         ("model.layers.0.self_attn.q_proj.weight", [8, 8]),
         ("model.layers.0.mlp.down_proj.weight", [8, 12]),
         ("model.norm.weight", [8]),
         ("lm_head.weight", [32, 8])]


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode("utf-8"))


def jdump(obj):
    return json.dumps(obj, indent=2, sort_keys=True) + "\n"


def sha(data):
    return hashlib.sha256(data if isinstance(data, bytes) else data.encode("utf-8")).hexdigest()


def torch_save_zip(obj):
    """What torch.save writes for an object without tensors: archive/data.pkl + version."""
    return fixture_lib.torch_save_zip(pickle.dumps(obj, protocol=2))


class Case:
    def __init__(self, out, name, source, fmt):
        self.dir = os.path.join(out, name)
        self.man = {"source": source, "format": fmt, "warnings": [], "nemo": {}, "tensors": [],
                    "hf_tensors": [], "hf_files": {}}

    def path(self, *parts):
        return os.path.join(self.dir, *parts)

    def tensor(self, name, path, dtype, shape, data_sha, nbytes, aside, source_prefix,
               in_hf=True):
        # Sidecars name files relative to the mounted directory.
        top = self.man["source"] + "/"
        if source_prefix.startswith(top):
            source_prefix = source_prefix[len(top):]
        self.man["tensors"].append({"name": name, "path": path, "dtype": dtype, "shape": shape,
                                    "nbytes": nbytes, "sha256": data_sha, "aside": aside,
                                    "source_prefix": source_prefix})
        if in_hf and not aside:
            self.man["hf_tensors"].append(name)

    def aux(self, rel, data, name=None):
        write(self.path(rel), data)
        self.man["hf_files"].setdefault(name or os.path.basename(rel), sha(data))

    def done(self):
        self.man["tensors"].sort(key=lambda t: t["path"])
        self.man["hf_tensors"].sort()
        write(self.path("manifest.json"), jdump(self.man))


# ---------------------------------------------------------------------------
# Pieces

def model_tensors(rng):
    return [hf.Tensor(n, "BF16", s, rng) for n, s in MODEL]


def write_shards(c, mdir_rel, tensors, prefix):
    """FSDP2-style shards (dim 0 over 2 ranks) written by NeMo's writer; prefix: where the
    mount shows them ("model/" in a step, "" for a model directory)."""
    plans = [(t, hf.plan_split(t, 2, [(0, 2)])) for t in tensors]
    hf.write_ranks(c.path(mdir_rel), plans, 2, style="automodel")
    for t in tensors:
        data = t.array.tobytes()
        c.tensor(t.name, prefix + t.name.replace(".", "/"), t.dtype, t.shape, sha(data),
                 len(data), False, mdir_rel + "/shard-" if mdir_rel else "shard-")


def write_hf_metadata(c, mdir_rel, tokenizer=True):
    rel = os.path.join(mdir_rel, ".hf_metadata") if mdir_rel else ".hf_metadata"
    c.aux(os.path.join(rel, "config.json"), jdump(CONFIG))
    c.aux(os.path.join(rel, "generation_config.json"), jdump({"bos_token_id": 1,
                                                              "eos_token_id": 2}))
    write(c.path(rel, "fqn_to_file_index_mapping.json"), jdump({n: 1 for n, _ in MODEL}))
    if tokenizer:
        c.aux(os.path.join(rel, "tokenizer_config.json"), jdump({"model_max_length": 64}))
        c.aux(os.path.join(rel, "tokenizer.json"), jdump({"version": "1.0", "model": {}}))


def write_consolidated(c, mdir_rel, tensors, differs=False, config=True):
    """model/consolidated/: one HF file + index (+ config), as the consolidation step writes."""
    rel = os.path.join(mdir_rel, "consolidated")
    ents = []
    for t in tensors:
        if differs and t.name == "lm_head.weight":
            continue                    # missing from the copy
        shape = list(t.shape)
        data = t.array.tobytes()
        if differs and t.name == "model.norm.weight":
            shape, data = [4, 2], data  # another shape, same bytes
        ents.append((t.name, t.dtype, shape, data))
    fname = "model-00001-of-00001.safetensors"
    hf.write_safetensors(c.path(rel, fname), ents, None, "consolidated")
    write(c.path(rel, "model.safetensors.index.json"),
          jdump({"metadata": {"total_size": sum(len(e[3]) for e in ents)},
                 "weight_map": {e[0]: fname for e in ents}}))
    if config:
        c.aux(os.path.join(rel, "config.json"), jdump(CONFIG))
        c.aux(os.path.join(rel, "special_tokens_map.json"), jdump({"bos_token": "<s>"}))
    return rel


def copy_dcp(c, name, dest_rel, path_prefix, source_prefix):
    """A committed torch DCP fixture copied to dest_rel; its tensors as the step shows them."""
    src = os.path.join(COMMITTED_DCP, name)
    dst = c.path(dest_rel)
    os.makedirs(dst, exist_ok=True)
    for f in os.listdir(src):
        if f != "manifest.json":
            shutil.copyfile(os.path.join(src, f), os.path.join(dst, f))
    with open(os.path.join(src, "manifest.json"), encoding="utf-8") as f:
        man = json.load(f)
    for t in man["tensors"]:
        path = t["path"] if t["aside"] else path_prefix + t["path"]
        c.tensor(t["name"], path, t["dtype"], t["shape"], t["sha256"], t["nbytes"], t["aside"],
                 source_prefix)
    return man


def write_training_state(c, root_rel):
    write(c.path(root_rel, "config.yaml"), "step_scheduler:\n  ckpt_every_steps: 20\n")
    write(c.path(root_rel, "losses.json"), jdump({"20": 1.25}))
    write(c.path(root_rel, "step_scheduler.pt"),
          torch_save_zip({"step": 20, "epoch": 0, "grad_acc_steps": 4, "max_steps": 100}))
    for d, n in (("dataloader", "dataloader_dp_rank_%d.pt"), ("rng", "rng_dp_rank_%d.pt")):
        for r in range(2):
            write(c.path(root_rel, d, n % r), torch_save_zip({"rank": r}))
    c.man["nemo"]["other_files"] = ["config.yaml", "dataloader/", "losses.json", "rng/",
                                    "step_scheduler.pt"]
    c.man["nemo"]["step_scheduler"] = {"step": 20, "epoch": 0, "grad_acc_steps": 4,
                                       "max_steps": 100}


def adapter(c, rel, prefix, rng):
    """adapter_model.safetensors (LoRA A/B of two projections) + adapter_config.json."""
    ents = []
    for proj, (i, o) in (("q_proj", (8, 8)), ("v_proj", (8, 8))):
        for ab, shape in (("lora_A", [4, i]), ("lora_B", [o, 4])):
            name = "base_model.model.model.layers.0.self_attn.%s.%s.weight" % (proj, ab)
            arr = rng.standard_normal(shape).astype("<f4")
            ents.append((name, "F32", shape, arr.tobytes()))
    path = c.path(rel, "adapter_model.safetensors")
    hf.write_safetensors(path, ents, {"format": "pt"}, "library")
    with open(path, "rb") as f:
        c.man["hf_files"]["adapter_model.safetensors"] = sha(f.read())
    for name, dt, shape, data in ents:
        c.tensor(name, prefix + name.replace(".", "/"), dt, shape, sha(data), len(data), False,
                 os.path.join(rel, "adapter_model.safetensors") if rel else
                 "adapter_model.safetensors")
    c.aux(os.path.join(rel, "adapter_config.json"),
          jdump({"peft_type": "LORA", "r": 4, "lora_alpha": 8,
                 "target_modules": ["q_proj", "v_proj"], "base_model_name_or_path": "tiny"}))
    write(c.path(rel, "automodel_peft_config.json"), jdump({"dim": 4}))
    c.aux(os.path.join(rel, "tokenizer_config.json"), jdump({"model_max_length": 64}))


# ---------------------------------------------------------------------------
# Cases

def step_case(out, name, rng, model="dcphf", consolidated=None, optim=True, state=True):
    c = Case(out, name, STEP, "nemo-automodel")
    c.man["nemo"]["layout"] = "step"
    m = os.path.join(STEP, "model")
    tensors = model_tensors(rng)
    if model == "dcphf":
        write_shards(c, m, tensors, "model/")
        write_hf_metadata(c, m)
        c.man["nemo"]["model"] = "dcp-hf shards"
    elif model == "dcp":
        copy_dcp(c, "nemo_model_dcp", m, "model/", "model/__")
        write_hf_metadata(c, m)
        c.man["nemo"]["model"] = "dcp"
    elif model == "consolidated_only":
        rel = write_consolidated(c, m, tensors)
        for t in tensors:
            data = t.array.tobytes()
            c.tensor(t.name, "model/" + t.name.replace(".", "/"), t.dtype, t.shape, sha(data),
                     len(data), False, "model/consolidated/model-00001-of-00001.safetensors")
        c.man["nemo"]["model"] = "consolidated safetensors"
        c.man["nemo"]["consolidated"] = {"backs_model": True}
        assert rel
    elif model == "peft":
        adapter(c, m, "adapter/", rng)
        c.man["nemo"]["model"] = "peft adapter"
    if consolidated:
        write_consolidated(c, m, tensors, differs=consolidated == "differs")
        n = len(MODEL)
        c.man["nemo"]["consolidated"] = {
            "backs_model": False, "tensors": n - 1 if consolidated == "differs" else n,
            "matching": n - 2 if consolidated == "differs" else n,
            "differing": 1 if consolidated == "differs" else 0,
            "missing": 1 if consolidated == "differs" else 0, "extra": 0}
        if consolidated == "differs":
            c.man["warnings"] += ["consolidated copy differs", "model.norm.weight"]
        if consolidated == "damaged":
            with open(c.path(m, "consolidated", "model-00001-of-00001.safetensors"), "r+b") as f:
                f.write(b"\xff" * 8)
            c.man["nemo"]["consolidated"] = {"backs_model": False}
            c.man["warnings"] += ["consolidated copy is not checked"]
    if optim:
        copy_dcp(c, "nemo_optim", os.path.join(STEP, "optim"), "", "optim/__")
        c.man["nemo"]["optim"] = "optim/.metadata"
    else:
        c.man["nemo"]["optim"] = None
    if state:
        write_training_state(c, STEP)
    c.done()


def case_peft_only(out, rng):
    c = Case(out, "peft_only", "adapter", "peft-adapter")
    c.man["nemo"] = {"layout": "peft adapter", "model": "peft adapter"}
    adapter(c, "adapter", "", rng)
    c.done()


def case_model_dir(out, rng):
    c = Case(out, "model_dir", os.path.join(STEP, "model"), "nemo-automodel")
    c.man["nemo"] = {"layout": "model directory", "model": "dcp-hf shards"}
    write_shards(c, os.path.join(STEP, "model"), model_tensors(rng), "")
    write_hf_metadata(c, os.path.join(STEP, "model"))
    c.done()


def case_optim_only(out):
    c = Case(out, "optim_only", STEP, "nemo-automodel")
    c.man["nemo"] = {"layout": "step", "model": None, "optim": "optim/.metadata"}
    copy_dcp(c, "nemo_optim", os.path.join(STEP, "optim"), "", "optim/__")
    c.man["warnings"].append("no model/ directory")
    c.done()


def write_hostile(out, rng):
    root = os.path.join(out, "hostile")
    rows = []
    # A damaged adapter: refused like any damaged safetensors file.
    c = Case(root, "peft_bad_header", "", "")
    adapter(c, os.path.join(STEP, "model"), "adapter/", rng)
    with open(c.path(STEP, "model", "adapter_model.safetensors"), "r+b") as f:
        f.write((10 ** 12).to_bytes(8, "little"))
    rows.append(("peft_bad_header/" + STEP, "adapter_model.safetensors&header",
                 "adapter header length 10^12"))
    # optim/.metadata that would run a command: the whole step is refused.
    c = Case(root, "optim_evil", "", "")
    copy_dcp(c, "nemo_optim", os.path.join(STEP, "optim"), "", "")
    write_shards(c, os.path.join(STEP, "model"), model_tensors(rng), "model/")
    write(c.path(STEP, "optim", ".metadata"),
          b"\x80\x04cos\nsystem\nX\x0b\x00\x00\x00echo pwned\x85R.")
    rows.append(("optim_evil/" + STEP, "os.system&optim/.metadata",
                 "optim/.metadata calls os.system"))
    # A shard with a damaged DCP_SHARDING_INFO.
    c = Case(root, "shard_bad_info", "", "")
    m = os.path.join(STEP, "model")
    hf.write_safetensors(c.path(m, hf.shard_name(0)),
                         [("w", "F32", [2], np.zeros(2, "<f4").tobytes())],
                         {"DCP_SHARDING_INFO": "{not json", "format": "pt"}, "automodel")
    write(c.path(m, ".hf_metadata", "config.json"), jdump(CONFIG))
    rows.append(("shard_bad_info/" + STEP, "DCP_SHARDING_INFO&model/",
                 "a shard whose DCP_SHARDING_INFO is not JSON"))
    write_cases(root, rows, ("path", "needle", "description"))


def main(argv):
    out = fresh_out(argv, __doc__)
    if out is None:
        return 2
    rng = np.random.default_rng(SEED)
    step_case(out, "step_dcphf", rng)
    step_case(out, "step_consolidated", rng, consolidated="same")
    step_case(out, "step_consolidated_differs", rng, consolidated="differs")
    step_case(out, "step_consolidated_damaged", rng, consolidated="damaged")
    step_case(out, "step_consolidated_only", rng, model="consolidated_only", state=False)
    step_case(out, "step_torch_save", rng, model="dcp")
    step_case(out, "step_peft", rng, model="peft")
    case_peft_only(out, rng)
    case_model_dir(out, rng)
    case_optim_only(out)
    write_hostile(out, rng)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
