#!/usr/bin/python3
"""Bench of the sharded paths, side by side in one run (ratios, medians, min-max):

  mount   mount time (command start to live mount), `find -printf` of every stat, daemon peak
          RSS, for: a 10,000-tensor safetensors file; a 64-shard HF index directory with
          100,000 tensors; a 64-shard DCP-HF directory with 100,000 tensors.
  consolidate  a 4-rank DCP-HF checkpoint of 1 GiB split on dim 1:
          cat of the HF view's model.safetensors through ckptfs (assembled on read) vs the
          same view of one consolidated safetensors file (no assembly) vs cat of that file on
          disk; cat of one dim-1-sharded tensor vs the same plain tensor; and a Python + numpy
          consolidation script doing what the torch/NeMo consolidators do (read the headers,
          copy the runs into one output file).

usage: shard_bench.py CKPTFS OUTDIR     (env RUNS=5)
Writes OUTDIR/bench-shard.json and prints a table. Every timed read is read again, untimed,
and compared with the checkpoint this script wrote (sha256 per tensor); wrong bytes fail the
run (exit 1), whatever the times.
"""
import hashlib
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

RUNS = int(os.environ.get("RUNS", "5"))


def write_safetensors(path, tensors, metadata=None):
    """tensors: list of (name, dtype string, shape, bytes-like)."""
    header, offset = {}, 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for _, _, _, data in tensors:
            f.write(data)


def make_many(path, n):
    data = bytes(16)
    write_safetensors(path, [(f"model.layers.{i // 10}.block.p{i % 10}.weight", "F32", [4], data)
                             for i in range(n)])


def make_hf_index(d, shards, n):
    os.makedirs(d, exist_ok=True)
    per, weight_map = n // shards, {}
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        names = [f"model.layers.{(s * per + i) // 20}.mod.p{(s * per + i) % 20}.weight" for i in range(per)]
        write_safetensors(os.path.join(d, fname), [(x, "F32", [4], bytes(16)) for x in names],
                          {"format": "pt"})
        weight_map.update({x: fname for x in names})
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 16 * n}, "weight_map": weight_map}, f, indent=2)


def make_dcp_hf(d, ranks, tensors, split_dim):
    """tensors: list of (name, full numpy array). Each rank gets a slice on split_dim."""
    os.makedirs(d, exist_ok=True)
    for r in range(ranks):
        items, info = [], {}
        for name, full in tensors:
            width = full.shape[split_dim] // ranks
            sl = [slice(None)] * full.ndim
            sl[split_dim] = slice(r * width, (r + 1) * width)
            chunk = np.ascontiguousarray(full[tuple(sl)])
            origin = [0] * full.ndim
            origin[split_dim] = r * width
            items.append((name, "F32", chunk.shape, chunk.tobytes()))
            info[name] = {"saved_offsets": origin}
        meta = {"DCP_SHARDING_INFO": json.dumps(info), "DCP_VERSION": "1.0", "format": "pt"}
        write_safetensors(os.path.join(d, f"shard-{r + 1:05d}-model-00001-of-00001.safetensors"), items, meta)


def make_dcp_many(d, shards, n):
    """100,000 small tensors over 64 rank files, each tensor split on dim 0 across 2 ranks."""
    os.makedirs(d, exist_ok=True)
    per = n // (shards // 2)
    for r in range(shards):
        pair, half = r // 2, r % 2
        items, info = [], {}
        for i in range(per):
            name = f"model.layers.{(pair * per + i) // 20}.mod.p{(pair * per + i) % 20}.weight"
            items.append((name, "F32", [2, 4], bytes(32)))
            info[name] = {"saved_offsets": [2 * half, 0]}
        meta = {"DCP_SHARDING_INFO": json.dumps(info), "DCP_VERSION": "1.0", "format": "pt"}
        write_safetensors(os.path.join(d, f"shard-{r + 1:05d}-model-00001-of-00001.safetensors"), items, meta)


class Mount:
    def __init__(self, ckptfs, src, opts=()):
        self.mnt = tempfile.mkdtemp(prefix="ckptfs-shard-bench.")
        t0 = time.perf_counter()
        subprocess.run([ckptfs, src, self.mnt, *opts], check=True, timeout=300)
        self.mount_s = time.perf_counter() - t0

    def daemon_pid(self):
        out = subprocess.run(["pgrep", "-f", f"ckptfs .* {self.mnt}"], capture_output=True, text=True).stdout
        return int(out.split()[0]) if out.strip() else None

    def peak_rss_kib(self):
        pid = self.daemon_pid()
        if not pid:
            return None
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
        return None

    def close(self):
        subprocess.run(["fusermount3", "-u", self.mnt], check=False, timeout=60)
        os.rmdir(self.mnt)


def timed(cmd):
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, timeout=600, shell=isinstance(cmd, str))
    return time.perf_counter() - t0


