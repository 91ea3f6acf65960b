#!/usr/bin/python3
"""A small S3-compatible server for the tests that VERIFIES AWS Signature Version 4 (header
authentication, as libcurl's CURLOPT_AWS_SIGV4 sends it). Standard library only; loopback unless
--listen names a test host's address (tests/lib/netns.py).
Written from the AWS documentation (Signature Version 4 for S3: canonical request, string to
sign, signing key); it shares no code with core/ nor with the test uploader in remote_servers.

What it serves, read-only, from a folder: every file under ROOT is the key of its relative path
in one bucket.
  GET  /KEY with an optional single Range (bytes=A-B, bytes=A-, bytes=-N): 200 or 206
  HEAD /KEY
  GET  /?list-type=2 ListObjectsV2: prefix, delimiter, max-keys (capped at the server's
       --max-keys, 1000 by default like S3), continuation-token, start-after
Addressing: path-style (/BUCKET/KEY) and virtual-hosted (Host: BUCKET.HOST:PORT).

Every request must carry: Authorization: AWS4-HMAC-SHA256 Credential=ID/DATE/REGION/s3/
aws4_request, SignedHeaders=..., Signature=...; x-amz-date (within 15 minutes of now, same day
as the credential scope); x-amz-content-sha256 (the body's hash, or UNSIGNED-PAYLOAD); host and
every x-amz-* header signed; x-amz-security-token equal to the key's session token when it has
one. Anything else is 403 with an S3 error document (InvalidAccessKeyId, SignatureDoesNotMatch,
AccessDenied, ...).

Each request is logged as one JSON line (method, path, query, host, status, error, x-amz-*
header names) to --log, for tests to count pages and see what was signed.

usage: s3_sigv4_server.py --root DIR --bucket B --key ID --secret S [--token T] [--region R]
                          [--max-keys N] [--port-file F] [--log F] [--listen ADDR --port N]
Prints nothing; writes the port to --port-file once listening.
"""

import argparse
import base64
import calendar
import datetime
import email.utils
import hashlib
import hmac
import http.server
import json
import os
import socketserver
import sys
import threading
import time
import urllib.parse
from xml.sax.saxutils import escape

UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.~")
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
MAX_SKEW = 15 * 60


def uri_encode(raw: bytes, keep_slash: bool) -> str:
    """AWS UriEncode: every byte but A-Z a-z 0-9 - _ . ~ (and '/' in a path) as %XX, upper hex."""
    out = []
    for b in raw:
        if b in UNRESERVED or (keep_slash and b == 0x2F):
            out.append(chr(b))
        else:
            out.append("%%%02X" % b)
    return "".join(out)


def canonical_query(raw_query: str) -> str:
    """Parameters decoded, re-encoded, sorted by name then value; a name without '=' gets an
    empty value."""
    pairs = []
    for part in raw_query.split("&") if raw_query else []:
        name, _, value = part.partition("=")
        name = urllib.parse.unquote_to_bytes(name.replace("+", "%20"))
        value = urllib.parse.unquote_to_bytes(value.replace("+", "%20"))
        pairs.append((uri_encode(name, False), uri_encode(value, False)))
    pairs.sort()
    return "&".join("%s=%s" % p for p in pairs)


def hmac_sha256(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode("utf-8"), hashlib.sha256).digest()


def signing_key(secret: str, day: str, region: str, service: str) -> bytes:
    k = hmac_sha256(("AWS4" + secret).encode("utf-8"), day)
    k = hmac_sha256(k, region)
    k = hmac_sha256(k, service)
    return hmac_sha256(k, "aws4_request")


def parse_authorization(value):
    """{'Credential': ..., 'SignedHeaders': ..., 'Signature': ...} or None."""
    algo, _, rest = value.strip().partition(" ")
    if algo != "AWS4-HMAC-SHA256":
        return None
    fields = {}
    for item in rest.split(","):
        k, eq, v = item.strip().partition("=")
        if not eq:
            return None
        fields[k] = v
    if set(fields) != {"Credential", "SignedHeaders", "Signature"}:
        return None
    return fields


class AuthError(Exception):
    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


