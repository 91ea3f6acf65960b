#!/usr/bin/python3
"""Remote sources against a misbehaving server (a small http.server run by this test).

Environment: CKPTFS.

One safetensors file (a 1 MiB F32 tensor, written here with numpy) is served with Range
support; the test switches the server's behaviour between requests. Mounted with 64 KiB blocks
and no prefetch, so each read of a new part of the tensor is one request:
- 500 twice, then the bytes: the read succeeds, cache.json counts the retries;
- a 200 (whole object) instead of 206, a wrong Content-Range, a short body (by half, by one
  byte), a body one byte longer than asked, a 206 whose total is not the size pinned at open,
  an ETag that changed (the object was replaced after the mount), a 403: the read fails with EIO, never
  with other bytes, and the daemon keeps serving the blocks it has; a changed object stays EIO;
- a server that stops answering: with remote_timeout=1 and retries=1 the read fails within
  seconds;
- at mount: 403, 404, 200 instead of 206 and a stalled server give exit 2 with one line naming
  the URL.
"""

import errno
import http.server
import os
import socketserver
import struct
import sys
import tempfile
import threading
import time
import json

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from ckptfs_test import run_capture  # noqa: E402
from mount_checks import finish, mounted, read_bytes, read_json, start  # noqa: E402

OPTS = ["-o", "block_size=64KiB,prefetch=0,remote_timeout=1,retries=2"]


def make_file():
    t = (np.arange(262144, dtype=np.float32) * 0.5).astype("<f4")
    header = json.dumps({"w": {"dtype": "F32", "shape": [512, 512], "data_offsets": [0, t.nbytes]}})
    header += " " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header.encode() + t.tobytes(), 8 + len(header), t


class State:
    def __init__(self, data):
        self.data = data
        self.etag = '"v1"'
        self.mode = None     # what the next ranged GETs do
        self.count = 0       # how many of them still misbehave (None: all)
        self.lock = threading.Lock()

    def set(self, mode, count=None, etag=None):
        with self.lock:
            self.mode, self.count = mode, count
            if etag:
                self.etag = etag

    def take(self):
        with self.lock:
            m = self.mode
            if m and self.count is not None:
                self.count -= 1
                if self.count <= 0:
                    self.mode = None
            return m


