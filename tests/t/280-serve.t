#!/usr/bin/python3
"""ckptfs serve: the Hub API, files, ranges, changes and hostile clients, checked with
http.client, raw sockets and curl against the fixture generators' manifests.

Environment:
  CKPTFS    path of the ckptfs binary
  FIXTURES  output directory of the fixture generators (FIXTURES/sharded: an HF directory
            of three shards, config and tokenizer files, manifest.json)

  1. command line: usage errors, a non-loopback address without a token, a bad source.
  2. repo info and revisions, siblings = the HF view; the tree API (recursive and not: the
     top's recursive listing holds tensors/ as a directory only, tensors/ lists recursively).
  3. model.safetensors of an HF shard set and of a DCP checkpoint, whole (curl): passes the
     strict safetensors reader of 320-hfview.t and holds the manifests' tensors; raw tensors
     under tensors/ equal the manifests' sha256; config/tokenizer files equal the source.
  4. ranges with curl (a-b, a-, -n, past the end, 416, multi-range refused), HEAD,
     If-None-Match, keep-alive.
  5. a source rewritten under the server: a new commit sha and the new bytes.
  6. hostile: traversal (raw and %-encoded), hidden .ckptfs/hf, other methods (405),
     oversized headers, 5000 ranges, slowloris, a client that stops reading, too many
     connections; Bearer tokens (missing, wrong, right).
The server must exit 0 on SIGTERM after all of it.
"""

import hashlib
import json
import os
import random
import shutil
import socket
import struct
import urllib.parse
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from ckptfs_test import Tap  # noqa: E402
from hf_side_files import side_files_of  # noqa: E402
from serve_util import Server, load_hfview_checks, request  # noqa: E402

HERE = os.path.dirname(os.path.realpath(__file__))
DCP = os.path.join(HERE, "..", "fixtures", "dcp", "v113_sharded")
hv = load_hfview_checks()


def sha(b):
    return hashlib.sha256(b).hexdigest()


def curl(server, path, *args):
    """(status, headers dict, body) from curl; headers lower-case."""
    with tempfile.TemporaryDirectory() as d:
        hdr, out = os.path.join(d, "h"), os.path.join(d, "b")
        p = subprocess.run(["curl", "-sS", "--path-as-is", "-D", hdr, "-o", out] + list(args)
                           + [server.url + path], capture_output=True, timeout=120)
        status, headers = None, {}
        if os.path.exists(hdr):
            for line in open(hdr, "rb").read().decode("latin-1").splitlines():
                if line.startswith("HTTP/"):
                    status, headers = int(line.split()[1]), {}
                elif ":" in line:
                    k, v = line.split(":", 1)
                    headers[k.strip().lower()] = v.strip()
        body = open(out, "rb").read() if os.path.exists(out) else b""
        return status, headers, body, p.returncode


