"""What the fixture mount tests (tests/t/30-*.t to 44-*.t) share: the start of a test
(environment, skip, TAP), one mount with its watchdog and unmount, checks of a tensor's
bytes, its sidecar and the tree, and a strict reader of the .ckptfs/hf safetensors view.

Tests import it with:  sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
"""

import hashlib
import json
import os
import re
import stat
import struct
import subprocess
import sys
import tempfile

from ckptfs_test import Tap, Watchdog, is_mounted, run_capture, skip_reason, unmount

MOUNT_TIMEOUT = 30      # seconds for `ckptfs SRC MNT` to return
CASE_TIMEOUT = 120      # seconds for all checks of one mounted case


# ---------------------------------------------------------------------------
# Start and end of a test

def start(subdir=None, generator=None):
    """(tap, ckptfs, root) for a test of FIXTURES (or FIXTURES/subdir), or None once the
    plan of a skipped test is printed.  With a generator, a missing subdir skips the test."""
    ckptfs = os.environ.get("CKPTFS", "")
    fixtures = os.environ.get("FIXTURES", "")
    reason = skip_reason(ckptfs, fixtures)
    root = os.path.join(fixtures, subdir) if subdir else fixtures
    if not reason and generator and not os.path.isdir(root):
        reason = "%s is missing (tests/gen/%s not run)" % (root, generator)
    if reason:
        print("1..0 # SKIP " + reason)
        return None
    # Names are UTF-8 whatever the locale of the harness says.
    sys.stdout.reconfigure(encoding="utf-8", errors="backslashreplace")
    return Tap(), os.path.abspath(ckptfs), os.path.abspath(root)


def finish(tap):
    tap.done()
    return 1 if tap.failed else 0


def run(body, subdir=None, generator=None):
    """The whole test: start(subdir, generator), body(tap, ckptfs, root), the plan; returns
    the exit status."""
    started = start(subdir, generator)
    if not started:
        return 0
    body(*started)
    return finish(started[0])


def case_dirs(root):
    """The directories under root that hold a manifest.json, sorted."""
    return sorted(d for d in os.listdir(root)
                  if os.path.isfile(os.path.join(root, d, "manifest.json")))


# ---------------------------------------------------------------------------
# Mounting

def mount_prefix():
    """mkdtemp prefix naming the running test: ckptfs-t42. for tests/t/420-gptrs.t."""
    return "ckptfs-t%s." % os.path.basename(sys.argv[0]).split("-")[0]


def mount(tap, ckptfs, src, mnt, desc, options=(), timeout=MOUNT_TIMEOUT):
    """Mount src on mnt; one TAP line, desc, says whether it worked."""
    rc, _, err = run_capture([ckptfs, src, mnt] + list(options), timeout)
    return tap.ok(rc == 0 and is_mounted(mnt), desc,
                  ["exit status %r%s" % (rc, " (timed out)" if rc is None else ""),
                   "stderr: " + err.decode("utf-8", "replace").strip()])


def mounted(tap, ckptfs, src, label, checks, options=(), mount_desc=None,
            unmount_desc="%s: fusermount3 -u", timeout=CASE_TIMEOUT):
    """Mount src, run checks(mnt) under a Watchdog and unmount.  TAP lines: the mount
    (mount_desc, "LABEL: mount" unless given), whatever checks writes, a failure if the
    watchdog had to abort the mount, the unmount (unmount_desc % label)."""
    mnt = tempfile.mkdtemp(prefix=mount_prefix())
    try:
        if not mount(tap, ckptfs, src, mnt, mount_desc or "%s: mount" % label, options):
            return
        with Watchdog(mnt, timeout) as dog:
            checks(mnt)
        if dog.fired:
            tap.ok(False, "%s: checks finished within %d s" % (label, timeout),
                   ["watchdog aborted the mount"])
    finally:
        tap.ok(unmount(mnt), unmount_desc % label)


# ---------------------------------------------------------------------------
# Files of a mount

