#!/usr/bin/python3
"""transformers' own from_pretrained of the HF view, for every layout ckptfs consolidates that
can be made here, against the same model loaded from the folder transformers saved.

Environment: CKPTFS; CLIENTS_PY (build/clients-venv/bin/python, `make deps-clients`): the test
re-execs itself with it, and fails naming the client if torch or transformers do not import.

A tiny Llama and a tiny GPT-2 are made by transformers (fixed seed) and saved with
save_pretrained. Layouts: single and sharded safetensors (save_pretrained), .bin repos one file
and sharded (torch.save as transformers 4.x wrote them; 5.x writes no .bin), the HF cache
folder huggingface_hub's snapshot_download writes from `ckptfs serve`, an hf:// mount of that
served repo, Meta's consolidated.NN.pth + params.json (Llama, 2 ranks, made here by undoing the
conversion script), a torch 1.13 DCP of the state dict (Debian's torch), DCP-HF shards of 2
ranks cut on dim 1 and a NeMo Automodel step (shards cut on dim 0 + .hf_metadata/), both by the
writer of tests/gen/dcphf_fixtures.py, a DeepSpeed ZeRO-2 checkpoint of 2 ranks (torch 1.13 and
the stand-ins of tests/gen/deepspeed_fixtures.py: bf16 module, F32 master partitions, which
zero_to_fp32 returns), an MLFramework tensor-parallel directory of 2 ranks (the BinaryWriter
and layer-name split rules of tests/gen/mlfw_fixtures.py), and a tar of the saved folder.
Layouts without a config.json (DCP, DCP-HF, ZeRO, MLFramework) are loaded through a folder of
the original config.json and links to the view's files. Each layout is mounted with -o view=hf
and read through .ckptfs/hf/ of a default mount. The view=hf root is loaded with transformers
5's default (mmap, async loading with min(4, CPUs) workers), sequentially
(HF_DEACTIVATE_ASYNC_LOAD=1), with 8 workers (HF_ENABLE_PARALLEL_LOADING=true as 4.x read it,
and 5.x's pool widened to 8) and with disable_mmap=True (what transformers does on hf-mount);
.ckptfs/hf/ with the default and 8 workers. The logits of a fixed prompt
must equal the original's exactly: the same bytes in the same dtype through the same code.

Stress: 16 threads fault the pages of one mmapped view file of a fresh mount at once, each in
its own order, and every tensor's bytes must hash as in the original file.

Every case has a deadline: a hang prints `not ok - CASE: hung` and aborts the mounts.
"""

import hashlib
import json
import mmap
import os
import random
import struct
import sys
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
import clients_env as ce  # noqa: E402

CASE_SECONDS = 120
MODES = {
    "default": ({}, {}),
    "sequential": ({"HF_DEACTIVATE_ASYNC_LOAD": "1"}, {}),
    "parallel-8": ({"HF_ENABLE_PARALLEL_LOADING": "true", "HF_PARALLEL_LOADING_WORKERS": "8"},
                   {}),
    "no-mmap": ({}, {"disable_mmap": True}),
}


def load_in_mode(path, mode, extra_kw):
    import transformers.core_model_loading as cml
    env, kw = MODES[mode]
    old_env, old_workers = dict(os.environ), cml.GLOBAL_WORKERS
    os.environ.update(env)
    if mode == "parallel-8":
        cml.GLOBAL_WORKERS = 8
    try:
        return ce.logits(path, **dict(kw, **extra_kw))
    finally:
        cml.GLOBAL_WORKERS = old_workers
        os.environ.clear()
        os.environ.update(old_env)


def config_beside(view, config, where):
    """A folder with config.json and links to the view's files: how a layout without a config
    (DCP) is loaded. from_pretrained(view, config=...) would do, but transformers 5.24 fails on
    any folder that holds neither config.json nor generation_config.json (ckptfs(5), Clients)."""
    import shutil
    shutil.rmtree(where, ignore_errors=True)
    os.makedirs(where)
    config.save_pretrained(where)
    for fn in os.listdir(view):
        if fn.endswith(".safetensors") or fn.endswith(".index.json"):
            os.symlink(os.path.join(view, fn), os.path.join(where, fn))
    return where


