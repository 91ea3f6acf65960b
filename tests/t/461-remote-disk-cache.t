#!/usr/bin/python3
"""The block cache's disk side (-o cache_dir=), which no test ran before (issue 29).

Environment: CKPTFS, FIXTURES.

A safetensors file of one 1 MiB U8 tensor (bytes written here) is served over http by this
test with Range and an ETag; mounts use block_size=64KiB,prefetch=0 and a cache folder:
1. a cold mount reads the tensor whole: the bytes are the file's, the folder holds the blocks
   (cache.json's disk_writes counts them, files are 0600 in a 0700 folder);
2. a second mount reads it again from the folder: the bytes are the file's, no ranged GET
   past the first block (cache.json's disk_hits counts the blocks);
3. a block file cut short in the folder is not used: that block is fetched again, the bytes
   are right;
4. the object replaced with other bytes of the same size and another ETag: a new mount reads
   the new bytes (blocks are keyed by URL and ETag);
5. cache_size=256KiB: after reading 1 MiB the folder holds at most that (least recently used
   blocks removed).
"""

import http.server
import json
import os
import shutil
import socketserver
import stat
import struct
import sys
import tempfile
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from mount_checks import finish, mounted, read_bytes, read_json, start  # noqa: E402

MIB = 1 << 20


def model(seed):
    data = bytes((i * 7 + seed) & 0xFF for i in range(MIB))
    header = json.dumps({"w": {"dtype": "U8", "shape": [MIB], "data_offsets": [0, MIB]}}).encode()
    header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header + data, data


class State:
    body, etag = b"", '"e1"'
    ranged_gets = []


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        if self.path != "/model.safetensors":
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        data = State.body
        rng = self.headers.get("Range")
        a, b = 0, len(data) - 1
        if rng:
            a, b = (int(x) for x in rng.split("=")[1].split("-"))
            b = min(b, len(data) - 1)
            State.ranged_gets.append(a)
        part = data[a:b + 1]
        self.send_response(206 if rng else 200)
        self.send_header("Content-Length", str(len(part)))
        self.send_header("ETag", State.etag)
        if rng:
            self.send_header("Content-Range", "bytes %d-%d/%d" % (a, b, len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(part)


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass


def folder_files(d):
    out = []
    for dirpath, _, files in os.walk(d):
        out += [os.path.join(dirpath, f) for f in files]
    return out


def body(tap, ckptfs):
    srv = Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = "http://127.0.0.1:%d/model.safetensors" % srv.server_address[1]
    work = tempfile.mkdtemp(prefix="ckptfs-t116.")
    cache = os.path.join(work, "cache")
    opts = ["-o", "block_size=64KiB,prefetch=0,cache_dir=%s" % cache]
    State.body, data = model(1)
    try:
        def cold(mnt):
            got = read_bytes(os.path.join(mnt, "w"))
            stats = read_json(os.path.join(mnt, ".ckptfs", "cache.json"))
            tap.ok(got == data, "cold mount: the tensor's bytes are the file's")
            files = folder_files(cache)
            modes_ok = stat.S_IMODE(os.stat(cache).st_mode) == 0o700 and files and all(
                stat.S_IMODE(os.stat(f).st_mode) == 0o600 for f in files)
            tap.ok(stats.get("disk_writes", 0) >= 16 and len(files) >= 16 and modes_ok,
                   "the blocks are written to the folder (%d writes, %d files, 0600 in 0700)"
                   % (stats.get("disk_writes", 0), len(files)), [stats])

        mounted(tap, ckptfs, url, "cold", cold, options=opts)

        def warm(mnt):
            State.ranged_gets = []
            got = read_bytes(os.path.join(mnt, "w"))
            stats = read_json(os.path.join(mnt, ".ckptfs", "cache.json"))
            tap.ok(got == data, "warm mount: the tensor's bytes are the file's")
            tap.ok(not State.ranged_gets and stats.get("disk_hits", 0) >= 16,
                   "warm mount: read from the folder (%d disk hits, ranged GETs at %r)"
                   % (stats.get("disk_hits", 0), State.ranged_gets[:8]), [stats])

        State.ranged_gets = []
        mounted(tap, ckptfs, url, "warm", warm, options=opts)

        # A block file cut short is not used.
        files = sorted(folder_files(cache), key=lambda f: os.path.basename(f))
        victim = [f for f in files if os.path.basename(f) == "5"]
        if victim:
            with open(victim[0], "r+b") as f:
                f.truncate(1000)

        def cut(mnt):
            State.ranged_gets = []
            got = read_bytes(os.path.join(mnt, "w"))
            tap.ok(got == data and len(State.ranged_gets) >= 1,
                   "a block file cut short is fetched again (%d ranged GETs), bytes right"
                   % len(State.ranged_gets))

        tap.ok(bool(victim), "the folder holds block 5 of the object", [files[:5]])
        mounted(tap, ckptfs, url, "cut block", cut, options=opts)

        # Another object under the same URL: other ETag, other bytes.
        State.body, data2 = model(2)
        State.etag = '"e2"'

        def replaced(mnt):
            got = read_bytes(os.path.join(mnt, "w"))
            tap.ok(got == data2 and got != data,
                   "replaced object (new ETag): a new mount reads the new bytes")

        mounted(tap, ckptfs, url, "replaced", replaced, options=opts)

        small = os.path.join(work, "small")
        opts_small = ["-o", "block_size=64KiB,prefetch=0,cache_dir=%s,cache_size=256KiB" % small]

        def capped(mnt):
            got = read_bytes(os.path.join(mnt, "w"))
            total = sum(os.path.getsize(f) for f in folder_files(small))
            tap.ok(got == data2 and total <= 256 * 1024,
                   "cache_size=256KiB: the folder holds %d bytes after a 1 MiB read" % total)

        mounted(tap, ckptfs, url, "capped", capped, options=opts_small)
    finally:
        srv.shutdown()
        shutil.rmtree(work, ignore_errors=True)


def main():
    os.environ.setdefault("FIXTURES", tempfile.gettempdir())
    started = start()
    if not started:
        return 0
    tap, ckptfs, _ = started
    body(tap, ckptfs)
    return finish(tap)


if __name__ == "__main__":
    sys.exit(main())
