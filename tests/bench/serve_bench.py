#!/usr/bin/python3
"""ckptfs serve vs nginx: 8 concurrent clients download the consolidated HF view of a 1 GiB
sharded checkpoint (targets: >= 0.8x nginx's aggregate throughput, server RSS < 128 MiB).

usage: serve_bench.py CKPTFS OUTDIR [--gib N] [--clients N] [--runs N]   (`make bench`)

The checkpoint (OUTDIR/serve-data/sharded: 4 safetensors shards + index, F32 and BF16 tensors
of 32 layers) is written once and cached. Its consolidated model.safetensors is fetched once
from ckptfs serve, checked against the shards (every tensor's bytes), and kept on disk as
the file nginx serves (Debian's nginx, sendfile on, 2 workers, access log off).

Each run: N curl clients at once download the whole file (warm page cache: one untimed round
first) and the wall time from the first start to the last end gives the aggregate
throughput. RSS: the server's peak resident set (VmHWM; for nginx, the largest process of
master and workers) after the runs.

Prints a table and writes OUTDIR/bench-serve.json. Exit status 0, or 1 when a download was
short or wrong; a missed target alone does not fail the run.
"""

import argparse
import hashlib
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from serve_util import Server  # noqa: E402

SHARDS = 4
LAYERS = 32


def write_shards(d, gib):
    """An HF shard set of about gib GiB: per layer two F32 matrices and a BF16 one."""
    os.makedirs(d, exist_ok=True)
    per_layer = int(gib * (1 << 30)) // LAYERS
    side = int((per_layer / 10) ** 0.5) // 64 * 64  # 2 F32 + 1 BF16 of side x side
    rng = np.random.default_rng(7)
    names = []
    for layer in range(LAYERS):
        names += [("model.layers.%d.mlp.up.weight" % layer, "F32"),
                  ("model.layers.%d.mlp.down.weight" % layer, "F32"),
                  ("model.layers.%d.attn.q.weight" % layer, "BF16")]
    weight_map, total = {}, 0
    per_shard = (len(names) + SHARDS - 1) // SHARDS
    for s in range(SHARDS):
        part = names[s * per_shard:(s + 1) * per_shard]
        fname = "model-%05d-of-%05d.safetensors" % (s + 1, SHARDS)
        header, blobs, off = {}, [], 0
        for name, dt in part:
            a = rng.standard_normal((side, side), dtype=np.float32)
            b = a.tobytes() if dt == "F32" else (a.view(np.uint32) >> 16).astype(np.uint16).tobytes()
            header[name] = {"dtype": dt, "shape": [side, side], "data_offsets": [off, off + len(b)]}
            off += len(b)
            blobs.append(b)
            weight_map[name] = fname
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)
        with open(os.path.join(d, fname), "wb") as f:
            f.write(struct.pack("<Q", len(text)) + text)
            for b in blobs:
                f.write(b)
        total += off
    json.dump({"metadata": {"total_size": total}, "weight_map": weight_map},
              open(os.path.join(d, "model.safetensors.index.json"), "w"))
    json.dump({"model_type": "llama", "num_hidden_layers": LAYERS},
              open(os.path.join(d, "config.json"), "w"))


