#!/usr/bin/python3
"""`ckptfs serve`'s request checks at their edges (issue 29: mutants of the Range end, the `..`
component check and the `Bearer ` prefix survived the suite).

Environment: CKPTFS.

A safetensors file written here is served with --token-file; tensors/w is its tensor's bytes,
known to the test:
- Range ends: bytes=0-(size-2), 0-(size-1), 0-size, 0-(size+100), (size-1)-(size-1), and
  suffix -1, -size, -(size+1): status, Content-Range and body are what RFC 9110 says, compared
  with the file's bytes; bytes=size- is 416.
- path components: ".", "..", "..." and ".a", "a..", "a.b" in a resolve path: the first two are
  400, the others are names (404 here, never 400).
- Authorization: "Bearer TOKEN" and "bearer TOKEN" pass; "BearerTOKEN" (the prefix one byte
  short), "Bearer  TOKEN", "Bearer TOKENx", "Bearer TOKE" and "Basic TOKEN" give 401.
- GET /api/models lists the repo with its commit (what Hub clients ask first).
"""

import json
import os
import shutil
import socket
import struct
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from ckptfs_test import Tap  # noqa: E402
from serve_util import Server  # noqa: E402

TOKEN = "hf_r3qu3stch3cks"


TENSOR = bytes(range(256)) * 4


def model_bytes():
    data = TENSOR
    header = json.dumps({"w": {"dtype": "U8", "shape": [len(data)],
                               "data_offsets": [0, len(data)]}}).encode()
    header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header + data


def raw_get(host, port, path, headers=(), head=False):
    """(status, {header: value}, body) over a fresh connection (HTTP/1.0: the body ends at
    the close)."""
    s = socket.create_connection((host, port), timeout=20)
    try:
        req = "%s %s HTTP/1.0\r\nHost: x\r\n%s\r\n" % (
            "HEAD" if head else "GET", path, "".join("%s: %s\r\n" % h for h in headers))
        s.sendall(req.encode())
        buf = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
    finally:
        s.close()
    head_text, _, body = buf.partition(b"\r\n\r\n")
    lines = head_text.decode(errors="replace").split("\r\n")
    status = int(lines[0].split()[1]) if lines and lines[0].startswith("HTTP/") else None
    hdrs = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        hdrs[k.strip().lower()] = v.strip()
    return status, hdrs, body


def main():
    tap = Tap()
    ckptfs = os.environ.get("CKPTFS", "build/ckptfs")
    tmp = tempfile.mkdtemp(prefix="ckptfs-t115.")
    src = os.path.join(tmp, "model.safetensors")
    with open(src, "wb") as f:
        f.write(model_bytes())
    data = TENSOR  # served as tensors/w: the tensor's bytes as written here
    tok = os.path.join(tmp, "token")
    with open(tok, "w") as f:
        f.write(TOKEN + "\n")
    os.chmod(tok, 0o600)
    auth = [("Authorization", "Bearer " + TOKEN)]
    try:
        with Server(ckptfs, [src], ["--token-file", tok]) as srv:
            name = list(srv.repos)[0]
            host, port = srv.host, srv.port
            path = "/ckptfs/%s/resolve/main/tensors/w" % name
            n = len(data)
            status, h, body = raw_get(host, port, path, auth)
            if not tap.ok(status == 200 and body == data,
                          "tensors/w is the tensor's bytes (status %s)" % status):
                tap.done()
                return 1

            def ranged(spec, want_status, a=None, b=None):
                status, h, body = raw_get(host, port, path, auth + [("Range", "bytes=" + spec)])
                if want_status == 206:
                    want_cr = "bytes %d-%d/%d" % (a, b, n)
                    good = status == 206 and h.get("content-range") == want_cr and \
                        body == data[a:b + 1]
                    tap.ok(good, "Range bytes=%s: 206, %s, those bytes" % (spec, want_cr),
                           [status, h.get("content-range"), len(body)])
                else:
                    tap.ok(status == want_status, "Range bytes=%s: %d (got %s)"
                           % (spec, want_status, status), [h])

            ranged("0-%d" % (n - 2), 206, 0, n - 2)
            ranged("0-%d" % (n - 1), 206, 0, n - 1)
            ranged("0-%d" % n, 206, 0, n - 1)
            ranged("0-%d" % (n + 100), 206, 0, n - 1)
            ranged("%d-%d" % (n - 1, n - 1), 206, n - 1, n - 1)
            ranged("%d-" % (n - 1), 206, n - 1, n - 1)
            ranged("-1", 206, n - 1, n - 1)
            ranged("-%d" % n, 206, 0, n - 1)
            ranged("-%d" % (n + 1), 206, 0, n - 1)
            ranged("%d-" % n, 416)
            ranged("%d-%d" % (n, n + 5), 416)

            base = "/ckptfs/%s/resolve/main/" % name
            for comp, want in ((".", 400), ("..", 400), ("...", 404), (".a", 404),
                               ("a..", 404), ("a.b", 404)):
                status, _, _ = raw_get(host, port, base + comp + "/w", auth)
                tap.ok(status == want, "path component %r: %d (got %s)" % (comp, want, status))
            status, _, _ = raw_get(host, port, base + "tensors/../tensors/w", auth)
            tap.ok(status == 400, "a '..' after a name: 400 (got %s)" % status)

            for value, want in (("Bearer " + TOKEN, 200), ("bearer " + TOKEN, 200),
                                ("Bearer" + TOKEN, 401), ("Bearer  " + TOKEN, 401),
                                ("Bearer " + TOKEN + "x", 401), ("Bearer " + TOKEN[:-1], 401),
                                ("Basic " + TOKEN, 401), ("Bearer ", 401)):
                status, _, _ = raw_get(host, port, "/api/models", [("Authorization", value)])
                tap.ok(status == want, "Authorization: %r: %d (got %s)"
                       % (value.replace(TOKEN, "TOKEN"), want, status))

            status, h, body = raw_get(host, port, "/api/models", auth)
            try:
                models = json.loads(body)
            except ValueError:
                models = None
            sha = None
            if isinstance(models, list) and models:
                sha = models[0].get("sha")
            status2, _, body2 = raw_get(host, port, "/api/models/ckptfs/%s" % name, auth)
            try:
                info_sha = json.loads(body2).get("sha")
            except (ValueError, AttributeError):
                info_sha = None
            tap.ok(status == 200 and isinstance(models, list) and len(models) == 1 and
                   models[0].get("id") == "ckptfs/" + name and sha and len(sha) == 40 and
                   sha == info_sha,
                   "GET /api/models lists the repo with the commit its info names",
                   [status, body[:300], info_sha])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    tap.done()
    return 1 if tap.failed else 0


if __name__ == "__main__":
    sys.exit(main())
