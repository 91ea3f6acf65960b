#!/usr/bin/python3
"""-o view=gguf: the GGUF `ckptfs convert SOURCE NAME.gguf` writes, built on read (issue 30
item 1; core/write/gguf_view.c, core/write/gguf_layout.c).

The tiny Llama of tests/lib/llama_ref.py stored as an HF folder, a NeMo step of 2 DCP-HF ranks
(q_proj cut by rows, k_proj by columns) and Meta MP shards of 2 ranks (tests/lib/llama_layouts.py,
written from the formats' notes, not by ckptfs); and a tensor container (a plain safetensors
fixture). For each, mounted with -o view=gguf:
- the root holds NAME.gguf, byte for byte the file convert writes, read through and mmap'd;
- every tensor (the in-repo reader, tests/lib/readers/gguf_reader.py) equals what numpy
  computes from the HF weights: llama.cpp's names, q/k rows in its rope order, ranks' chunks
  assembled;
- gguf-py's GGUFReader (0.19, $CLIENTS_PY) reads the view from the mount and agrees with the
  in-repo reader on every KV (key, type, value) and every tensor (type, shape, bytes);
- llama.cpp (node-llama-cpp, as tests/t/78) maps the view from the mount and its next-token
  log-probabilities match the float64 numpy forward within 1e-2, greedy tokens equal.
The HF folder served over http:// by nginx (tests/lib/remote_servers.py): its view=gguf mount
is the local convert's file byte for byte.
The same tiny model as a Mistral folder (llama.cpp's converter maps it to arch llama) and as a
Qwen2 folder (arch qwen2: q/k/v biases, q/k rows kept in HF's order, which llama.cpp ropes
NEOX-style): KVs under the arch's name, and llama.cpp's log-probabilities as above.
"""
import hashlib
import json
import mmap
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
sys.path.insert(0, os.path.join(HERE, "..", "lib", "readers"))
from ckptfs_test import Tap, run_capture, skip_reason, unmount, is_mounted  # noqa: E402
import gguf_reader  # noqa: E402
import llama_layouts as Y  # noqa: E402
import llama_ref as L  # noqa: E402
from remote_servers import Nginx, nginx_skip_reason  # noqa: E402

CKPTFS = os.environ.get("CKPTFS")
FIXTURES = os.environ.get("FIXTURES")
CLIENTS_PY = os.environ.get("CLIENTS_PY")
TOKENS = [1, 50, 60, 70, 80, 262, 3, 299, 100]

# gguf-py's view of a file: every KV as (type, value) and every tensor as (type, shape, sha256)
GGUF_PY = r'''
import hashlib, json, sys
from gguf import GGUFReader
r = GGUFReader(sys.argv[1])
kvs = {}
for name, f in r.fields.items():
    if name.startswith("GGUF."):
        continue
    v = f.contents()
    if isinstance(v, float):
        v = repr(v)
    elif isinstance(v, list):
        v = [repr(x) if isinstance(x, float) else x for x in v]
    kvs[name] = [int(f.types[0]), v]
ts = {t.name: [int(t.tensor_type), [int(x) for x in reversed(t.shape.tolist())],
               hashlib.sha256(t.data.tobytes()).hexdigest()] for t in r.tensors}
print(json.dumps({"kvs": kvs, "tensors": ts}))
'''


def in_repo_view(path):
    g = gguf_reader.read(path)
    kvs = {}
    for k in g.kvs:
        v = k.value
        if isinstance(v, tuple):  # (element type, values)
            v = [repr(float(x)) if isinstance(x, float) else x for x in v[1]]
        elif isinstance(v, float):
            v = repr(float(v))
        kvs[k.key] = [k.type, v]
    ts = {t.name: [t.ggml_type, t.shape, hashlib.sha256(bytes(g.tensor_bytes(t))).hexdigest()]
          for t in g.tensors}
    return g, {"kvs": kvs, "tensors": ts}


def tensor_problems(g, want):
    got = {t.name: t for t in g.tensors}
    bad = ["names: %s" % sorted(set(got) ^ set(want))] if set(got) != set(want) else []
    for name, a in want.items():
        t = got.get(name)
        if t is not None and not np.array_equal(
                np.frombuffer(bytes(g.tensor_bytes(t)), "<f4").reshape(a.shape), a):
            bad.append("%s: other values" % name)
    return bad


def node_llama():
    mods = os.path.join(os.path.dirname(os.path.realpath(CKPTFS)), "node-llama", "node_modules")
    if not os.path.exists(os.path.join(mods, "node-llama-cpp", "dist", "index.js")):
        return None, "node-llama-cpp is not installed in build/node-llama (tests/t/78 installs it)"
    if not shutil.which("node"):
        return None, "node is not installed"
    return mods, None


