#!/usr/bin/python3
"""One mode rule for every output and view, checked by a second user this test creates
(useradd, removed at the end) against root's files (issue 29, items 1, 2, 3, 7):
- a stage --from a 0600 file with -o allow_other shows its tensors 0600 (owner only, the
  directories 0700): the second user can neither read a tensor nor list the tree;
- the commit of that unchanged stage into a single .safetensors, and into a directory OUT/,
  writes 0600 files (the pack's mode took the umask's 0644 before);
- a remote source fetched with a secret (http://user:password@, the server answers 401
  without it) mounted with -o allow_other shows 0400: the second user reads nothing;
- `ckptfs serve` of a 0600 file on 127.0.0.1 without --token-file is refused (every local user
  could download it); with --token-file it serves; a 0644 file is served without a token.

Environment: CKPTFS.  Needs root (useradd, a mount with allow_other).
"""

import base64
import json
import os
import shutil
import stat
import struct
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from ckptfs_test import Tap, is_mounted, run_capture, unmount  # noqa: E402
from hostile_http import HostileHTTP  # noqa: E402
from serve_util import Server  # noqa: E402


def safetensors(values):
    t = np.asarray(values, dtype="<f4")
    header = json.dumps({"layer.w": {"dtype": "F32", "shape": [t.size],
                                     "data_offsets": [0, t.nbytes]}})
    header += " " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header.encode() + t.tobytes()


class User:
    """A system user made for this test, removed by close()."""

    def __init__(self):
        self.name = "ckt86u%d" % (os.getpid() % 100000)
        subprocess.run(["userdel", self.name], capture_output=True)
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                        self.name], check=True, capture_output=True)
        out = subprocess.run(["id", "-u", self.name], check=True, capture_output=True, text=True)
        self.uid = int(out.stdout)

    def run(self, code, *args):
        """Python code run as this user: (exit status, stdout)."""
        p = subprocess.run(["setpriv", "--reuid", self.name, "--regid", self.name,
                            "--clear-groups", "/usr/bin/python3", "-c", code] + list(args),
                           capture_output=True, text=True, timeout=60)
        return p.returncode, p.stdout.strip() + p.stderr.strip()

    def can_read(self, path):
        rc, out = self.run("import sys; open(sys.argv[1], 'rb').read(1); print('read')", path)
        return rc == 0 and out == "read", out

    def can_list(self, path):
        rc, out = self.run("import os, sys; print(len(os.listdir(sys.argv[1])))", path)
        return rc == 0, out

    def close(self):
        subprocess.run(["userdel", self.name], capture_output=True)


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def stage_case(tap, ckptfs, work, user, vals):
    src = os.path.join(work, "private.safetensors")
    with open(src, "wb") as f:
        f.write(safetensors(vals))
    os.chmod(src, 0o600)
    for out_name in ("out.safetensors", "out-dir/"):
        out = os.path.join(work, out_name)
        mnt = tempfile.mkdtemp(prefix="stage.", dir=work)
        os.chmod(mnt, 0o755)
        rc, _, err = run_capture([ckptfs, "stage", out, mnt, "--from", src, "-o", "allow_other"],
                                 60)
        tap.ok(rc == 0 and is_mounted(mnt), "stage %s --from a 0600 file, allow_other" % out_name,
               [rc, err])
        if not is_mounted(mnt):
            continue
        t = os.path.join(mnt, "layer", "w")
        modes = (mode(t), mode(t + ".json"), mode(os.path.join(mnt, "layer")), mode(mnt))
        tap.ok(modes[0] & 0o077 == 0 and modes[1] & 0o077 == 0 and modes[2] & 0o077 == 0 and
               modes[3] & 0o077 == 0,
               "stage: tensor, sidecar and directories give group and others nothing "
               "(%s)" % ", ".join("%04o" % m for m in modes))
        can, why = user.can_read(t)
        tap.ok(not can, "stage: the second user cannot read the 0600 source's tensor", [why])
        can, why = user.can_list(mnt)
        tap.ok(not can, "stage: the second user cannot list the tree", [why])
        rc, _, err = run_capture([ckptfs, "commit", mnt], 120)
        run_capture([ckptfs, "umount", mnt], 60)
        unmount(mnt)
        files = [out] if not out.endswith("/") else [
            os.path.join(out, n) for n in sorted(os.listdir(out))
            if n.endswith(".safetensors") or n.endswith(".json")] if os.path.isdir(out) else []
        got = {os.path.basename(p): "%04o" % mode(p) for p in files if os.path.exists(p)}
        tap.ok(rc == 0 and got and all(mode(p) & 0o077 == 0 for p in files),
               "commit into %s: written 0600 like its source (%s)" % (out_name, got), [rc, err])
        if files and os.path.exists(files[0]):
            can, why = user.can_read(files[0])
            tap.ok(not can, "commit into %s: the second user cannot read it" % out_name, [why])


