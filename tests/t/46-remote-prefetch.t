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
  - every byte read equals the file's.
"""

import json
import os
import struct
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from mount_checks import finish, mounted, read_json, start  # noqa: E402
import remote_servers  # noqa: E402

MIB = 1 << 20
TENSOR = 12 * MIB
BLOCK = MIB
HEAD = 256 << 10
STEP = 256 << 10


def write_file(path):
    names = ["a", "b", "c"]
    header, off = {}, 0
    for n in names:
        header[n] = {"dtype": "U8", "shape": [TENSOR], "data_offsets": [off, off + TENSOR]}
        off += TENSOR
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    data = {n: os.urandom(TENSOR) for n in names}
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for n in names:
            f.write(data[n])
    return data


def body(tap, ckptfs, work, server, data):
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


def main():
    started = start()
    if not started:
        return 0
    tap, ckptfs, _ = started
    reason = remote_servers.nginx_skip_reason()
    if reason:
        tap.skip("remote prefetch tests", reason)
        return finish(tap)
    work = tempfile.mkdtemp(prefix="ckptfs-t46p.")
    try:
        data = write_file(os.path.join(work, "three.safetensors"))
        with remote_servers.Nginx(work) as server:
            body(tap, ckptfs, work, server, data)
    finally:
        for n in os.listdir(work):
            os.unlink(os.path.join(work, n))
        os.rmdir(work)
    return finish(tap)


if __name__ == "__main__":
    sys.exit(main())
