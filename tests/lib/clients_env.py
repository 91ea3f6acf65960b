"""What the real-client tests (tests/t/900-906) share: running under the pinned client venv
($CLIENTS_PY, `make deps-clients`), a failure that names a client that cannot be imported, a
per-case deadline that names the case when it hangs, mounting quietly, and the tiny models.

The tests start as /usr/bin/python3 (as prove runs them) and re-exec themselves with
$CLIENTS_PY, so everything after reexec_in_clients() runs with torch 2.x, transformers,
safetensors and huggingface_hub from tests/clients/requirements.txt. A client that is missing
or does not import fails the test with its name: it is never a silent skip.
"""

import gc
import json
import os
import shutil
import sys
import tempfile
import threading

from ckptfs_test import Tap, is_mounted, run_capture, skip_reason, unmount

MOUNT_TIMEOUT = 60
PROMPT = [1, 5, 9, 17, 33, 65, 100, 2]  # token ids of the fixed prompt (vocabulary 128)
SEED = 1234


def _import_problems(modules):
    problems = []
    for name in modules:
        try:
            __import__(name)
        except Exception as e:  # an ImportError, or a wheel that fails to load
            problems.append("%s (%s: %s)" % (name, type(e).__name__, e))
    return problems


def under_clients(*modules):
    """Become $CLIENTS_PY (re-exec, once) and import modules; returns only there. A missing
    interpreter or a client that does not import is one failing TAP line naming it."""
    py = os.environ.get("CLIENTS_PY", "")
    if os.environ.get("CKPTFS_IN_CLIENTS_PY") != "1":
        if not py or not os.access(py, os.X_OK):
            print("1..1\nnot ok 1 - client environment: CLIENTS_PY (%r) is not an executable "
                  "python; `make deps-clients` makes build/clients-venv" % py)
            sys.exit(1)
        os.environ["CKPTFS_IN_CLIENTS_PY"] = "1"
        sys.stdout.flush()
        os.execv(py, [py] + sys.argv)
    missing = _import_problems(modules)
    if missing:
        print("1..1\nnot ok 1 - real clients: cannot import under %s: %s" % (py, "; ".join(missing)))
        sys.exit(1)
    # Names are UTF-8 whatever the locale of the harness says.
    sys.stdout.reconfigure(encoding="utf-8", errors="backslashreplace")


def reexec_in_clients(modules):
    """Become $CLIENTS_PY and import modules; returns (tap, ckptfs) or exits (SKIP without
    FUSE or ckptfs, a named failure without a client)."""
    ckptfs = os.environ.get("CKPTFS", "")
    why = skip_reason(ckptfs, os.environ.get("FIXTURES") or "/")
    if why:
        print("1..0 # SKIP " + why)
        sys.exit(0)
    under_clients()
    # The clients' own state (token, cache, xet) in a scratch HF_HOME, never the user's; no
    # token from the environment unless a test sets one.
    import atexit
    home = tempfile.mkdtemp(prefix="ckptfs-hfhome.")
    atexit.register(shutil.rmtree, home, True)
    os.environ.update(HF_HOME=home, HF_HUB_DISABLE_TELEMETRY="1",
                      HF_HUB_DISABLE_IMPLICIT_TOKEN="1")
    for var in ("HF_TOKEN", "HF_HUB_OFFLINE", "HF_ENDPOINT", "TRANSFORMERS_OFFLINE"):
        os.environ.pop(var, None)
    tap = Tap()
    missing = _import_problems(modules)
    if missing:
        for m in missing:
            tap.ok(False, "client %s imports under %s" % (m, os.environ.get("CLIENTS_PY")))
        tap.done()
        sys.exit(1)
    return tap, os.path.abspath(ckptfs)