def shard_tensors(d):
    """name -> sha256 of its bytes, read from the shards directly."""
    out = {}
    for f in sorted(os.listdir(d)):
        if not f.endswith(".safetensors"):
            continue
        with open(os.path.join(d, f), "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            hdr = json.loads(fh.read(n))
            for name, e in hdr.items():
                if name == "__metadata__":
                    continue
                a, b = e["data_offsets"]
                fh.seek(8 + n + a)
                out[name] = hashlib.sha256(fh.read(b - a)).hexdigest()
    return out


def check_consolidated(path, want):
    with open(path, "rb") as fh:
        n = struct.unpack("<Q", fh.read(8))[0]
        hdr = json.loads(fh.read(n))
        got = {}
        for name, e in hdr.items():
            if name == "__metadata__":
                continue
            a, b = e["data_offsets"]
            fh.seek(8 + n + a)
            got[name] = hashlib.sha256(fh.read(b - a)).hexdigest()
    return got == want


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def start_nginx(root, tmp):
    port = free_port()
    conf = os.path.join(tmp, "nginx.conf")
    with open(conf, "w") as f:
        f.write("""user root;
worker_processes 2;
daemon off;
pid %(t)s/nginx.pid;
error_log %(t)s/error.log;
events { worker_connections 256; }
http {
  access_log off;
  sendfile on;
  tcp_nopush on;
  client_body_temp_path %(t)s/body;
  proxy_temp_path %(t)s/proxy;
  fastcgi_temp_path %(t)s/fastcgi;
  uwsgi_temp_path %(t)s/uwsgi;
  scgi_temp_path %(t)s/scgi;
  types { application/octet-stream safetensors; }
  server { listen 127.0.0.1:%(p)d; root %(r)s; location / { } }
}
""" % {"t": tmp, "p": port, "r": root})
    proc = subprocess.Popen(["nginx", "-c", conf, "-p", tmp], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, port
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("nginx did not start")


def children(pid):
    try:
        with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def peak_rss_kib(pid):
    try:
        for line in open("/proc/%d/status" % pid):
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def round_of(url, clients, size):
    """Seconds for `clients` curls fetching url at once; raises on a short download."""
    t0 = time.time()
    procs = [subprocess.Popen(["curl", "-sS", "-o", "/dev/null", "-w", "%{size_download}", url],
                              stdout=subprocess.PIPE) for _ in range(clients)]
    for p in procs:
        out, _ = p.communicate(timeout=600)
        if p.returncode != 0 or int(out or 0) != size:
            raise RuntimeError("short download from %s: %r" % (url, out))
    return time.time() - t0


def measure(url, clients, size, runs):
    round_of(url, clients, size)  # warm-up
    times = [round_of(url, clients, size) for _ in range(runs)]
    best = min(times)
    return {"seconds": times, "best_s": best, "gib_per_s": clients * size / best / (1 << 30)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ckptfs")
    ap.add_argument("outdir")
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    if not shutil.which("nginx") and os.geteuid() == 0:  # the peer, installed like peers.py's
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        cmd = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "nginx-light"]
        if subprocess.run(cmd, env=env).returncode != 0:
            subprocess.run(["apt-get", "update", "-qq"], env=env)
            subprocess.run(cmd, env=env)
    for tool in ("curl", "nginx"):
        if not shutil.which(tool):
            print("serve_bench: %s not found (apt-get install %s); skipped" % (tool, tool))
            return 0
    data = os.path.abspath(os.path.join(a.outdir, "serve-data"))
    src = os.path.join(data, "sharded")
    stamp = os.path.join(src, ".gib-%g" % a.gib)
    if not os.path.exists(stamp):
        shutil.rmtree(src, ignore_errors=True)
        write_shards(src, a.gib)
        open(stamp, "w").close()
    tmp = tempfile.mkdtemp(prefix="serve-bench.")
    result = {"clients": a.clients, "gib": a.gib}
    status = 0
    try:
        with Server(a.ckptfs, ["bench=" + src]) as srv:
            url = srv.url + "/ckptfs/bench/resolve/main/model.safetensors"
            web = os.path.join(data, "www")
            os.makedirs(web, exist_ok=True)
            consolidated = os.path.join(web, "model.safetensors")
            subprocess.run(["curl", "-sS", "-o", consolidated, url], check=True)
            size = os.path.getsize(consolidated)
            ok = check_consolidated(consolidated, shard_tensors(src))
            result["consolidated_bytes"] = size
            result["consolidated_matches_shards"] = ok
            if not ok:
                status = 1
            result["ckptfs"] = measure(url, a.clients, size, a.runs)
            result["ckptfs"]["rss_mib"] = peak_rss_kib(srv.proc.pid) / 1024
        ng, port = start_nginx(web, tmp)
        try:
            url = "http://127.0.0.1:%d/model.safetensors" % port
            result["nginx"] = measure(url, a.clients, size, a.runs)
            result["nginx"]["rss_mib"] = max([peak_rss_kib(ng.pid)] +
                                             [peak_rss_kib(c) for c in children(ng.pid)]) / 1024
        finally:
            ng.send_signal(signal.SIGQUIT)
            ng.wait(30)
    except RuntimeError as e:
        print("serve_bench: %s" % e)
        status = 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if "nginx" in result and "ckptfs" in result:
        ratio = result["ckptfs"]["gib_per_s"] / result["nginx"]["gib_per_s"]
        result["ratio"] = ratio
        result["target_ratio_met"] = ratio >= 0.8
        result["target_rss_met"] = result["ckptfs"]["rss_mib"] < 128
        print("serve bench: %d clients x %.2f GiB (consolidated HF view of %d shards)"
              % (a.clients, size / (1 << 30), SHARDS))
        print("  %-8s %10s %10s" % ("server", "GiB/s", "RSS MiB"))
        for k in ("ckptfs", "nginx"):
            print("  %-8s %10.2f %10.1f" % (k, result[k]["gib_per_s"], result[k]["rss_mib"]))
        print("  ratio %.2f (target >= 0.8: %s), ckptfs RSS target < 128 MiB: %s"
              % (ratio, "met" if ratio >= 0.8 else "MISSED",
                 "met" if result["target_rss_met"] else "MISSED"))
    os.makedirs(a.outdir, exist_ok=True)
    json.dump(result, open(os.path.join(a.outdir, "bench-serve.json"), "w"), indent=1)
    return status


if __name__ == "__main__":
    sys.exit(main())
