#!/usr/bin/python3
"""`ckptfs serve` against clients that hold connections without asking (issue 29 #13), and a
slow source behind layers.svg (#14).

Environment: CKPTFS.

A server with --token-file and the default 64 connections; the source is a safetensors file
written here. 64 clients connect and send their request headers one byte every 2 s (so the
idle timeout never fires): an authorised GET /api/models is still answered within 5 s (before,
nothing answered for the length of the drip), and each dripping client is closed within its
header time (10 s, ckptfs(1)) plus slack: its socket reads EOF or a reset by 20 s. A client
without the token gets 401 and its connection is closed after the answer.

layers.svg reads every tensor. Served from a slow http source (a server here that answers each
data read after 10 s), 8 requests for it at once, then GET /api/models: answered within 2 s
(before, the drawing held server threads and /api/models waited for it), and the 8 requests all
get the SVG, which names the layers' tensor family.
"""

import http.server
import socketserver

import json
import os
import socket
import struct
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from ckptfs_test import Tap  # noqa: E402
from serve_util import Server  # noqa: E402

TOKEN = "hf_sl0wcl13nts0k"
DRIPPERS = 64


def write_model(path):
    data = struct.pack("<4f", 1, 2, 3, 4)
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + data)


def get(host, port, path, token, timeout):
    """(status, headers text, seconds) of one GET over a fresh connection; status None when
    nothing came within timeout."""
    t0 = time.monotonic()
    s = socket.create_connection((host, port), timeout=timeout)
    try:
        auth = "Authorization: Bearer %s\r\n" % token if token else ""
        s.sendall(("GET %s HTTP/1.1\r\nHost: x\r\n%s\r\n" % (path, auth)).encode())
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
        head = buf.split(b"\r\n\r\n")[0].decode(errors="replace")
        status = int(head.split()[1]) if head.startswith("HTTP/") else None
        closed = None
        if status == 401:  # is the connection closed after the answer?
            s.settimeout(5)
            try:
                while s.recv(65536):
                    pass
                closed = True
            except socket.timeout:
                closed = False
            except OSError:
                closed = True
        return status, head, time.monotonic() - t0, closed
    except (socket.timeout, OSError):
        return None, "", time.monotonic() - t0, None
    finally:
        s.close()


class Dripper(threading.Thread):
    """Sends a request's headers a byte every 2 s; notes when the server ends the socket."""

    def __init__(self, host, port):
        super().__init__(daemon=True)
        self.sock = socket.create_connection((host, port), timeout=30)
        self.ended = None
        self.stop = False

    def run(self):
        text = b"GET /api/models HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 200
        t0 = time.monotonic()
        self.sock.settimeout(2)
        for b in text:
            if self.stop:
                return
            try:
                self.sock.send(bytes([b]))
                got = self.sock.recv(1)
                if got == b"":
                    self.ended = time.monotonic() - t0
                    return
            except socket.timeout:
                continue
            except OSError:
                self.ended = time.monotonic() - t0
                return


def layered_model():
    """A safetensors file of 4 layers x one F32 tensor: bytes, written here."""
    header, data = {}, b""
    for i in range(4):
        t = struct.pack("<32768f", *[float(i + 1)] * 32768)  # 128 KiB: past the first block
        header["model.layers.%d.mlp.weight" % i] = {"dtype": "F32", "shape": [32768],
                                                    "data_offsets": [len(data), len(data) + len(t)]}
        data += t
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


