#!/usr/bin/python3
"""Many hosts reading one served checkpoint through a caching proxy, the deployment README.md
documents: hosts are network namespaces on one bridge (tests/lib/netns.py), made and removed
here; nothing leaves the machine.

  origin  ckptfs serve model=SRC (an HF folder of two safetensors shards, written here)
  cache   nginx, proxy_cache with 1 MiB slices in front of the origin; it holds the origin's
          token (--token-file) and the clients, on the trusted side, need none
  c1..c4  ckptfs hf://ckptfs/model MNT, HF_ENDPOINT at the cache

The same topology against an S3 origin (tests/lib/s3_sigv4_server.py, which verifies every
SigV4 signature) with nginx caching the objects: two clients mount s3://models/ with
s3_endpoint at the cache.

Checks: every client's tensors equal the arrays the source was written from, and its HF view
files are byte-identical to every other client's and to what the origin serves; the origin
sends each byte about once (nginx's upstream byte count against four clients' reads); a
client whose link is cut mid-read gets EIO within its remote_timeout, never a hang, and reads
the same bytes once the link is back.

Needs root, iproute2, nsenter and nginx: a SKIP without them, a failure under CKPTFS_CI=1.
"""

import hashlib
import json
import os
import re
import struct
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from ckptfs_test import Tap, is_mounted, unmount  # noqa: E402
from netns import NGINX_CONF, NGINX_S3_CONF, Hosts, missing_tools, tcp_up, wait_for  # noqa: E402
from remote_servers import nginx_binary  # noqa: E402

CKPTFS = os.environ.get("CKPTFS")
CLIENTS = ["c1", "c2", "c3", "c4"]
PORT = 8080
TIMEOUT = 3  # remote_timeout of the clients, seconds


def write_safetensors(path, tensors):
    """A safetensors file by the format's own rules (u64 header length, JSON, data)."""
    header, data = {}, b""
    for name, arr in tensors.items():
        b = arr.tobytes()
        header[name] = {"dtype": {"float32": "F32", "float16": "F16"}[arr.dtype.name],
                        "shape": list(arr.shape), "data_offsets": [len(data), len(data) + len(b)]}
        data += b
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)