class Store:
    """The bucket's objects: the files under root, keyed by relative path ('/' separated)."""

    def __init__(self, root):
        self.root = os.path.abspath(root)
        keys = []
        for d, _, files in os.walk(self.root, followlinks=True):
            for f in files:
                keys.append(os.path.relpath(os.path.join(d, f), self.root).replace(os.sep, "/"))
        self.keys = sorted(keys, key=lambda k: k.encode("utf-8"))

    def path(self, key):
        p = os.path.normpath(os.path.join(self.root, key))
        if not p.startswith(self.root + os.sep) or not os.path.isfile(p):
            return None
        return p


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "ckptfs-test-s3"

    def log_message(self, fmt, *args):
        pass

    # ---- plumbing ----

    def log_request_line(self, status, error=""):
        cfg = self.server.cfg
        if not cfg.log:
            return
        u = urllib.parse.urlsplit(self.path)
        rec = {"method": self.command, "path": u.path, "query": u.query,
               "host": self.headers.get("Host", ""), "status": status, "error": error,
               "amz": sorted(k.lower() for k in self.headers.keys()
                             if k.lower().startswith("x-amz-")),
               "range": self.headers.get("Range", "")}
        with cfg.log_lock:
            cfg.log.write(json.dumps(rec) + "\n")
            cfg.log.flush()

    def send(self, status, body=b"", headers=(), error=""):
        self.log_request_line(status, error)
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD" and body:
            self.wfile.write(body)

    def send_error_doc(self, status, code, message, resource=""):
        body = ("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>%s</Code>"
                "<Message>%s</Message><Resource>%s</Resource></Error>"
                % (code, escape(message), escape(resource))).encode()
        self.send(status, body, [("Content-Type", "application/xml")], code + ": " + message)

    # ---- authentication ----

    def verify(self, body: bytes):
        cfg = self.server.cfg
        auth = self.headers.get("Authorization")
        if not auth:
            raise AuthError("AccessDenied", "anonymous request refused")
        f = parse_authorization(auth)
        if not f:
            raise AuthError("AuthorizationHeaderMalformed", "not an AWS4-HMAC-SHA256 header")
        cred = f["Credential"].split("/")
        if len(cred) != 5 or cred[4] != "aws4_request":
            raise AuthError("AuthorizationHeaderMalformed", "credential scope " + f["Credential"])
        key_id, day, region, service = cred[:4]
        if key_id not in cfg.keys:
            raise AuthError("InvalidAccessKeyId", "unknown access key " + key_id)
        if region != cfg.region or service != "s3":
            raise AuthError("AuthorizationHeaderMalformed",
                            "scope region/service %s/%s, expected %s/s3"
                            % (region, service, cfg.region))
        amz_date = self.headers.get("x-amz-date")
        if not amz_date:
            raise AuthError("AccessDenied", "no x-amz-date")
        try:
            when = calendar.timegm(time.strptime(amz_date, "%Y%m%dT%H%M%SZ"))
        except ValueError:
            raise AuthError("AccessDenied", "malformed x-amz-date " + amz_date)
        if abs(time.time() - when) > MAX_SKEW:
            raise AuthError("RequestTimeTooSkewed", "x-amz-date " + amz_date)
        if amz_date[:8] != day:
            raise AuthError("SignatureDoesNotMatch", "scope date is not x-amz-date's day")
        payload = self.headers.get("x-amz-content-sha256")
        if not payload:
            raise AuthError("InvalidRequest", "no x-amz-content-sha256")
        if payload != "UNSIGNED-PAYLOAD" and payload != hashlib.sha256(body).hexdigest():
            raise AuthError("XAmzContentSHA256Mismatch", "x-amz-content-sha256 is not the body's")
        signed = f["SignedHeaders"].split(";")
        if signed != sorted(signed) or any(h != h.lower() for h in signed):
            raise AuthError("SignatureDoesNotMatch", "SignedHeaders not sorted lowercase")
        present = {k.lower() for k in self.headers.keys()}
        for must in ["host"] + sorted(h for h in present if h.startswith("x-amz-")):
            if must not in signed:
                raise AuthError("AccessDenied", "header %s present but not signed" % must)
        secret, token = cfg.keys[key_id]
        if token is not None and self.headers.get("x-amz-security-token") != token:
            raise AuthError("InvalidToken", "session token missing or wrong")
        lines = []
        for h in signed:
            values = self.headers.get_all(h)
            if values is None:
                raise AuthError("SignatureDoesNotMatch", "signed header %s missing" % h)
            # Values trimmed, inner runs of spaces folded to one; repeats joined by commas.
            lines.append("%s:%s\n" % (h, ",".join(" ".join(v.split()) for v in values)))
        u = urllib.parse.urlsplit(self.path)
        canon_uri = uri_encode(urllib.parse.unquote_to_bytes(u.path or "/"), True)
        canonical = "\n".join([self.command, canon_uri, canonical_query(u.query), "".join(lines),
                               f["SignedHeaders"], payload])
        scope = "%s/%s/s3/aws4_request" % (day, region)
        to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope,
                             hashlib.sha256(canonical.encode("utf-8")).hexdigest()])
        want = hmac.new(signing_key(secret, day, region, "s3"), to_sign.encode("utf-8"),
                        hashlib.sha256).hexdigest()
        if not hmac.compare_digest(want, f["Signature"]):
            raise AuthError("SignatureDoesNotMatch",
                            "signature does not match (canonical request %r)" % canonical)

    # ---- addressing ----

    def bucket_and_key(self):
        """(bucket, key) from a virtual-hosted Host or the path; key '' for the bucket."""
        cfg = self.server.cfg
        u = urllib.parse.urlsplit(self.path)
        path = urllib.parse.unquote(u.path)
        host = self.headers.get("Host", "").rsplit(":", 1)[0]
        suffix = "." + cfg.base_host
        if host.endswith(suffix) and len(host) > len(suffix):
            return host[:-len(suffix)], path.lstrip("/"), "virtual"
        bucket, _, key = path.lstrip("/").partition("/")
        return bucket, key, "path"

    # ---- requests ----

    def handle_any(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        try:
            self.verify(body)
        except AuthError as e:
            return self.send_error_doc(403, e.code, str(e), self.path)
        cfg = self.server.cfg
        bucket, key, style = self.bucket_and_key()
        cfg.styles.add(style)
        if bucket != cfg.bucket:
            return self.send_error_doc(404, "NoSuchBucket", "no bucket " + bucket, bucket)
        if self.command not in ("GET", "HEAD"):
            return self.send_error_doc(405, "MethodNotAllowed", "read-only server")
        q = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query, keep_blank_values=True)
        if key == "":
            if self.command == "GET" and q.get("list-type") == ["2"]:
                return self.list_v2(q)
            return self.send_error_doc(400, "InvalidRequest", "only ListObjectsV2 on a bucket")
        return self.get_object(key)

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = handle_any

    def get_object(self, key):
        p = self.server.cfg.store.path(key)
        if not p:
            return self.send_error_doc(404, "NoSuchKey", "no key " + key, key)
        st = os.stat(p)
        size = st.st_size
        etag = '"%x-%x"' % (st.st_mtime_ns, size)
        headers = [("ETag", etag), ("Last-Modified", email.utils.formatdate(st.st_mtime, usegmt=True)),
                   ("Accept-Ranges", "bytes"), ("Content-Type", "application/octet-stream")]
        rng = self.headers.get("Range")
        start, end, status = 0, size - 1, 200
        if rng:
            r = self.parse_range(rng, size)
            if r is None:
                return self.send_error_doc(416, "InvalidRange", "range " + rng, key)
            start, end = r
            status = 206
            headers.append(("Content-Range", "bytes %d-%d/%d" % (start, end, size)))
        n = max(0, end - start + 1)
        self.log_request_line(status)
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(n))
        self.end_headers()
        if self.command == "HEAD":
            return
        with open(p, "rb") as f:
            f.seek(start)
            left = n
            while left:
                chunk = f.read(min(left, 1 << 20))
                if not chunk:
                    break
                self.wfile.write(chunk)
                left -= len(chunk)

    @staticmethod
    def parse_range(value, size):
        unit, _, spec = value.partition("=")
        if unit.strip() != "bytes" or "," in spec:
            return None
        a, _, b = spec.strip().partition("-")
        try:
            if a == "":
                n = int(b)
                if n <= 0:
                    return None
                return max(0, size - n), size - 1
            start = int(a)
            end = int(b) if b else size - 1
        except ValueError:
            return None
        if start >= size or end < start:
            return None
        return start, min(end, size - 1)

    def list_v2(self, q):
        cfg = self.server.cfg
        prefix = q.get("prefix", [""])[0]
        delim = q.get("delimiter", [""])[0]
        try:
            max_keys = int(q.get("max-keys", ["1000"])[0])
        except ValueError:
            return self.send_error_doc(400, "InvalidArgument", "max-keys")
        max_keys = max(0, min(max_keys, cfg.max_keys))
        after = q.get("start-after", [""])[0]
        token = q.get("continuation-token", [None])[0]
        if token is not None:
            try:
                after = base64.urlsafe_b64decode(token.encode()).decode("utf-8")
            except Exception:
                return self.send_error_doc(400, "InvalidArgument", "continuation-token")
        # The token is the last key or common prefix returned: a page resumes after it (and
        # after every key under a common prefix).
        entries, prefixes, last, truncated = [], [], None, False
        for key in cfg.store.keys:
            if not key.startswith(prefix) or (after and key.encode() <= after.encode()):
                continue
            if token is not None and delim and after.endswith(delim) and key.startswith(after):
                continue
            name = key
            if delim:
                cut = key.find(delim, len(prefix))
                if cut >= 0:
                    name = key[:cut + len(delim)]
                    if prefixes and prefixes[-1] == name:
                        continue
            if len(entries) + len(prefixes) >= max_keys:
                truncated = True
                break
            (prefixes if name != key else entries).append(name)
            last = name
        out = ["<?xml version=\"1.0\" encoding=\"UTF-8\"?>",
               "<ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">",
               "<Name>%s</Name><Prefix>%s</Prefix>" % (escape(cfg.bucket), escape(prefix)),
               "<KeyCount>%d</KeyCount><MaxKeys>%d</MaxKeys>" % (len(entries) + len(prefixes),
                                                                   max_keys),
               "<IsTruncated>%s</IsTruncated>" % ("true" if truncated else "false")]
        if delim:
            out.append("<Delimiter>%s</Delimiter>" % escape(delim))
        if token is not None:
            out.append("<ContinuationToken>%s</ContinuationToken>" % escape(token))
        if truncated:
            nxt = base64.urlsafe_b64encode(last.encode("utf-8")).decode()
            out.append("<NextContinuationToken>%s</NextContinuationToken>" % escape(nxt))
        for key in entries:
            st = os.stat(cfg.store.path(key))
            mod = datetime.datetime.fromtimestamp(st.st_mtime, datetime.timezone.utc)
            out.append("<Contents><Key>%s</Key><LastModified>%s</LastModified>"
                       "<ETag>&quot;%x-%x&quot;</ETag><Size>%d</Size>"
                       "<StorageClass>STANDARD</StorageClass></Contents>"
                       % (escape(key), mod.strftime("%Y-%m-%dT%H:%M:%S.000Z"), st.st_mtime_ns,
                          st.st_size, st.st_size))
        for cp in prefixes:
            out.append("<CommonPrefixes><Prefix>%s</Prefix></CommonPrefixes>" % escape(cp))
        out.append("</ListBucketResult>")
        self.send(200, "".join(out).encode("utf-8"), [("Content-Type", "application/xml")])


