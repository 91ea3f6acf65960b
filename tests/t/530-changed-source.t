#!/usr/bin/python3
"""A source rewritten in place after the mount (same inode, same size: what `cp NEW SRC` does)
must give EIO on every read path, never the new bytes under the old header.

The checkpoint is an HF directory this test writes itself (model.safetensors + config.json).
For each case a fresh scratch copy is mounted, descriptors are opened (O_DIRECT, so reads reach
the daemon), the source is rewritten in place with other bytes of the same size, and then:
  raw        a tensor file opened before the change gives EIO
  npy        its .npy file opened before gives EIO
  view-open  the HF view's model.safetensors opened before gives EIO for a tensor's range
  view-new   the HF view opened after the change gives EIO (at open or on read), not new bytes
  aux        config.json opened before gives EIO (mounted -o passthrough=off: config.json is
             one source file as it is, which passthrough hands to the kernel, whose reads of
             a file changed in place give the new bytes: tests/t/302-passthrough.t)
  mmap       pages of a tensor mapped before the change, faulted after: SIGBUS, not new bytes
  xattr      user.ckpt.sha256 asked after the change: EIO
  as_dtype   an F16 tensor read as F32 (-o as_dtype=f32): EIO
  splice     with -o splice: EIO
  zst        a seekable .safetensors.zst rewritten in place (other frames, same size): EIO
  cat        `ckptfs cat` of an 8 MiB tensor, paused on a full pipe while the file changes:
             exits non-zero naming the change, and what it wrote is a prefix of the old bytes
  tar splice a 1 MiB tensor of a safetensors member of a tar (after another member) read with
             -o splice gives the member's bytes (the splice took the archive's offsets), and
             EIO once the tar is rewritten in place
  verify     `ckptfs verify` of 3000 tensors, paused on a small full pipe while the file
             changes: exits non-zero, and every digest it printed is an old tensor's
  serve      `ckptfs serve`: a request right after the change (before the snapshot is looked at
             again) gets an error or a new ETag, never new bytes under the old ETag, for the HF
             view, a tensor and config.json; a 64 MiB tensor downloaded by a client with a
             small receive buffer, the file changed a few MiB in, is cut short with old bytes
             only (it was sent with sendfile, and completed as a 200 with mixed bytes)
  serve shard  `ckptfs serve --max-shard-size` of two source shards, one rewritten in place: a
             request right after the change for the HF view file the other shard makes gives
             its bytes (200), not 503 (serve looked at every source of the repo, where the mount
             and core look at the sources of the file asked for)

Every case runs twice: with the new bytes' mtime as cp leaves it, and with the old mtime put
back (`cp -p`, `touch -r`, `rsync --inplace -t`: same size, same mtime; only ctime tells).
Then: a source chmod-ed under the mount reads as changed (EIO) through descriptors opened
before, and a mount made after it reads it.
"""
import errno
import fcntl
import hashlib
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from ckptfs_test import read_to_eof, run_capture  # noqa: E402
from mount_checks import mounted, run  # noqa: E402
from serve_util import Server, request  # noqa: E402

PUT_BACK = [False]  # rewrite_in_place puts the old mtime back (the second round of cases)


def safetensors_bytes(tensors):
    """tensors: [(name, dtype, shape, raw bytes)] -> file bytes (written here, not by ckptfs)."""
    header, off = {}, 0
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(t[3] for t in tensors)


def model(seed):
    rng = np.random.default_rng(seed)
    return [("a", "F32", (512, 512), rng.standard_normal((512, 512), np.float32).tobytes()),
            ("b", "F16", (256, 256), rng.standard_normal((256, 256)).astype("<f2").tobytes()),
            ("c", "I32", (256, 256), rng.integers(0, 1 << 30, (256, 256), np.int32).tobytes())]


CONFIG_OLD = b'{"model_type": "llama", "hidden_size": 4096}\n'
CONFIG_NEW = b'{"model_type": "gpt2x", "hidden_size": 8192}\n'


def make_source(scratch):
    src = tempfile.mkdtemp(prefix="src.", dir=scratch)
    with open(os.path.join(src, "model.safetensors"), "wb") as f:
        f.write(safetensors_bytes(model(1)))
    with open(os.path.join(src, "config.json"), "wb") as f:
        f.write(CONFIG_OLD)
    return src