class Deadline:
    """A case that has not finished in `seconds` is a hang: print `not ok - CASE: hung`, abort
    the FUSE mounts it uses (so nothing stays blocked in the kernel) and end the test. The
    thread that hangs cannot be interrupted from Python, so the test ends there."""

    mounts = set()  # every mount of the test that is up

    def __init__(self, tap, case, seconds):
        self.tap, self.case, self.seconds = tap, case, seconds
        self.timer = threading.Timer(seconds, self._fire)
        self.timer.daemon = True

    def _fire(self):
        # The TAP lines first: once a mount is aborted the hung thread wakes with an error and
        # may end the interpreter before this thread is done.
        self.tap.ok(False, "%s: hung (not done in %d s)" % (self.case, self.seconds))
        self.tap.done()
        sys.stdout.flush()
        for mnt in list(Deadline.mounts):
            # Detach first (nothing may stat a hung mount), then abort its connection by its
            # device number, so the blocked request fails and no daemon is left serving it.
            minor = fuse_minor(mnt)
            run_capture(["fusermount3", "-u", "-z", mnt], 20)
            if minor is not None:
                try:
                    with open("/sys/fs/fuse/connections/%d/abort" % minor, "w") as f:
                        f.write("1")
                except OSError:
                    pass
        os._exit(1)

    def __enter__(self):
        self.timer.start()
        return self

    def __exit__(self, *exc):
        self.timer.cancel()
        return False


