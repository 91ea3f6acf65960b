#!/usr/bin/python3
"""FUSE passthrough (-o passthrough=auto|off|on, ckptfs(1)): a file of the mount that is one
source file as it is is opened so that the kernel reads it itself.

The source is an HF folder: model.safetensors written by the real safetensors library
($CLIENTS_PY; its header is the one the HF view writes, so the view serves the file
unchanged) and config.json. Whether a read reached the daemon is seen from outside: the file
is opened, the daemon is stopped (SIGSTOP), and a child reads it to the end and maps it;
passed through, that finishes with the daemon stopped, on the daemon path it waits until the
daemon goes on (SIGCONT after STALL_SECONDS).
  on         passthrough=on mounts; the view's model.safetensors and config.json read and map
             with the daemon stopped, with the source's bytes (SHA-256 of both); a tensor
             file (part of the file, other offsets) waits for the daemon
  off        passthrough=off: the view's model.safetensors waits for the daemon, bytes equal
  changed    passthrough=on, the source rewritten in place (same inode and size, other bytes)
             while the view file is open: the open descriptor reads the new bytes (what
             ckptfs(1) says passthrough does: the kernel reads the source, the daemon cannot
             check); an open after the change, the first descriptor still open, gives EIO,
             and once it is closed EIO at open or on read (the daemon path)
  refused    in a user namespace (no CAP_SYS_ADMIN in the initial one) passthrough=on fails
             with exit status 3 naming FUSE_DEV_IOC_BACKING_OPEN and EPERM; the default (auto)
             mounts and serves the same bytes from the daemon
  usage      passthrough=maybe: exit status 1
"""
import errno
import hashlib
import os
import select
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from ckptfs_test import run_capture  # noqa: E402
from mount_checks import finish, mounted, start  # noqa: E402

STALL_SECONDS = 2.0

WRITER = r"""
import sys, numpy as np
from safetensors.numpy import save_file
rng = np.random.default_rng(int(sys.argv[2]))
save_file({"a": rng.standard_normal((512, 512), np.float32),
           "b": rng.standard_normal((1024, 1024), np.float32)}, sys.argv[1],
          metadata={"format": "pt"})
"""

# Opens argv[1], says so, waits for a line, then reads it to the end and maps it: prints the
# SHA-256 of both.
READER = r"""
import hashlib, mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
print("open", flush=True)
sys.stdin.readline()
h = hashlib.sha256()
while True:
    b = os.read(fd, 1 << 20)
    if not b:
        break
    h.update(b)
m = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
print(h.hexdigest(), hashlib.sha256(m[:]).hexdigest(), flush=True)
"""


def sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def daemon_pid(mnt):
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % p, "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if args and args[0].endswith(b"ckptfs") and os.fsencode(mnt) in args:
            return int(p)
    return None


