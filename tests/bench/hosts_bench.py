#!/usr/bin/python3
"""Many hosts, one checkpoint: 8 client hosts read the 1 GiB HF view of a 4-shard checkpoint
through a caching nginx in front of `ckptfs serve` (the deployment README.md documents), against
the same 8 hosts downloading the consolidated file from nginx serving it from disk.

usage: hosts_bench.py CKPTFS OUTDIR [--gib N] [--clients N] [--runs N]   (`make bench`, root)

Hosts are network namespaces on one bridge (tests/lib/netns.py): origin (ckptfs serve), cache
(nginx proxy_cache, 1 MiB slices, the test's configuration), plain (nginx serving the
consolidated file, sendfile on) and the clients. Each run, for ckptfs: every client mounts
hf://ckptfs/model with HF_ENDPOINT at the cache and reads .ckptfs/hf/model.safetensors whole,
all at once (the first run fills the cache: "cold"; later ones find it warm); for nginx: every
client curls the consolidated file from plain. The wall time from the first start to the last
end gives the aggregate throughput. Bytes from the origin: nginx's upstream byte count.

Prints a table and writes OUTDIR/bench-hosts.json. Exit status 0, or 1 when a client read
wrong bytes.
"""

import argparse
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
from ckptfs_test import unmount  # noqa: E402
from netns import NGINX_CONF, Hosts, missing_tools, tcp_up, wait_for  # noqa: E402
from remote_servers import nginx_binary  # noqa: E402

PORT = 8080


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def sha_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(1 << 22)
            if not b:
                return h.hexdigest()
            h.update(b)