class Running:
    """This server as a child process on a free loopback port: `with Running(root, ...) as s:`
    gives s.url, s.port and s.requests() (the log's records so far)."""

    def __init__(self, root, bucket, key, secret, token=None, region="us-east-1",
                 max_keys=1000):
        import subprocess
        import tempfile
        self.dir = tempfile.mkdtemp(prefix="ckptfs-s3v4.")
        self.logfile = os.path.join(self.dir, "requests.jsonl")
        port_file = os.path.join(self.dir, "port")
        argv = [sys.executable, os.path.realpath(__file__), "--root", root, "--bucket", bucket,
                "--key", key, "--secret", secret, "--region", region,
                "--max-keys", str(max_keys), "--port-file", port_file, "--log", self.logfile]
        if token is not None:
            argv += ["--token", token]
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
        deadline = time.time() + 20
        while not os.path.exists(port_file):
            if self.proc.poll() is not None or time.time() > deadline:
                self.stop()
                raise RuntimeError("s3_sigv4_server did not start")
            time.sleep(0.02)
        with open(port_file) as f:
            self.port = int(f.read())
        self.url = "http://127.0.0.1:%d" % self.port

    def requests(self):
        try:
            with open(self.logfile) as f:
                return [json.loads(line) for line in f if line.strip()]
        except OSError:
            return []

    def stop(self):
        import shutil
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except Exception:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        return False


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--bucket", required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--secret", required=True)
    ap.add_argument("--token")
    ap.add_argument("--region", default="us-east-1")
    ap.add_argument("--max-keys", type=int, default=1000)
    ap.add_argument("--base-host", default="localhost")
    ap.add_argument("--port-file")
    ap.add_argument("--log")
    ap.add_argument("--listen", default="127.0.0.1",
                    help="address to listen on (a test's own network namespace host)")
    ap.add_argument("--port", type=int, default=0)
    a = ap.parse_args()
    srv = Server((a.listen, a.port), Handler)

    class Cfg:
        pass

    cfg = Cfg()
    cfg.store = Store(a.root)
    cfg.bucket = a.bucket
    cfg.keys = {a.key: (a.secret, a.token)}
    cfg.region = a.region
    cfg.max_keys = a.max_keys
    cfg.base_host = a.base_host
    cfg.log = open(a.log, "a") if a.log else None
    cfg.log_lock = threading.Lock()
    cfg.styles = set()
    srv.cfg = cfg
    if a.port_file:
        tmp = a.port_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(str(srv.server_address[1]))
        os.rename(tmp, a.port_file)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
