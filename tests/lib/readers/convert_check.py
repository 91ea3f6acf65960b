"""What the writer tests (600-convert-gguf.t, 610-convert-lwt.t, 620-convert-gptrs.t)
share: running convert_tool, the reference a conversion is checked against (the
generator's manifest or the tensors written here, never a ckptfs mount of the
source), and the checks every conversion and every refusal must pass.

Environment: CKPTFS (the binary), FIXTURES (generated fixtures), TOOLS (the
directory of convert_tool). The committed torch and DCP fixtures are found
next to this file (tests/fixtures).
"""

import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
from ckptfs_test import Tap, Watchdog, run_capture, skip_reason, unmount  # noqa: E402,F401

COMMITTED = os.path.join(HERE, "..", "..", "fixtures")
MOUNT_TIMEOUT = 30
CONVERT_TIMEOUT = 60
CHECK_TIMEOUT = 120
# Paths of tensors that are not the model's in the fixtures used: per-rank copies, optimizer
# state. summary.json's tensor_count double-checks the split.
ASIDE = (".ckptfs/", "optim/")


def env():
    ckptfs, fixtures = os.environ.get("CKPTFS"), os.environ.get("FIXTURES")
    tools = os.environ.get("TOOLS")
    why = skip_reason(ckptfs, fixtures)
    tool = os.path.join(tools or "", "convert_tool")
    if not why and not os.access(tool, os.X_OK):
        why = "TOOLS (%r) holds no convert_tool" % tools
    return ckptfs, fixtures, tool, why


def sha(data):
    return hashlib.sha256(data).hexdigest()


def leftovers(directory):
    """Temporary files the writer framework might have left: .NAME.partial-XXXXXX."""
    return sorted(n for n in os.listdir(directory) if ".partial-" in n)


# ---------------------------------------------------------------------------
# Reading a checkpoint through the mount

class Mounted:
    def __init__(self, ckptfs, source):
        self.ckptfs, self.source, self.mnt = ckptfs, source, None

    def __enter__(self):
        self.mnt = tempfile.mkdtemp(prefix="ckptfs-conv-")
        rc, _, err = run_capture([self.ckptfs, self.source, self.mnt], MOUNT_TIMEOUT)
        if rc != 0:
            os.rmdir(self.mnt)
            raise RuntimeError("mounting %s failed (%r): %s"
                               % (self.source, rc, err.decode(errors="replace").strip()))
        return self.mnt

    def __exit__(self, *exc):
        unmount(self.mnt)
        return False


def _unescape(field):
    return re.sub(rb"%([0-9A-F]{2})", lambda m: bytes([int(m.group(1), 16)]),
                  field.encode("utf-8")).decode("utf-8", "surrogateescape")


def sidecar_of(path):
    return (path[:-4] if path.endswith(".raw") else path) + ".json"


def mount_model(ckptfs, source, aside=ASIDE):
    """{name: {dtype, shape, nbytes, sha256, sidecar}} of the model's tensors, read through
    the mount, and the tensor_count summary.json gives. Tensors under a path in `aside`
    (per-rank copies, optimizer state) are not the model's."""
    with Mounted(ckptfs, source) as mnt, Watchdog(mnt, CHECK_TIMEOUT):
        with open(os.path.join(mnt, ".ckptfs", "summary.json")) as f:
            summary = json.load(f)
        with open(os.path.join(mnt, ".ckptfs", "tensors.tsv"), encoding="utf-8") as f:
            rows = f.read().split("\n")[1:]
        tensors, dup = {}, []
        for row in rows:
            if not row:
                continue
            name, dtype, shape, nbytes, path = row.split("\t")
            if path.startswith(aside):
                continue
            name = _unescape(name)
            if name in tensors:
                dup.append(name)
            with open(os.path.join(mnt, path), "rb") as f:
                data = f.read()
            with open(os.path.join(mnt, sidecar_of(path)), "rb") as f:
                sidecar = json.load(f)
            tensors[name] = {"dtype": dtype, "shape": json.loads(shape), "nbytes": int(nbytes),
                             "sha256": sha(data), "size": len(data), "sidecar": sidecar}
        if dup:
            raise RuntimeError("%s: names shown twice: %r" % (source, dup[:5]))
        return tensors, summary