def logprobs(mods, gguf, tokens):
    p = subprocess.run(["node", os.path.join(HERE, "..", "lib", "llama_logprobs.mjs"), mods, gguf,
                        ",".join(map(str, tokens)), "mmap"], capture_output=True, timeout=300)
    if p.returncode != 0:
        raise RuntimeError(p.stderr.decode(errors="replace")[-800:])
    d = json.loads(p.stdout)
    probs = np.array([[x if x is not None else 0.0 for x in row] for row in d["probs"]])
    return d, np.log(np.maximum(probs, 1e-30))


def layout_case(tap, work, label, src, want, ref, mods, llama=True, arch="llama"):
    out = os.path.join(work, label + ".gguf")
    rc, _, err = run_capture([CKPTFS, "convert", src, out], 120)
    if not tap.ok(rc == 0, "%s: convert -> .gguf" % label, [err]):
        return
    mnt = os.path.join(work, "mnt-" + label)
    os.mkdir(mnt)
    rc, _, err = run_capture([CKPTFS, src, mnt, "-o", "view=gguf"], 60)
    try:
        if not tap.ok(rc == 0 and is_mounted(mnt), "%s: mount -o view=gguf" % label, [err]):
            return
        names = sorted(n for n in os.listdir(mnt) if not n.startswith("."))
        if not tap.ok(len(names) == 1 and names[0].endswith(".gguf"),
                      "%s: the root holds one NAME.gguf (%s)" % (label, names), [names]):
            return
        view = os.path.join(mnt, names[0])
        with open(view, "rb") as f:
            got = f.read()
        with open(out, "rb") as f:
            conv = f.read()
        with open(view, "rb") as f:
            mapped = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
            mapped_bytes = bytes(mapped)
            mapped.close()
        tap.ok(got == conv and mapped_bytes == conv and os.path.getsize(view) == len(conv),
               "%s: the view is convert's file byte for byte (%d bytes), read and mmap'd"
               % (label, len(conv)), [len(got), len(conv)])
        g, mine = in_repo_view(view)
        if want is not None:
            bad = tensor_problems(g, want)
            tap.ok(not bad, "%s: every tensor as numpy computes it (llama.cpp names, q/k in its "
                   "rope order, chunks assembled)" % label, bad)
        if CLIENTS_PY and os.path.exists(CLIENTS_PY):
            p = subprocess.run([CLIENTS_PY, "-c", GGUF_PY, view], capture_output=True,
                               timeout=120)
            theirs = json.loads(p.stdout) if p.returncode == 0 else None
            diff = [] if theirs is None else (
                ["kv %s: %r vs %r" % (k, mine["kvs"].get(k), theirs["kvs"].get(k))
                 for k in sorted(set(mine["kvs"]) | set(theirs["kvs"]))
                 if mine["kvs"].get(k) != theirs["kvs"].get(k)] +
                ["tensor %s" % k for k in sorted(set(mine["tensors"]) | set(theirs["tensors"]))
                 if mine["tensors"].get(k) != theirs["tensors"].get(k)])
            tap.ok(theirs is not None and not diff and mine["kvs"],
                   "%s: gguf-py's GGUFReader agrees on %d KVs and %d tensors"
                   % (label, len(mine["kvs"]), len(mine["tensors"])),
                   [p.stderr.decode(errors="replace")[-500:]] + diff[:10])
        else:
            tap.skip("%s: gguf-py's GGUFReader agrees" % label, "no CLIENTS_PY")
        if not llama:
            return
        if mods is None:
            tap.skip("%s: llama.cpp maps the view from the mount" % label, "no node-llama-cpp")
            return
        try:
            d, lp = logprobs(mods, view, TOKENS)
        except (RuntimeError, ValueError, subprocess.TimeoutExpired) as e:
            tap.ok(False, "%s: llama.cpp maps the view from the mount and runs it" % label,
                   [str(e)])
            return
        ok_shape = lp.shape == ref.shape
        diff = np.abs(lp - ref).max() if ok_shape else np.inf
        tap.ok(d["arch"] == arch and ok_shape and diff < 1e-2 and
               (lp.argmax(1) == ref.argmax(1)).all(),
               "%s: llama.cpp maps the view from the mount: log-probabilities within %.1e of "
               "the numpy forward, greedy tokens equal" % (label, diff), [d["arch"], lp.shape])
    finally:
        unmount(mnt)


