#!/usr/bin/python3
"""`ckptfs serve` against clients that hold connections without asking (issue 29 #13).

Environment: CKPTFS.

A server with --token-file and the default 64 connections; the source is a safetensors file
written here. 64 clients connect and send their request headers one byte every 2 s (so the
idle timeout never fires): an authorised GET /api/models is still answered within 5 s (before,
nothing answered for the length of the drip), and each dripping client is closed within its
header time (10 s, ckptfs(1)) plus slack: its socket reads EOF or a reset by 20 s. A client
without the token gets 401 and its connection is closed after the answer.
"""

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


def main():
    tap = Tap()
    ckptfs = os.environ.get("CKPTFS", "build/ckptfs")
    tmp = tempfile.mkdtemp(prefix="ckptfs-t87.")
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
    tap.done()
    return 1 if tap.failed else 0


if __name__ == "__main__":
    sys.exit(main())