def rewrite_in_place(path, data):
    """What cp does to an existing file: open with O_TRUNC (same inode), write the new bytes;
    in the second round, then the old mtime put back (cp -p, touch -r)."""
    time.sleep(0.05)  # a user's cp does not land in the mount's clock tick
    was = os.stat(path)
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    if PUT_BACK[0]:
        os.utime(path, ns=(was.st_atime_ns, was.st_mtime_ns))
    now = os.stat(path)
    assert now.st_ino == was.st_ino and now.st_size == len(data)
    assert not PUT_BACK[0] or (now.st_mtime_ns == was.st_mtime_ns and now.st_size == was.st_size)


class Labelled:
    """The TAP stream with a note on every line: which round of cases it belongs to."""

    def __init__(self, tap, note):
        self.tap, self.note = tap, note

    def ok(self, cond, desc, diag=()):
        return self.tap.ok(cond, desc + self.note, diag)

    def skip(self, desc, reason):
        self.tap.skip(desc + self.note, reason)

    def diag(self, text):
        self.tap.diag(text)


def new_model_bytes():
    return safetensors_bytes(model(2))  # same names, dtypes, shapes: same header, other data


def pread_all(fd, off, length):
    out = b""
    while len(out) < length:
        chunk = os.pread(fd, min(1 << 20, length - len(out)), off + len(out))
        if not chunk:
            break
        out += chunk
    return out


def outcome(fn):
    try:
        fn()
        return "bytes"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))


def open_direct(path):
    return os.open(path, os.O_RDONLY | os.O_DIRECT)


def view_range(fd, name):
    (hlen,) = struct.unpack("<Q", pread_all(fd, 0, 8))
    header = json.loads(pread_all(fd, 8, hlen))
    a, b = header[name]["data_offsets"]
    return 8 + hlen + a, b - a


