#!/usr/bin/python3
"""What a remote source may be trusted with, against small hostile servers on loopback
(tests/lib/hostile_http.py) and the bytes numpy wrote here (issue 29):
- secrets: a URL's password and signed query stay out of /proc/mounts (fsname), the daemon's
  /proc/PID/cmdline, `ckptfs serve`'s pages, repo ids and /api/models, and its banner;
- an S3 endpoint redirecting GET to another origin: the other origin gets neither
  x-amz-security-token nor Authorization;
- pinning: with Last-Modified and no ETag, an object replaced by one of the same size under
  another Last-Modified gives EIO; an ETag pinned at mount that later answers drop gives EIO;
- diff of two URLs with the same size, Last-Modified and ETag (nginx's is mtime-size) but other
  values reads them (exit 1),
  never "same bytes of the same file";
- http://host/dir/ keeps its slash: a server where /dir is 404 but /dir/ lists mounts;
- `stage --from URL` and `URL MNT -o stage=OUT` stage the remote tensors and commit them.

Environment: CKPTFS.
"""

import errno
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from ckptfs_test import Tap, is_mounted, run_capture, unmount  # noqa: E402
from hostile_http import HostileHTTP  # noqa: E402
from serve_util import Server  # noqa: E402

PASSWORD, SIGNATURE, TOKEN = "Pa55w0rdXYZ", "SigN4tur3QRS", "S3ss10nT0kenUVW"
OPTS = ["-o", "block_size=64KiB,prefetch=0,remote_timeout=2,retries=0"]


def safetensors(values):
    t = np.asarray(values, dtype="<f4")
    header = json.dumps({"w": {"dtype": "F32", "shape": [t.size], "data_offsets": [0, t.nbytes]}})
    header += " " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header.encode() + t.tobytes(), 8 + len(header)


def ck(ckptfs, *args, timeout=60, env=None):
    if env is None:
        return run_capture([ckptfs] + list(args), timeout)
    p = subprocess.run([ckptfs] + list(args), capture_output=True, timeout=timeout, env=env,
                       stdin=subprocess.DEVNULL)
    return p.returncode, p.stdout, p.stderr


def mount(ckptfs, src, mnt, extra=()):
    rc, out, err = run_capture([ckptfs, src, mnt] + OPTS + list(extra), 60)
    return rc, err.decode("utf-8", "replace")


