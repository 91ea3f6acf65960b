"""What the staging-mount tests (700-stage.t, 710-stage-faults.t) share: `ckptfs stage` and
`ckptfs commit`, the spool and its daemon, hashes of what they wrote.

Tests import it with:  sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
"""

import fcntl
import hashlib
import json
import os
import struct
import time

from ckptfs_test import run_capture

MOUNT_TIMEOUT = 30
COMMIT_TIMEOUT = 120


def sha(data):
    return hashlib.sha256(data).hexdigest()


def file_sha(path, offset=0, length=None):
    """sha256 of length bytes (all up to the end when None) of path from offset."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(offset)
        left = length
        while left is None or left > 0:
            chunk = f.read(1 << 20 if left is None else min(1 << 20, left))
            if not chunk:
                break
            h.update(chunk)
            if left is not None:
                left -= len(chunk)
    return h.hexdigest()


def tensor_count_problems(mnt, want):
    """[] when the mount's summary counts `want` tensors, else what is wrong."""
    try:
        with open(os.path.join(mnt, ".ckptfs", "summary.json")) as f:
            count = json.load(f).get("tensor_count")
    except (OSError, ValueError) as e:
        return [str(e)]
    return [] if count == want else ["tensor_count %r, want %d" % (count, want)]


def spool_of(out):
    """The default spool of OUT: .NAME.stage next to it."""
    out = out.rstrip("/")
    return os.path.join(os.path.dirname(out), "." + os.path.basename(out) + ".stage")


def spool_for(out, extra):
    """The spool of `ckptfs stage OUT MNT EXTRA...`: -o spool=DIR, or the default."""
    opt = dict(zip(extra[::2], extra[1::2])).get("-o", "")
    return opt[6:] if opt.startswith("spool=") else spool_of(out)


def daemon_pid(spool):
    """The pid of the staging daemon, from the spool's lock file; 0 when there is none."""
    try:
        with open(os.path.join(spool, "lock")) as f:
            return int(f.read().strip() or 0)
    except (OSError, ValueError):
        return 0


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def wait_gone(pid, seconds=60):
    """The daemon commits after the unmount: wait for it to exit (or be a zombie)."""
    end = time.time() + seconds
    while pid and alive(pid) and time.time() < end:
        time.sleep(0.05)
    return not pid or not alive(pid)


def wait_spool_free(spool, seconds=60):
    """Waits until no daemon holds the spool's lock: it keeps it through its commit on unmount
    until it exits. (Its pid in the lock file is replaced by how it ended, so a pid read after
    the unmount cannot be waited for.)"""
    end = time.time() + seconds
    while time.time() < end:
        try:
            fd = os.open(os.path.join(spool, "lock"), os.O_RDONLY)
        except OSError:
            return True
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return True
        except OSError:
            time.sleep(0.05)
        finally:
            os.close(fd)
    return False


def stage(ckptfs, out, mnt, *extra):
    return run_capture([ckptfs, "stage", out, mnt] + list(extra), MOUNT_TIMEOUT)


def staged(tap, ckptfs, out, mnt, what, *extra):
    """`ckptfs stage OUT MNT EXTRA...` as a TAP check "WHAT: ckptfs stage": (ok, stderr)."""
    from ckptfs_test import is_mounted
    rc, _, err = stage(ckptfs, out, mnt, *extra)
    return tap.ok(rc == 0 and is_mounted(mnt), "%s: ckptfs stage" % what,
                  ["exit %r: %s" % (rc, err.decode("utf-8", "replace"))]), err


def commit(ckptfs, mnt, timeout=COMMIT_TIMEOUT):
    return run_capture([ckptfs, "commit", mnt], timeout)


def write_sidecar(path, dtype, shape, **extra):
    d = {"dtype": dtype, "shape": shape}
    d.update(extra)
    with open(path, "w") as f:
        json.dump(d, f)


def write_raw_tensor(path, values):
    """An F32 tensor of `values` staged as raw bytes + sidecar (path: str or bytes)."""
    with open(path, "wb") as f:
        f.write(struct.pack("<%df" % len(values), *values))
    side = path + (b".json" if isinstance(path, bytes) else ".json")
    with open(side, "w") as f:
        json.dump({"dtype": "F32", "shape": [len(values)]}, f)