def read_daemon_stopped(path, pid):
    """(finished with the daemon stopped, [sha of read, sha of map] or None)."""
    child = subprocess.Popen([sys.executable, "-c", READER, path], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    stalled = True
    try:
        if child.stdout.readline().strip() != "open":
            return False, None
        os.kill(pid, signal.SIGSTOP)
        try:
            child.stdin.write("go\n")
            child.stdin.flush()
            ready, _, _ = select.select([child.stdout], [], [], STALL_SECONDS)
            stalled = not ready
        finally:
            os.kill(pid, signal.SIGCONT)
        out, _ = child.communicate(timeout=60)
        return not stalled, out.split()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def body(tap, ckptfs, fixtures):
    clients = os.environ.get("CLIENTS_PY")
    if not clients or not os.access(clients, os.X_OK):
        tap.skip("passthrough", "CLIENTS_PY (safetensors) is not set: make deps-clients")
        return
    scratch = tempfile.mkdtemp(prefix="ckptfs-t120-src.")
    src = os.path.join(scratch, "repo")
    os.mkdir(src)
    model = os.path.join(src, "model.safetensors")
    subprocess.run([clients, "-c", WRITER, model, "1"], check=True, timeout=120)
    with open(os.path.join(src, "config.json"), "w") as f:
        f.write('{"model_type": "llama"}\n')
    want = sha(model)

    def on(mnt):
        pid = daemon_pid(mnt)
        view = os.path.join(mnt, ".ckptfs", "hf", "model.safetensors")
        # Nothing of these files is read before: the kernel's cache of a file read once through
        # the daemon would answer with the daemon stopped too.
        for name, path, source in (
                ("model.safetensors", view, model),
                ("config.json", os.path.join(mnt, ".ckptfs", "hf", "config.json"),
                 os.path.join(src, "config.json"))):
            done, shas = read_daemon_stopped(path, pid)
            tap.ok(done, "on: %s reads and maps with the daemon stopped (passed through)" % name)
            tap.ok(shas == [sha(source)] * 2, "on: %s read and mapped: the source's bytes" % name,
                   ["got %r" % shas])
        tap.ok(sha(view) == want, "on: the view's model.safetensors is the source's bytes")
        done, shas = read_daemon_stopped(os.path.join(mnt, "a"), pid)
        tap.ok(not done and shas and shas[0] == shas[1],
               "on: a tensor file (a part of the source) waits for the daemon")

    mounted(tap, ckptfs, src, "on", on, options=("-o", "passthrough=on"))

    def off(mnt):
        done, shas = read_daemon_stopped(os.path.join(mnt, ".ckptfs", "hf", "model.safetensors"),
                                         daemon_pid(mnt))
        tap.ok(not done, "off: the view's model.safetensors waits for the daemon")
        tap.ok(shas == [want] * 2, "off: its bytes are the source's", ["got %r" % shas])

    mounted(tap, ckptfs, src, "off", off, options=("-o", "passthrough=off"))

    def changed(mnt):
        view = os.path.join(mnt, ".ckptfs", "hf", "model.safetensors")
        fd = os.open(view, os.O_RDONLY)
        try:
            new = model + ".new"
            subprocess.run([clients, "-c", WRITER, new, "2"], check=True, timeout=120)
            with open(new, "rb") as f:
                data = f.read()
            os.unlink(new)
            time.sleep(0.05)
            ino = os.stat(model).st_ino
            wfd = os.open(model, os.O_WRONLY)  # in place, as cp does it
            os.write(wfd, data)
            os.close(wfd)
            assert os.stat(model).st_ino == ino and os.stat(model).st_size == len(data)
            got = b""
            while True:
                b = os.read(fd, 1 << 20)
                if not b:
                    break
                got += b
            tap.ok(got == data, "changed: the descriptor opened before reads the new bytes "
                   "(documented: the kernel reads the source)")
            try:
                os.close(os.open(view, os.O_RDONLY))
                second = "opened"
            except OSError as e:
                second = errno.errorcode.get(e.errno, str(e.errno))
            tap.ok(second == "EIO", "changed: an open beside it, after the change, gives EIO",
                   ["got " + second])
        finally:
            os.close(fd)
        try:
            fd = os.open(view, os.O_RDONLY)
            try:
                while os.read(fd, 1 << 20):
                    pass
                outcome = "bytes"
            finally:
                os.close(fd)
        except OSError as e:
            outcome = errno.errorcode.get(e.errno, str(e.errno))
        tap.ok(outcome == "EIO", "changed: an open after the change gives EIO (at open or read)",
               ["got " + outcome])

    mounted(tap, ckptfs, src, "changed", changed, options=("-o", "passthrough=on"))

    # Unprivileged: a user namespace of our own, whose root has no CAP_SYS_ADMIN in the initial
    # namespace; mounting in it takes a mount namespace too, so both runs happen in one shell.
    subprocess.run([clients, "-c", WRITER, model, "1"], check=True, timeout=120)
    mnt = tempfile.mkdtemp(prefix="ckptfs-t120.")
    script = ('"$0" "$1" "$2" -o passthrough=on 2>"$3"; echo "on=$?"; '
              '"$0" "$1" "$2" && sha256sum "$2/.ckptfs/hf/model.safetensors"; '
              'fusermount3 -u "$2"')
    errf = os.path.join(scratch, "err")
    rc, out, err = run_capture(["unshare", "-Urm", "sh", "-c", script, ckptfs, src, mnt, errf],
                               60)
    text = out.decode()
    if rc != 0 and "on=" not in text:
        tap.skip("refused: passthrough=on without CAP_SYS_ADMIN", "unshare -Urm: %r" % err)
    else:
        with open(errf) as f:
            msg = f.read()
        tap.ok("on=3" in text and "FUSE_DEV_IOC_BACKING_OPEN" in msg and
               "Operation not permitted" in msg,
               "refused: passthrough=on without CAP_SYS_ADMIN fails with the kernel's answer",
               [text, msg])
        tap.ok(want in text, "refused: the default mounts there and serves the same bytes",
               [text, err.decode()])
    os.rmdir(mnt)

    mnt = tempfile.mkdtemp(prefix="ckptfs-t120.")
    rc, _, err = run_capture([ckptfs, src, mnt, "-o", "passthrough=maybe"], 30)
    tap.ok(rc == 1 and b"passthrough=maybe" in err, "usage: passthrough=maybe is refused",
           ["rc %r, %r" % (rc, err)])
    os.rmdir(mnt)
    subprocess.run(["rm", "-rf", scratch])


if __name__ == "__main__":
    started = start()
    if started:
        body(*started)
        sys.exit(finish(started[0]))