def at_once(fns):
    out = [None] * len(fns)

    def run(i):
        out[i] = fns[i]()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(fns))]
    t0 = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.time() - t0, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ckptfs")
    ap.add_argument("outdir")
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    missing = missing_tools() + ([] if nginx_binary() else ["nginx"])
    if missing:
        print("hosts_bench: skipped, needs " + ", ".join(missing))
        return 0
    serve_bench = load(os.path.join(HERE, "serve_bench.py"), "serve_bench")
    data = os.path.join(a.outdir, "serve-data", "sharded")
    if not os.path.exists(os.path.join(data, "model.safetensors.index.json")):
        serve_bench.write_shards(data, a.gib)
    work = tempfile.mkdtemp(prefix="ckptfs-hosts-bench-")
    clients = ["c%d" % i for i in range(1, a.clients + 1)]
    mounts, rows, ok = [], [], True
    try:
        with Hosts(["origin", "cache", "plain"] + clients) as h:
            token = "bench-" + hashlib.sha256(work.encode()).hexdigest()[:20]
            with open(os.path.join(work, "token"), "w") as f:
                f.write(token + "\n")
            h.popen("origin", [a.ckptfs, "serve", "--listen", "%s:%d" % (h.addr("origin"), PORT),
                               "--token-file", os.path.join(work, "token"), "model=" + data],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            nd = os.path.join(work, "nginx")
            os.makedirs(os.path.join(nd, "tmp"))
            with open(os.path.join(nd, "nginx.conf"), "w") as f:
                f.write(NGINX_CONF % {"d": nd, "addr": h.addr("cache"), "port": PORT,
                                           "origin": h.addr("origin"), "token": token})
            h.popen("cache", [nginx_binary(), "-c", os.path.join(nd, "nginx.conf"), "-p", nd],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            wait_for(lambda: tcp_up(h, "cache", h.addr("origin")), 30)
            wait_for(lambda: tcp_up(h, "c1", h.addr("cache")), 30)
            env = dict(os.environ, HF_ENDPOINT="http://%s:%d" % (h.addr("cache"), PORT))
            # the consolidated file, for plain nginx: straight from the origin, so that the cache
            # stays empty until the first ckptfs run
            plain_root = os.path.join(work, "plain")
            os.makedirs(os.path.join(plain_root, "tmp"))
            p = h.run("cache", ["curl", "-sf", "-H", "Authorization: Bearer " + token, "-o",
                                os.path.join(plain_root, "model.safetensors"),
                                "http://%s:%d/ckptfs/model/resolve/main/model.safetensors"
                                % (h.addr("origin"), PORT)])
            if p.returncode != 0:
                print("hosts_bench: cannot fetch the view from the origin")
                return 1
            want = sha_file(os.path.join(plain_root, "model.safetensors"))
            size = os.path.getsize(os.path.join(plain_root, "model.safetensors"))
            with open(os.path.join(plain_root, "nginx.conf"), "w") as f:
                f.write("""daemon off; master_process on; worker_processes 2;
pid %(d)s/nginx.pid; error_log %(d)s/error.log warn;
events { worker_connections 512; }
http { access_log off; sendfile on; client_body_temp_path %(d)s/tmp;
  server { listen %(addr)s:%(port)d; root %(d)s; } }
""" % {"d": plain_root, "addr": h.addr("plain"), "port": PORT})
            h.popen("plain", [nginx_binary(), "-c", os.path.join(plain_root, "nginx.conf"), "-p",
                              plain_root], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            wait_for(lambda: tcp_up(h, "c1", h.addr("plain")), 30)

            def upstream():
                n = 0
                with open(os.path.join(nd, "access.log")) as f:
                    for line in f:
                        m = re.search(r" (\d+)$", line.strip())
                        if m and "/resolve/" in line:
                            n += int(m.group(1))
                return n
            before = upstream()
            for run in range(a.runs):
                # fresh page caches: a mount per run for ckptfs, curl reads from the network
                for m in mounts:
                    unmount(m)
                mounts = []
                for c in clients:
                    mnt = tempfile.mkdtemp(prefix="ckptfs-hb-%s." % c)
                    h.run(c, [a.ckptfs, "hf://ckptfs/model", mnt], env=env, capture_output=True)
                    mounts.append(mnt)
                files = [os.path.join(m, ".ckptfs", "hf", "model.safetensors") for m in mounts]
                wall, shas = at_once([lambda p=p: sha_file(p) for p in files])
                ok = ok and all(s == want for s in shas)
                rows.append(("ckptfs via cache", "cold" if run == 0 else "warm",
                             a.clients * size / wall / 1e9, wall))
                url = "http://%s:%d/model.safetensors" % (h.addr("plain"), PORT)
                wall, outs = at_once([lambda c=c: h.run(c, ["curl", "-sf", "-o", "/dev/null",
                                                            "-w", "%{size_download}", url],
                                                        capture_output=True).stdout
                                      for c in clients])
                ok = ok and all(o == str(size).encode() for o in outs)
                rows.append(("nginx, consolidated file", "-", a.clients * size / wall / 1e9, wall))
            origin_bytes = upstream() - before
    finally:
        for m in mounts:
            unmount(m)
        shutil.rmtree(work, ignore_errors=True)
    print("%d clients, %.2f GB view each" % (a.clients, size / 1e9))
    print("%-26s %-5s %10s %8s" % ("", "cache", "GB/s", "wall s"))
    for r in rows:
        print("%-26s %-5s %10.2f %8.2f" % r)
    warm = [r[2] for r in rows if r[1] == "warm"]
    plain = [r[2] for r in rows if r[0].startswith("nginx")]
    ratio = (sorted(warm)[len(warm) // 2] / sorted(plain)[len(plain) // 2]) if warm else None
    print("ckptfs warm / nginx (medians): %s" % ("%.2fx" % ratio if ratio else "-"))
    print("bytes from the origin: %.2f GB for %d x %d x %.2f GB read (%.2fx one view)" %
          (origin_bytes / 1e9, a.runs, a.clients, size / 1e9, origin_bytes / size))
    os.makedirs(a.outdir, exist_ok=True)
    with open(os.path.join(a.outdir, "bench-hosts.json"), "w") as f:
        json.dump({"clients": a.clients, "view_bytes": size, "rows": rows,
                   "warm_over_nginx": ratio, "origin_bytes": origin_bytes, "ok": ok}, f,
                  indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