def make_source(root):
    rng = np.random.default_rng(99)
    shards = [{"model.layers.%d.weight" % i: rng.standard_normal((1024, 1024)).astype(np.float32)
               for i in range(2)},
              {"model.layers.%d.weight" % i: rng.standard_normal((1024, 1024)).astype(np.float32)
               for i in range(2, 4)} | {"model.norm.weight": np.ones(1024, np.float16)}]
    os.makedirs(root)
    index = {"metadata": {}, "weight_map": {}}
    arrays = {}
    for k, shard in enumerate(shards):
        name = "model-%05d-of-%05d.safetensors" % (k + 1, len(shards))
        write_safetensors(os.path.join(root, name), shard)
        for t, a in shard.items():
            index["weight_map"][t] = name
            arrays[t] = a
    with open(os.path.join(root, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f)
    with open(os.path.join(root, "config.json"), "w") as f:
        json.dump({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}, f)
    return arrays


def sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def s3_part(tap, h, work, arrays, mounts):
    """Two clients read the checkpoint from an S3 origin through the caching nginx."""
    origin, cache = h.addr("s3origin"), h.addr("s3cache")
    lib = os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib")
    h.popen("s3origin", [sys.executable, os.path.join(lib, "s3_sigv4_server.py"), "--root",
                         os.path.join(work, "src"), "--bucket", "models", "--key", "AKIDHOSTS",
                         "--secret", "hosts-secret", "--listen", origin, "--port", str(PORT),
                         "--base-host", cache],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    nd = os.path.join(work, "nginx-s3")
    os.makedirs(os.path.join(nd, "tmp"))
    with open(os.path.join(nd, "nginx.conf"), "w") as f:
        f.write(NGINX_S3_CONF % {"d": nd, "addr": cache, "port": PORT, "origin": origin})
    h.popen("s3cache", [nginx_binary(), "-c", os.path.join(nd, "nginx.conf"), "-p", nd],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    up = wait_for(lambda: tcp_up(h, "s3cache", origin), 20) and \
        wait_for(lambda: tcp_up(h, "s1", cache), 20)
    tap.ok(up, "the S3 origin and its cache listen")
    if not up:
        return
    env = dict(os.environ, AWS_ACCESS_KEY_ID="AKIDHOSTS", AWS_SECRET_ACCESS_KEY="hosts-secret",
               AWS_REGION="us-east-1")
    reads = {}
    for c in ("s1", "s2"):
        mnt = tempfile.mkdtemp(prefix="ckptfs-host-%s." % c)
        p = h.run(c, [CKPTFS, "s3://models/", mnt, "-o",
                      "s3_endpoint=http://%s:%d,remote_timeout=%d" % (cache, PORT, TIMEOUT)],
                  env=env, capture_output=True, timeout=120)
        mounts.append(mnt)
        tap.ok(p.returncode == 0 and is_mounted(mnt), "%s mounts s3://models/ through the cache"
               % c, [p.returncode, p.stderr.decode()[-2000:]])
        if p.returncode != 0:
            continue
        ok = all(np.fromfile(os.path.join(mnt, t.replace(".", "/")), a.dtype).tobytes() ==
                 a.tobytes() for t, a in arrays.items())
        hf = os.path.join(mnt, ".ckptfs", "hf")
        reads[c] = (ok, {n: sha(os.path.join(hf, n)) for n in sorted(os.listdir(hf))
                         if n.endswith(".safetensors")})
    tap.ok(len(reads) == 2 and all(r[0] for r in reads.values()) and
           reads["s1"][1] == reads["s2"][1] and reads["s1"][1],
           "both S3 clients read the source's arrays and byte-identical HF views", [reads])
    upstream, objects = 0, 0
    with open(os.path.join(nd, "access.log")) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 4 and parts[0] == "GET" and parts[1].endswith(".safetensors"):
                upstream += int(parts[3]) if parts[3].isdigit() else 0
    objects = sum(os.path.getsize(os.path.join(work, "src", n))
                  for n in os.listdir(os.path.join(work, "src")) if n.endswith(".safetensors"))
    tap.ok(0 < upstream < 1.5 * objects + (2 << 20), "the S3 origin sent the shards about once: "
           "%.2f MB upstream for 2 clients, %.2f MB of shards" % (upstream / 1e6, objects / 1e6),
           ["upstream %d, shards %d" % (upstream, objects)])


def main():
    tap = Tap()
    missing = missing_tools() + ([] if nginx_binary() else ["nginx"])
    if not CKPTFS or not os.path.exists("/dev/fuse"):
        missing.append("CKPTFS and /dev/fuse")
    if missing:
        if os.environ.get("CKPTFS_CI") == "1":
            tap.ok(False, "the many-hosts test can run (CI)", ["missing: " + ", ".join(missing)])
            tap.done()
            return 1
        print("1..0 # SKIP needs " + ", ".join(missing))
        return 0
    work = tempfile.mkdtemp(prefix="ckptfs-hosts-")
    arrays = make_source(os.path.join(work, "src"))
    mounts = []
    try:
        with Hosts(["origin", "cache"] + CLIENTS + ["cut", "s3origin", "s3cache", "s1", "s2"]) as h:
            origin, cache = h.addr("origin"), h.addr("cache")
            serve_err = open(os.path.join(work, "serve.err"), "w")
            token = "cache-" + hashlib.sha256(work.encode()).hexdigest()[:24]
            with open(os.path.join(work, "token"), "w") as f:
                f.write(token + "\n")
            os.chmod(os.path.join(work, "token"), 0o600)
            h.popen("origin", [CKPTFS, "serve", "--listen", "%s:%d" % (origin, PORT),
                               "--token-file", os.path.join(work, "token"),
                               "model=" + os.path.join(work, "src")],
                    stdout=subprocess.DEVNULL, stderr=serve_err)
            nd = os.path.join(work, "nginx")
            os.makedirs(os.path.join(nd, "tmp"))
            with open(os.path.join(nd, "nginx.conf"), "w") as f:
                f.write(NGINX_CONF % {"d": nd, "addr": cache, "port": PORT, "origin": origin,
                                      "token": token})
            h.popen("cache", [nginx_binary(), "-c", os.path.join(nd, "nginx.conf"), "-p", nd],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            up = wait_for(lambda: tcp_up(h, "cache", origin), 20) and \
                wait_for(lambda: tcp_up(h, "c1", cache), 20)
            tap.ok(up, "origin and cache listen on their hosts' addresses",
                   [open(os.path.join(work, "serve.err")).read()])
            if not up:
                tap.done()
                return 1

            env = dict(os.environ, HF_ENDPOINT="http://%s:%d" % (cache, PORT))

            def mount(host, opts):
                mnt = tempfile.mkdtemp(prefix="ckptfs-host-%s." % host)
                p = h.run(host, [CKPTFS, "hf://ckptfs/model", mnt, "-o", opts], env=env,
                          capture_output=True, timeout=120)
                mounts.append(mnt)
                return mnt, p
            opts = "remote_timeout=%d,retries=1" % TIMEOUT
            mnts = {}
            for c in CLIENTS:
                mnt, p = mount(c, opts)
                mnts[c] = mnt
                tap.ok(p.returncode == 0 and is_mounted(mnt), "%s mounts hf://ckptfs/model "
                       "through the cache" % c, [p.returncode, p.stderr.decode()[-2000:]])
            views = {}

            def read_all(c):
                mnt = mnts[c]
                hf = os.path.join(mnt, ".ckptfs", "hf")
                try:
                    views[c] = {n: sha(os.path.join(hf, n)) for n in sorted(os.listdir(hf))
                                if n.endswith((".safetensors", ".json"))}
                    views[c]["tensors"] = {t: np.fromfile(os.path.join(mnt, t.replace(".", "/")),
                                                          a.dtype).tobytes() == a.tobytes()
                                           for t, a in arrays.items()}
                except OSError as e:
                    views[c] = {"error": str(e)}
            threads = [threading.Thread(target=read_all, args=(c,)) for c in CLIENTS]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
            bad = {c: v for c, v in views.items()
                   if "error" in v or not all(v.get("tensors", {}).values())}
            tap.ok(len(views) == len(CLIENTS) and not bad, "every client's tensors equal the "
                   "arrays the source was written from (%d clients at once)" % len(CLIENTS),
                   [bad])
            files = {c: {k: v for k, v in views.get(c, {}).items() if k != "tensors"}
                     for c in CLIENTS}
            first = files[CLIENTS[0]]
            tap.ok(first and all(files[c] == first for c in CLIENTS),
                   "every client's HF view is byte-identical (%d files)" % len(first), [files])
            # the origin's own bytes, fetched from the cache host straight from the origin
            direct = {}
            for n in first:
                p = h.run("cache", ["curl", "-sf", "-H", "Authorization: Bearer " + token,
                                    "http://%s:%d/ckptfs/model/resolve/main/%s" % (origin, PORT, n)],
                          capture_output=True, timeout=60)
                direct[n] = hashlib.sha256(p.stdout).hexdigest() if p.returncode == 0 else None
            tap.ok(direct == first, "the HF view equals what the origin serves", [direct, first])

            view_bytes = sum(os.path.getsize(os.path.join(mnts["c1"], ".ckptfs", "hf", n))
                             for n in first)
            upstream = 0
            with open(os.path.join(nd, "access.log")) as f:
                for line in f:
                    m = re.search(r" (\d+)$", line.strip())
                    if m and "/resolve/" in line:
                        upstream += int(m.group(1))
            tap.ok(0 < upstream < 1.5 * view_bytes + (2 << 20),
                   "the origin sent each byte about once: %.2f MB upstream for %d clients "
                   "reading %.2f MB each" % (upstream / 1e6, len(CLIENTS), view_bytes / 1e6),
                   ["upstream %d, view %d" % (upstream, view_bytes)])

            # a client whose link is cut mid-read: EIO after its timeout, then reads again
            mnt, p = mount("cut", opts + ",prefetch=0,block_size=1MiB")
            tap.ok(p.returncode == 0, "the client to be cut mounts", [p.stderr.decode()])
            path = os.path.join(mnt, "model", "layers", "3", "weight")
            want = arrays["model.layers.3.weight"].tobytes()
            with open(path, "rb") as f:
                head = f.read(1 << 20)
                h.cut("cut")
                t0 = time.time()
                result = {}

                def late_read():
                    try:
                        f.seek(len(want) - (1 << 20))
                        result["data"] = f.read(1 << 20)
                    except OSError as e:
                        result["errno"] = e.errno
                r = threading.Thread(target=late_read, daemon=True)
                r.start()
                r.join(TIMEOUT * 4 + 30)
                took = time.time() - t0
            tap.ok(not r.is_alive() and result.get("errno") == 5,
                   "a read after the link is cut fails with EIO in %.1f s (remote_timeout %d s, "
                   "one retry), no hang" % (took, TIMEOUT), [result.keys(), took])
            h.mend("cut")
            got = None
            for _ in range(20):  # the link comes back: the next read works
                try:
                    with open(path, "rb") as f:
                        got = f.read()
                    break
                except OSError:
                    time.sleep(0.5)
            tap.ok(head == want[:1 << 20] and got == want,
                   "once the link is back the same client reads the whole tensor, every byte "
                   "right", [len(got or b"")])
            s3_part(tap, h, work, arrays, mounts)
            for m in mounts:
                tap.ok(unmount(m), "unmount %s" % os.path.basename(m))
            mounts = []
    finally:
        for m in mounts:
            unmount(m)
        subprocess.run(["rm", "-rf", work])
    tap.done()
    return 0 if tap.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
