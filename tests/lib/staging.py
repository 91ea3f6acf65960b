"""What the staging-mount tests (70-stage.t, 71-stage-faults.t) share: `ckptfs stage` and
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