def handler_for(state):
    class H(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def send_bytes(self, status, body, extra=()):
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("ETag", state.etag)
            for k, v in extra:
                self.send_header(k, v)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_HEAD(self):
            self.do_GET()

        def do_GET(self):
            if self.path != "/model.safetensors":
                return self.send_bytes(404, b"no")
            data = state.data
            rng = self.headers.get("Range")
            mode = state.take() if rng else None
            if mode == "403":
                return self.send_bytes(403, b"denied")
            if mode == "500":
                return self.send_bytes(500, b"oops")
            if mode == "slow":
                time.sleep(4)
                return self.send_bytes(500, b"late")
            if not rng or mode == "200":
                return self.send_bytes(200, data)
            a, b = rng.split("=")[1].split("-")
            a, b = int(a), min(int(b), len(data) - 1)
            body = data[a:b + 1]
            cr = "bytes %d-%d/%d" % (a, b, len(data))
            if mode == "bad_range":
                cr = "bytes %d-%d/%d" % (a + 16, b + 16, len(data))
            if mode == "changed":
                state.etag = '"v2"'
            if mode == "other_total":  # the object's size is not the one pinned at open
                cr = "bytes %d-%d/%d" % (a, b, len(data) + 1)
            if mode == "longer":  # the range asked, then one byte more, sent apart
                self.send_response(206)
                self.send_header("Content-Length", str(len(body) + 1))
                self.send_header("Content-Range", cr)
                self.send_header("ETag", state.etag)
                self.end_headers()
                self.wfile.write(body)
                self.wfile.flush()
                time.sleep(0.2)  # the reader has the whole range before the extra byte
                self.wfile.write(b"\0")
                return
            if mode in ("short", "short1"):
                self.send_response(206)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Content-Range", cr)
                self.send_header("ETag", state.etag)
                self.end_headers()
                self.wfile.write(body[:len(body) // 2] if mode == "short" else body[:-1])
                self.wfile.flush()
                self.close_connection = True
                return
            self.send_bytes(206, body, [("Content-Range", cr)])

    return H


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request, client_address):
        pass  # clients that give up mid-answer (timeouts) are part of the test


def read_range(path, off, n):
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.pread(fd, n, off)
    finally:
        os.close(fd)


def expect_eio(path, off, n):
    try:
        read_range(path, off, n)
        return False, "read succeeded"
    except OSError as e:
        return e.errno == errno.EIO, os.strerror(e.errno)


def body(tap, ckptfs):
    data, base, t = make_file()
    want = t.tobytes()
    state = State(data)
    srv = Server(("127.0.0.1", 0), handler_for(state))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = "http://127.0.0.1:%d/model.safetensors" % srv.server_address[1]
    blk = 64 * 1024
    try:
        def checks(mnt):
            w = os.path.join(mnt, "w")
            # Offsets into the tensor, each in a block not read before.
            state.set("500", 2)
            got = read_range(w, 4 * blk, 4096)
            stats = read_json(os.path.join(mnt, ".ckptfs", "cache.json"))
            tap.ok(got == want[4 * blk:4 * blk + 4096] and stats["retries"] >= 2,
                   "500 twice then 206: the read succeeds after retries", [stats])
            for i, (mode, what) in enumerate([("200", "200 instead of 206"),
                                              ("bad_range", "wrong Content-Range"),
                                              ("short", "short body"),
                                              ("403", "403 after the mount"),
                                              ("short1", "a body one byte short"),
                                              ("longer", "a body one byte longer than asked")]):
                state.set(mode)
                # Blocks not read before: 6-9, then 5 and 10 (0-3 came with the open).
                ok, why = expect_eio(w, [6, 7, 8, 9, 5, 10][i] * blk, 4096)
                state.set(None)
                tap.ok(ok, "%s: EIO" % what, [why])
            again = read_range(w, 4 * blk, 4096)
            tap.ok(again == want[4 * blk:4 * blk + 4096],
                   "the daemon still serves cached blocks after the faults")
            later = read_range(w, 7 * blk, 4096)  # failed before, fine now
            tap.ok(later == want[7 * blk:7 * blk + 4096],
                   "a block that failed is fetched again on the next read")
            state.set("slow")
            t0 = time.time()
            ok, why = expect_eio(w, 11 * blk, 4096)
            took = time.time() - t0
            state.set(None)
            tap.ok(ok and took < 30, "stalled server: EIO after %.1f s (timeout 1 s, 2 retries)"
                   % took, [why])
            # Another size than the one pinned: the object is not the one mounted (from here on
            # it stays EIO, as for the changed ETag below).
            state.set("other_total")
            ok, why = expect_eio(w, 14 * blk, 4096)
            state.set(None)
            tap.ok(ok, "a 206 naming another size than the pinned: EIO", [why])
            state.set("changed", 1)
            ok, why = expect_eio(w, 12 * blk, 4096)
            tap.ok(ok, "object changed after the mount (other ETag): EIO", [why])
            state.set(None)
            ok2, why2 = expect_eio(w, 13 * blk, 4096)
            tap.ok(ok2, "a changed object stays EIO", [why2])

        mounted(tap, ckptfs, url, "faults", checks, options=OPTS)

        # At mount: each fault gives exit 2 and one line naming the URL.
        state.etag = '"v1"'
        for mode, word in (("403", b"403"), ("200", b"Range"), ("slow", b"")):
            state.set(mode)
            mnt = tempfile.mkdtemp(prefix="ckptfs-t49.")
            t0 = time.time()
            rc, out, err = run_capture([ckptfs, url, mnt] + OPTS, 60)
            took = time.time() - t0
            os.rmdir(mnt)
            state.set(None)
            tap.ok(rc == 2 and url.encode() in err and word in err and err.count(b"\n") == 1,
                   "mount with %s: exit 2, one line naming the URL (%.1f s)" % (mode, took),
                   [rc, err])
        mnt = tempfile.mkdtemp(prefix="ckptfs-t49.")
        rc, out, err = run_capture([ckptfs, url.replace("model", "gone"), mnt] + OPTS, 60)
        os.rmdir(mnt)
        tap.ok(rc == 2 and b"404" in err and err.count(b"\n") == 1,
               "mount of a 404: exit 2, one line", [rc, err])
    finally:
        srv.shutdown()
        srv.server_close()


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
