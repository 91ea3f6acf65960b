"""Several hosts on one machine, for tests of what crosses a network: network namespaces joined
by veth links to one bridge, each with an address of 10.RR.0.0/24 (RR picked per run, so that
two runs never share a subnet). Nothing leaves the machine: the bridge has no uplink and no
route out. Needs root, iproute2 and nsenter (util-linux).

    with Hosts(["origin", "cache", "c1", "c2"]) as h:
        h.popen("origin", [ckptfs, "serve", "--listen", h.addr("origin") + ":8080", src])
        h.run("c1", ["curl", ...])
        h.cut("c1"); h.mend("c1")        # the link of c1 down, then up again

A process started in a host lives in that network namespace only: mounts and files are the
machine's, so a FUSE daemon started in a client host serves a mount every process sees, and
its network traffic is the client host's."""

import os
import random
import shutil
import subprocess
import time


def missing_tools():
    """The tools Hosts needs that this machine lacks, and why it cannot run (not root)."""
    why = [t for t in ("ip", "nsenter") if not shutil.which(t)]
    if os.geteuid() != 0:
        why.append("root (network namespaces)")
    return why


def _ip(*args, check=True):
    return subprocess.run(["ip"] + list(args), capture_output=True, text=True, check=check)


class Hosts:
    def __init__(self, names):
        self.tag = "ck%05d" % (os.getpid() % 100000)
        self.subnet = random.randrange(64, 250)
        self.names = list(names)
        self.ns = {n: "%s-%s" % (self.tag, n) for n in self.names}
        self.bridge_ns = self.tag + "-br"
        self.procs = []
        self.made = []
        try:
            self._build()
        except Exception:
            self.close()
            raise

    def addr(self, name):
        return "10.%d.0.%d" % (self.subnet, self.names.index(name) + 1)

    def _build(self):
        _ip("netns", "add", self.bridge_ns)
        self.made.append(self.bridge_ns)
        _ip("-n", self.bridge_ns, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.bridge_ns, "link", "set", "br0", "up")
        for i, name in enumerate(self.names):
            ns = self.ns[name]
            _ip("netns", "add", ns)
            self.made.append(ns)
            # one end in the host's namespace as eth0, the other on the bridge
            _ip("-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", "p%d" % i,
                "netns", self.bridge_ns)
            _ip("-n", self.bridge_ns, "link", "set", "p%d" % i, "master", "br0")
            _ip("-n", self.bridge_ns, "link", "set", "p%d" % i, "up")
            _ip("-n", ns, "addr", "add", self.addr(name) + "/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")

    def argv(self, name, argv):
        return ["nsenter", "--net=/run/netns/" + self.ns[name], "--"] + list(argv)

    def popen(self, name, argv, **kw):
        p = subprocess.Popen(self.argv(name, argv), **kw)
        self.procs.append(p)
        return p

    def run(self, name, argv, **kw):
        return subprocess.run(self.argv(name, argv), **kw)

    def cut(self, name):
        """The host's link goes down: its packets go nowhere (no error reaches its sockets)."""
        _ip("-n", self.bridge_ns, "link", "set", "p%d" % self.names.index(name), "down")

    def mend(self, name):
        _ip("-n", self.bridge_ns, "link", "set", "p%d" % self.names.index(name), "up")

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        for ns in reversed(self.made):
            _ip("netns", "del", ns, check=False)
        self.made = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


# What both caches below share: one worker, files under d, a log of each request and its
# upstream bytes (the slices are subrequests: their bytes are what the origin sent), and a cache.
_CACHE_HEAD = """
daemon off;
master_process off;
worker_processes 1;
pid %(d)s/nginx.pid;
error_log %(d)s/error.log warn;
events { worker_connections 512; }
http {
    log_format up '$request_method $request_uri $status $upstream_bytes_received';
    log_subrequest on;
    access_log %(d)s/access.log up;
    client_body_temp_path %(d)s/tmp;
    proxy_temp_path %(d)s/tmp;
    proxy_cache_path %(d)s/cache levels=1:2 keys_zone=ck:10m max_size=2g inactive=1h
                     use_temp_path=off;
"""

# The caching proxy of the many-readers deployment (README.md): file downloads cached in 1 MiB
# slices, the Hub API passed through; the cache holds the origin's token. Fields: d (its folder),
# addr and port (where it listens), origin (the origin's address, same port), token.
NGINX_CONF = _CACHE_HEAD + """    server {
        listen %(addr)s:%(port)d;
        # file downloads: cached in 1 MiB slices, one upstream fetch per slice
        location ~ /resolve/ {
            slice 1m;
            proxy_cache ck;
            proxy_cache_key $request_method$uri$slice_range;
            proxy_set_header Range $slice_range;
            proxy_cache_valid 200 206 1h;
            proxy_cache_lock on;
            proxy_http_version 1.1;
            proxy_set_header Authorization "Bearer %(token)s";
            proxy_pass http://%(origin)s:%(port)d;
        }
        # the Hub API: passed through (small, and must be current)
        location / {
            proxy_http_version 1.1;
            proxy_set_header Authorization "Bearer %(token)s";
            proxy_pass http://%(origin)s:%(port)d;
        }
    }
}
"""


def wait_for(pred, seconds):
    end = time.time() + seconds
    while time.time() < end:
        if pred():
            return True
        time.sleep(0.1)
    return False


def tcp_up(h, host, addr, port=8080):
    """True when host can open a TCP connection to addr:port."""
    return h.run(host, ["bash", "-c", "exec 3<>/dev/tcp/%s/%d" % (addr, port)],
                 capture_output=True).returncode == 0


# The same cache in front of an S3 origin: objects cached in 1 MiB slices, listings and HEADs
# passed through. SigV4 signs the Host header, which nginx passes on as the client sent it;
# Range is not signed, so the slice's Range may replace the client's. Fields as NGINX_CONF's.
NGINX_S3_CONF = _CACHE_HEAD + """    server {
        listen %(addr)s:%(port)d;
        location ~ \\.(safetensors|json)$ {
            slice 1m;
            proxy_cache ck;
            proxy_cache_key $request_method$uri$slice_range;
            proxy_set_header Range $slice_range;
            proxy_set_header Host $http_host;
            proxy_cache_valid 200 206 1h;
            proxy_cache_lock on;
            proxy_http_version 1.1;
            proxy_pass http://%(origin)s:%(port)d;
        }
        location / {
            proxy_set_header Host $http_host;
            proxy_http_version 1.1;
            proxy_pass http://%(origin)s:%(port)d;
        }
    }
}
"""