def fuse_minor(mnt):
    """The minor device number of the FUSE mount on mnt (its connection's number under
    /sys/fs/fuse/connections), read from mountinfo: a stat of a hung mount would hang too."""
    target = os.path.realpath(mnt)
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                fields = line.split()
                if len(fields) > 4 and fields[4] == target:
                    return int(fields[2].split(":")[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def mount(tap, ckptfs, src, label, options=(), env=None):
    """Mount src on a new directory; the mountpoint, or None after a `not ok` naming label."""
    # ckptfs-tNN.: with-timeout unmounts what a killed test NN left under that prefix.
    prefix = "ckptfs-t%s." % os.path.basename(sys.argv[0]).split("-")[0]
    mnt = tempfile.mkdtemp(prefix=prefix)
    rc, _, err = run_capture([ckptfs, src, mnt] + list(options), MOUNT_TIMEOUT) if env is None \
        else run_env([ckptfs, src, mnt] + list(options), env)
    if rc != 0 or not is_mounted(mnt):
        tap.ok(False, "%s: ckptfs %s mounts" % (label, " ".join(options)),
               ["exit status %r" % rc, err.decode("utf-8", "replace").strip()])
        os.rmdir(mnt)
        return None
    Deadline.mounts.add(mnt)
    return mnt


def run_env(argv, env):
    old = dict(os.environ)
    os.environ.update(env)
    try:
        return run_capture(argv, MOUNT_TIMEOUT)
    finally:
        os.environ.clear()
        os.environ.update(old)


def release(tap, mnt, label):
    """Unmount (after dropping the mappings of loaded models); a busy mount is a failure."""
    gc.collect()
    Deadline.mounts.discard(mnt)
    if not unmount(mnt):
        tap.ok(False, "%s: unmounts cleanly (still busy: a mapping or descriptor leaked)"
               % label)


# ---------------------------------------------------------------------------
# The tiny models, made by transformers itself with a fixed seed

def tiny_configs():
    from transformers import GPT2Config, LlamaConfig
    # intermediate_size 96 is what Meta's FeedForward makes of dim 32 with multiple_of 32, so
    # the same model also has a Meta layout; rms_norm_eps as Meta's params.json says.
    return {
        "llama": LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=96,
                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                             max_position_embeddings=64, rms_norm_eps=1e-5,
                             tie_word_embeddings=False),
        "gpt2": GPT2Config(vocab_size=128, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                           bos_token_id=0, eos_token_id=0),
    }


def make_model(name, cfg):
    import torch
    from transformers import AutoModelForCausalLM
    torch.manual_seed(SEED)
    model = AutoModelForCausalLM.from_config(cfg)
    return model.eval()


def logits(path, **kw):
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(path, **kw)
    with torch.no_grad():
        out = model(torch.tensor([PROMPT])).logits
    del model
    return out


def logits_problems(got, want):
    import torch
    if got.shape != want.shape or got.dtype != want.dtype:
        return ["logits %s %s, want %s %s" % (tuple(got.shape), got.dtype, tuple(want.shape),
                                              want.dtype)]
    if not torch.equal(got, want):
        return ["logits differ: max |diff| %g" % (got - want).abs().max().item()]
    return []


def write_bin_repo(model, out, shards):
    """A .bin repo as transformers 4.x wrote it with safe_serialization=False (transformers 5
    no longer writes one): torch.save of the state dict, tied weights included, as
    pytorch_model.bin or pytorch_model-0000i-of-0000N.bin with pytorch_model.bin.index.json."""
    import torch
    os.makedirs(out, exist_ok=True)
    model.config.save_pretrained(out)
    sd = model.state_dict()
    if shards == 1:
        torch.save(sd, os.path.join(out, "pytorch_model.bin"))
        return
    names = list(sd)
    weight_map, total = {}, 0
    for i in range(shards):
        part = names[i::shards]
        fname = "pytorch_model-%05d-of-%05d.bin" % (i + 1, shards)
        torch.save({k: sd[k] for k in part}, os.path.join(out, fname))
        for k in part:
            weight_map[k] = fname
            total += sd[k].numel() * sd[k].element_size()
    with open(os.path.join(out, "pytorch_model.bin.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


def write_meta_mp(model, out, ranks=2):
    """Meta's consolidated.NN.pth + params.json of the tiny Llama, made here from the HF
    weights by undoing what convert_llama_weights_to_hf.py does: Meta names, q/k rows back in
    Meta's rotary order, each rank's slices as fairscale cuts them (column-parallel: rows;
    row-parallel: columns; Llama 2's ParallelEmbedding: columns; norms whole everywhere)."""
    import torch
    cfg = model.config
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}

    def unpermute(w, heads):
        rows, cols = w.shape
        return w.view(heads, 2, rows // heads // 2, cols).transpose(1, 2).reshape(rows, cols)

    meta, split = {}, {}
    meta["tok_embeddings.weight"], split["tok_embeddings.weight"] = \
        sd["model.embed_tokens.weight"], 1
    meta["norm.weight"], split["norm.weight"] = sd["model.norm.weight"], None
    meta["output.weight"], split["output.weight"] = sd["lm_head.weight"], 0
    for i in range(cfg.num_hidden_layers):
        h, m = "model.layers.%d." % i, "layers.%d." % i
        rows = [
            ("attention.wq.weight", unpermute(sd[h + "self_attn.q_proj.weight"],
                                              cfg.num_attention_heads), 0),
            ("attention.wk.weight", unpermute(sd[h + "self_attn.k_proj.weight"],
                                              cfg.num_key_value_heads), 0),
            ("attention.wv.weight", sd[h + "self_attn.v_proj.weight"], 0),
            ("attention.wo.weight", sd[h + "self_attn.o_proj.weight"], 1),
            ("feed_forward.w1.weight", sd[h + "mlp.gate_proj.weight"], 0),
            ("feed_forward.w2.weight", sd[h + "mlp.down_proj.weight"], 1),
            ("feed_forward.w3.weight", sd[h + "mlp.up_proj.weight"], 0),
            ("attention_norm.weight", sd[h + "input_layernorm.weight"], None),
            ("ffn_norm.weight", sd[h + "post_attention_layernorm.weight"], None),
        ]
        for name, t, dim in rows:
            meta[m + name], split[m + name] = t, dim
    os.makedirs(out, exist_ok=True)
    for r in range(ranks):
        part = {}
        for k, t in meta.items():
            part[k] = t.clone() if split[k] is None else \
                t.chunk(ranks, dim=split[k])[r].clone().contiguous()
        torch.save(part, os.path.join(out, "consolidated.%02d.pth" % r))
    params = {"dim": cfg.hidden_size, "multiple_of": 32, "n_heads": cfg.num_attention_heads,
              "n_kv_heads": cfg.num_key_value_heads, "n_layers": cfg.num_hidden_layers,
              "norm_eps": cfg.rms_norm_eps, "vocab_size": -1}
    with open(os.path.join(out, "params.json"), "w") as f:
        json.dump(params, f)


# dcp_fixtures.import_dcp_113: torch 1.13's DCP needs a patch to import on Python 3.11.
DCP_113 = r"""
import sys, torch
sys.path.insert(0, sys.argv[3])
from dcp_fixtures import import_dcp_113
dcp = import_dcp_113()
sd = torch.load(sys.argv[1])
dcp.save_state_dict(sd, dcp.FileSystemWriter(sys.argv[2]), no_dist=True)
"""
GEN = os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "gen")


def write_dcp_113(model, out, scratch):
    """A torch.distributed checkpoint of the state dict written by Debian's torch 1.13
    (FileSystemWriter, one process); the state dict goes over as a torch.save file. Returns
    None, or why it could not be written."""
    import torch
    pt = os.path.join(scratch, "sd.pt")
    torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, pt)
    rc, out_, err = run_capture(["/usr/bin/python3", "-c", DCP_113, pt, out, GEN], 120)
    os.unlink(pt)
    if rc != 0:
        return "torch 1.13 save_state_dict failed: %s" % err.decode("utf-8", "replace")[-400:]
    return None


def scratch_dir(prefix):
    return tempfile.mkdtemp(prefix=prefix, dir=os.environ.get("TMPDIR", "/tmp"))


def share_with_others(path):
    """Makes every file under path readable by other users, as a checkpoint shared on a
    machine is. safetensors 0.8 (and so save_pretrained) writes its files 0600, and
    `ckptfs serve` without --token-file refuses a source other local users cannot read
    (541-modes-users checks that rule): a test about a client, not modes, serves shared files."""
    files = [path] if os.path.isfile(path) else [
        os.path.join(d, n) for d, _, names in os.walk(path) for n in names]
    for p in files:
        os.chmod(p, os.stat(p).st_mode | 0o044)


def rmtree(path):
    shutil.rmtree(path, ignore_errors=True)


def write_dcphf(model, out, nemo_step):
    """DCP with Hugging Face storage as torch's HuggingFaceStorageWriter / NeMo Automodel write
    it, by the independent writer of tests/gen/dcphf_fixtures.py: one shard file per rank (2)
    with DCP_SHARDING_INFO, 2-D tensors cut on dim 1 (dim 0 for a NeMo step, as FSDP2 does),
    uneven where the size is odd. nemo_step: out is a step directory, the shards in model/
    with model/.hf_metadata/ (config, generation config, fqn_to_file_index_mapping.json)."""
    sys.path.insert(0, GEN)
    import dcphf_fixtures as hf
    mdir = os.path.join(out, "model") if nemo_step else out
    plans = []
    for name, t in model.state_dict().items():
        if nemo_step and name == "lm_head.weight" and model.config.tie_word_embeddings:
            continue  # tied: transformers' own files leave it out too
        tensor = hf.Tensor.__new__(hf.Tensor)
        tensor.name, tensor.dtype, tensor.shape = name, "F32", list(t.shape)
        tensor.array, tensor.chunks = t.detach().numpy().astype("<f4"), []
        dim = 0 if nemo_step or t.dim() < 2 else 1
        plans.append((tensor, hf.plan_split(tensor, 2, [(dim, 2)])))
    hf.write_ranks(mdir, plans, 2, style="automodel")
    if nemo_step:
        meta = os.path.join(mdir, ".hf_metadata")
        os.makedirs(meta)
        model.config.to_json_file(os.path.join(meta, "config.json"))
        model.generation_config.to_json_file(os.path.join(meta, "generation_config.json"))
        with open(os.path.join(meta, "fqn_to_file_index_mapping.json"), "w") as f:
            json.dump({t.name: 1 for t, _ in plans}, f)


ZERO2_113 = r"""
import collections, math, os, sys, torch
sys.path.insert(0, sys.argv[3])
import deepspeed_fixtures as gen
ds = gen.deepspeed_standins()
sd, shared = torch.load(sys.argv[1])
out, world = sys.argv[2], 2
names = [n for n in sd if n not in shared]
step = os.path.join(out, "global_step1")
os.makedirs(step)
open(os.path.join(out, "latest"), "w").write("global_step1")
flat = torch.cat([sd[n].reshape(-1).float() for n in names])
align = 2 * world
padded = align * math.ceil(flat.numel() / align)
padding = padded - flat.numel()
flat = torch.cat([flat, torch.zeros(padding)])
part = padded // world
for r in range(world):
    lean = part - (padding if r == world - 1 else 0)
    osd = {"loss_scaler": ds.DynamicLossScaler(), "dynamic_loss_scale": True, "overflow": False,
           "clip_grad": 1.0, "base_optimizer_state": [],
           "single_partition_of_fp32_groups": [flat[r * part:(r + 1) * part][:lean].clone()],
           "zero_stage": ds.ZeroStageEnum.gradients, "group_paddings": [padding],
           "partition_count": [world], "ds_version": gen.DS_VERSION}
    torch.save({"optimizer_state_dict": osd, "ds_version": gen.DS_VERSION},
               os.path.join(step, "zero_pp_rank_%d_mp_rank_00_optim_states.pt" % r))
module = collections.OrderedDict((n, sd[shared.get(n, n)].bfloat16()) for n in sd)
torch.save({"module": module, "buffer_names": [], "optimizer": None,
            "param_shapes": [collections.OrderedDict((n, sd[n].shape) for n in names)],
            "frozen_param_shapes": collections.OrderedDict(), "shared_params": shared,
            "frozen_param_fragments": collections.OrderedDict(), "ds_version": gen.DS_VERSION},
           os.path.join(step, "mp_rank_00_model_states.pt"))
"""


def write_zero2(model, out, scratch):
    """A DeepSpeed ZeRO-2 checkpoint of 2 ranks (bf16 module, F32 master partitions, one
    param group, padded as the engine aligns it), written with Debian's torch 1.13 and the
    stand-ins of tests/gen/deepspeed_fixtures.py (DeepSpeed itself is not installed). What
    zero_to_fp32 returns from it is the model's F32 weights. None, or why it failed."""
    import torch
    pt = os.path.join(scratch, "zero-sd.pt")
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    shared = {}
    if model.config.tie_word_embeddings and "lm_head.weight" in sd:
        shared["lm_head.weight"] = next(k for k in sd if k.endswith("wte.weight") or
                                        k.endswith("embed_tokens.weight"))
    torch.save((sd, shared), pt)
    rc, _, err = run_capture(["/usr/bin/python3", "-c", ZERO2_113, pt, out, GEN], 120)
    os.unlink(pt)
    if rc != 0:
        return "torch 1.13 ZeRO-2 writer failed: %s" % err.decode("utf-8", "replace")[-400:]
    return None


def write_tar(src_dir, out):
    """A tar archive of a model folder (members at the top, as `tar -C DIR -cf OUT .` makes)."""
    import tarfile
    with tarfile.open(out, "w") as tf:
        for fn in sorted(os.listdir(src_dir)):
            tf.add(os.path.join(src_dir, fn), arcname=fn)


def write_mlfw_tp(model, out, ranks=2):
    """An MLFramework tensor-parallel directory (metadata.bin + shard_rank{N}.pt) of the model,
    by the BinaryWriter of tests/gen/mlfw_fixtures.py: tensors its layer-name rules call
    column-parallel cut on dim 0, row-parallel on dim 1 (unevenly where the size is odd),
    the rest (norms, GPT-2's Conv1D names) whole and identical on every rank."""
    import datetime
    import numpy as np
    sys.path.insert(0, GEN)
    import mlfw_fixtures as mf
    per_rank = [[] for _ in range(ranks)]
    for name, t in model.state_dict().items():
        if name == "lm_head.weight" and model.config.tie_word_embeddings:
            continue
        arr = t.detach().numpy().astype("<f4")
        _, dim = mf.dim_by_name(name, arr.ndim)
        parts = np.array_split(arr, ranks, axis=dim) if dim is not None and arr.ndim else \
            [arr] * ranks
        for r in range(ranks):
            per_rank[r].append((name, mf.F32, np.ascontiguousarray(parts[r]), False))
    os.makedirs(out)
    meta = mf.metadata_bytes("tiny tp%d" % ranks, datetime.datetime(2026, 1, 1), ranks, [], 1)
    with open(os.path.join(out, "metadata.bin"), "wb") as f:
        f.write(meta)
    for r in range(ranks):
        with open(os.path.join(out, "shard_rank%d.pt" % r), "wb") as f:
            f.write(mf.shard_bytes(per_rank[r])[0])
