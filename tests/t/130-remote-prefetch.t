#!/usr/bin/python3
"""Prefetch of remote sources, counted by .ckptfs/cache.json over nginx on loopback.

A safetensors file of three 12 MiB tensors (random bytes, written here) is mounted by URL with
1 MiB blocks and prefetch=4:
  - two readers moving forward through two tensors in turns, 256 KiB each (one open file
    each, kernel readahead off so the daemon sees exactly these reads) both get
    their next blocks prefetched: few blocks are fetched by the readers themselves (misses),
    where one stream per object would restart at every turn and miss every block;
  - a tensor read whole fetches at most one block more than its bytes (plus the first 256 KiB
    block read when the object was opened): prefetch stops at the next tensor's start;
  - two readers of the two halves of a tensor at once, the first reading a little past the
    middle (as the kernel's readahead does past where a reader stops), with 256 KiB blocks and
    a RAM cache of twenty (the second reader's first blocks have left it by then; both windows
    of unread prefetches fit in half of it): at most one block fetched beyond the bytes read
    per reader; prefetch does not fetch again what the second one read;
  - the Hugging Face view's model.safetensors read whole, 256 KiB at a time (its tensors are the
    file's, in the file's order): once the reader has crossed a's end into b, prefetch runs on
    past c's start (a reader of a whole shard is not stopped at every tensor start: blocks
    wholly inside c are fetched before the reader gets there), and every block of the file is
    fetched once;
  - a tar of a.safetensors, ten members of random bytes and b.safetensors: reading a's last
    tensor whole fetches at most one block beyond it (prefetch stops at the member's end, not
    at b's first tensor);
  - every byte read equals the file's.
"""

import io
import json
import os
import struct
import sys
import tarfile
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from mount_checks import finish, mounted, read_json, start  # noqa: E402
import remote_servers  # noqa: E402

MIB = 1 << 20
TENSOR = 12 * MIB
BLOCK = MIB
HEAD = 256 << 10
STEP = 256 << 10
SMALL_BLOCK = 256 << 10  # the halves case: 24 blocks a half, a cache of 20


def safetensors_bytes(names, data):
    header, off = {}, 0
    for n in names:
        header[n] = {"dtype": "U8", "shape": [len(data[n])],
                     "data_offsets": [off, off + len(data[n])]}
        off += len(data[n])
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(data[n] for n in names)


def write_file(path):
    names = ["a", "b", "c"]
    data = {n: os.urandom(TENSOR) for n in names}
    with open(path, "wb") as f:
        f.write(safetensors_bytes(names, data))
    return data