def remote_case(tap, ckptfs, work, user, vals):
    srv = HostileHTTP()
    try:
        srv.files["/gated.safetensors"] = safetensors(vals)
        srv.etag["/gated.safetensors"] = '"g"'
        srv.require_auth = "Basic " + base64.b64encode(b"user:s3cret").decode()
        mnt = tempfile.mkdtemp(prefix="remote.", dir=work)
        os.chmod(mnt, 0o755)
        url = "http://user:s3cret@127.0.0.1:%d/gated.safetensors" % srv.port
        rc, _, err = run_capture([ckptfs, url, mnt, "-o", "allow_other"], 60)
        tap.ok(rc == 0, "a URL the server answers 401 without its password, allow_other",
               [rc, err])
        if rc != 0:
            return
        t = os.path.join(mnt, "layer", "w")
        tap.ok(mode(t) == 0o400 and mode(os.path.join(mnt, "layer")) == 0o500,
               "remote with a secret: tensor 0400, directory 0500 (%04o, %04o)" % (
                   mode(t), mode(os.path.join(mnt, "layer"))))
        can, why = user.can_read(t)
        tap.ok(not can, "remote with a secret: the second user cannot read the tensor", [why])
        with open(t, "rb") as f:
            tap.ok(f.read() == np.asarray(vals, "<f4").tobytes(), "the owner reads its bytes")
        unmount(mnt)
        srv.require_auth = None
        url = "http://127.0.0.1:%d/gated.safetensors" % srv.port
        mnt = tempfile.mkdtemp(prefix="remote.", dir=work)
        os.chmod(mnt, 0o755)
        rc, _, err = run_capture([ckptfs, url, mnt, "-o", "allow_other"], 60)
        t = os.path.join(mnt, "layer", "w")
        tap.ok(rc == 0 and mode(t) == 0o444 and user.can_read(t)[0],
               "an anonymous URL: 0444, the second user reads it", [rc, err])
        unmount(mnt)
    finally:
        srv.stop()


def serve_case(tap, ckptfs, work, vals):
    private = os.path.join(work, "private.safetensors")
    public = os.path.join(work, "public.safetensors")
    with open(public, "wb") as f:
        f.write(safetensors(vals))
    os.chmod(public, 0o644)
    rc, _, err = run_capture([ckptfs, "serve", "--listen", "127.0.0.1:0", private], 30)
    tap.ok(rc == 2 and b"private.safetensors" in err and b"--token-file" in err,
           "serve of a 0600 file on loopback without --token-file: refused, naming it",
           [rc, err])
    token = os.path.join(work, "token")
    with open(token, "w") as f:
        f.write("a-token-of-the-test\n")
    try:
        with Server(ckptfs, [private], extra=["--token-file", token]) as s:
            tap.ok(s.alive(), "serve of the 0600 file with --token-file")
    except RuntimeError as e:
        tap.ok(False, "serve of the 0600 file with --token-file", [e])
    try:
        with Server(ckptfs, [public]) as s:
            tap.ok(s.alive() and list(s.repos) == ["public"], "a 0644 file: served without a token")
    except RuntimeError as e:
        tap.ok(False, "a 0644 file: served without a token", [e])


def main():
    ckptfs = os.environ.get("CKPTFS", "")
    if not os.access(ckptfs, os.X_OK) or not os.path.exists("/dev/fuse"):
        print("1..0 # SKIP CKPTFS or /dev/fuse missing")
        return 0
    if os.geteuid() != 0:
        print("1..0 # SKIP needs root (useradd, allow_other)")
        return 0
    tap = Tap()
    work = tempfile.mkdtemp(prefix="ckptfs-t86.")
    os.chmod(work, 0o755)
    user = User()
    vals = np.arange(1024) * 0.5
    try:
        stage_case(tap, ckptfs, work, user, vals)
        remote_case(tap, ckptfs, work, user, vals)
        serve_case(tap, ckptfs, work, vals)
    finally:
        for d in os.listdir(work):
            p = os.path.join(work, d)
            if os.path.isdir(p) and is_mounted(p):
                unmount(p)
        user.close()
        shutil.rmtree(work, ignore_errors=True)
    tap.done()
    return 0 if tap.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
