"""Shared pieces of the `ckptfs serve` tests (280-serve.t, 290-serve-clients.t, the bench):
starting and stopping a server, plain HTTP requests, and the strict safetensors checks of
320-hfview.t (loaded from that file, so both tests hold the view to the same rules).

HTTP is spoken with http.client / raw sockets only: nothing here shares code with ckptfs.
"""

import http.client
import importlib.machinery
import importlib.util
import os
import re
import select
import signal
import subprocess
import tempfile
import time

HERE = os.path.dirname(os.path.realpath(__file__))
START_TIMEOUT = 30
STOP_TIMEOUT = 20


def load_hfview_checks():
    """320-hfview.t as a module: parse_strict, writer_style_problems, manifest_want, ..."""
    path = os.path.join(HERE, "..", "t", "320-hfview.t")
    loader = importlib.machinery.SourceFileLoader("hfview_checks", path)
    spec = importlib.util.spec_from_loader("hfview_checks", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


class Server:
    """A running `ckptfs serve`; .port, .host, .repos (name -> source; the id for repos outside
    ckptfs/), .ids (repo id -> source)."""

    def __init__(self, ckptfs, sources, extra=(), listen="127.0.0.1:0"):
        self.argv = [ckptfs, "serve", "--listen", listen] + list(extra) + list(sources)
        # stderr to a file: a pipe nobody drains would stall the server once full.
        self.err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=self.err)
        self.repos = {}
        self.ids = {}  # repo id -> source
        self.port = None
        self.host = "127.0.0.1"
        self.banner = ""
        deadline = time.time() + START_TIMEOUT
        buf = b""
        while time.time() < deadline and self.proc.poll() is None:
            r, _, _ = select.select([self.proc.stdout], [], [], 0.2)
            if not r:
                continue
            chunk = os.read(self.proc.stdout.fileno(), 65536)
            if not chunk:
                break
            buf += chunk
            text = buf.decode("utf-8", "replace")
            m = re.search(r"listening on http://(\S+?):(\d+)/", text)
            lines = [l for l in text.splitlines() if "  <- " in l]
            if m and len(lines) == len(sources):
                self.host = m.group(1).strip("[]")
                self.port = int(m.group(2))
                for l in lines:
                    # "ckptfs serve: ORG/NAME  <- SOURCE"; repos are keyed by NAME for the
                    # ckptfs/ org (what most tests build their URLs from), by the id otherwise
                    rid, src = l.split("ckptfs serve: ", 1)[1].split("  <- ", 1)
                    self.ids[rid] = src
                    self.repos[rid[len("ckptfs/"):] if rid.startswith("ckptfs/") else rid] = src
                break
        self.banner = buf.decode("utf-8", "replace")
        if self.port is None:
            self.stop()
            raise RuntimeError("ckptfs serve did not start: %s %s" % (
                self.banner, self.stderr_text()))

    @property
    def url(self):
        return "http://%s:%d" % (self.host, self.port)

    def stderr_text(self):
        self.err.seek(0)
        return self.err.read().decode("utf-8", "replace")

    def alive(self):
        return self.proc.poll() is None

    def stop(self):
        """SIGTERM and wait: the exit status (None if it had to be killed)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                return None
        self.proc.stdout.close()
        return self.proc.returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        return False


class Response:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers  # lower-case name -> value
        self.body = body

    def header(self, name):
        return self.headers.get(name.lower())


def request(server, path, method="GET", headers=None, conn=None, timeout=60):
    """One request; returns Response. With conn, reuses that keep-alive connection."""
    own = conn is None
    if own:
        conn = http.client.HTTPConnection(server.host, server.port, timeout=timeout)
    try:
        conn.request(method, path, headers=headers or {})
        r = conn.getresponse()
        body = r.read()
        return Response(r.status, {k.lower(): v for k, v in r.getheaders()}, body)
    finally:
        if own:
            conn.close()
