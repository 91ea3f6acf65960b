"""A small HTTP server on loopback whose every answer the test decides: files with Range
support, an ETag and a Last-Modified time that can be changed or dropped between requests,
redirects to another server, index pages only under a name ending in '/', and a log of the
headers each request carried.  Shares nothing with ckptfs; Python's standard library only.

    srv = HostileHTTP()                  # started on 127.0.0.1, a free port
    srv.files["/m.safetensors"] = data   # served with Range
    srv.etag["/m.safetensors"] = '"v1"'  # None: no ETag header
    srv.lastmod["/m.safetensors"] = "Tue, 01 Dec 2026 10:00:00 GMT"
    srv.redirects["/r"] = other.url + "/m.safetensors"
    srv.dirs["/d/"] = ["m.safetensors"]  # an index page; "/d" itself is 404
    srv.require_auth = "Basic ..."        # else 401
    ...
    srv.stop()
"""

import http.server
import re
import socketserver
import threading


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class HostileHTTP:
    def __init__(self):
        self.files, self.etag, self.lastmod = {}, {}, {}
        self.redirects, self.dirs = {}, {}
        self.require_auth = None  # an Authorization value every request must carry, else 401
        self.log = []  # (method, path, {header: value}) of every request
        self.lock = threading.Lock()
        state = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _answer(self, head):
                path = self.path.split("?", 1)[0]
                with state.lock:
                    state.log.append((self.command, self.path,
                                      {k.lower(): v for k, v in self.headers.items()}))
                    data = state.files.get(path)
                    etag, lastmod = state.etag.get(path), state.lastmod.get(path)
                    to, listing = state.redirects.get(path), state.dirs.get(path)
                if state.require_auth and self.headers.get("Authorization") != state.require_auth:
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="t"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if to is not None:
                    self.send_response(302)
                    self.send_header("Location", to)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if listing is not None:
                    body = ("<html><body>" + "".join('<a href="%s">%s</a>\n' % (n, n)
                                                      for n in listing) + "</body></html>").encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "text/html")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    if not head:
                        self.wfile.write(body)
                    return
                if data is None:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                start, end, status = 0, len(data) - 1, 200
                m = re.match(r"bytes=(\d+)-(\d*)$", self.headers.get("Range", ""))
                if m and data:
                    start = int(m.group(1))
                    end = min(int(m.group(2)) if m.group(2) else len(data) - 1, len(data) - 1)
                    status = 206
                    if start >= len(data):
                        self.send_response(416)
                        self.send_header("Content-Range", "bytes */%d" % len(data))
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                body = data[start:end + 1]
                self.send_response(status)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Accept-Ranges", "bytes")
                if status == 206:
                    self.send_header("Content-Range", "bytes %d-%d/%d" % (start, end, len(data)))
                if etag:
                    self.send_header("ETag", etag)
                if lastmod:
                    self.send_header("Last-Modified", lastmod)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def do_GET(self):
                self._answer(False)

            def do_HEAD(self):
                self._answer(True)

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = "http://127.0.0.1:%d" % self.port
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def requests_for(self, path):
        with self.lock:
            return [h for (_, p, h) in self.log if p.split("?", 1)[0] == path]

    def stop(self):
        self.server.shutdown()
        self.server.server_close()