def read_safetensors(path):
    """name -> (dtype, shape, values for F32 else raw bytes), read strictly without ckptfs."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n].decode("utf-8"))
    out = {}
    for name, v in header.items():
        if name == "__metadata__":
            continue
        a, b = v["data_offsets"]
        raw = data[8 + n + a:8 + n + b]
        vals = list(struct.unpack("<%df" % (len(raw) // 4), raw)) if v["dtype"] == "F32" else raw
        out[name] = (v["dtype"], v["shape"], vals)
    return out


def read_safetensors_dir(d):
    """The tensors of a Hugging Face directory (one model.safetensors, or shards + index);
    {} when it cannot be read."""
    try:
        index = os.path.join(d, "model.safetensors.index.json")
        if not os.path.exists(index):
            return read_safetensors(os.path.join(d, "model.safetensors"))
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        out = {}
        for shard in sorted(set(weight_map.values())):
            part = read_safetensors(os.path.join(d, shard))
            if any(weight_map.get(k) != shard for k in part):
                return {}
            out.update(part)
        return out if sorted(out) == sorted(weight_map) else {}
    except (OSError, ValueError, KeyError, struct.error):
        return {}


# ---- the scaffolding the stage tests share: a stage mounted, written, committed, ended ----

RESERVED = 1 << 20  # the pack's room for the header (fs/stage/stage_pack.c)
DTYPE_SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
               "U8": 1, "BOOL": 1}


def rnd(n, seed):
    """n reproducible random bytes."""
    import random
    return random.Random(seed).randbytes(n)


def strict_read(path):
    """(name -> (dtype, shape, bytes), header length, header bytes) of a safetensors file;
    raises ValueError on anything a strict reader refuses: offsets that do not tile the data
    exactly (gap, overlap), sizes that do not match dtype and shape, bytes after the end."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError("%d bytes: no header length" % len(data))
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        raise ValueError("header length %d runs past the end" % n)
    header = json.loads(data[8:8 + n].decode("utf-8"))
    header.pop("__metadata__", None)
    spans, out = [], {}
    for name, v in header.items():
        a, b = v["data_offsets"]
        numel = 1
        for d in v["shape"]:
            numel *= d
        if b - a != numel * DTYPE_SIZES[v["dtype"]]:
            raise ValueError("%s: %d bytes for %s %r" % (name, b - a, v["dtype"], v["shape"]))
        spans.append((a, b))
        out[name] = (v["dtype"], v["shape"], data[8 + n + a:8 + n + b])
    at = 0
    for a, b in sorted(spans):
        if a != at:
            raise ValueError("offsets do not tile the data: %d after %d" % (a, at))
        at = b
    if 8 + n + at != len(data):
        raise ValueError("%d bytes after the last tensor" % (len(data) - 8 - n - at))
    return out, n, data[8:8 + n]


def strict_read_dir(d):
    """name -> bytes of an HF directory (model.safetensors, or shards + index), read strictly:
    every shard as strict_read, the index naming exactly the shards' tensors and total size.
    Also returns {shard file name: its tensor bytes}. Raises ValueError."""
    index = os.path.join(d, "model.safetensors.index.json")
    if not os.path.exists(index):
        got, _, _ = strict_read(os.path.join(d, "model.safetensors"))
        return {k: v[2] for k, v in got.items()}, {"model.safetensors": sum(len(v[2]) for v in got.values())}
    with open(index) as f:
        doc = json.load(f)
    weight_map = doc["weight_map"]
    out, sizes = {}, {}
    for shard in sorted(set(weight_map.values())):
        got, _, _ = strict_read(os.path.join(d, shard))
        for k in got:
            if weight_map.get(k) != shard:
                raise ValueError("%s holds %s, the index says %s" % (shard, k, weight_map.get(k)))
        out.update({k: v[2] for k, v in got.items()})
        sizes[shard] = sum(len(v[2]) for v in got.values())
    if sorted(out) != sorted(weight_map):
        raise ValueError("the index names %d tensors, the shards hold %d" % (len(weight_map), len(out)))
    if doc.get("metadata", {}).get("total_size") != sum(sizes.values()):
        raise ValueError("total_size %r, the shards hold %d bytes"
                         % (doc.get("metadata", {}).get("total_size"), sum(sizes.values())))
    shards = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
    if shards != sorted(sizes):
        raise ValueError("shard files %r, the index names %r" % (shards, sorted(sizes)))
    return out, sizes


def write_st(path, tensors):
    """A safetensors file: name -> (dtype, shape, raw bytes), in that order."""
    header, blob = {}, b""
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(blob), len(blob) + len(raw)]}
        blob += raw
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + blob)