def manifest_tensors(path, source):
    """The tensor entries ({name, dtype, shape, sha256, path, ...}) a generator's manifest
    gives for source: a plain {"tensors": [...]}, the committed torch manifest's entry for
    the file ({"fixtures": [{"file", "tensors"}]}), or an MLFramework directory's default
    mount without options (its manifest is one level up: {"mounts": [{"options",
    "tensors"}]}). None when
    there is no such manifest."""
    for candidate in (path, os.path.join(os.path.dirname(os.path.dirname(path)),
                                         "manifest.json")):
        try:
            with open(candidate) as f:
                m = json.load(f)
        except (OSError, ValueError):
            continue
        if not isinstance(m, dict):
            continue
        if isinstance(m.get("tensors"), list) and candidate == path:
            return m["tensors"]
        for fx in m.get("fixtures", []):
            if fx.get("file") == os.path.basename(source) and isinstance(fx.get("tensors"),
                                                                          list):
                return fx["tensors"]
        for mount in m.get("mounts", []):
            if not mount.get("options"):
                return mount["tensors"]
    return None


def reference_model(source, manifest, aside=ASIDE):
    """{name: (dtype, shape, sha256)} of source's model tensors from an independent record
    of them: the tensors this module wrote (write_safetensors), else the generator's
    manifest (tensors under a path in `aside` left out). Raises ValueError when there is
    none: a conversion checked against nothing would pass for nothing."""
    if source in WRITTEN:
        return {name: (dtype, shape, sha(data)) for name, dtype, shape, data in WRITTEN[source]}
    entries = manifest_tensors(manifest, source) if manifest else None
    if entries is None:
        raise ValueError("no independent record of %s's tensors (manifest %s)"
                         % (source, manifest))
    out = {}
    for t in entries:
        if str(t.get("path", "")).startswith(aside):
            continue
        if t["name"] in out:
            raise ValueError("%s lists %r twice" % (manifest, t["name"]))
        out[t["name"]] = (t["dtype"], list(t["shape"]), t["sha256"])
    return out


# ---------------------------------------------------------------------------
# Small safetensors sources made on the spot (names, ranks and sizes no fixture has)

# path -> [(name, dtype, shape, bytes)] of every file write_safetensors made: the reference
# for converting it.
WRITTEN = {}


def write_safetensors(path, tensors, raw_header=None):
    """tensors: [(name, dtype, shape, bytes)]."""
    WRITTEN[path] = [(n, d, list(sh), p) for n, d, sh, p in tensors]
    header, data = {}, b""
    for name, dtype, shape, payload in tensors:
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(payload)]}
        data += payload
    text = raw_header if raw_header is not None else json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