def write_safetensors(path, tensors):
    """A plain safetensors file written here (name -> numpy array)."""
    names = {"float32": "F32", "float16": "F16", "int64": "I64"}
    header, off, blobs = {}, 0, []
    for name, a in tensors.items():
        b = a.tobytes()
        header[name] = {"dtype": names[str(a.dtype)], "shape": list(a.shape),
                        "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def check_cli(tap, ckptfs, tmp):
    p = subprocess.run([ckptfs, "serve"], capture_output=True, timeout=30)
    tap.ok(p.returncode == 1 and b"SOURCE" in p.stderr, "serve without SOURCE: exit 1",
           [p.returncode, p.stderr])
    p = subprocess.run([ckptfs, "serve", "--listen", "0.0.0.0:0", DCP], capture_output=True,
                       timeout=30)
    tap.ok(p.returncode == 1 and b"not a loopback address" in p.stderr,
           "0.0.0.0 without --token-file or --insecure-no-auth: refused (exit 1)",
           [p.returncode, p.stderr])
    p = subprocess.run([ckptfs, "serve", "--listen", "127.0.0.1:0", os.path.join(tmp, "nope")],
                       capture_output=True, timeout=30)
    tap.ok(p.returncode == 2 and b"nope" in p.stderr, "a missing source: exit 2",
           [p.returncode, p.stderr])
    bad = os.path.join(tmp, "bad.safetensors")
    open(bad, "wb").write(struct.pack("<Q", 1 << 40) + b"{}")
    p = subprocess.run([ckptfs, "serve", "--listen", "127.0.0.1:0", bad], capture_output=True,
                       timeout=30)
    tap.ok(p.returncode == 2, "an invalid source: exit 2", [p.returncode, p.stderr])
    p = subprocess.run([ckptfs, "serve", "--help"], capture_output=True, timeout=30)
    lines = p.stdout.decode().splitlines()
    tap.ok(p.returncode == 0 and len(lines) <= 30 and "--token-file" in p.stdout.decode(),
           "serve --help: exit 0, fits a screen (%d lines)" % len(lines))
    short = os.path.join(tmp, "short.token")
    open(short, "w").write("abc\n")
    p = subprocess.run([ckptfs, "serve", "--token-file", short, DCP], capture_output=True,
                       timeout=30)
    tap.ok(p.returncode == 1 and b"token" in p.stderr, "a token shorter than 8: refused")


def expected_siblings(source_dir, model_files):
    return sorted(side_files_of(source_dir) + model_files)


def check_info(tap, srv, name, want_files):
    r = request(srv, "/api/models/ckptfs/%s" % name)
    info = json.loads(r.body) if r.status == 200 else {}
    sha_ = info.get("sha", "")
    tap.ok(r.status == 200 and info.get("id") == "ckptfs/" + name and len(sha_) == 40
           and all(c in "0123456789abcdef" for c in sha_) and r.header("x-repo-commit") == sha_,
           "%s: repo info: id, 40-hex sha, X-Repo-Commit" % name, [r.status, r.body[:300]])
    sib = sorted(s["rfilename"] for s in info.get("siblings", []))
    tap.ok(sib == want_files, "%s: siblings are the HF view %s" % (name, want_files), [sib])
    for rev in ("main", sha_):
        r2 = request(srv, "/api/models/ckptfs/%s/revision/%s" % (name, rev))
        tap.ok(r2.status == 200 and json.loads(r2.body).get("sha") == sha_,
               "%s: revision/%s answers with the same sha" % (name, rev[:8]))
    r3 = request(srv, "/api/models/ckptfs/%s/revision/v9" % name)
    tap.ok(r3.status == 404 and r3.header("x-error-code") == "RevisionNotFound",
           "%s: an unknown revision: 404 RevisionNotFound" % name, [r3.status, r3.headers])
    r4 = request(srv, "/api/models/ckptfs/nosuchrepo")
    tap.ok(r4.status == 404 and r4.header("x-error-code") == "RepoNotFound",
           "unknown repo: 404 RepoNotFound")
    return info


def check_tree(tap, srv, name, want_files, manifest):
    r = request(srv, "/api/models/ckptfs/%s/tree/main" % name)
    top = json.loads(r.body) if r.status == 200 else []
    got = sorted((e["type"], e["path"]) for e in top)
    want = sorted([("file", f) for f in want_files] + [("directory", "tensors")])
    tap.ok(got == want, "%s: tree/main lists the HF view and tensors/" % name, [got, want])
    r = request(srv, "/api/models/ckptfs/%s/tree/main?recursive=true" % name)
    rec = json.loads(r.body) if r.status == 200 else []
    got = sorted((e["type"], e["path"]) for e in rec)
    tap.ok(got == want, "%s: tree/main?recursive=true: the HF view and tensors/ as a directory "
           "(a client downloading the listing gets the view once, not the tensors again)" % name,
           [got[:8], want])
    r = request(srv, "/api/models/ckptfs/%s/tree/main/tensors?recursive=true" % name)
    entries = json.loads(r.body) if r.status == 200 else []
    files = {e["path"]: e for e in entries if e["type"] == "file"}
    problems = []
    for t in manifest["tensors"]:
        if t.get("aside") or t.get("prefix"):
            continue
        e = files.get("tensors/" + t["path"])
        if not e or e["size"] != t["nbytes"] or len(e.get("oid", "")) != 40:
            problems.append("tensors/%s: %r, want %d bytes" % (t["path"], e, t["nbytes"]))
    tap.ok(not problems and all(not p.startswith("tensors/.ckptfs/hf") for p in files),
           "%s: recursive tree: every manifest tensor under tensors/ with its size, "
           ".ckptfs/hf hidden" % name, problems[:5])
    r = request(srv, "/api/models/ckptfs/%s/tree/main/tensors/.ckptfs" % name)
    docs = sorted(e["path"] for e in json.loads(r.body)) if r.status == 200 else []
    tap.ok(docs == ["tensors/.ckptfs/metadata.json", "tensors/.ckptfs/summary.json",
                    "tensors/.ckptfs/tensors.tsv"] or
           (docs and "tensors/.ckptfs/summary.json" in docs and
            "tensors/.ckptfs/hf" not in docs and "tensors/.ckptfs/stats.json" not in docs),
           "%s: tree of tensors/.ckptfs: the documents, without hf/ and stats.json" % name, [docs])
    return files


def check_model_file(tap, srv, name, manifest):
    st, h, body, rc = curl(srv, "/ckptfs/%s/resolve/main/model.safetensors" % name)
    tap.ok(st == 200 and rc == 0 and int(h.get("content-length", -1)) == len(body)
           and h.get("x-linked-size") == str(len(body)) and h.get("etag")
           and h.get("accept-ranges") == "bytes",
           "%s: GET model.safetensors (curl): 200, Content-Length = X-Linked-Size = %d"
           % (name, len(body)), [st, h])
    try:
        view = hv.parse_strict(body, len(body))
        problems = hv.writer_style_problems(view)
        # The view holds the model's tensors: not optimizer state or other aside ones.
        want, _ = hv.manifest_want({"tensors": [t for t in manifest["tensors"]
                                                if not t.get("aside") and not t.get("prefix")]})
        problems += hv.compare_tensors(view, body, want)
    except hv.Invalid as e:
        problems = ["strict reader: %s" % e]
    tap.ok(not problems, "%s: model.safetensors passes the strict reader and holds the "
           "manifest's tensors byte for byte" % name, problems[:8])
    return body, h


def check_raw_tensors(tap, srv, name, manifest):
    import http.client
    conn = http.client.HTTPConnection(srv.host, srv.port, timeout=60)
    problems = []
    for t in manifest["tensors"]:
        if t.get("aside") or t.get("prefix") or t.get("incomplete"):
            continue
        r = request(srv, "/ckptfs/%s/resolve/main/tensors/%s" % (name, t["path"]), conn=conn)
        if r.status != 200 or sha(r.body) != t["sha256"]:
            problems.append("%s: status %d, %d bytes" % (t["path"], r.status, len(r.body)))
    conn.close()
    tap.ok(not problems, "%s: every tensor under tensors/ equals the manifest's sha256 "
           "(one keep-alive connection)" % name, problems[:5])


def check_side_files(tap, srv, name, source_dir, files):
    problems = []
    for f in files:
        if f.startswith("model"):
            continue
        r = request(srv, "/ckptfs/%s/resolve/main/%s" % (name, f))
        if r.status != 200 or r.body != open(os.path.join(source_dir, f), "rb").read():
            problems.append(f)
    tap.ok(not problems, "%s: config and tokenizer files equal the source's" % name, problems)


def check_ranges(tap, srv, name, path, whole, rng):
    size = len(whole)
    url = "/ckptfs/%s/resolve/main/%s" % (name, path)
    problems = []
    specs = [(0, 0), (0, 7), (size - 1, size - 1), (0, size - 1), (size - 10, size + 1000)]
    for _ in range(12):
        a = rng.randrange(size)
        specs.append((a, rng.randrange(a, size)))
    for a, b in specs:
        st, h, body, _ = curl(srv, url, "-r", "%d-%d" % (a, b))
        b2 = min(b, size - 1)
        if (st != 206 or body != whole[a:b2 + 1]
                or h.get("content-range") != "bytes %d-%d/%d" % (a, b2, size)):
            problems.append("%d-%d: %s %s, %d bytes" % (a, b, st, h.get("content-range"),
                                                         len(body)))
    for spec, lo in (("%d-" % (size - 5), size - 5), ("-16", size - 16), ("-%d" % (size * 2), 0)):
        st, h, body, _ = curl(srv, url, "-H", "Range: bytes=" + spec)
        if st != 206 or body != whole[lo:]:
            problems.append("%s: %s, %d bytes" % (spec, st, len(body)))
    tap.ok(not problems, "%s %s: %d ranges (curl) are 206 with the exact bytes and "
           "Content-Range" % (name, path, len(specs) + 3), problems[:5])
    bad = []
    for spec in ("%d-" % size, "%d-%d" % (size + 5, size + 9), "-0"):
        st, h, body, _ = curl(srv, url, "-H", "Range: bytes=" + spec)
        if st != 416 or h.get("content-range") != "bytes */%d" % size:
            bad.append("%s: %s %s" % (spec, st, h.get("content-range")))
    st, h, body, _ = curl(srv, url, "-H", "Range: bytes=0-1,4-5")
    if st != 416:
        bad.append("two ranges: %s" % st)
    for spec in ("lines=0-4", "bytes=5-2", "bytes=x-3"):  # ignored, as RFC 9110 says
        st, h, body, _ = curl(srv, url, "-H", "Range: " + spec)
        if st != 200 or body != whole:
            bad.append("%s: %s" % (spec, st))
    tap.ok(not bad, "%s %s: past the end and '-0' are 416 with bytes */size; two ranges "
           "refused (416); malformed ranges ignored (200)" % (name, path), bad)


def check_head_etag(tap, srv, name, whole, etag):
    url = "/ckptfs/%s/resolve/main/model.safetensors" % name
    r = request(srv, url, method="HEAD")
    tap.ok(r.status == 200 and r.body == b"" and r.header("content-length") == str(len(whole))
           and r.header("etag") == etag and r.header("x-linked-etag") == etag
           and len(r.header("x-repo-commit") or "") == 40,
           "%s: HEAD: no body, Content-Length, ETag = X-Linked-Etag, X-Repo-Commit" % name,
           [r.status, r.headers])
    r = request(srv, url, headers={"If-None-Match": etag})
    tap.ok(r.status == 304 and r.body == b"", "%s: If-None-Match with the ETag: 304" % name,
           [r.status])
    r = request(srv, url, headers={"Range": "bytes=0-3", "If-Range": '"stale"'})
    tap.ok(r.status == 200 and r.body == whole, "%s: If-Range with another ETag: the whole "
           "file (200)" % name, [r.status])


def check_change(tap, srv, path):
    name = "changing"
    r = request(srv, "/api/models/ckptfs/%s" % name)
    old = json.loads(r.body)["sha"]
    a = np.arange(64, dtype=np.float32) * 3
    write_safetensors(path + ".new", {"w": a, "b": np.ones(3, np.float32)})
    os.rename(path + ".new", path)
    time.sleep(1.2)
    r = request(srv, "/api/models/ckptfs/%s" % name)
    new = json.loads(r.body)["sha"] if r.status == 200 else None
    tap.ok(new and new != old, "a source replaced under the server: a new commit sha",
           [old, new, r.status])
    r = request(srv, "/ckptfs/%s/resolve/main/tensors/w" % name)
    tap.ok(r.status == 200 and r.body == a.tobytes(), "the new tensor bytes are served",
           [r.status, len(r.body)])
    r = request(srv, "/ckptfs/%s/resolve/%s/tensors/w" % (name, old))
    tap.ok(r.status == 404 and r.header("x-error-code") == "RevisionNotFound",
           "the old sha as revision: 404 RevisionNotFound", [r.status])
    os.unlink(path)
    time.sleep(1.2)
    r = request(srv, "/api/models/ckptfs/%s" % name)
    tap.ok(r.status == 503 and b"cannot be read" in r.body,
           "a source removed under the server: 503 naming it", [r.status, r.body[:200]])


def raw_exchange(srv, data, timeout=10):
    s = socket.create_connection((srv.host, srv.port), timeout=timeout)
    try:
        s.sendall(data)
        out = b""
        while True:
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                break
            if not chunk:
                break
            out += chunk
            if b"\r\n\r\n" in out and len(out) > 4096:
                break
        return out
    finally:
        s.close()


def status_of(raw):
    try:
        return int(raw.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return None


def check_hostile(tap, srv, name, whole):
    problems = []
    for path in ("/ckptfs/%s/resolve/main/../../../../etc/passwd" % name,
                 "/ckptfs/%s/resolve/main/tensors/../../../etc/passwd" % name,
                 "/ckptfs/%s/resolve/main/%%2e%%2e/%%2e%%2e/etc/passwd" % name,
                 "/ckptfs/%s/resolve/main//etc/passwd" % name,
                 "/ckptfs/%s/resolve/main/tensors/.ckptfs/hf/model.safetensors" % name,
                 "/ckptfs/%s/resolve/main/tensors/.ckptfs/stats.json" % name,
                 "/ckptfs/..%%2f..%%2fetc/resolve/main/passwd",
                 "/ckptfs/%s/resolve/main/.%%2e/.%%2e/etc/passwd" % name,
                 "/ckptfs/%s/resolve/main/model.safetensors%%00.txt" % name,
                 "/api/models/ckptfs/%s/tree/main/../../.." % name,
                 "/ckptfs/%s/resolve/main/tensors/" % name):
        raw = raw_exchange(srv, b"GET " + path.encode() + b" HTTP/1.1\r\nHost: x\r\n"
                           b"Connection: close\r\n\r\n")
        st = status_of(raw)
        if st not in (400, 404) or b"root:" in raw:
            problems.append("%s: %s" % (path, raw[:80]))
    tap.ok(not problems, "traversal, hidden and empty components: 400/404, never a file",
           problems)
    bad = []
    for m in ("POST", "PUT", "DELETE", "PATCH", "OPTIONS", "PROPFIND"):
        r = request(srv, "/ckptfs/%s/resolve/main/model.safetensors" % name, method=m)
        if r.status != 405 or "GET" not in (r.header("allow") or ""):
            bad.append("%s: %s" % (m, r.status))
    tap.ok(not bad, "POST/PUT/DELETE/PATCH/OPTIONS/PROPFIND: 405 with Allow", bad)
    raw = raw_exchange(srv, b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 200000 +
                       b"\r\n\r\n")
    st = status_of(raw)
    tap.ok(st is None or 400 <= st < 500, "a 200 KB header: refused (%s)" % st, [raw[:100]])
    ranges = ",".join("%d-%d" % (i, i) for i in range(5000))
    t0 = time.time()
    raw = raw_exchange(srv, ("GET /ckptfs/%s/resolve/main/model.safetensors HTTP/1.1\r\n"
                             "Host: x\r\nRange: bytes=%s\r\nConnection: close\r\n\r\n"
                             % (name, ranges)).encode())
    tap.ok(status_of(raw) in (416, 431, 413, 400) and time.time() - t0 < 5,
           "5000 ranges in one header: refused at once (%s)" % status_of(raw), [raw[:120]])
    r = request(srv, "/api/models/ckptfs/%s" % name)
    tap.ok(r.status == 200, "the server still answers after the hostile requests")


def check_slow_clients(tap, ckptfs, srcs, big_name, big_size):
    """A server with --timeout 2 and 16 connections: slowloris, stalled readers, a flood."""
    with Server(ckptfs, srcs, ["--timeout", "2", "--max-connections", "16"]) as srv:
        slow = []
        for _ in range(10):
            s = socket.create_connection((srv.host, srv.port), timeout=10)
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")  # headers never end
            slow.append(s)
        stalled = []
        for _ in range(3):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.connect((srv.host, srv.port))
            s.sendall(("GET /ckptfs/%s/resolve/main/model.safetensors HTTP/1.1\r\nHost: x\r\n"
                       "\r\n" % big_name).encode())
            stalled.append(s)  # never read
        time.sleep(0.5)
        r = request(srv, "/api/models/ckptfs/%s" % big_name, timeout=10)
        tap.ok(r.status == 200, "13 slow or stalled clients open: others are still served")
        time.sleep(4)
        closed = 0
        for s in slow:
            s.settimeout(2)
            try:
                data = s.recv(100)
                closed += data == b"" or data.startswith(b"HTTP/1.1 408")
            except ConnectionResetError:
                closed += 1
            except socket.timeout:
                pass  # still open: not closed by the server
        tap.ok(closed == len(slow), "slowloris: all %d half-sent requests closed after the "
               "idle timeout (%d)" % (len(slow), closed))
        ended = 0
        for s in stalled:
            s.settimeout(5)
            got = 0
            try:
                while True:
                    chunk = s.recv(1 << 20)
                    if not chunk:
                        break
                    got += len(chunk)
            except ConnectionResetError:
                got = -1
            except socket.timeout:
                continue
            ended += got < big_size  # closed before the whole body went out
        tap.ok(ended == len(stalled), "clients that stop reading: cut off after the idle "
               "timeout (%d of %d)" % (ended, len(stalled)))
        for s in slow + stalled:
            s.close()
        flood = []
        for _ in range(40):
            try:
                flood.append(socket.create_connection((srv.host, srv.port), timeout=5))
            except OSError:
                break
        time.sleep(0.5)
        refused = 0
        for s in flood:
            s.settimeout(2)
            try:
                refused += s.recv(10) == b""
            except (socket.timeout, ConnectionResetError):
                refused += isinstance(sys.exc_info()[1], ConnectionResetError)
        for s in flood:
            s.close()
        time.sleep(0.5)
        r = request(srv, "/api/models/ckptfs/%s" % big_name, timeout=10)
        tap.ok(refused >= len(flood) - 16 and r.status == 200,
               "40 connections against a limit of 16: %d beyond it closed at once; served "
               "again afterwards" % refused, [len(flood), refused, r.status])
        tap.ok(srv.stop() == 0, "that server exits 0 on SIGTERM", [srv.stderr_text()[-500:]])


def check_tokens(tap, ckptfs, tmp, src):
    tok = os.path.join(tmp, "token")
    secret = "s3cret-token-%d" % random.randrange(10 ** 9)
    open(tok, "w").write(secret + "\n")
    with Server(ckptfs, [src], ["--token-file", tok]) as srv:
        path = "/api/models/ckptfs/%s" % list(srv.repos)[0]
        r = request(srv, path)
        tap.ok(r.status == 401 and "Bearer" in (r.header("www-authenticate") or ""),
               "token server: no Authorization: 401 with WWW-Authenticate", [r.status])
        bad = []
        for h in ("Bearer " + secret[:-1], "Bearer " + secret + "x", "Basic " + secret,
                  "Bearer", "Bearer " + secret.upper(), secret):
            if request(srv, path, headers={"Authorization": h}).status != 401:
                bad.append(h)
        tap.ok(not bad, "wrong, truncated, extended or non-Bearer tokens: 401", bad)
        r = request(srv, path, headers={"Authorization": "Bearer " + secret})
        r2 = request(srv, "/", headers={"Authorization": "Bearer " + secret})
        tap.ok(r.status == 200 and r2.status == 200, "the right token: 200 (API and pages)")
        tap.ok(srv.stop() == 0, "token server exits 0 on SIGTERM")


def check_listed_fetchable(tap, srv, name):
    """Every file the recursive tree lists resolves: a tensor named a\\b (resolve refuses
    backslashes) is left out of the listing, so a snapshot download of tensors/ succeeds."""
    r = request(srv, "/api/models/ckptfs/%s/tree/main/tensors?recursive=true" % name)
    files = [e["path"] for e in json.loads(r.body) if e["type"] == "file"] \
        if r.status == 200 else []
    bad = []
    for p in files:
        got = request(srv, "/ckptfs/%s/resolve/main/%s" % (name, urllib.parse.quote(p)))
        if got.status != 200:
            bad.append((p, got.status))
    tap.ok(r.status == 200 and "tensors/c/d" in files and not bad,
           "%s: every file the tree lists under tensors/ resolves (%d listed)" % (
               name, len(files)), [files, bad])


def check_pages(tap, srv, manifest):
    r = request(srv, "/ckptfs/sharded")
    page = r.body.decode("utf-8", "replace")
    missing = [t["path"] for t in manifest["tensors"]
               if ">%s</a>" % t["path"].split("/")[-1] not in page
               or "/resolve/main/tensors/%s\"" % t["path"] not in page]
    tap.ok(r.status == 200 and r.header("content-type").startswith("text/html")
           and not missing and "<script" not in page and "<details" in page,
           "repo page: HTML without script, every tensor linked to resolve/main/tensors/...",
           [r.status, missing[:5]])
    dtypes = sorted({t["dtype"] for t in manifest["tensors"]})
    tap.ok(all(d in page for d in dtypes) and "Summary" in page and "Warnings" in page,
           "repo page: dtypes %s, the summary and the warnings section" % dtypes)
    r = request(srv, "/")
    tap.ok(r.status == 200 and b'href="/ckptfs/sharded"' in r.body, "index page links the repos")
    r = request(srv, "/ckptfs/nasty")
    page = r.body.decode("utf-8", "replace")
    tap.ok(r.status == 200 and "<b>" not in page and "&lt;b&gt;" in page and "&amp;" in page
           and "%3Cb%3E" in page, "a tensor named with <b>, & and quotes: escaped in text "
           "and percent-encoded in links", [page[-600:]])
    r = request(srv, "/api/models/ckptfs/nasty/tree/main/tensors?recursive=true")
    deep = "tensors/" + "/".join(["d"] * 3000)
    paths = [e["path"] for e in json.loads(r.body)] if r.status == 200 else []
    got = request(srv, "/ckptfs/nasty/resolve/main/" + deep)
    tap.ok(deep in paths and got.body == np.arange(3, dtype=np.float32).tobytes(),
           "a tensor 3000 directories deep: listed with its whole path and served",
           [r.status, len(paths), got.status])
    r = request(srv, "/ckptfs/big/layers.svg")
    svg = r.body.decode("utf-8", "replace")
    tap.ok(r.status == 200 and r.header("content-type") == "image/svg+xml"
           and svg.lstrip().startswith("<") and "<svg" in svg and "layers.*.w" in svg,
           "layers.svg: the per-layer plot of the layers.*.w family", [r.status, svg[:200]])
    r = request(srv, "/ckptfs/changing/layers.svg")
    tap.ok(r.status == 404, "layers.svg of a repo without layer numbers: 404")


def main():
    tap = Tap()
    ckptfs, fixtures = os.environ.get("CKPTFS"), os.environ.get("FIXTURES")
    reason = None
    if not ckptfs or not os.access(ckptfs, os.X_OK):
        reason = "CKPTFS (%r) is not an executable" % ckptfs
    elif not fixtures or not os.path.isdir(os.path.join(fixtures, "sharded")):
        reason = "FIXTURES/sharded missing"
    elif not shutil.which("curl"):
        reason = "curl not found (make deps installs it)"
    if reason:
        tap.skip("ckptfs serve", reason)
        tap.done()
        return 0
    rng = random.Random(28)
    tmp = tempfile.mkdtemp(prefix="ckptfs-t28.")
    try:
        check_cli(tap, ckptfs, tmp)
        sharded = os.path.join(fixtures, "sharded")
        changing = os.path.join(tmp, "changing.safetensors")
        write_safetensors(changing, {"w": np.arange(64, dtype=np.float32)})
        big = os.path.join(tmp, "big.safetensors")
        write_safetensors(big, {"layers.%d.w" % i: np.full((256, 256), i, np.float32)
                                for i in range(8)})
        nasty = os.path.join(tmp, "nasty.safetensors")
        deep = ".".join(["d"] * 3000)  # nests 3000 directories deep
        write_safetensors(nasty, {"a.<b>&\"x'": np.zeros(2, np.float32),
                                  deep: np.arange(3, dtype=np.float32)})
        slashy = os.path.join(tmp, "slashy.safetensors")
        write_safetensors(slashy, {"a\\b": np.arange(4, dtype=np.float32),
                                   "c.d": np.arange(5, dtype=np.float32)})
        srcs = [sharded, "dcp=" + DCP, changing, big, nasty, slashy]
        with Server(ckptfs, srcs) as srv:
            tap.ok(sorted(srv.repos) == ["big", "changing", "dcp", "nasty", "sharded", "slashy"],
                   "repo names: the sources' names without extension, NAME=SOURCE",
                   [srv.repos])
            for name, src in (("sharded", sharded), ("dcp", DCP)):
                manifest = json.load(open(os.path.join(src, "manifest.json")))
                # A DCP checkpoint is no Hugging Face folder: it carries no side files.
                want_files = expected_siblings(src, ["model.safetensors"]) \
                    if name == "sharded" else ["model.safetensors"]
                check_info(tap, srv, name, want_files)
                check_tree(tap, srv, name, want_files, manifest)
                whole, h = check_model_file(tap, srv, name, manifest)
                check_raw_tensors(tap, srv, name, manifest)
                check_side_files(tap, srv, name, src, want_files)
                check_ranges(tap, srv, name, "model.safetensors", whole, rng)
                check_head_etag(tap, srv, name, whole, h.get("etag"))
            t = json.load(open(os.path.join(sharded, "manifest.json")))["tensors"][0]
            raw = request(srv, "/ckptfs/sharded/resolve/main/tensors/" + t["path"]).body
            check_ranges(tap, srv, "sharded", "tensors/" + t["path"], raw, rng)
            side = request(srv, "/ckptfs/sharded/resolve/main/tensors/%s.json" % t["path"])
            tap.ok(side.status == 200 and json.loads(side.body)["dtype"] == t["dtype"],
                   "a sidecar under tensors/ is served with its dtype")
            r = request(srv, "/ckptfs/big/resolve/main/tensors/layers/3/w")
            tap.ok(r.status == 200 and r.body == np.full((256, 256), 3, np.float32).tobytes(),
                   "big: a tensor in one extent of one file is exact")
            check_pages(tap, srv, json.load(open(os.path.join(sharded, "manifest.json"))))
            check_listed_fetchable(tap, srv, "slashy")
            check_change(tap, srv, changing)
            check_hostile(tap, srv, "sharded", None)
            tap.ok(srv.stop() == 0, "the server exits 0 on SIGTERM", [srv.stderr_text()[-800:]])
        # Larger than what socket buffers on loopback can hold, so a stalled reader blocks it.
        huge = os.path.join(tmp, "huge.safetensors")
        write_safetensors(huge, {"layers.%d.w" % i: np.zeros((1024, 1024), np.float32)
                                 for i in range(24)})
        check_slow_clients(tap, ckptfs, [huge], "huge", os.path.getsize(huge))
        os.unlink(huge)
        check_tokens(tap, ckptfs, tmp, DCP)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    tap.done()
    return 1 if tap.failed else 0


if __name__ == "__main__":
    sys.exit(main())