def put(mnt, name, raw, dtype="F32"):
    """A 1-D tensor copied in as cp does it: the raw file, then its sidecar."""
    path = os.path.join(mnt, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(raw)
    write_sidecar(path + ".json", dtype, [len(raw) // DTYPE_SIZES[dtype]])


def remove(mnt, name):
    """A staged tensor taken out: its raw file and sidecar."""
    os.unlink(os.path.join(mnt, name))
    os.unlink(os.path.join(mnt, name + ".json"))


def spool_inodes(out, extra=()):
    """Inodes of the spool's data files (the packs among them)."""
    d = os.path.join(spool_for(out, list(extra)), "data")
    try:
        return {os.stat(os.path.join(d, n)).st_ino for n in os.listdir(d)}
    except OSError:
        return set()


def stop_stage(mnt, pid, kill=False, spool=None, seconds=60):
    """Ends a staging daemon: SIGKILL and the dead mount cleared (kill), or an unmount and a
    wait for its commit on unmount and its exit. True when it has ended: the process is gone
    and (spool given) its lock is free. The process being a zombie is not enough: the thread
    group leader turns zombie while other threads of a killed daemon may still be exiting,
    holding the spool's lock, and a stage started then is refused as "already being staged"."""
    if kill and pid:
        import signal
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        gone = wait_gone(pid, seconds)
        run_capture(["fusermount3", "-u", "-z", mnt], 20)
    else:
        run_capture(["fusermount3", "-u", mnt], 20)
        gone = wait_gone(pid, seconds)
    return gone and (spool is None or wait_spool_free(spool, seconds))


_mountpoints = []


def _remove_mountpoints():
    """Mountpoints of sessions that were killed and never closed (each test makes dozens): the
    empty ones left at exit are removed; a test may mount again on a killed session's."""
    from ckptfs_test import is_mounted
    for mnt in _mountpoints:
        if os.path.isdir(mnt) and not is_mounted(mnt):
            try:
                os.rmdir(mnt)
            except OSError:
                pass


class StageSession:
    """`ckptfs stage OUT MNT EXTRA...` on a fresh mountpoint: .ok, .err, .pid; commit(),
    kill() (SIGKILL, then the dead mount cleared), close() (unmount, wait for the commit on
    unmount and the daemon's end). Usable as a context manager (close at the end)."""

    def __init__(self, ckptfs, out, *extra, prefix="ckptfs-stage."):
        import tempfile
        from ckptfs_test import is_mounted
        self.ckptfs, self.out, self.extra = ckptfs, out, extra
        self.mnt = tempfile.mkdtemp(prefix=prefix)
        if not _mountpoints:
            import atexit
            atexit.register(_remove_mountpoints)
        _mountpoints.append(self.mnt)
        rc, _, err = stage(ckptfs, out, self.mnt, *extra)
        self.ok = rc == 0 and is_mounted(self.mnt)
        self.err = err.decode(errors="replace")
        self.spool = spool_for(out, list(extra))
        self.pid = daemon_pid(self.spool) if self.ok else 0

    def path(self, name):
        return os.path.join(self.mnt, name)

    def commit(self, timeout=COMMIT_TIMEOUT):
        """(exit status, stdout + stderr as text) of `ckptfs commit MNT`."""
        rc, o, e = commit(self.ckptfs, self.mnt, timeout)
        return rc, (o + e).decode(errors="replace")

    def kill(self):
        """SIGKILL; True once the daemon has ended and freed its spool (callers check it: a
        stage started before that is refused)."""
        return stop_stage(self.mnt, self.pid, kill=True, spool=self.spool)

    def close(self):
        from ckptfs_test import unmount
        stop_stage(self.mnt, self.pid)
        wait_spool_free(self.spool)
        unmount(self.mnt)
        try:
            os.rmdir(self.mnt)
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def write_bytes(pid):
    """Bytes process pid has caused to be written to storage so far (/proc/PID/io, all its
    threads, those ended included); None when the kernel does not count them."""
    try:
        with open("/proc/%d/io" % pid) as f:
            for line in f:
                if line.startswith("write_bytes:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def write_st_dir(d, shards, extra=None):
    """An HF directory as another writer makes it: shards = [{name: (dtype, shape, raw)}],
    model-0000k-of-0000n.safetensors and an index (the test's own writer, not ckptfs')."""
    os.makedirs(d, exist_ok=True)
    n = len(shards)
    weight_map, total = {}, 0
    for k, tensors in enumerate(shards):
        name = "model-%05d-of-%05d.safetensors" % (k + 1, n)
        write_st(os.path.join(d, name), tensors)
        for t, (_, _, raw) in tensors.items():
            weight_map[t] = name
            total += len(raw)
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
    for name, text in (extra or {}).items():
        with open(os.path.join(d, name), "w") as f:
            f.write(text)


def dir_files(d):
    """{file name: (inode, sha256)} of a directory's files."""
    out = {}
    for n in sorted(os.listdir(d)):
        p = os.path.join(d, n)
        out[n] = (os.stat(p).st_ino, file_sha(p))
    return out