def check_help(tap, ckptfs, cmd):
    """--help of a subcommand fits a screen, every option it lists is in ckptfs(1), and
    `ckptfs help CMD` says the same."""
    def ck(*args):
        p = subprocess.run([ckptfs] + list(args), capture_output=True, timeout=60)
        return p.returncode, p.stdout, p.stderr
    rc, out, _ = ck(cmd, "--help")
    text = out.decode()
    lines = text.splitlines()
    tap.ok(rc == 0 and text.startswith("Usage: ckptfs " + cmd) and len(lines) <= 24 and
           max(map(len, lines)) <= 80, "ckptfs %s --help fits a screen" % cmd)
    with open(os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "..", "man",
                           "ckptfs.1")) as f:
        man = f.read()
    opts = set(re.findall(r"^ +(?:-\w, )?(--?[a-z][a-z-]*)", text, re.M))
    missing = [o for o in opts if o.replace("-", "\\-") not in man]
    tap.ok(opts and not missing, "ckptfs %s: every option of --help is in ckptfs(1)" % cmd, missing)
    rc2, out2, _ = ck("help", cmd)
    tap.ok(rc2 == 0 and out2 == out, "ckptfs help %s = ckptfs %s --help" % (cmd, cmd))


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def tree_bytes(mnt, rename=()):
    """{path: bytes} of every file of the mount; in .json and .tsv files each (old, new) of
    `rename` names the source file as another mount of the same checkpoint does."""
    out = {}
    for dirpath, _, files in os.walk(mnt):
        for name in files:
            full = os.path.join(dirpath, name)
            data = read_bytes(full)
            if name.endswith((".json", ".tsv")):
                for old, new in rename:
                    data = data.replace(old.encode(), new.encode())
            out[os.path.relpath(full, mnt)] = data
    return out


def read_json(path):
    return json.loads(read_bytes(path))


def sidecar_path(raw_path):
    # Path components never contain '.', so a trailing ".raw" can only be the
    # marker for a tensor that is also a directory.
    base = raw_path[:-4] if raw_path.endswith(".raw") else raw_path
    return base + ".json"


def bytes_problems(raw, nbytes, sha256):
    """(problems, data) of the raw file of a tensor: a regular file of nbytes bytes, that
    many read, with that sha256 (None: not checked)."""
    problems, data = [], b""
    try:
        st = os.stat(raw)
        if not stat.S_ISREG(st.st_mode):
            problems.append("not a regular file")
        if st.st_size != nbytes:
            problems.append("st_size %d != nbytes %d" % (st.st_size, nbytes))
        data = read_bytes(raw)
        if len(data) != nbytes:
            problems.append("read %d bytes, want %d" % (len(data), nbytes))
        if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
            problems.append("sha256 mismatch")
    except OSError as e:
        problems.append(str(e))
    return problems, data


def field_problems(doc, want, exact_type=False):
    """Members of doc (a sidecar, say) that differ from want's; with exact_type, 1 and
    1.0 or true differ too."""
    problems = []
    for key, value in want.items():
        got = doc.get(key)
        if got != value or (exact_type and type(got) is not type(value)):
            problems.append("%s: got %r, want %r" % (key, got, value))
    return problems


def warning_problems(summary, expected):
    """Each expected text is part of a warning of summary.json; none is there unasked."""
    warnings = " ".join(summary.get("warnings", []))
    problems = ["no warning mentions %r: %r" % (w, warnings) for w in expected if w not in warnings]
    if not expected and summary.get("warnings"):
        problems.append("unexpected warnings %r" % summary["warnings"])
    return problems


def tree_files(top, problems, skip_ckptfs=True, every_file=False):
    """Paths of the files below top (without .ckptfs/ at its top when skip_ckptfs).  Unless
    every_file, only raw tensors (no '.'), sidecars (.json) and tensor-directories' bytes
    (.raw) count; NAME.npy views never do (350-npy.t checks them)."""
    got = set()
    for dirpath, dirnames, filenames in os.walk(top, onerror=problems.append):
        rel = os.path.relpath(dirpath, top)
        if rel == ".":
            rel = ""
            if skip_ckptfs:
                dirnames[:] = [d for d in dirnames if d != ".ckptfs"]
        for name in filenames:
            if name.endswith(".npy"):
                continue
            if every_file or "." not in name or name.endswith((".json", ".raw")):
                got.add(os.path.join(rel, name))
    return got


def check_tree(tap, label, mnt, tensors, desc="tree holds exactly the expected files",
               every_file=False):
    """The tree outside .ckptfs holds exactly the tensors' raw files and sidecars."""
    want = {t["path"] for t in tensors} | {sidecar_path(t["path"]) for t in tensors}
    problems = []
    got = tree_files(mnt, problems, every_file=every_file)
    problems += ["missing: " + p for p in sorted(want - got)]
    problems += ["unexpected: " + p for p in sorted(got - want)]
    tap.ok(not problems, "%s: %s" % (label, desc), problems)