class SlowSource(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    body = b""
    slow = False

    def log_message(self, *a):
        pass

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        rng = self.headers.get("Range")
        a, b = 0, len(self.body) - 1
        if rng:
            a, b = (int(x) for x in rng.split("=")[1].split("-"))
            b = min(b, len(self.body) - 1)
        if SlowSource.slow and a >= 256 * 1024:  # past the first block, read at open
            time.sleep(10)
        part = self.body[a:b + 1]
        self.send_response(206 if rng else 200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("ETag", '"slow1"')
        self.send_header("Content-Length", str(len(part)))
        if rng:
            self.send_header("Content-Range", "bytes %d-%d/%d" % (a, b, len(self.body)))
        self.end_headers()
        if self.command != "HEAD":
            try:
                self.wfile.write(part)
            except OSError:
                pass


class ThreadingServer(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass


def plot_checks(tap, ckptfs):
    SlowSource.body = layered_model()
    src_srv = ThreadingServer(("127.0.0.1", 0), SlowSource)
    threading.Thread(target=src_srv.serve_forever, daemon=True).start()
    url = "http://127.0.0.1:%d/model.safetensors" % src_srv.server_address[1]
    try:
        with Server(ckptfs, [url], ["--threads", "4"]) as srv:
            SlowSource.slow = True
            name = list(srv.repos)[0]
            results = [None] * 8

            def ask(i):
                results[i] = get_body(srv.host, srv.port, "/ckptfs/%s/layers.svg" % name, 60)

            askers = [threading.Thread(target=ask, args=(i,), daemon=True) for i in range(8)]
            for t in askers:  # spaced, so that each server thread accepts some of them
                t.start()
                time.sleep(0.3)
            status, _, took, _ = get(srv.host, srv.port, "/api/models", None, 10)
            tap.ok(status == 200 and took < 2, "while layers.svg is drawn from a slow source, "
                   "GET /api/models answers (status %s in %.1f s)" % (status, took))
            for t in askers:
                t.join(60)
            good = [r for r in results if r and r[0] == 200 and b"<svg" in r[1] and
                    b"mlp.weight" in r[1]]
            tap.ok(len(good) == 8, "the 8 requests for layers.svg all get the SVG (%d did)"
                   % len(good), [repr(r)[:200] for r in results if r not in good][:3])
    finally:
        src_srv.shutdown()


def get_body(host, port, path, timeout):
    """(status, body) of one GET, or None."""
    import http.client
    try:
        c = http.client.HTTPConnection(host, port, timeout=timeout)
        c.request("GET", path)
        r = c.getresponse()
        body = r.read()
        c.close()
        return r.status, body
    except (OSError, http.client.HTTPException):
        return None


def main():
    tap = Tap()
    ckptfs = os.environ.get("CKPTFS", "build/ckptfs")
    tmp = tempfile.mkdtemp(prefix="ckptfs-t119.")
    src = os.path.join(tmp, "model.safetensors")
    write_model(src)
    tok = os.path.join(tmp, "token")
    with open(tok, "w") as f:
        f.write(TOKEN + "\n")
    os.chmod(tok, 0o600)
    with Server(ckptfs, [src], ["--token-file", tok]) as srv:
        host, port = srv.host, srv.port
        drippers = []
        for _ in range(DRIPPERS):
            try:
                drippers.append(Dripper(host, port))
            except OSError:
                break
        for d in drippers:
            d.start()
        time.sleep(3)  # every dripper is connected and has sent a byte
        status, head, took, _ = get(host, port, "/api/models", TOKEN, 10)
        tap.ok(status == 200 and took < 5,
               "with %d connections dripping headers, an authorised GET /api/models answers "
               "(status %s in %.1f s)" % (len(drippers), status, took), [head[:300]])
        status, head, took, closed = get(host, port, "/api/models", None, 10)
        tap.ok(status == 401 and closed, "without the token: 401, the connection closed after "
               "it (status %s, closed %s)" % (status, closed), [head[:300]])
        end = time.monotonic() + 20
        while time.monotonic() < end and any(d.ended is None for d in drippers):
            time.sleep(0.5)
        ended = [d.ended for d in drippers if d.ended is not None]
        tap.ok(len(ended) == len(drippers),
               "every dripping connection is closed within 20 s (%d of %d, latest %.1f s)"
               % (len(ended), len(drippers), max(ended) if ended else -1))
        for d in drippers:
            d.stop = True
            try:
                d.sock.close()
            except OSError:
                pass
        status, head, took, _ = get(host, port, "/api/models", TOKEN, 10)
        tap.ok(status == 200 and srv.alive(), "the server answers after them (status %s)"
               % status)
    plot_checks(tap, ckptfs)
    tap.done()
    return 1 if tap.failed else 0


if __name__ == "__main__":
    sys.exit(main())