def check_views(tap, ckptfs, src, label, want, config=None, env=None):
    """Both ways to the HF view of src, each loaded in every mode; with config, through a
    folder of that config and links to the view's files."""
    # Every mode on the view at the root; the same files under .ckptfs/hf/ with the default
    # and the widest loading (the modes differ in how the client reads, not in what ckptfs
    # serves, and the suite's time is shared).
    for how, options, sub, modes in (("view=hf", ["-o", "view=hf"], "", list(MODES)),
                                     (".ckptfs/hf", [], ".ckptfs/hf", ["default", "parallel-8"])):
        case = "%s %s" % (label, how)
        mnt = ce.mount(tap, ckptfs, src, case, options, env=env)
        if mnt is None:
            continue
        for mode in modes:
            with ce.Deadline(tap, "%s %s" % (case, mode), CASE_SECONDS):
                try:
                    path = os.path.join(mnt, sub)
                    if config is not None:
                        path = config_beside(path, config, mnt.rstrip("/") + ".cfg")
                    got = load_in_mode(path, mode, {})
                    problems = ce.logits_problems(got, want)
                except Exception as e:
                    problems = ["%s: %s" % (type(e).__name__, str(e)[-600:])]
            tap.ok(not problems, "%s, %s loading: from_pretrained's logits equal the "
                   "original's" % (case, mode), problems)
        ce.rmtree(mnt.rstrip("/") + ".cfg")
        ce.release(tap, mnt, case)


def safetensors_hashes(path):
    """name -> sha256 of a safetensors file's tensors, read with a header parser of its own."""
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    base = 8 + n
    return {k: hashlib.sha256(data[base + v["data_offsets"][0]:base + v["data_offsets"][1]])
            .hexdigest() for k, v in header.items() if k != "__metadata__"}


def check_stress(tap, ckptfs, src, want_hashes):
    case = "stress: 16 threads faulting one mmapped view file"
    mnt = ce.mount(tap, ckptfs, src, case, ["-o", "view=hf"])
    if mnt is None:
        return
    path = os.path.join(mnt, "model.safetensors")
    problems, lock = [], threading.Lock()
    with ce.Deadline(tap, case, CASE_SECONDS), open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
        n = struct.unpack("<Q", m[:8])[0]
        header = json.loads(m[8:8 + n])
        base = 8 + n
        spans = [(k, base + v["data_offsets"][0], base + v["data_offsets"][1])
                 for k, v in header.items() if k != "__metadata__"]
        pages = list(range(0, len(m), mmap.PAGESIZE))

        def worker(seed):
            order = pages[:]
            random.Random(seed).shuffle(order)
            touched = 0
            for p in order:  # one byte per page: each is a fault of its own
                touched += m[p]
            mine = spans[:]
            random.Random(seed + 100).shuffle(mine)
            for k, a, b in mine:
                h = hashlib.sha256(m[a:b]).hexdigest()
                if h != want_hashes.get(k):
                    with lock:
                        problems.append("thread %d: %s hashes %s" % (seed, k, h[:16]))

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        m.close()
    missing = set(want_hashes) - {k for k, _, _ in spans}
    if missing:
        problems.append("tensors missing from the view: %s" % sorted(missing)[:5])
    tap.ok(not problems, "%s (%d pages, %d tensors): every tensor as in the original"
           % (case, len(pages), len(spans)), problems[:8])
    ce.release(tap, mnt, case)


def serve_layouts(tap, ckptfs, work, origs, refs):
    """snapshot_download from `ckptfs serve` into an HF cache, then the cache folder and an
    hf:// mount of the served repo."""
    from huggingface_hub import snapshot_download
    from serve_util import Server
    for p in origs.values():
        ce.share_with_others(p)  # saved 0600: see share_with_others
    with Server(ckptfs, ["%s=%s" % (n, p) for n, p in origs.items()]) as srv:
        env = {"HF_ENDPOINT": srv.url}
        cache = os.path.join(work, "hf-cache")
        for name in origs:
            with ce.Deadline(tap, "snapshot_download ckptfs/" + name, CASE_SECONDS):
                old = dict(os.environ)
                os.environ.update(env)
                try:
                    snapshot_download("ckptfs/" + name, cache_dir=cache, endpoint=srv.url)
                    err = None
                except Exception as e:
                    err = "%s: %s" % (type(e).__name__, e)
                finally:
                    os.environ.clear()
                    os.environ.update(old)
            if not tap.ok(err is None, "%s: snapshot_download from ckptfs serve" % name, [err]):
                continue
            check_views(tap, ckptfs, os.path.join(cache, "models--ckptfs--" + name),
                        "%s HF cache folder" % name, refs[name])
            check_views(tap, ckptfs, "hf://ckptfs/" + name, "%s hf:// of ckptfs serve" % name,
                        refs[name], env=env)