def body(tap, ckptfs, fixtures):
    scratch = tempfile.mkdtemp(prefix="ckptfs-t53-src.")
    try:
        for put_back, note in ((False, ""), (True, " (old mtime put back)")):
            PUT_BACK[0] = put_back
            cases(Labelled(tap, note), ckptfs, fixtures, scratch)
        PUT_BACK[0] = False
        chmod_case(tap, ckptfs, scratch)
        stage_case(tap, ckptfs, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def mounted_case(tap, ckptfs, scratch, label, check, options=()):
    src = make_source(scratch)
    mounted(tap, ckptfs, src, label, lambda mnt: check(mnt, src), options=options)


def expect_eio(tap, label, got):
    tap.ok(got == "EIO", "%s: EIO after the source was rewritten in place" % label,
           ["got %s" % got])


def cases(tap, ckptfs, fixtures, scratch):
    def raw_and_npy(mnt, src):
        fd_raw = open_direct(os.path.join(mnt, "a"))
        fd_npy = open_direct(os.path.join(mnt, "a.npy"))
        fd_view = open_direct(os.path.join(mnt, ".ckptfs", "hf", "model.safetensors"))
        fd_aux = open_direct(os.path.join(mnt, ".ckptfs", "hf", "config.json"))
        off, n = view_range(fd_view, "c")
        rewrite_in_place(os.path.join(src, "model.safetensors"), new_model_bytes())
        rewrite_in_place(os.path.join(src, "config.json"), CONFIG_NEW)
        expect_eio(tap, "raw", outcome(lambda: pread_all(fd_raw, 0, 512 * 512 * 4)))
        expect_eio(tap, "npy", outcome(lambda: pread_all(fd_npy, 0, 512 * 512 * 4 + 128)))
        expect_eio(tap, "view-open", outcome(lambda: pread_all(fd_view, off, n)))
        expect_eio(tap, "aux", outcome(lambda: pread_all(fd_aux, 0, len(CONFIG_OLD))))
        for fd in (fd_raw, fd_npy, fd_view, fd_aux):
            os.close(fd)

        def fresh_view():
            fd = open_direct(os.path.join(mnt, ".ckptfs", "hf", "model.safetensors"))
            try:
                pread_all(fd, off, n)
            finally:
                os.close(fd)
        expect_eio(tap, "view-new", outcome(fresh_view))
        expect_eio(tap, "xattr", outcome(
            lambda: os.getxattr(os.path.join(mnt, "c"), "user.ckpt.sha256")))

    mounted_case(tap, ckptfs, scratch, "raw, npy, view, aux", raw_and_npy,
                 options=("-o", "passthrough=off"))

    def mmap_case(mnt, src):
        # The mapping is made before the change, its pages are faulted after it, in a child
        # (SIGBUS would end this process).
        prog = ("import mmap,os,sys\n"
                "fd=os.open(sys.argv[1],os.O_RDONLY)\n"
                "m=mmap.mmap(fd,0,prot=mmap.PROT_READ)\n"
                "sys.stdout.write('mapped\\n');sys.stdout.flush()\n"
                "sys.stdin.readline()\n"
                "sys.stdout.write('read %d\\n' % sum(m[i] for i in range(0,len(m),4096)))\n")
        p = subprocess.Popen([sys.executable, "-c", prog, os.path.join(mnt, "c")],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        first = p.stdout.readline().strip()
        rewrite_in_place(os.path.join(src, "model.safetensors"), new_model_bytes())
        p.stdin.write("go\n")
        p.stdin.flush()
        try:
            rest, _ = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            rest, _ = p.communicate()
        tap.ok(first == "mapped" and p.returncode == -7,
               "mmap: faulting pages after the source was rewritten gives SIGBUS",
               ["child: %r then %r, status %r" % (first, rest.strip(), p.returncode)])

    mounted_case(tap, ckptfs, scratch, "mmap", mmap_case)

    def as_f32(mnt, src):
        fd = open_direct(os.path.join(mnt, "b"))
        rewrite_in_place(os.path.join(src, "model.safetensors"), new_model_bytes())
        expect_eio(tap, "as_dtype=f32", outcome(lambda: pread_all(fd, 0, 256 * 256 * 4)))
        os.close(fd)

    mounted_case(tap, ckptfs, scratch, "as_dtype=f32", as_f32, options=("-o", "as_dtype=f32"))

    def splice(mnt, src):
        fd = open_direct(os.path.join(mnt, "a"))
        rewrite_in_place(os.path.join(src, "model.safetensors"), new_model_bytes())
        expect_eio(tap, "splice", outcome(lambda: pread_all(fd, 0, 512 * 512 * 4)))
        os.close(fd)

    mounted_case(tap, ckptfs, scratch, "splice", splice, options=("-o", "splice"))

    zst_case(tap, ckptfs, scratch)
    cat_case(tap, ckptfs, scratch)
    tar_splice_case(tap, ckptfs, scratch)
    verify_case(tap, ckptfs, scratch)
    serve_snapshot_case(tap, ckptfs, scratch)
    serve_long_response_case(tap, ckptfs, scratch)
    serve_view_shard_case(tap, ckptfs, scratch)


def chmod_case(tap, ckptfs, scratch):
    """chmod moves ctime like a write does: documented (ckptfs(1)) as a change, EIO until the
    source is mounted again."""
    def check(mnt, src):
        fd = open_direct(os.path.join(mnt, "a"))
        time.sleep(0.05)
        path = os.path.join(src, "model.safetensors")
        os.chmod(path, 0o600)
        got = outcome(lambda: pread_all(fd, 0, 4096))
        tap.ok(got == "EIO", "chmod: EIO through a descriptor opened before the source's mode "
               "changed (its ctime moved)", ["got %s" % got])
        os.close(fd)

    src = make_source(scratch)
    mounted(tap, ckptfs, src, "chmod", lambda mnt: check(mnt, src))

    def fresh(mnt):
        with open(os.path.join(mnt, "a"), "rb") as f:
            tap.ok(f.read() == model(1)[0][3], "chmod: a mount made after it reads the file")

    mounted(tap, ckptfs, src, "chmod, mounted again", fresh)


def stage_case(tap, ckptfs, scratch):
    """A stage's commits hard-link a --from shard that none of its tensors changed into OUT:
    the shard's ctime moves, by ckptfs itself, and must not read as a change. A change in place
    with the old mtime put back, after that, must."""
    from staging import StageSession, put
    src = make_source(scratch)
    shard = os.path.join(src, "model.safetensors")
    out = os.path.join(scratch, "staged-out") + "/"
    old_a = model(1)[0][3]
    with StageSession(ckptfs, out, "--from", src + "/", "-o", "nocommit",
                      prefix="ckptfs-t53.") as s:
        if not tap.ok(s.ok, "stage: ckptfs stage OUT/ --from SRC/", [s.err]):
            return
        put(s.mnt, "n", np.ones(1024, "<f4").tobytes())
        rc1, text1 = s.commit()
        nlink = os.stat(shard).st_nlink
        fd = open_direct(s.path("a"))
        got = outcome(lambda: pread_all(fd, 0, len(old_a)) == old_a or "other bytes")
        rc2, text2 = s.commit()
        tap.ok(rc1 == 0 and rc2 == 0 and nlink > 1 and got == "bytes",
               "stage: after a commit that linked its --from shard into OUT, the stage reads "
               "the shard and commits again",
               ["commits: %r %r, shard links: %d, read: %s" % (rc1, rc2, nlink, got),
                text1, text2])
        PUT_BACK[0] = True
        try:
            rewrite_in_place(shard, new_model_bytes())
        finally:
            PUT_BACK[0] = False
        expect_eio(tap, "stage (old mtime put back)",
                   outcome(lambda: pread_all(fd, 0, len(old_a))))
        os.close(fd)
        put(s.mnt, "n2", np.ones(256, "<f4").tobytes())
        rc3, text3 = s.commit()
        tap.ok(rc3 != 0 and "changed" in text3,
               "stage: a commit after the --from shard changed in place (old mtime put back) "
               "is refused", ["exit %r: %s" % (rc3, text3)])


def verify_case(tap, ckptfs, scratch):
    src = tempfile.mkdtemp(prefix="verify.", dir=scratch)
    path = os.path.join(src, "many.safetensors")
    n = 3000
    old = [bytes([i % 251]) * 4096 for i in range(n)]
    names = ["t%04d" % i for i in range(n)]
    with open(path, "wb") as f:
        f.write(safetensors_bytes([(k, "U8", (4096,), v) for k, v in zip(names, old)]))
    new_file = safetensors_bytes([(k, "U8", (4096,), bytes([255]) * 4096) for k in names])
    digest = {k: hashlib.sha256(v).hexdigest() for k, v in zip(names, old)}
    r, w = os.pipe()
    fcntl.fcntl(w, 1031, 4096)  # F_SETPIPE_SZ: verify blocks after a few dozen lines
    with tempfile.TemporaryFile() as errf:
        p = subprocess.Popen([ckptfs, "verify", path], stdout=w, stderr=errf)
        os.close(w)
        got = os.read(r, 4096)
        time.sleep(0.3)
        rewrite_in_place(path, new_file)
        got = read_to_eof(r, got)
        rc = p.wait(timeout=120)
        errf.seek(0)
        err = errf.read().decode("utf-8", "replace").strip()
    bad, hashed = [], 0
    for line in got.decode("utf-8", "replace").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1] in digest and len(parts[0]) == 64:
            hashed += 1
            if parts[0] != digest[parts[1]]:
                bad.append(line)
    tap.ok(rc != 0 and not bad and hashed < n and "changed" in (err + got.decode()),
           "verify: a source rewritten while verify reads it: an error, only old digests",
           ["exit %r, %d of %d hashed, wrong digests: %s, stderr: %s"
            % (rc, hashed, n, bad[:3], err[:500])])


def serve_snapshot_case(tap, ckptfs, scratch):
    """A request right after the change, within the second before serve looks at its sources
    again: it must not give the new bytes under the old ETag."""
    src = make_source(scratch)
    srv = Server(ckptfs, [src])
    try:
        name = next(iter(srv.repos))
        paths = ["model.safetensors", "tensors/a", "config.json"]
        first = {}
        for pth in paths:
            first[pth] = request(srv, "/ckptfs/%s/resolve/main/%s" % (name, pth))
        rewrite_in_place(os.path.join(src, "model.safetensors"), new_model_bytes())
        rewrite_in_place(os.path.join(src, "config.json"), CONFIG_NEW)
        for pth in paths:
            a = first[pth]
            b = request(srv, "/ckptfs/%s/resolve/main/%s" % (name, pth))
            same_tag = b.status == 200 and b.headers.get("etag") == a.headers.get("etag")
            tap.ok(a.status == 200 and (not same_tag or b.body == a.body),
                   "serve %s: right after the change, an error or a new ETag, never new bytes "
                   "under the old one" % pth,
                   ["before: %d %s, after: %d %s, same bytes: %s"
                    % (a.status, a.headers.get("etag"), b.status, b.headers.get("etag"),
                       b.body == a.body)])
    finally:
        srv.stop()


def serve_view_shard_case(tap, ckptfs, scratch):
    """Two source shards of 1 MiB, an HF view cut at 1.5 MB: each view file reads one source.
    The shard rewritten in place must not take the view file of the other down with it."""
    src = tempfile.mkdtemp(prefix="shards.", dir=scratch)
    rng = np.random.default_rng(7)
    shards = {"model-00001-of-00002.safetensors": "a", "model-00002-of-00002.safetensors": "b"}
    for fname, tname in shards.items():
        with open(os.path.join(src, fname), "wb") as f:
            f.write(safetensors_bytes([(tname, "F32", (512, 512),
                                        rng.standard_normal((512, 512), np.float32).tobytes())]))
    with open(os.path.join(src, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": {t: f for f, t in shards.items()}}, f)
    srv = Server(ckptfs, [src], extra=["--max-shard-size", "1500000"])
    try:
        name = next(iter(srv.repos))
        url = "/ckptfs/%s/resolve/main/" % name
        views = {f: request(srv, url + f) for f in shards}
        unchanged = [f for f in shards if b'"a"' in views[f].body[:200]]
        changed = "model-00002-of-00002.safetensors"
        with open(os.path.join(src, changed), "rb") as f:
            old = f.read()
        rewrite_in_place(os.path.join(src, changed), old[:-4096] + os.urandom(4096))
        after = request(srv, url + unchanged[0]) if len(unchanged) == 1 else None
        tap.ok(all(v.status == 200 for v in views.values()) and after is not None and
               after.status == 200 and after.body == views[unchanged[0]].body,
               "serve shard: the view file of the unchanged shard is served, with its bytes, "
               "right after the other shard changed",
               ["before: %s; view files with tensor a: %s; after: %s"
                % ({f: v.status for f, v in views.items()}, unchanged,
                   after and (after.status, after.body[:120]))])
    finally:
        srv.stop()


def serve_long_response_case(tap, ckptfs, scratch):
    """A 64 MiB download read slowly through a small receive buffer; the file changes a few MiB
    in. The body must end short, with the old bytes only: never a complete 200 mixing both."""
    src = tempfile.mkdtemp(prefix="serve.", dir=scratch)
    path = os.path.join(src, "big.safetensors")
    size = 64 << 20
    old = np.arange(size // 4, dtype="<u4").tobytes()
    with open(path, "wb") as f:
        f.write(safetensors_bytes([("big", "U32", (size // 4,), old)]))
    new_file = safetensors_bytes([("big", "U32", (size // 4,), bytes(size))])
    srv = Server(ckptfs, [path])
    try:
        name = next(iter(srv.repos))
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
        s.settimeout(60)
        s.connect((srv.host, srv.port))
        s.sendall(("GET /ckptfs/%s/resolve/main/tensors/big HTTP/1.1\r\nHost: x\r\n"
                   "Connection: close\r\n\r\n" % name).encode())
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = s.recv(4096)
            if not chunk:
                break
            buf += chunk
        head, _, got = buf.partition(b"\r\n\r\n")
        status = head.split(b"\r\n")[0].decode("latin-1")
        while len(got) < (2 << 20):
            chunk = s.recv(16384)
            if not chunk:
                break
            got += chunk
        at_change = len(got)
        rewrite_in_place(path, new_file)
        error = None
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                got += chunk
        except OSError as e:
            error = str(e)
        s.close()
        whole = len(got) == size
        tap.ok(" 200 " in status + " " and not whole and got == old[:len(got)],
               "serve: a 64 MiB download during which the file changed ends short, old bytes "
               "only",
               ["%s; %d bytes at the change, %d in all of %d, old bytes only: %s, error: %s"
                % (status, at_change, len(got), size, got == old[:len(got)], error)])
    finally:
        srv.stop()


def tar_splice_case(tap, ckptfs, scratch):
    import io
    import tarfile
    data = bytes((i * 7 + 3) % 251 for i in range(1 << 20))
    model = safetensors_bytes([("big", "U8", (1 << 20,), data)])
    path = os.path.join(scratch, "m.tar")

    def tar_bytes(payload):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
            for name, blob in (("pad.txt", b"x" * 5000), ("model.safetensors", payload)):
                info = tarfile.TarInfo(name)
                info.size = len(blob)
                t.addfile(info, io.BytesIO(blob))
        return buf.getvalue()

    with open(path, "wb") as f:
        f.write(tar_bytes(model))

    def check(mnt):
        fd = open_direct(os.path.join(mnt, "big"))
        got = pread_all(fd, 4096, (1 << 20) - 4096)
        tap.ok(got == data[4096:], "tar splice: the member's bytes, not the archive's")
        rewrite_in_place(path, tar_bytes(safetensors_bytes([("big", "U8", (1 << 20,),
                                                              bytes(1 << 20))])))
        expect_eio(tap, "tar splice", outcome(lambda: pread_all(fd, 0, 1 << 20)))
        os.close(fd)

    mounted(tap, ckptfs, path, "tar splice", check, options=("-o", "splice"))


def zst_case(tap, ckptfs, scratch):
    src = tempfile.mkdtemp(prefix="zst.", dir=scratch)
    plain = os.path.join(src, "m.safetensors")
    # Two versions whose compressed sizes match: constant data of two values compresses alike.
    # ckptfs convert writes the seekable form the mount needs (the bytes are checked elsewhere).
    versions = []
    for fill in (1, 2):
        with open(plain, "wb") as f:
            f.write(safetensors_bytes([("z", "U8", (1 << 20,), bytes([fill]) * (1 << 20))]))
        rc, _, err = run_capture([ckptfs, "convert", plain, plain + ".zst"], 60)
        if rc != 0:
            tap.ok(False, "zst: ckptfs convert makes a seekable .zst", [err.decode()])
            return
        with open(plain + ".zst", "rb") as f:
            versions.append(f.read())
        os.unlink(plain + ".zst")
    os.unlink(plain)
    if len(versions[0]) != len(versions[1]):
        tap.skip("zst: EIO after a .zst source was rewritten",
                 "the two compressed versions differ in size")
        return
    with open(plain + ".zst", "wb") as f:
        f.write(versions[0])

    def check(mnt):
        fd = open_direct(os.path.join(mnt, "z"))
        rewrite_in_place(plain + ".zst", versions[1])
        expect_eio(tap, "zst", outcome(lambda: pread_all(fd, 0, 1 << 20)))
        os.close(fd)

    mounted(tap, ckptfs, plain + ".zst", "zst", check)


def cat_case(tap, ckptfs, scratch):
    src = tempfile.mkdtemp(prefix="cat.", dir=scratch)
    path = os.path.join(src, "big.safetensors")
    old = np.arange(2 << 20, dtype="<u4").tobytes()  # 8 MiB
    with open(path, "wb") as f:
        f.write(safetensors_bytes([("big", "U32", (2 << 20,), old)]))
    new_file = safetensors_bytes([("big", "U32", (2 << 20,), bytes(len(old)))])
    with tempfile.TemporaryFile() as errf:
        p = subprocess.Popen([ckptfs, "cat", path, "big"], stdout=subprocess.PIPE, stderr=errf)
        got = p.stdout.read(4096)  # cat has read its first chunk and waits on the full pipe
        time.sleep(0.2)
        rewrite_in_place(path, new_file)
        got += p.stdout.read()
        rc = p.wait(timeout=60)
        errf.seek(0)
        err = errf.read().decode("utf-8", "replace").strip()
    tap.ok(rc != 0 and "changed" in err and len(got) < len(old) and old.startswith(got),
           "cat: a source rewritten while cat reads it ends it with an error, old bytes only",
           ["exit %r, %d of %d bytes, prefix of the old: %s, stderr: %s"
            % (rc, len(got), len(old), old.startswith(got), err)])


sys.exit(run(body))