def f32(n, seed=1):
    """n float32 values, a pattern that repeats every 97."""
    cycle = struct.pack("<97f", *[(seed * 7 + i * 13) % 97 / 8.0 - 6 for i in range(97)])
    return (cycle * (n // 97 + 1))[:4 * n]


# ---------------------------------------------------------------------------
# The checks

def run(ext, tensors_of, out_format, body):
    """The whole writer test: skip without the environment, else body(checker, tap) with a
    Checker of the writer; returns the exit status."""
    tap = Tap()
    ckptfs, fx, tool, why = env()
    if why:
        print("1..0 # SKIP %s" % why)
        return 0
    c = Checker(tap, ckptfs, tool, ext, tensors_of, out_format, fx)
    try:
        body(c, tap)
    finally:
        c.close()
    tap.done()
    return 0 if tap.failed == 0 else 1


class Checker:
    """tensors_of(path) -> (parsed file, [(name, dtype, shape, bytes)]) is the strict reader
    of the output format; ext its file name ending; fx the generated fixtures."""

    def __init__(self, tap, ckptfs, tool, ext, tensors_of, out_format, fx=None):
        self.tap, self.ckptfs, self.tool, self.ext = tap, ckptfs, tool, ext
        self.tensors_of, self.out_format, self.fx = tensors_of, out_format, fx
        self.torch = os.path.join(COMMITTED, "torch")
        self.dcp = os.path.join(COMMITTED, "dcp")
        self.work = tempfile.mkdtemp(prefix="ckptfs-convert-")
        self.cache = {}

    def close(self):
        shutil.rmtree(self.work, ignore_errors=True)

    def fixture(self, src):
        """(path, the manifest.json next to it) of src: absolute, or under FIXTURES."""
        path = src if os.path.isabs(src) else os.path.join(self.fx, src)
        return path, os.path.join(path if os.path.isdir(path) else os.path.dirname(path),
                                  "manifest.json")

    def source_format(self, source):
        """The format summary.json of a mount of source says."""
        return self.source_model(source, ASIDE)[1].get("format")

    def convert(self, source, out, *extra):
        return run_capture([self.tool, source, out] + list(extra), CONVERT_TIMEOUT)

    def source_model(self, source, aside):
        key = (source, aside)
        if key not in self.cache:
            self.cache[key] = mount_model(self.ckptfs, source, aside)
        return self.cache[key]

    def converts(self, label, source, aside=ASIDE, manifest=None, ext=None):
        """Converts source; checks the output with the strict reader against the source's
        independent reference (reference_model: the manifest, or what write_safetensors
        wrote; none fails), and through a mount of the output. Returns the parsed output,
        or None."""
        tap = self.tap
        out = os.path.join(self.work, re.sub(r"\W", "_", label) + (ext or self.ext))
        rc, _, err = self.convert(source, out)
        err = err.decode(errors="replace").strip()
        if not tap.ok(rc == 0 and not err, "%s: converts (exit 0, nothing on stderr)" % label,
                      ["exit %r: %s" % (rc, err)]):
            return None
        tap.ok(not leftovers(self.work), "%s: no temporary file left" % label,
               leftovers(self.work))
        try:
            parsed, written = self.tensors_of(out)
        except Exception as e:  # the reader's own error classes, struct and JSON errors
            tap.ok(False, "%s: the strict reader accepts the output" % label,
                   ["%s: %s" % (type(e).__name__, e)])
            return None
        tap.ok(True, "%s: the strict reader accepts the output" % label)

        try:
            model = reference_model(source, manifest, aside)
        except (ValueError, KeyError, TypeError) as e:
            tap.ok(False, "%s: an independent reference of the source's tensors" % label,
                   [str(e)])
            return parsed
        problems = []
        names = [w[0] for w in written]
        if sorted(names) != sorted(model) or len(set(names)) != len(names):
            problems.append("names differ: missing %r, extra %r"
                            % (sorted(set(model) - set(names))[:5],
                               sorted(set(names) - set(model))[:5]))
        for name, dtype, shape, data in written:
            want = model.get(name)
            if want is None:
                continue
            if (dtype, shape) != tuple(want[:2]):
                problems.append("%r: %s %r, source %s %r" % (name, dtype, shape, want[0],
                                                            want[1]))
            if sha(data) != want[2]:
                problems.append("%r: bytes differ from the source's" % name)
        tap.ok(bool(model) or not written, "%s: the reference lists tensors (%d)"
               % (label, len(model)))
        tap.ok(not problems, "%s: %d tensors, each with the dtype, shape and sha256 of %s"
               % (label, len(written), "the tensors written" if source in WRITTEN
                  else "the generator's manifest"), problems[:20])

        try:
            back, back_summary = mount_model(self.ckptfs, out)
        except (OSError, RuntimeError, ValueError) as e:
            tap.ok(False, "%s: output mounts" % label, [str(e)])
            return parsed
        problems = []
        if back_summary.get("format") != self.out_format:
            problems.append("format %r" % back_summary.get("format"))
        if sorted(back) != sorted(names):
            problems.append("the mount shows %d tensors, the file has %d" % (len(back),
                                                                            len(names)))
        for name, dtype, shape, data in written:
            got = back.get(name)
            if got is None:
                continue
            sc = got["sidecar"]
            if (got["dtype"], got["shape"], got["sha256"]) != (dtype, shape, sha(data)):
                problems.append("%r: mount shows %s %r, sha256 %s" % (name, got["dtype"],
                                                                      got["shape"],
                                                                      got["sha256"][:12]))
            if (sc.get("name"), sc.get("dtype"), sc.get("shape")) != (name, dtype, shape):
                problems.append("%r: sidecar %r" % (name, sc))
        tap.ok(not problems, "%s: the output mounts as %s with every tensor's bytes, dtype and "
               "shape" % (label, self.out_format), problems[:20])
        return parsed

    def refuses(self, label, source, words, tensors=None, ext=None):
        """Refused with exit 2 and one stderr line holding `words`, naming one tensor (in
        `tensors` when given), leaving neither OUT nor a temporary file."""
        tap = self.tap
        out = os.path.join(self.work, "refused" + (ext or self.ext))
        rc, _, err = self.convert(source, out)
        lines = err.decode(errors="replace").strip().splitlines()
        named = re.search(r'tensor "([^"]*)"', lines[0]) if len(lines) == 1 else None
        good = rc == 2 and len(lines) == 1 and all(w in lines[0] for w in words) and named
        if good and tensors is not None:
            good = named.group(1) in tensors
        tap.ok(good, "%s: refused (exit 2, one line naming the tensor, %s)"
               % (label, ", ".join(repr(w) for w in words)), ["exit %r: %r" % (rc, lines)])
        tap.ok(not os.path.exists(out) and not leftovers(self.work),
               "%s: neither OUT nor a temporary file is left" % label,
               [os.listdir(self.work)])
        return lines[0] if lines else ""

    def refuses_made(self, cases):
        """cases: (label, tensors, words); a safetensors file of a fine tensor and the
        tensors is refused (see refuses)."""
        for label, tensors, words in cases:
            path = os.path.join(self.work, "bad.safetensors")
            write_safetensors(path, [("fine", "F32", [2], f32(2))] + tensors)
            self.refuses(label, path, words)

    def big_and_write_failures(self, label):
        """6 MiB: more than the writers' 4 MiB buffer, so the file is written in several
        parts; then write_failures with it."""
        big = os.path.join(self.work, "big.safetensors")
        write_safetensors(big, [("big", "F32", [1536, 1024], f32(1536 * 1024)),
                                ("small", "F32", [3], f32(3))])
        self.converts("6 MiB", big)
        self.write_failures(label, big)

    def write_failures(self, label, source):
        """A read-only output directory and a full file system: clear error, nothing left."""
        tap = self.tap
        d = tempfile.mkdtemp(prefix="ckptfs-ro-")
        try:
            ro = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", d],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
            if ro != 0:  # not root: the mode bits are enough
                os.chmod(d, 0o555)
            out = os.path.join(d, "out" + self.ext)
            rc, _, err = self.convert(source, out)
            lines = err.decode(errors="replace").strip().splitlines()
            tap.ok(rc == 2 and len(lines) == 1 and out in lines[0] and
                   ("Read-only file system" in lines[0] or "Permission denied" in lines[0]),
                   "%s: a read-only output directory is a clear one-line error" % label,
                   ["exit %r: %r" % (rc, lines)])
            tap.ok(os.listdir(d) == [], "%s: nothing is left in the read-only directory" % label,
                   [os.listdir(d)])
        finally:
            if subprocess.run(["umount", d], stderr=subprocess.DEVNULL).returncode != 0:
                os.chmod(d, 0o755)
            os.rmdir(d)

        d = tempfile.mkdtemp(prefix="ckptfs-full-")
        try:
            if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", d],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode:
                self.tap.diag("%s: no tmpfs (not root?): the full file system case is not run"
                              % label)
                return
            out = os.path.join(d, "out" + self.ext)
            rc, _, err = self.convert(source, out)
            lines = err.decode(errors="replace").strip().splitlines()
            tap.ok(rc == 2 and len(lines) == 1 and "No space left on device" in lines[0],
                   "%s: a full file system is a clear one-line error" % label,
                   ["exit %r: %r" % (rc, lines)])
            tap.ok(os.listdir(d) == [], "%s: nothing is left on the full file system" % label,
                   [os.listdir(d)])
        finally:
            subprocess.run(["umount", d], stderr=subprocess.DEVNULL)
            os.rmdir(d)