def write_tar(path):
    """a.safetensors (x, y), ten 3 MiB members of random bytes (not checkpoints: their
    headers, read when the archive is indexed, are more than the reader's streams remember),
    b.safetensors (z)."""
    data = {n: os.urandom(TENSOR // 2) for n in ("x", "y", "z")}
    members = [("a.safetensors", safetensors_bytes(["x", "y"], data))]
    members += [("notes%d.bin" % i, os.urandom(3 * MIB)) for i in range(10)]
    members += [("b.safetensors", safetensors_bytes(["z"], data))]
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as t:
        for name, blob in members:
            info = tarfile.TarInfo(name)
            info.size = len(blob)
            t.addfile(info, io.BytesIO(blob))
    return data


def body(tap, ckptfs, work, server, data, tar_data):
    url = server.url + "/three.safetensors"
    opts = ["-o", "block_size=1MiB,prefetch=4"]

    def two_streams(mnt):
        fa = os.open(os.path.join(mnt, "a"), os.O_RDONLY)
        fc = os.open(os.path.join(mnt, "c"), os.O_RDONLY)
        # No kernel readahead: the daemon sees the reads as made, 256 KiB from a, then from c.
        for fd in (fa, fc):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        ok = True
        for off in range(0, TENSOR, STEP):
            ok &= os.pread(fa, STEP, off) == data["a"][off:off + STEP]
            ok &= os.pread(fc, STEP, off) == data["c"][off:off + STEP]
        os.close(fa)
        os.close(fc)
        st = read_json(os.path.join(mnt, ".ckptfs", "cache.json"))
        tap.ok(ok, "two readers in turns read the right bytes")
        blocks = 2 * TENSOR // BLOCK
        tap.ok(st["blocks_prefetched"] >= blocks - 8 and st["block_misses"] <= 8,
               "two streams in turns: %d of %d blocks prefetched, %d fetched by the readers"
               % (st["blocks_prefetched"], blocks, st["block_misses"]), [st])

    mounted(tap, ckptfs, url, "two streams", two_streams, options=opts)

    def one_tensor(mnt):
        with open(os.path.join(mnt, "b"), "rb") as f:
            got = f.read()
        st = read_json(os.path.join(mnt, ".ckptfs", "cache.json"))
        tap.ok(got == data["b"], "tensor b read whole is right")
        waste = st["bytes_fetched"] - TENSOR - HEAD
        tap.ok(waste <= BLOCK,
               "reading one tensor fetched %d bytes more than it and the first block (at most "
               "one block)" % waste, [st])
        tap.ok(st["blocks_prefetched"] >= TENSOR // BLOCK - 4,
               "and it was prefetched (%d blocks)" % st["blocks_prefetched"], [st])

    mounted(tap, ckptfs, url, "one tensor of three", one_tensor, options=opts)

    def whole_shard(mnt):
        size = os.path.getsize(os.path.join(server.root, "three.safetensors"))
        hlen = struct.unpack("<Q", open(os.path.join(server.root, "three.safetensors"),
                                        "rb").read(8))[0]
        c_remote = 8 + hlen + 2 * TENSOR  # where c starts in the served file
        path = os.path.join(mnt, ".ckptfs", "hf", "model.safetensors")
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        vlen = struct.unpack("<Q", os.pread(fd, 8, 0))[0]
        view = json.loads(os.pread(fd, vlen, 8))
        base = 8 + vlen
        c_view = base + view["c"]["data_offsets"][0]
        # Up to the page before the one c starts in: the kernel reads whole pages.
        stop = (c_view // 4096 - 1) * 4096
        got, off = [], 0
        while off < stop:
            got.append(os.pread(fd, min(STEP, stop - off), off))
            off += len(got[-1])
        # The prefetches this read started: wait until they are in.
        st = read_json(os.path.join(mnt, ".ckptfs", "cache.json"))
        for _ in range(100):
            time.sleep(0.05)
            before, st = st, read_json(os.path.join(mnt, ".ckptfs", "cache.json"))
            if st["bytes_fetched"] == before["bytes_fetched"]:
                break
        fetched_at_c = st["bytes_fetched"]
        while True:
            b = os.pread(fd, STEP, off)
            if not b:
                break
            got.append(b)
            off += len(b)
        os.close(fd)
        st = read_json(os.path.join(mnt, ".ckptfs", "cache.json"))
        whole = b"".join(got)
        tap.ok(all(whole[base + view[n]["data_offsets"][0]:base + view[n]["data_offsets"][1]]
                   == data[n] for n in ("a", "b", "c")),
               "the Hugging Face view's model.safetensors read whole holds a, b and c")
        tap.ok(fetched_at_c > c_remote + BLOCK,
               "reading the view up to a page before c's start had bytes up to %d fetched, past "
               "the block that holds c's start (%d): prefetch does not stop at every tensor start for a reader "
               "of many tensors" % (fetched_at_c, c_remote), [st])
        tap.ok(st["bytes_fetched"] <= size,
               "the view read whole fetched %d bytes of a %d-byte file (each block once)"
               % (st["bytes_fetched"], size), [st])

    mounted(tap, ckptfs, url, "a shard read whole", whole_shard, options=opts)

    def halves(mnt):
        half = TENSOR // 2
        past = STEP  # what the first reader reads past the middle
        f1 = os.open(os.path.join(mnt, "a"), os.O_RDONLY)
        f2 = os.open(os.path.join(mnt, "a"), os.O_RDONLY)
        for fd in (f1, f2):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        ok = True
        for off in range(0, half + past, STEP):
            ok &= os.pread(f1, STEP, off) == data["a"][off:off + STEP]
            if half + off < TENSOR:
                ok &= os.pread(f2, STEP, half + off) == data["a"][half + off:half + off + STEP]
        os.close(f1)
        os.close(f2)
        st = read_json(os.path.join(mnt, ".ckptfs", "cache.json"))
        tap.ok(ok, "two readers of the halves of a tensor read the right bytes")
        waste = st["bytes_fetched"] - TENSOR - HEAD
        tap.ok(waste <= 2 * SMALL_BLOCK,
               "two readers stopping mid-tensor fetched %d bytes beyond the tensor and the first "
               "block (at most one block each)" % waste, [st])

    mounted(tap, ckptfs, url, "two halves of a tensor", halves,
            options=["-o", "block_size=256KiB,prefetch=4,cache_ram=5MiB"])

    def member_end(mnt):
        leaf = [os.path.join(dp, f) for dp, _, fs in os.walk(mnt) for f in fs
                if f == "y" and ".ckptfs" not in dp]
        got = b""
        # The mount read the members' headers: count from here.
        st0 = read_json(os.path.join(mnt, ".ckptfs", "cache.json"))
        if len(leaf) == 1:
            with open(leaf[0], "rb") as f:
                got = f.read()
        st = read_json(os.path.join(mnt, ".ckptfs", "cache.json"))
        tap.ok(got == tar_data["y"], "the last tensor of the tar's first member reads right",
               leaf)
        waste = st["bytes_fetched"] - st0["bytes_fetched"] - len(tar_data["y"])
        tap.ok(waste <= BLOCK,
               "reading the first member's last tensor fetched %d bytes beyond it (at most one "
               "block: prefetch stops at the member's end)" % waste, [st0, st])

    mounted(tap, ckptfs, server.url + "/two.tar", "a member's last tensor", member_end,
            options=opts)


def main():
    started = start()
    if not started:
        return 0
    tap, ckptfs, _ = started
    reason = remote_servers.nginx_skip_reason()
    if reason:
        tap.skip_unless_ci("remote prefetch tests", reason)
        return finish(tap)
    work = tempfile.mkdtemp(prefix="ckptfs-t46p.")
    try:
        data = write_file(os.path.join(work, "three.safetensors"))
        tar_data = write_tar(os.path.join(work, "two.tar"))
        with remote_servers.Nginx(work) as server:
            body(tap, ckptfs, work, server, data, tar_data)
    finally:
        for n in os.listdir(work):
            os.unlink(os.path.join(work, n))
        os.rmdir(work)
    return finish(tap)


if __name__ == "__main__":
    sys.exit(main())