def file_sha(path, start=0, length=None):
    h, left = hashlib.sha256(), length
    with open(path, "rb") as f:
        f.seek(start)
        while left is None or left > 0:
            chunk = f.read(1 << 22 if left is None else min(1 << 22, left))
            if not chunk:
                break
            h.update(chunk)
            if left is not None:
                left -= len(chunk)
    return h.hexdigest()


def safetensors_shas(path):
    """{name: sha256} of a safetensors file read here (header parsed, each tensor hashed)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return {name: file_sha(path, 8 + n + e["data_offsets"][0],
                           e["data_offsets"][1] - e["data_offsets"][0])
            for name, e in header.items()}


WRONG = []


def check_bytes(what, got, want):
    """A timed read is only worth its time when it returned the right bytes: every timed
    file is read again, untimed, and compared; any difference fails the run."""
    if got != want:
        diff = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k)) \
            if isinstance(got, dict) else ["content"]
        WRONG.append("%s: wrong bytes (%s)" % (what, ", ".join(diff[:3])))
        print("WRONG BYTES: " + WRONG[-1], file=sys.stderr, flush=True)


def summary(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "runs": xs}


def python_consolidate(shard_dir, out_path):
    """What torch's/NeMo's consolidators do: headers first, then copy each chunk's rows into
    the full tensor's place in one output file."""
    files = sorted(os.path.join(shard_dir, f) for f in os.listdir(shard_dir) if f.endswith(".safetensors"))
    chunks, full = {}, {}
    for path in files:
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
        info = json.loads(header["__metadata__"]["DCP_SHARDING_INFO"])
        for name, e in header.items():
            if name == "__metadata__":
                continue
            origin = info[name]["saved_offsets"]
            chunks.setdefault(name, []).append((path, 8 + n + e["data_offsets"][0], e["shape"], origin))
            shape = [max(a, o + s) for a, o, s in zip(full.get(name, [0] * len(origin)), origin, e["shape"])]
            full[name] = shape
    order, header, offset = sorted(full), {}, 0
    for name in order:
        nbytes = 4 * int(np.prod(full[name]))
        header[name] = {"dtype": "F32", "shape": full[name], "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(header).encode()
    with open(out_path, "wb") as out:
        out.write(struct.pack("<Q", len(text)) + text)
        base = out.tell()
        for name in order:
            shape = full[name]
            row_bytes = 4 * shape[1]
            for path, off, cshape, origin in chunks[name]:
                src = np.memmap(path, dtype="<f4", mode="r", offset=off, shape=tuple(cshape))
                for row in range(cshape[0]):
                    out.seek(base + header[name]["data_offsets"][0] + (origin[0] + row) * row_bytes + 4 * origin[1])
                    out.write(src[row].tobytes())
        out.flush()
        os.fsync(out.fileno())


def main():
    ckptfs, outdir = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    data = os.path.join(outdir, "shard-data")
    os.makedirs(data, exist_ok=True)
    results = {"runs": RUNS}

    # ---- mount time, find + stat, RSS ----
    sources = {
        "safetensors 10k tensors": os.path.join(data, "many10k.safetensors"),
        "HF index 64 shards 100k tensors": os.path.join(data, "hf100k"),
        "DCP-HF 64 shards 100k tensors": os.path.join(data, "dcp100k"),
    }
    if not os.path.exists(sources["safetensors 10k tensors"]):
        make_many(sources["safetensors 10k tensors"], 10000)
    if not os.path.exists(sources["HF index 64 shards 100k tensors"]):
        make_hf_index(sources["HF index 64 shards 100k tensors"], 64, 100000)
    if not os.path.exists(sources["DCP-HF 64 shards 100k tensors"]):
        make_dcp_many(sources["DCP-HF 64 shards 100k tensors"], 64, 100000)
    results["mount"] = {}
    for label, src in sources.items():
        mounts, finds, rss = [], [], []
        for _ in range(RUNS):
            m = Mount(ckptfs, src)
            try:
                mounts.append(m.mount_s)
                finds.append(timed(["find", m.mnt, "-printf", "%s %m %i\n"]))
                rss.append(m.peak_rss_kib())
            finally:
                m.close()
        results["mount"][label] = {"mount_s": summary(mounts), "find_stat_s": summary(finds),
                                   "peak_rss_kib": max(x for x in rss if x)}

    # ---- consolidated read of a 1 GiB dim-1 sharded checkpoint ----
    dcp = os.path.join(data, "dcp_dim1")
    plain = os.path.join(data, "plain_dim1.safetensors")
    if not os.path.exists(plain):
        rng = np.random.default_rng(0)
        tensors = [(f"model.layers.{i}.mlp.up_proj.weight", rng.standard_normal((4096, 4096), dtype=np.float32))
                   for i in range(16)]
        make_dcp_hf(dcp, 4, tensors, 1)
        write_safetensors(plain, [(n, "F32", a.shape, a.tobytes()) for n, a in tensors], {"format": "pt"})
        del tensors
    subprocess.run(f"cat {dcp}/* {plain} > /dev/null", shell=True, check=True)
    # The reference: the plain file this script wrote, read by this script.
    want = safetensors_shas(plain)
    one = "model.layers.0.mlp.up_proj.weight"
    rows = {"view_assembled": [], "view_plain": [], "file_on_disk": [], "tensor_dim1": [],
            "tensor_plain": [], "python_consolidate": []}
    for _ in range(RUNS):
        a, b = Mount(ckptfs, dcp), Mount(ckptfs, plain)
        try:
            rows["view_assembled"].append(timed(["cat", f"{a.mnt}/.ckptfs/hf/model.safetensors"]))
            rows["view_plain"].append(timed(["cat", f"{b.mnt}/.ckptfs/hf/model.safetensors"]))
            check_bytes("assembled view", safetensors_shas(f"{a.mnt}/.ckptfs/hf/model.safetensors"),
                        want)
            check_bytes("plain view", safetensors_shas(f"{b.mnt}/.ckptfs/hf/model.safetensors"),
                        want)
        finally:
            a.close()
            b.close()
        a, b = Mount(ckptfs, dcp), Mount(ckptfs, plain)
        try:
            rows["tensor_dim1"].append(timed(["cat", f"{a.mnt}/model/layers/0/mlp/up_proj/weight"]))
            rows["tensor_plain"].append(timed(["cat", f"{b.mnt}/model/layers/0/mlp/up_proj/weight"]))
            check_bytes("dim-1 tensor", file_sha(f"{a.mnt}/model/layers/0/mlp/up_proj/weight"),
                        want[one])
            check_bytes("plain tensor", file_sha(f"{b.mnt}/model/layers/0/mlp/up_proj/weight"),
                        want[one])
        finally:
            a.close()
            b.close()
        rows["file_on_disk"].append(timed(["cat", plain]))
        out = os.path.join(data, "consolidated_by_python.safetensors")
        t0 = time.perf_counter()
        python_consolidate(dcp, out)
        rows["python_consolidate"].append(time.perf_counter() - t0)
        check_bytes("python consolidation", safetensors_shas(out), want)
        os.unlink(out)
    results["consolidate"] = {k: summary(v) for k, v in rows.items()}
    results["bytes_checked"] = not WRONG
    results["wrong_bytes"] = WRONG

    with open(os.path.join(outdir, "bench-shard.json"), "w") as f:
        json.dump(results, f, indent=2)
    print(f"{'mount (median of %d)' % RUNS:40} {'mount s':>9} {'find+stat s':>12} {'peak RSS MiB':>13}")
    for label, r in results["mount"].items():
        print(f"{label:40} {r['mount_s']['median']:9.3f} {r['find_stat_s']['median']:12.3f} "
              f"{r['peak_rss_kib'] / 1024:13.1f}")
    c = results["consolidate"]
    med = {k: v["median"] for k, v in c.items()}
    gib = 16 * 4096 * 4096 * 4 / 2**30
    print(f"\n{'consolidated read, 1 GiB, 4 ranks split on dim 1':52} {'median s':>9} {'min-max':>15} {'GiB/s':>7}")
    for k in ("view_assembled", "view_plain", "file_on_disk", "python_consolidate"):
        v = c[k]
        print(f"{k:52} {v['median']:9.3f} {v['min']:7.3f}-{v['max']:<7.3f} {gib / v['median']:7.2f}")
    for k in ("tensor_dim1", "tensor_plain"):
        v = c[k]
        print(f"{k + ' (64 MiB)':52} {v['median']:9.3f} {v['min']:7.3f}-{v['max']:<7.3f} {gib / 16 / v['median']:7.2f}")
    print(f"\nassembled view vs plain view: {med['view_plain'] / med['view_assembled']:.2f}x (target >= 0.8)")
    print(f"assembled view vs file on disk: {med['file_on_disk'] / med['view_assembled']:.2f}x")
    print(f"plain view vs file on disk: {med['file_on_disk'] / med['view_plain']:.2f}x")
    print(f"dim-1 tensor vs plain tensor: {med['tensor_plain'] / med['tensor_dim1']:.2f}x (target >= 0.8)")
    print(f"python consolidation vs reading the assembled view: "
          f"{med['python_consolidate'] / med['view_assembled']:.2f}x slower")
    if WRONG:
        print("\nFAIL: timed reads returned wrong bytes, so the times above mean nothing:")
        for w in WRONG:
            print("  " + w)
        sys.exit(1)
    print("every timed read was compared with the bytes this script wrote: all equal")


if __name__ == "__main__":
    main()