# ---------------------------------------------------------------------------
# The .ckptfs/hf view, read with a strict safetensors reader

ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2,
            "I8": 1, "U8": 1, "BOOL": 1}


def no_duplicates(pairs):
    d = {}
    for k, v in pairs:
        if k in d:
            raise ValueError("duplicate key %r" % k)
        d[k] = v
    return d


def parse_safetensors(data):
    """{name: (dtype, shape, bytes)}; raises ValueError on anything off: the header is a
    JSON object without duplicate keys, __metadata__ maps strings to strings, every entry
    has exactly dtype, shape and data_offsets whose span fits dtype and shape, and the
    tensors tile the data section."""
    if len(data) < 8:
        raise ValueError("%d bytes, shorter than the length prefix" % len(data))
    (hlen,) = struct.unpack("<Q", data[:8])
    if 8 + hlen > len(data):
        raise ValueError("header length %d runs past the end" % hlen)
    header = json.loads(data[8:8 + hlen].decode("utf-8"), object_pairs_hook=no_duplicates)
    if not isinstance(header, dict):
        raise ValueError("header is not an object")
    meta = header.pop("__metadata__", None)
    if meta is not None and not (isinstance(meta, dict) and
                                 all(isinstance(v, str) for v in meta.values())):
        raise ValueError("__metadata__ is not an object of strings")
    body = data[8 + hlen:]
    spans = []
    out = {}
    for name, e in header.items():
        if not isinstance(e, dict) or set(e) != {"dtype", "shape", "data_offsets"}:
            raise ValueError("%s: entry keys %r" % (name, e))
        dt, shape, offs = e["dtype"], e["shape"], e["data_offsets"]
        if dt not in ITEMSIZE or not isinstance(shape, list) or \
                not all(isinstance(x, int) and x >= 0 for x in shape) or \
                not isinstance(offs, list) or len(offs) != 2 or \
                not all(isinstance(x, int) for x in offs):
            raise ValueError("%s: bad entry %r" % (name, e))
        n = ITEMSIZE[dt]
        for x in shape:
            n *= x
        if offs[1] - offs[0] != n:
            raise ValueError("%s: data_offsets span %d, want %d" % (name, offs[1] - offs[0], n))
        spans.append((offs[0], offs[1], name))
        out[name] = (dt, shape, body[offs[0]:offs[1]])
    at = 0
    for b, e, name in sorted(spans):
        if b != at:
            raise ValueError("%s: begins at %d, previous tensor ends at %d" % (name, b, at))
        at = e
    if at != len(body):
        raise ValueError("data section is %d bytes, tensors cover %d" % (len(body), at))
    return out


def read_hf_view(mnt):
    """All tensors of .ckptfs/hf, single file or index + shards."""
    hf = os.path.join(mnt, ".ckptfs", "hf")
    single = os.path.join(hf, "model.safetensors")
    if os.path.exists(single):
        return parse_safetensors(read_bytes(single))
    index = read_json(os.path.join(hf, "model.safetensors.index.json"))
    out = {}
    for shard in sorted(set(index["weight_map"].values())):
        part = parse_safetensors(read_bytes(os.path.join(hf, shard)))
        for name in part:
            if index["weight_map"].get(name) != shard:
                raise ValueError("%s is in %s but the index says %r"
                                 % (name, shard, index["weight_map"].get(name)))
        out.update(part)
    return out


def check_hf_view(tap, label, mnt, want, desc):
    """.ckptfs/hf holds exactly the tensors of want ({name: manifest tensor with dtype,
    shape and sha256}), with the same bytes."""
    problems = []
    try:
        view = read_hf_view(mnt)
        problems += ["unexpected tensor %s" % n for n in sorted(set(view) - set(want))]
        problems += ["missing tensor %s" % n for n in sorted(set(want) - set(view))]
        for name in sorted(set(view) & set(want)):
            dt, shape, data = view[name]
            t = want[name]
            if dt != t["dtype"] or shape != t["shape"]:
                problems.append("%s: %s%r, want %s%r" % (name, dt, shape, t["dtype"], t["shape"]))
            elif hashlib.sha256(data).hexdigest() != t["sha256"]:
                problems.append("%s: bytes differ" % name)
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        problems.append("%s: %s" % (type(e).__name__, e))
    tap.ok(not problems, "%s: %s" % (label, desc), problems)