def cmdlines_naming(word):
    """The /proc/PID/cmdline of every process whose arguments hold word."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if word.encode() in cmd:
            found.append((pid, cmd))
    return found


def secrets(tap, ckptfs, work, srv):
    data, _ = safetensors(np.arange(4096) * 0.25)
    srv.files["/m.safetensors"] = data
    srv.etag["/m.safetensors"] = '"s1"'
    url = "http://user:%s@127.0.0.1:%d/m.safetensors?X-Amz-Signature=%s" % (
        PASSWORD, srv.port, SIGNATURE)
    mnt = tempfile.mkdtemp(prefix="m.", dir=work)
    rc, err = mount(ckptfs, url, mnt)
    tap.ok(rc == 0, "mount of a URL with a password and a signed query", [rc, err])
    with open("/proc/mounts") as f:
        mounts = f.read()
    line = [l for l in mounts.splitlines() if mnt in l]
    tap.ok(line and PASSWORD not in mounts and SIGNATURE not in mounts and
           "127.0.0.1:%d/m.safetensors" % srv.port in line[0],
           "/proc/mounts: fsname is the URL without password and query", line)
    daemons = [c for c in cmdlines_naming(mnt) if b"ckptfs" in c[1]]
    tap.ok(daemons and not any(PASSWORD.encode() in c or SIGNATURE.encode() in c
                               for _, c in daemons),
           "the daemon's /proc/PID/cmdline holds neither the password nor the signature",
           [c for _, c in daemons])
    try:
        with open(os.path.join(mnt, "w"), "rb") as f:
            got = f.read()
    except OSError as e:
        got = str(e)
    tap.ok(got == data[-16384:], "the tensor reads its bytes (the real URL is still used)")
    got_auth = [h.get("authorization", "") for h in srv.requests_for("/m.safetensors")]
    tap.ok(got_auth and all(a.startswith("Basic ") for a in got_auth),
           "every request still authenticates as user:password")
    unmount(mnt)

    # A source read with a password is private (item 3): served behind a token only.
    rc, out, err = run_capture([ckptfs, "serve", "--listen", "127.0.0.1:0", url], 30)
    tap.ok(rc == 2 and b"--token-file" in err and PASSWORD.encode() not in err and
           SIGNATURE.encode() not in err,
           "serve of a password-protected URL without --token-file: refused, no secret shown",
           [rc, err])
    token_file = os.path.join(work, "token")
    with open(token_file, "w") as f:
        f.write("t0ken-for-the-test\n")

    def get(s, path):
        rq = urllib.request.Request(s.url + path,
                                    headers={"Authorization": "Bearer t0ken-for-the-test"})
        with urllib.request.urlopen(rq, timeout=30) as r:
            return r.read().decode("utf-8", "replace")

    with Server(ckptfs, [url], extra=["--token-file", token_file]) as s:
        pages = [s.banner] + [get(s, path) for path in ("/", "/api/models")]
        names = list(s.repos)
        if names:
            pages.append(get(s, "/ckptfs/" + names[0]))
        cmd = [c for _, c in cmdlines_naming("127.0.0.1:%d/m.safetensors" % srv.port)
               if b"serve" in c]
        text = "\n".join(pages)
        tap.ok(names == ["m.safetensors"], "serve: the default repo id comes from the shown name",
               [names])
        tap.ok(len(pages) == 4 and PASSWORD not in text and SIGNATURE not in text,
               "serve: banner, /, /api/models and the repo page show no password or signature",
               [text[:2000]])
        tap.ok(cmd and not any(PASSWORD.encode() in c or SIGNATURE.encode() in c for c in cmd),
               "serve: its /proc/PID/cmdline holds no secret", cmd)


def s3_redirect(tap, ckptfs, work, srv, other):
    data, _ = safetensors(np.arange(1024) * 0.5)
    listing = ("<?xml version=\"1.0\" encoding=\"UTF-8\"?><ListBucketResult><Name>b</Name>"
               "<KeyCount>1</KeyCount><IsTruncated>false</IsTruncated><Contents>"
               "<Key>m.safetensors</Key><Size>%d</Size><ETag>\"e\"</ETag></Contents>"
               "</ListBucketResult>" % len(data)).encode()
    srv.files["/b"] = listing
    srv.redirects["/b/m.safetensors"] = other.url + "/elsewhere/m.safetensors"
    other.files["/elsewhere/m.safetensors"] = data
    other.etag["/elsewhere/m.safetensors"] = '"e"'
    env = dict(os.environ, AWS_ACCESS_KEY_ID="AKIDTEST", AWS_SECRET_ACCESS_KEY="secretkey",
               AWS_SESSION_TOKEN=TOKEN, AWS_REGION="us-east-1",
               AWS_ENDPOINT_URL_S3=srv.url)
    rc, out, err = ck(ckptfs, "cat", "s3://b/m.safetensors", "w", env=env)
    seen = other.requests_for("/elsewhere/m.safetensors")
    tap.ok(seen, "s3: the GET was redirected to another origin", [rc, err])
    leaked = [h for h in seen if "x-amz-security-token" in h or "authorization" in h]
    tap.ok(seen and not leaked,
           "s3: the other origin got neither x-amz-security-token nor Authorization", leaked)
    first = srv.requests_for("/b/m.safetensors")
    tap.ok(first and all(h.get("x-amz-security-token") == TOKEN for h in first),
           "s3: the endpoint itself still got the session token")
    tap.ok(rc == 0 and out == data[-4096:], "s3: the redirected object's bytes", [rc, err])


def pinning(tap, ckptfs, work, srv):
    rng = np.random.default_rng(7)
    a = rng.standard_normal(1 << 20)  # 4 MiB: far past what the first read's readahead takes
    data, hl = safetensors(a)
    other, _ = safetensors(a[::-1].copy())
    for name, etag, lastmod, change in (
            ("lm", None, "Tue, 01 Dec 2026 10:00:00 GMT",
             ("lastmod", "Tue, 01 Dec 2026 10:00:01 GMT")),
            ("drop", '"v1"', None, ("etag", None)),
            ("lmdrop", None, "Tue, 01 Dec 2026 10:00:00 GMT", ("lastmod", None))):
        path = "/%s.safetensors" % name
        srv.files[path], srv.etag[path], srv.lastmod[path] = data, etag, lastmod
        mnt = tempfile.mkdtemp(prefix="p.", dir=work)
        rc, err = mount(ckptfs, srv.url + path, mnt)
        tap.ok(rc == 0, "%s: mounted" % name, [rc, err])
        f = os.path.join(mnt, "w")
        try:
            with open(f, "rb") as fh:
                first = fh.read(4096)
            ok = first == data[hl:hl + 4096]
        except OSError as e:
            ok, first = False, str(e)
        tap.ok(ok, "%s: a first read gives the pinned bytes" % name)
        srv.files[path] = other  # same size, other values
        if change[0] == "lastmod":
            srv.lastmod[path] = change[1]
        else:
            srv.etag[path] = change[1]
        errs = []
        for off in (3500000, 2600000):
            try:
                with open(f, "rb") as fh:
                    fh.seek(off)
                    got = fh.read(4096)
                errs.append("read %d bytes, new ones: %s" % (
                    len(got), got == other[hl + off:hl + off + 4096]))
            except OSError as e:
                errs.append(e.errno)
        tap.ok(errs == [errno.EIO, errno.EIO],
               "%s: after the object changed (%s) reads give EIO, never its new bytes" % (
                   name, "Last-Modified moved" if name == "lm" else "the pinned header dropped"),
               errs)
        unmount(mnt)


def diff_remote(tap, ckptfs, work, srv):
    a, _ = safetensors(np.arange(2048) * 1.0)
    b, _ = safetensors(np.arange(2048) * 1.0 + 1.0)
    # nginx's ETag is "mtime-size" in hex: two files of one size and time share it.
    for p, d in (("/diff-a/m.safetensors", a), ("/diff-b/m.safetensors", b)):
        srv.files[p], srv.etag[p] = d, '"692d6ea0-%x"' % len(d)
        srv.lastmod[p] = "Tue, 01 Dec 2026 10:00:00 GMT"
    rc, out, err = ck(ckptfs, "diff", srv.url + "/diff-a/m.safetensors",
                      srv.url + "/diff-b/m.safetensors")
    text = out.decode("utf-8", "replace")
    tap.ok(rc == 1 and "same bytes of the same file" not in text,
           "diff of two URLs of one size, Last-Modified and (nginx) ETag, other values: read, exit 1",
           [rc, text, err])


def trailing_slash(tap, ckptfs, work, srv):
    data, _ = safetensors(np.arange(256) * 2.0)
    srv.dirs["/only-slash/"] = ["model.safetensors"]
    srv.files["/only-slash/model.safetensors"] = data
    srv.etag["/only-slash/model.safetensors"] = '"d"'
    rc, out, err = ck(ckptfs, "ls", srv.url + "/only-slash/")
    tap.ok(rc == 0 and b"w" in out.split(),
           "http://host/dir/ whose /dir is 404: listed through dir/ (rc %r)" % rc, [out, err])


def stage_from_url(tap, ckptfs, work, srv):
    vals = np.arange(512, dtype=np.float32) * 3.0
    data, _ = safetensors(vals)
    srv.files["/s.safetensors"], srv.etag["/s.safetensors"] = data, '"st"'
    url = srv.url + "/s.safetensors"
    for how in ("stage --from URL", "URL MNT -o stage=OUT"):
        out = os.path.join(work, "out-%d.safetensors" % len(how))
        mnt = tempfile.mkdtemp(prefix="s.", dir=work)
        if how.startswith("stage"):
            rc, _, err = run_capture([ckptfs, "stage", out, mnt, "--from", url], 60)
        else:
            rc, _, err = run_capture([ckptfs, url, mnt, "-o", "stage=" + out], 60)
        tap.ok(rc == 0 and is_mounted(mnt), "%s: staged" % how, [rc, err])
        try:
            with open(os.path.join(mnt, "w"), "rb") as f:
                got = f.read()
        except OSError as e:
            got = str(e)
        tap.ok(got == vals.tobytes(), "%s: the staged tensor has the remote bytes" % how)
        rc, _, err = run_capture([ckptfs, "commit", mnt], 120)
        committed = b""
        if os.path.exists(out):
            with open(out, "rb") as f:
                committed = f.read()
        tap.ok(rc == 0 and vals.tobytes() in committed,
               "%s: commit writes OUT holding the tensor" % how, [rc, err])
        run_capture([ckptfs, "umount", mnt], 60)
        unmount(mnt)


def main():
    ckptfs = os.environ.get("CKPTFS", "")
    if not os.access(ckptfs, os.X_OK) or not os.path.exists("/dev/fuse"):
        print("1..0 # SKIP CKPTFS or /dev/fuse missing")
        return 0
    tap = Tap()
    work = tempfile.mkdtemp(prefix="ckptfs-t85.")
    srv, other = HostileHTTP(), HostileHTTP()
    try:
        secrets(tap, ckptfs, work, srv)
        s3_redirect(tap, ckptfs, work, srv, other)
        pinning(tap, ckptfs, work, srv)
        diff_remote(tap, ckptfs, work, srv)
        trailing_slash(tap, ckptfs, work, srv)
        stage_from_url(tap, ckptfs, work, srv)
    finally:
        for d in os.listdir(work):
            p = os.path.join(work, d)
            if os.path.isdir(p) and is_mounted(p):
                unmount(p)
        srv.stop()
        other.stop()
        shutil.rmtree(work, ignore_errors=True)
    tap.done()
    return 0 if tap.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
