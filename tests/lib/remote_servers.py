"""Servers on loopback for the remote-source tests, started and stopped by the test itself.

Nginx (Debian's package) runs in the foreground with its own configuration in a temporary
folder, on a free port, serving a folder with Range support and index pages; optional extra
`location` blocks shape it like the Hugging Face Hub.  Tests import it with:
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
"""

import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request

NGINX_CANDIDATES = ("/usr/sbin/nginx", "/usr/bin/nginx")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def nginx_binary():
    for p in NGINX_CANDIDATES:
        if os.access(p, os.X_OK):
            return p
    return shutil.which("nginx")


def wait_port(port, proc, seconds=10):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.05)
    return False


class Nginx:
    """nginx serving `root` at http://127.0.0.1:PORT/ (autoindex on, Range as nginx does it).
    `extra` is put inside the server block (locations, rewrites)."""

    def __init__(self, root, extra="", extra_http=""):
        self.root = os.path.abspath(root)
        self.dir = tempfile.mkdtemp(prefix="ckptfs-nginx.")
        self.port = free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        for sub in ("logs", "tmp"):
            os.mkdir(os.path.join(self.dir, sub))
        conf = os.path.join(self.dir, "nginx.conf")
        with open(conf, "w") as f:
            f.write("""
daemon off;
master_process off;
worker_processes 1;
pid %(d)s/nginx.pid;
error_log %(d)s/logs/error.log warn;
events { worker_connections 256; }
http {
    access_log %(d)s/logs/access.log;
    client_body_temp_path %(d)s/tmp;
    proxy_temp_path %(d)s/tmp;
    fastcgi_temp_path %(d)s/tmp;
    uwsgi_temp_path %(d)s/tmp;
    scgi_temp_path %(d)s/tmp;
    default_type application/octet-stream;
    types { text/html html; application/json json; }
    sendfile on;
    keepalive_requests 100000;
    %(extra_http)s
    server {
        listen 127.0.0.1:%(port)d;
        root %(root)s;
        autoindex on;
        %(extra)s
    }
}
""" % {"d": self.dir, "port": self.port, "root": self.root, "extra": extra,
       "extra_http": extra_http})
        self.proc = subprocess.Popen([nginx_binary(), "-c", conf, "-p", self.dir],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=open(os.path.join(self.dir, "logs", "stderr"), "w"))
        if not wait_port(self.port, self.proc):
            self.stop()
            raise RuntimeError("nginx did not start: " + self.errors())

    def errors(self):
        try:
            with open(os.path.join(self.dir, "logs", "stderr")) as f:
                a = f.read()
            with open(os.path.join(self.dir, "logs", "error.log")) as f:
                return a + f.read()
        except OSError:
            return ""

    def requests(self):
        """Lines of the access log so far."""
        try:
            with open(os.path.join(self.dir, "logs", "access.log")) as f:
                return f.read().splitlines()
        except OSError:
            return []

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        return False


def nginx_skip_reason():
    if not nginx_binary():
        return "nginx is not installed (make deps installs it)"
    return None


def fetch(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read()


# ---------------------------------------------------------------------------
# S3: the credentials 470-remote-s3.t's bucket takes (tests/lib/s3_sigv4_server.py serves it)
# and a SigV4 signer of our own for requests the tests make themselves

S3_KEY, S3_SECRET, S3_REGION = "AKIDCKPTFS47", "ckptfs/47+secret=", "us-east-1"


def _sign(key, msg):
    import hmac
    import hashlib
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


def s3_request(base_url, method, path, body=b"", key=S3_KEY, secret=S3_SECRET,
               region=S3_REGION, query=""):
    """One SigV4-signed request (written here from the AWS spec, not shared with core/);
    returns (status, body)."""
    import hashlib
    import http.client
    import urllib.parse
    u = urllib.parse.urlsplit(base_url)
    host = u.netloc
    now = time.gmtime()
    amz_date = time.strftime("%Y%m%dT%H%M%SZ", now)
    day = time.strftime("%Y%m%d", now)
    payload = hashlib.sha256(body).hexdigest()
    canon_path = urllib.parse.quote(path, safe="/-_.~")
    headers = {"host": host, "x-amz-content-sha256": payload, "x-amz-date": amz_date}
    signed = ";".join(sorted(headers))
    canon = "\n".join([method, canon_path, query,
                       "".join("%s:%s\n" % (k, headers[k]) for k in sorted(headers)),
                       signed, payload])
    scope = "%s/%s/s3/aws4_request" % (day, region)
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope,
                         hashlib.sha256(canon.encode()).hexdigest()])
    k = _sign(("AWS4" + secret).encode(), day)
    for part in (region, "s3", "aws4_request"):
        k = _sign(k, part)
    import hmac
    sig = hmac.new(k, to_sign.encode(), hashlib.sha256).hexdigest()
    headers["authorization"] = ("AWS4-HMAC-SHA256 Credential=%s/%s, SignedHeaders=%s, "
                                "Signature=%s" % (key, scope, signed, sig))
    c = http.client.HTTPConnection(host, timeout=30)
    c.request(method, canon_path + ("?" + query if query else ""), body=body, headers=headers)
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data
