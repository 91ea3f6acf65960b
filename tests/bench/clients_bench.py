#!/usr/bin/env python3
"""transformers' from_pretrained of a ~1 GiB model: through the HF view of a ckptfs mount vs
from a consolidated local copy (issue 27's first client figure).

usage: clients_bench.py CKPTFS OUTDIR        (run by `make bench` with the client venv's python)

The model: a Llama config sized to ~1.1 GiB of F32 weights (hidden 2048, 3 layers, vocabulary
32000), random weights (fixed seed) saved by transformers' save_pretrained with torch, once, into
OUTDIR/clients-data:
  source/  sharded safetensors (4 shards of <= 300 MB + index): what is mounted. A 4-rank DCP
           source (issue 27 item 3, branch clients-torch) is not on main yet, so the mount's
           source is the sharded safetensors folder.
  local/   the same model consolidated into one model.safetensors: the baseline.
Both are read once before timing (source warm in the page cache). Each round mounts afresh
(-o view=hf, so the FUSE page cache is cold: a first load) and loads, in a new process each:
  local:  from_pretrained(local/)
  mount:  from_pretrained(MOUNT)
timing from_pretrained and then a touch of every page of every weight (a sum of every 1024th
element), since mmap-backed weights are only read when used. Reported: the median of RUNS
(default 3) rounds, seconds and the child's peak RSS, the daemon's VmHWM, and the ratio
mount/local. Results: OUTDIR/clients.json and a table on stdout.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile

RUNS = int(os.environ.get("RUNS", "3"))

MAKE = r"""
import sys, torch
from transformers import LlamaConfig, AutoModelForCausalLM
from transformers.utils import logging
logging.disable_progress_bar()
cfg = LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5504,
                  num_hidden_layers=3, num_attention_heads=16, num_key_value_heads=16,
                  max_position_embeddings=2048, dtype="float32")
torch.manual_seed(27)
with torch.device("meta"):
    model = AutoModelForCausalLM.from_config(cfg)
model = model.to_empty(device="cpu")
with torch.no_grad():
    for p in model.parameters():
        p.normal_(0, 0.02)
model.save_pretrained(sys.argv[1], max_shard_size="300MB")
model.save_pretrained(sys.argv[2], max_shard_size="5GB")
print(sum(p.numel() * p.element_size() for p in model.parameters()))
"""

LOAD = r"""
import json, sys, time, torch
from transformers import AutoModelForCausalLM
from transformers.utils import logging
logging.set_verbosity_error(); logging.disable_progress_bar()
t0 = time.perf_counter()
model = AutoModelForCausalLM.from_pretrained(sys.argv[1])
t1 = time.perf_counter()
s = 0.0
with torch.no_grad():
    for p in model.parameters():
        s += float(p.view(-1)[::1024].sum())
t2 = time.perf_counter()
print(json.dumps({"from_pretrained": t1 - t0, "with_touch": t2 - t0, "checksum": s}))
"""


def warm(top):
    for dirpath, _, files in os.walk(top):
        for fn in files:
            with open(os.path.join(dirpath, fn), "rb") as f:
                while f.read(1 << 24):
                    pass


def run_load(path):
    """A new process loads path: its timings, and its own peak RSS (wait4's rusage)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        p = subprocess.Popen([sys.executable, "-c", LOAD, path], stdout=out, stderr=err)
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if p.returncode != 0:
            raise RuntimeError("loading %s failed: %s" % (path, err.read().decode()[-800:]))
        res = json.loads(out.read().decode().strip().splitlines()[-1])
    res["peak_rss_kib"] = ru.ru_maxrss
    return res


def daemon_hwm(mnt):
    out = subprocess.run(["pgrep", "-f", mnt], capture_output=True, text=True).stdout
    for pid in out.split():
        try:
            argv = open("/proc/%s/cmdline" % pid, "rb").read().split(b"\0")
            if os.fsencode(mnt) in argv:
                for line in open("/proc/%s/status" % pid):
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1])
        except OSError:
            continue
    return None


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    ckptfs, outdir = os.path.abspath(argv[1]), os.path.abspath(argv[2])
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        print("clients_bench: %s: the client venv (make deps-clients) is needed" % e)
        return 1
    data = os.path.join(outdir, "clients-data")
    src, local = os.path.join(data, "source"), os.path.join(data, "local")
    if not os.path.isdir(local):
        os.makedirs(data, exist_ok=True)
        subprocess.run([sys.executable, "-c", MAKE, src + ".tmp", local + ".tmp"], check=True,
                       stdout=subprocess.DEVNULL)
        os.rename(src + ".tmp", src)
        os.rename(local + ".tmp", local)
    warm(src)
    warm(local)
    rounds = {"local": [], "mount": []}
    hwm = []
    for _ in range(RUNS):
        rounds["local"].append(run_load(local))
        mnt = tempfile.mkdtemp(prefix="ckptfs-bench-clients.")
        subprocess.run([ckptfs, src, mnt, "-o", "view=hf"], check=True)
        try:
            rounds["mount"].append(run_load(mnt))
            hwm.append(daemon_hwm(mnt))
        finally:
            subprocess.run(["fusermount3", "-u", mnt])
            os.rmdir(mnt)
    if len({r["checksum"] for r in rounds["local"] + rounds["mount"]}) != 1:
        print("clients_bench: the mount's weights differ from the local copy's")
        return 1
    results = {"model_bytes": sum(os.path.getsize(os.path.join(local, f))
                                  for f in os.listdir(local) if f.endswith(".safetensors")),
               "source": "sharded safetensors (4-rank DCP not on main yet)", "runs": RUNS}
    for k, rs in rounds.items():
        results[k] = {m: statistics.median(r[m] for r in rs)
                      for m in ("from_pretrained", "with_touch", "peak_rss_kib")}
        results[k]["all"] = rs
    results["mount"]["daemon_vmhwm_kib"] = max(h or 0 for h in hwm)
    for m in ("from_pretrained", "with_touch"):
        results["ratio_" + m] = results["mount"][m] / results["local"][m]
    with open(os.path.join(outdir, "clients.json"), "w") as f:
        json.dump(results, f, indent=2)
    print("from_pretrained of %.2f GiB (median of %d, first load, source warm)"
          % (results["model_bytes"] / 2 ** 30, RUNS))
    print("%-28s %16s %16s %14s" % ("", "from_pretrained s", "+ touch s", "peak RSS MiB"))
    for k in ("local", "mount"):
        r = results[k]
        print("%-28s %16.2f %16.2f %14.1f" % (
            "local copy" if k == "local" else "ckptfs mount -o view=hf",
            r["from_pretrained"], r["with_touch"], r["peak_rss_kib"] / 1024))
    print("ratio mount/local: from_pretrained %.2f, with touch %.2f (daemon VmHWM %.1f MiB)"
          % (results["ratio_from_pretrained"], results["ratio_with_touch"],
             results["mount"]["daemon_vmhwm_kib"] / 1024))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