def remote_case(tap, work, hf):
    why = nginx_skip_reason()
    if why:
        tap.skip("http://: the view of a served folder is convert's file", why)
        return
    local = os.path.join(work, "hf-folder.gguf")
    mnt = os.path.join(work, "mnt-remote")
    os.mkdir(mnt)
    with Nginx(work) as n:
        rc, _, err = run_capture([CKPTFS, n.url + "/tiny-llama/", mnt, "-o", "view=gguf"], 60)
        try:
            view = os.path.join(mnt, "tiny-llama.gguf")
            same = rc == 0 and os.path.exists(view) and os.path.exists(local) and \
                open(view, "rb").read() == open(local, "rb").read()
            tap.ok(same, "http://: the view=gguf mount of a served HF folder is the local "
                   "convert's file byte for byte", [err])
        finally:
            unmount(mnt)


def family_cases(tap, work, w, ref, mods):
    mistral = os.path.join(work, "tiny-mistral")
    L.make_folder(mistral, dict(L.CONFIG, model_type="mistral",
                                architectures=["MistralForCausalLM"]))
    layout_case(tap, work, "mistral", mistral, Y.llama_cpp_tensors(w), ref, mods)

    cfg = dict(L.CONFIG, model_type="qwen2", architectures=["Qwen2ForCausalLM"])
    qwen = os.path.join(work, "tiny-qwen2")
    qw = L.make_folder(qwen, cfg)
    rng = np.random.default_rng(7)
    for i in range(cfg["num_hidden_layers"]):
        for n in ("q", "k", "v"):
            rows = qw["model.layers.%d.self_attn.%s_proj.weight" % (i, n)].shape[0]
            qw["model.layers.%d.self_attn.%s_proj.bias" % (i, n)] = (
                0.1 * rng.standard_normal(rows)).astype(np.float32)
    L.write_safetensors(os.path.join(qwen, "model.safetensors"), qw)
    want = {"token_embd.weight": qw["model.embed_tokens.weight"],
            "output_norm.weight": qw["model.norm.weight"], "output.weight": qw["lm_head.weight"]}
    for name, a in qw.items():
        if name.startswith("model.layers."):
            layer, rest = name[len("model.layers."):].split(".", 1)
            gg = Y.GG.get(rest) or {"self_attn.q_proj.bias": "attn_q.bias",
                                     "self_attn.k_proj.bias": "attn_k.bias",
                                     "self_attn.v_proj.bias": "attn_v.bias"}[rest]
            want["blk.%s.%s" % (layer, gg)] = a  # rows as HF stores them
    layout_case(tap, work, "qwen2", qwen, want, L.log_softmax(L.forward(qw, TOKENS, cfg)), mods,
                arch="qwen2")
    g = gguf_reader.read(os.path.join(work, "qwen2.gguf"))
    kv = {k.key: k.value for k in g.kvs}
    tap.ok(kv.get("general.architecture") == "qwen2" and
           kv.get("qwen2.attention.head_count_kv") == cfg["num_key_value_heads"] and
           kv.get("qwen2.block_count") == cfg["num_hidden_layers"] and
           kv.get("tokenizer.ggml.pre") == "qwen2",
           "qwen2: KVs under qwen2., its pre-tokenizer named",
           [{k: v for k, v in kv.items() if not k.startswith("tokenizer.ggml.t")}])


def main():
    why = skip_reason(CKPTFS, FIXTURES)
    if why:
        print("1..0 # SKIP %s" % why)
        return 0
    tap = Tap()
    mods, why_not = node_llama()
    if mods is None:
        tap.diag("llama.cpp checks skipped: %s" % why_not)
    work = tempfile.mkdtemp(prefix="ckptfs-gguf-view-")
    try:
        hf = os.path.join(work, "tiny-llama")
        w = L.make_folder(hf)
        want = Y.llama_cpp_tensors(w)
        ref = L.log_softmax(L.forward(w, TOKENS))
        layout_case(tap, work, "hf-folder", hf, want, ref, mods)
        remote_case(tap, work, hf)
        layout_case(tap, work, "nemo-dcphf-2ranks", Y.nemo_step(os.path.join(work, "nemo"), w),
                    want, ref, mods)
        meta, why = Y.meta_mp(os.path.join(work, "meta"), w)
        if tap.ok(meta is not None, "torch 1.13 wrote Meta MP shards of 2 ranks", [why]):
            layout_case(tap, work, "meta-mp-2ranks", meta, want, ref, mods)
        family_cases(tap, work, w, ref, mods)
        container = os.path.join(FIXTURES, "sharded")
        if os.path.isdir(container):
            layout_case(tap, work, "container", container, None, None, mods, llama=False)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    tap.done()
    return 0 if tap.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