def main():
    tap, ckptfs = ce.reexec_in_clients(["torch", "transformers", "huggingface_hub"])
    import torch
    torch.set_num_threads(1)
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    work = ce.scratch_dir("ckptfs-t85.")
    try:
        origs, refs, models = {}, {}, {}
        for name, cfg in ce.tiny_configs().items():
            model = ce.make_model(name, cfg)
            models[name] = model
            orig = origs[name] = os.path.join(work, name)
            model.save_pretrained(orig)
            refs[name] = ce.logits(orig)
        for name, model in models.items():
            want = refs[name]
            check_views(tap, ckptfs, origs[name], "%s single safetensors" % name, want)
            sharded = os.path.join(work, name + "-sharded")
            model.save_pretrained(sharded, max_shard_size="20KB")
            shards = [f for f in os.listdir(sharded) if f.endswith(".safetensors")]
            tap.ok(len(shards) > 2, "%s: save_pretrained wrote %d shards" % (name, len(shards)))
            check_views(tap, ckptfs, sharded, "%s sharded safetensors" % name, want)
            for n_bin in (1, 3):
                d = os.path.join(work, "%s-bin%d" % (name, n_bin))
                ce.write_bin_repo(model, d, n_bin)
                check_views(tap, ckptfs, d, "%s .bin repo (%d file%s)"
                            % (name, n_bin, "s" if n_bin > 1 else ""), want)
            dcp = os.path.join(work, name + "-dcp113")
            why = ce.write_dcp_113(model, dcp, work)
            if tap.ok(why is None, "%s: torch 1.13 wrote a DCP checkpoint" % name, [why]):
                check_views(tap, ckptfs, dcp, "%s DCP (torch 1.13)" % name, want,
                            config=model.config)
            d = os.path.join(work, name + "-dcphf")
            ce.write_dcphf(model, d, nemo_step=False)
            check_views(tap, ckptfs, d, "%s DCP-HF shards (2 ranks)" % name, want,
                        config=model.config)
            d = os.path.join(work, name + "-nemo", "epoch_0_step_20")
            ce.write_dcphf(model, d, nemo_step=True)
            check_views(tap, ckptfs, d, "%s NeMo Automodel step (2 ranks)" % name, want)
            d = os.path.join(work, name + "-zero2")
            why = ce.write_zero2(model, d, work)
            if tap.ok(why is None, "%s: torch 1.13 wrote a ZeRO-2 checkpoint" % name, [why]):
                check_views(tap, ckptfs, d, "%s DeepSpeed ZeRO-2 (2 ranks)" % name, want,
                            config=model.config)
            d = os.path.join(work, name + "-mlfw-tp2")
            ce.write_mlfw_tp(model, d)
            check_views(tap, ckptfs, d, "%s MLFramework TP (2 ranks)" % name, want,
                        config=model.config)
            d = os.path.join(work, name + ".tar")
            ce.write_tar(origs[name], d)
            check_views(tap, ckptfs, d, "%s tar of the folder" % name, want)
        meta = os.path.join(work, "llama-meta-mp2")
        ce.write_meta_mp(models["llama"], meta)
        check_views(tap, ckptfs, meta, "llama Meta consolidated.0N.pth (2 ranks)", refs["llama"])
        serve_layouts(tap, ckptfs, work, origs, refs)
        # A model big enough for many pages: 4 MiB of embeddings.
        from transformers import LlamaConfig
        big_cfg = LlamaConfig(vocab_size=8192, hidden_size=128, intermediate_size=384,
                              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
        big = os.path.join(work, "llama-big")
        ce.make_model("llama-big", big_cfg).save_pretrained(big)
        check_stress(tap, ckptfs, big, safetensors_hashes(os.path.join(big, "model.safetensors")))
    finally:
        for mnt in list(ce.Deadline.mounts):
            ce.release(tap, mnt, mnt)
        ce.rmtree(work)
    tap.done()
    return 1 if tap.failed else 0


if __name__ == "__main__":
    sys.exit(main())
