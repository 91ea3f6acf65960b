#!/usr/bin/python3
"""The Hugging Face layout view: .ckptfs/hf/ (or the root with -o view=hf).

Environment:
  CKPTFS    path of the ckptfs binary
  FIXTURES  output directory of tests/gen/safetensors_fixtures.py

Every synthesized safetensors file is checked with a strict reader written
here from the format notes (section 1 of safetensors-dcp-torch-gguf.md), not
from the C code: header length <= 1e8, UTF-8 JSON object without duplicate
keys, __metadata__ exactly {"format":"pt"}, exact dtype spellings, offsets that
tile the data section with nothing left over, nbytes == numel*bits/8, header
padded with spaces to a multiple of 8 and every tensor aligned to its element
size.  Tensor bytes are compared with the manifests the (independent) fixture
generator wrote, or with the bytes this test wrote itself.

  1. every fixture case with a manifest.json: .ckptfs/hf/model.safetensors
     holds exactly the manifest's tensors; the hostile cases that must mount
     round-trip their nasty names through the view; the other decoders'
     fixtures (FIXTURES/NAME/.../manifest.json) that mount show exactly their
     complete safetensors-dtype tensors, with the tree's bytes.
  2. -o max_shard_size: shards + model.safetensors.index.json, greedy packing,
     units, the boundary (total == limit stays one file), bad values.
  3. -o view=hf: the layout at the root; bad view values.
  4. mmap: four threads fault random slices of the view (with pages evicted
     under them) and compare them with bytes built independently; then the
     whole file through numpy.memmap.
  5. config and tokenizer files equal the source's byte for byte.

Every mount must also end cleanly: the daemon exits after fusermount3 -u, and
no ASan/UBSan report is written by the mount or its daemon (the daemon's
stderr is /dev/null, so reports go to files through ASAN_OPTIONS/UBSAN_OPTIONS
log_path, one directory per run; with an unsanitized binary this passes
trivially).
"""

import contextlib
import hashlib
import json
import mmap
import os
import random
import re
import shutil
import struct
import sys
import tempfile
import threading
import time

MOUNT_TIMEOUT = 30      # seconds for `ckptfs SRC MNT` to return
REFUSE_TIMEOUT = 10     # seconds for a refused mount to exit
CASE_TIMEOUT = 180      # seconds for all checks of one mounted case
HAMMER_SECONDS = 3.0    # how long the mmap threads fault pages
HAMMER_THREADS = 4
DAEMON_EXIT_TIMEOUT = 20  # seconds for the daemon to exit after its unmount

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from ckptfs_test import Tap, Watchdog, is_mounted, run_capture, unmount  # noqa: E402
from mount_checks import case_dirs, run  # noqa: E402
from hf_side_files import HF_SIDE_FILES  # noqa: E402

# ---------------------------------------------------------------------------
# safetensors facts (format notes, 1.3 and 1.5)

DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "U16": 16, "I16": 16, "F16": 16, "BF16": 16,
    "U32": 32, "I32": 32, "F32": 32, "F64": 64, "U64": 64, "I64": 64, "C64": 64,
    "F8_E4M3": 8, "F8_E5M2": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8,
    "F8_E5M2FNUZ": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}

# The reference writer (>= 0.6) lays tensors out in this dtype order, then by name.
WRITER_DTYPE_ORDER = [
    "U64", "I64", "F64", "C64", "F32", "U32", "I32", "BF16", "F16", "U16",
    "I16", "F8_E5M2FNUZ", "F8_E4M3FNUZ", "F8_E8M0", "F8_E4M3", "F8_E5M2",
    "I8", "U8", "F6_E3M2", "F6_E2M3", "F4", "BOOL",
]

MAX_HEADER = 100_000_000


SHARD_RE = re.compile(r"model-(\d{5})-of-(\d{5})\.safetensors\Z")
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


class Invalid(Exception):
    pass


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def is_uint(v):
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def strict_json(text):
    """json.loads that refuses duplicate keys and NaN/Infinity."""
    def pairs(items):
        out = {}
        for k, v in items:
            if k in out:
                raise Invalid("duplicate key %r" % k)
            out[k] = v
        return out

    def constant(name):
        raise Invalid("non-JSON constant %s" % name)

    try:
        return json.loads(text, object_pairs_hook=pairs, parse_constant=constant)
    except ValueError as e:
        raise Invalid("JSON: %s" % e)


def compact_outside_strings(text):
    """True when no whitespace appears outside JSON strings."""
    in_str = esc = False
    for c in text:
        if in_str:
            if esc:
                esc = False
            elif c == "\\":
                esc = True
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif c in " \t\r\n":
            return False
    return True


class View:
    """A parsed and validated safetensors file."""

    def __init__(self, header_len, text, tensors, size):
        self.header_len = header_len
        self.text = text                 # header text without the padding
        self.tensors = tensors           # name -> (dtype, shape, begin, end), JSON order
        self.data_start = 8 + header_len
        self.size = size

    def by_offset(self):
        return sorted(self.tensors.items(), key=lambda kv: (kv[1][2], kv[1][3]))

    def tensor_bytes(self, data, name):
        _, _, begin, end = self.tensors[name]
        return data[self.data_start + begin:self.data_start + end]


def parse_strict(prefix, size):
    """Validate a safetensors file from its first bytes (at least 8 + N) and its size.

    Raises Invalid with the first problem found.
    """
    if size < 8 or len(prefix) < 8:
        raise Invalid("file of %d bytes is shorter than the length prefix" % size)
    n = struct.unpack("<Q", prefix[:8])[0]
    if n > MAX_HEADER:
        raise Invalid("header length %d > %d" % (n, MAX_HEADER))
    if 8 + n > size:
        raise Invalid("header length %d runs past the end (%d bytes)" % (n, size))
    if len(prefix) < 8 + n:
        raise Invalid("only %d header bytes given" % (len(prefix) - 8))
    if n % 8:
        raise Invalid("header length %d is not a multiple of 8" % n)
    raw = prefix[8:8 + n]
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise Invalid("header is not UTF-8: %s" % e)
    if raw[:1] != b"{":
        raise Invalid("header does not start with '{': %r" % raw[:16])
    body = raw.rstrip(b" ")
    if not body.endswith(b"}"):
        raise Invalid("header padding is not spaces only: %r" % raw[-16:])
    if n - len(body) >= 8:
        raise Invalid("%d bytes of padding, more than needed" % (n - len(body)))
    text = body.decode("utf-8")
    doc = strict_json(text)
    if not isinstance(doc, dict):
        raise Invalid("header is a %s, not an object" % type(doc).__name__)

    meta = doc.pop("__metadata__", None)
    if not isinstance(meta, dict) or any(not isinstance(k, str) or not isinstance(v, str)
                                         for k, v in meta.items()):
        raise Invalid("__metadata__ %r is not a string->string object" % (meta,))
    if meta != {"format": "pt"}:
        raise Invalid("__metadata__ %r, want {'format': 'pt'}" % (meta,))

    tensors = {}
    for name, e in doc.items():
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            raise Invalid("name %r is not valid Unicode (lone surrogate)" % name)
        if not isinstance(e, dict) or set(e) != {"dtype", "shape", "data_offsets"}:
            raise Invalid("%r: entry %r is not {dtype, shape, data_offsets}" % (name, e))
        dt, shape, offs = e["dtype"], e["shape"], e["data_offsets"]
        if not isinstance(dt, str) or dt not in DTYPE_BITS:
            raise Invalid("%r: dtype %r is not a safetensors dtype" % (name, dt))
        if not isinstance(shape, list) or not all(is_uint(d) for d in shape):
            raise Invalid("%r: shape %r" % (name, shape))
        if (not isinstance(offs, list) or len(offs) != 2 or not all(is_uint(o) for o in offs)
                or offs[0] > offs[1]):
            raise Invalid("%r: data_offsets %r" % (name, offs))
        tensors[name] = (dt, shape, offs[0], offs[1])

    pos = 0
    for name, (dt, shape, begin, end) in sorted(tensors.items(),
                                                key=lambda kv: (kv[1][2], kv[1][3])):
        if begin != pos:
            raise Invalid("%r: begins at %d, want %d (gap or overlap)" % (name, begin, pos))
        bits = numel(shape) * DTYPE_BITS[dt]
        if bits % 8:
            raise Invalid("%r: %d bits is not a whole number of bytes" % (name, bits))
        if end - begin != bits // 8:
            raise Invalid("%r: %d bytes for %s%s, want %d" % (name, end - begin, dt, shape,
                                                             bits // 8))
        elem = max(1, DTYPE_BITS[dt] // 8)
        if (8 + n + begin) % elem:
            raise Invalid("%r: file offset %d not aligned to %d" % (name, 8 + n + begin, elem))
        pos = end
    if 8 + n + pos != size:
        raise Invalid("data section ends at %d, file is %d bytes (trailing or missing bytes)"
                      % (8 + n + pos, size))
    return View(n, text, tensors, size)


def writer_style_problems(view):
    """Departures from the reference writer's layout, which ckptfs(5) promises."""
    problems = []
    if not compact_outside_strings(view.text):
        problems.append("header JSON is not compact")
    if not view.text.startswith('{"__metadata__":{"format":"pt"}'):
        problems.append("__metadata__ is not the first key")
    rank = {d: i for i, d in enumerate(WRITER_DTYPE_ORDER)}
    laid = [name for name, _ in view.by_offset()]
    want = sorted(view.tensors, key=lambda nm: (rank[view.tensors[nm][0]], nm.encode("utf-8")))
    if laid != want:
        problems.append("data order %r, want dtype-then-name %r" % (laid[:6], want[:6]))
    if list(view.tensors) != laid:
        problems.append("JSON keys are not in data order")
    entry_order = re.findall(r'\{"dtype":"[^"]*","shape":\[[0-9,]*\],"data_offsets":\[\d+,\d+\]\}',
                             view.text)
    if len(entry_order) != len(view.tensors):
        problems.append("%d of %d entries spelled dtype,shape,data_offsets"
                        % (len(entry_order), len(view.tensors)))
    return problems


# ---------------------------------------------------------------------------
# File helpers

def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def read_prefix(path):
    """The length prefix and header of a safetensors file, plus its size (two preads)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        head = os.pread(fd, 8, 0)
        n = struct.unpack("<Q", head)[0] if len(head) == 8 else 0
        if n <= MAX_HEADER:
            head += os.pread(fd, n, 8)
        return head, size
    finally:
        os.close(fd)


def load_view(path):
    """Read a whole file; returns (View, bytes); checks stat size == bytes read."""
    st = os.stat(path)
    data = read_bytes(path)
    if st.st_size != len(data):
        raise Invalid("st_size %d, but %d bytes read" % (st.st_size, len(data)))
    return parse_strict(data, len(data)), data


def sha(b):
    return hashlib.sha256(b).hexdigest()


def read_lenient_safetensors(path):
    """name -> raw bytes of a (valid) source safetensors file, padding of any kind."""
    data = read_bytes(path)
    n = struct.unpack("<Q", data[:8])[0]
    doc = json.loads(data[8:8 + n].decode("utf-8"))
    doc.pop("__metadata__", None)
    base = 8 + n
    return {k: data[base + v["data_offsets"][0]:base + v["data_offsets"][1]]
            for k, v in doc.items()}


def write_safetensors(path, tensors, misalign_to=3):
    """A small writer for this test's own sources: tensors in the given order, header
    padded so its length is misalign_to mod 8 (the data section is deliberately
    unaligned, unlike what the view must produce)."""
    header, pos = {"__metadata__": {"format": "pt"}}, 0
    for name, dt, shape, data in tensors:
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [pos, pos + len(data)]}
        pos += len(data)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((misalign_to - len(text)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for t in tensors:
            f.write(t[3])


# ---------------------------------------------------------------------------
# Mounting

class Ctx:
    def __init__(self, tap, ckptfs, fixtures):
        self.tap, self.ckptfs, self.fixtures = tap, ckptfs, fixtures
        self.san = SanitizerLogs()


class SanitizerLogs:
    """Sends the ASan/UBSan reports of each ckptfs run to a directory of its own.

    The detached daemon's stderr is /dev/null, so without log_path a report from it (a
    bad read, a leak at exit) would be lost. A log_path set by the caller is kept, and
    then no reports are collected here.
    """

    VARS = (("ASAN_OPTIONS", "asan"), ("UBSAN_OPTIONS", "ubsan"))

    def __init__(self):
        self.root = tempfile.mkdtemp(prefix="ckptfs-t32-san.")
        self.base = {var: os.environ.get(var, "") for var, _ in self.VARS}
        self.n = 0

    def point(self):
        """A fresh directory for the next ckptfs run (set in the environment it inherits)."""
        self.n += 1
        d = os.path.join(self.root, str(self.n))
        os.mkdir(d)
        for var, stem in self.VARS:
            base = self.base[var]
            if "log_path=" not in base:
                os.environ[var] = (base + ":" if base else "") + "log_path=" + \
                    os.path.join(d, stem)
        return d

    @staticmethod
    def reports(d):
        lines = []
        for f in sorted(os.listdir(d)):
            with open(os.path.join(d, f), encoding="utf-8", errors="replace") as fh:
                lines += ["%s: %s" % (f, ln.rstrip()) for ln in fh.readlines()[:40]]
        return lines

    def cleanup(self):
        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def mounted(ctx, source, opts, label, required=True):
    """Mount source (opts for -o, or None); yields the mount point or None if it failed.
    Always unmounts, waits for the daemon to exit and collects its sanitizer reports; a
    watchdog aborts the mount if the checks hang. A mount that is not required only
    leaves a diagnostic when it fails (the decoder's own test reports that)."""
    tap = ctx.tap
    mnt = tempfile.mkdtemp(prefix="ckptfs-t32.")
    logs = ctx.san.point()
    ok = False
    try:
        argv = [ctx.ckptfs, source, mnt] + (["-o", opts] if opts else [])
        rc, _, err = run_capture(argv, MOUNT_TIMEOUT)
        ok = rc == 0 and is_mounted(mnt)
        diag = ["exit status %r%s" % (rc, " (timed out)" if rc is None else ""),
                "stderr: %s" % err.decode("utf-8", "replace").strip()]
        if not ok and not required:
            tap.diag("%s: does not mount, skipped (%s)" % (label, "; ".join(diag)))
            yield None
            return
        if not tap.ok(ok, "%s: mount%s" % (label, " -o " + opts if opts else ""),
                      diag + SanitizerLogs.reports(logs)):
            yield None
            return
        with Watchdog(mnt, CASE_TIMEOUT) as dog:
            yield mnt
        if dog.fired:
            tap.ok(False, "%s: checks finished within %d s" % (label, CASE_TIMEOUT),
                   ["watchdog aborted the mount"])
    finally:
        clean = unmount(mnt)
        gone = wait_daemon_gone(mnt)
        problems = [] if gone else ["a ckptfs process for %s is still running" % mnt]
        reports = SanitizerLogs.reports(logs)
        if ok or required:
            problems += reports
        elif reports:
            tap.diag("%s: sanitizer report from the failed mount (the decoder's bug):" % label)
            for line in reports[:12]:
                tap.diag("  " + line)
        tap.ok(clean and not problems, "%s: fusermount3 -u, daemon exits, no sanitizer report"
               % label, problems)


def daemon_running(mnt):
    """True while some process has mnt as a command-line argument (the detached daemon)."""
    target = os.fsencode(mnt)
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                if target in f.read().split(b"\0"):
                    return True
        except OSError:
            pass
    return False


def wait_daemon_gone(mnt, seconds=None):
    # The daemon writes its sanitizer reports (leaks) while exiting, after the unmount.
    deadline = time.monotonic() + (seconds or DAEMON_EXIT_TIMEOUT)
    while daemon_running(mnt):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def guarded(problems, fn, *args):
    """Run a check step; an exception becomes a problem instead of ending the test."""
    try:
        return fn(*args)
    except Invalid as e:
        problems.append("invalid safetensors: %s" % e)
    except Exception as e:  # noqa: BLE001 - any failure is a test failure, not a crash
        problems.append("%s: %s" % (type(e).__name__, e))
    return None


def expect_refused(ctx, source, opts, needle, label, todo=None):
    """The mount must exit 1 quickly with one stderr line naming the option.
    todo: a known bug; the result is reported as a TAP TODO and does not fail the run."""
    mnt = tempfile.mkdtemp(prefix="ckptfs-t32.")
    logs = ctx.san.point()
    problems = []
    try:
        rc, _, err = run_capture([ctx.ckptfs, source, mnt, "-o", opts], REFUSE_TIMEOUT)
        text = err.decode("utf-8", "replace")
        if rc != 1:
            problems.append("exit status %r, want 1" % (rc,))
        if is_mounted(mnt):
            problems.append("something is mounted")
        lines = text.strip().splitlines()
        if len(lines) != 1 or needle not in lines[0]:
            problems.append("stderr should be one line naming %s: %r" % (needle, text))
    finally:
        if not unmount(mnt):
            problems.append("had to force the unmount")
        if not wait_daemon_gone(mnt):
            problems.append("a ckptfs process for %s is still running" % mnt)
        problems += SanitizerLogs.reports(logs)
    desc = "%s: -o %s refused with exit status 1, nothing mounted" % (label, opts)
    if todo:
        todo_ok(ctx.tap, not problems, desc, todo, problems)
    else:
        ctx.tap.ok(not problems, desc, problems)


def todo_ok(tap, cond, desc, reason, diag=()):
    # Tap.ok escapes '#', so the TODO directive is written here.
    tap.n += 1
    print("%s %d - %s # TODO %s" % ("ok" if cond else "not ok", tap.n, Tap._clean(desc),
                                    Tap._clean(reason)))
    for line in ([] if cond else diag):
        print("#   " + Tap._clean(line))
    sys.stdout.flush()


# ---------------------------------------------------------------------------
# 1. Fixture cases: the single-file view equals the manifest

def manifest_want(manifest):
    """name -> manifest record for the tensors the view can hold."""
    want, left_out = {}, []
    for t in manifest["tensors"]:
        if t["dtype"] in DTYPE_BITS and not t.get("incomplete"):
            want[t["name"]] = t
        else:
            left_out.append(t["name"])
    return want, left_out


def compare_tensors(view, data, want):
    """Problems between a view's tensors and name -> {dtype, shape, nbytes, sha256}."""
    problems = []
    for name in sorted(set(want) - set(view.tensors)):
        problems.append("missing: %r" % name)
    for name in sorted(set(view.tensors) - set(want)):
        problems.append("extra: %r" % name)
    for name in sorted(set(want) & set(view.tensors)):
        dt, shape, begin, end = view.tensors[name]
        w = want[name]
        if dt != w["dtype"] or shape != list(w["shape"]):
            problems.append("%r: %s%s, want %s%s" % (name, dt, shape, w["dtype"], w["shape"]))
        if end - begin != w["nbytes"]:
            problems.append("%r: %d bytes, want %d" % (name, end - begin, w["nbytes"]))
        if sha(view.tensor_bytes(data, name)) != w["sha256"]:
            problems.append("%r: sha256 differs" % name)
    return problems


def expected_listing(source_dir, model_files):
    side = set()
    if source_dir and os.path.isdir(source_dir):
        side = {f for f in os.listdir(source_dir)
                if f in HF_SIDE_FILES and os.path.isfile(os.path.join(source_dir, f))}
    return side | set(model_files)


def check_listing(tap, label, d, want):
    problems = []
    try:
        got = set(os.listdir(d))
        for f in sorted(want - got):
            problems.append("missing: %s" % f)
        for f in sorted(got - want):
            problems.append("unexpected: %s" % f)
    except OSError as e:
        problems.append(str(e))
    tap.ok(not problems, "%s: %s lists exactly %s"
           % (label, "hf/" if os.path.basename(d) == "hf" else "the root",
              ", ".join(sorted(want))), problems)


def check_side_files(tap, label, d, source_dir):
    """Every HF side file of the source shows in d with identical bytes and size."""
    names = sorted(f for f in os.listdir(source_dir)
                   if f in HF_SIDE_FILES and os.path.isfile(os.path.join(source_dir, f)))
    if not names:
        return
    problems = []
    for f in names:
        try:
            src = read_bytes(os.path.join(source_dir, f))
            got = read_bytes(os.path.join(d, f))
            if got != src:
                problems.append("%s: %d bytes differ from the source's %d" % (f, len(got),
                                                                             len(src)))
            if os.stat(os.path.join(d, f)).st_size != len(src):
                problems.append("%s: st_size differs" % f)
        except OSError as e:
            problems.append("%s: %s" % (f, e))
    tap.ok(not problems, "%s: %s equal the source byte for byte" % (label, ", ".join(names)),
           problems)


def check_single_view(tap, label, path, want):
    """path is a model.safetensors of the view; want: name -> record. Returns the View."""
    problems = []
    loaded = guarded(problems, load_view, path)
    tap.ok(loaded is not None, "%s: %s is a strictly valid safetensors file"
           % (label, os.path.basename(path)), problems)
    if loaded is None:
        return None
    view, data = loaded
    problems = writer_style_problems(view)
    tap.ok(not problems, "%s: header laid out as the reference writer does "
           "(compact, metadata first, dtype then name)" % label, problems)
    problems = compare_tensors(view, data, want)
    tap.ok(not problems, "%s: %d tensors, dtype/shape/sha256 equal the manifest, no extras"
           % (label, len(want)), problems)
    return view


def run_fixture_case(ctx, case):
    case_dir = os.path.join(ctx.fixtures, case)
    with open(os.path.join(case_dir, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    source = os.path.normpath(os.path.join(case_dir, manifest["source"]))
    want, left_out = manifest_want(manifest)
    if left_out:
        ctx.tap.diag("%s: %d tensors have dtypes safetensors cannot hold or are incomplete; "
                     "the view must leave them out" % (case, len(left_out)))
    with mounted(ctx, source, None, case) as mnt:
        if not mnt:
            return
        hf = os.path.join(mnt, ".ckptfs", "hf")
        check_listing(ctx.tap, case, hf, expected_listing(
            source if os.path.isdir(source) else None, [SINGLE]))
        check_single_view(ctx.tap, case, os.path.join(hf, SINGLE), want)


def run_hostile_mount_cases(ctx):
    """Valid sources with hostile names: their names and bytes survive the view."""
    root = os.path.join(ctx.fixtures, "hostile")
    names_path = os.path.join(root, "mount-names.json")
    if not ctx.tap.ok(os.path.isfile(names_path), "the generator wrote %s" % names_path):
        return
    with open(names_path, encoding="utf-8") as f:
        cases = json.load(f)
    for rel in sorted(cases):
        src = os.path.join(root, rel)
        label = "hostile/" + rel
        with mounted(ctx, src, None, label) as mnt:
            if not mnt:
                continue
            problems = []
            loaded = guarded(problems, load_view, os.path.join(mnt, ".ckptfs", "hf", SINGLE))
            if loaded:
                view, data = loaded
                source_bytes = guarded(problems, read_lenient_safetensors, src) or {}
                if sorted(view.tensors) != sorted(cases[rel]):
                    problems.append("names %r, want %r" % (sorted(view.tensors)[:8],
                                                           sorted(cases[rel])[:8]))
                for name in sorted(set(view.tensors) & set(source_bytes)):
                    if view.tensor_bytes(data, name) != source_bytes[name]:
                        problems.append("%r: bytes differ from the source" % name)
                problems += writer_style_problems(view)
            ctx.tap.ok(not problems, "%s: hf view strictly valid, %d names and bytes "
                       "round-trip" % (label, len(cases[rel])), problems)


def tree_tensors(mnt):
    """name -> (sidecar, raw file path) for every tensor of the mounted tree."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(mnt):
        if dirpath == mnt:
            dirnames[:] = [d for d in dirnames if d != ".ckptfs"]
        for fn in filenames:
            # Path components never contain '.', so every *.json here is a sidecar.
            if not fn.endswith(".json"):
                continue
            base = os.path.join(dirpath, fn[:-5])
            sc = json.loads(read_bytes(os.path.join(dirpath, fn)))
            out[sc["name"]] = (sc, base if os.path.isfile(base) else base + ".raw")
    return out


def run_other_format_cases(ctx, top_cases):
    """The fixtures of the other decoders (FIXTURES/NAME/.../manifest.json): whatever their
    catalog holds, the view must be valid safetensors holding exactly the complete tensors
    of safetensors dtypes, with the bytes the tree shows and the dtype, shape and sha256 the
    generator's manifest records. Every fixture with a manifest must mount."""
    found = []
    for dirpath, dirnames, filenames in os.walk(ctx.fixtures):
        rel = os.path.relpath(dirpath, ctx.fixtures)
        depth = 0 if rel == "." else rel.count(os.sep) + 1
        if depth == 0:
            dirnames[:] = [d for d in dirnames if d not in top_cases and d != "hostile"]
        elif "manifest.json" in filenames:
            found.append(rel)
        if depth >= 4:
            dirnames[:] = []
    for rel in sorted(found):
        case_dir = os.path.join(ctx.fixtures, rel)
        try:
            with open(os.path.join(case_dir, "manifest.json"), encoding="utf-8") as f:
                manifest = json.load(f)
            src = manifest.get("source", manifest.get("sources"))
            if isinstance(src, list):
                src = src[0]
            source = os.path.normpath(os.path.join(case_dir, src))
            if "skip" in manifest:  # the generator had no sample to write this case from
                ctx.tap.skip("%s: HF view" % rel, manifest["skip"])
                continue
            entries = manifest.get("tensors")
            if entries is None:  # MLFramework: the tensors of the mount without options
                entries = next(m["tensors"] for m in manifest["mounts"]
                               if not m.get("options"))
            recorded = {t["name"]: t for t in entries}
            if len(recorded) != len(entries):
                raise ValueError("a name is listed twice")
        except (OSError, ValueError, TypeError, KeyError, IndexError, StopIteration) as e:
            ctx.tap.ok(False, "%s: the manifest lists the tensors" % rel, [repr(e)])
            continue
        # The view's reference: the generator's record of the complete, model (not aside)
        # tensors of safetensors dtypes.
        expected = {n: t for n, t in recorded.items()
                    if t.get("dtype") in DTYPE_BITS and not t.get("incomplete") and
                    not t.get("aside") and not str(t.get("path", "")).startswith("optim/")}
        with mounted(ctx, source, None, rel) as mnt:
            if not mnt:
                continue
            problems = []
            loaded = guarded(problems, load_view, os.path.join(mnt, ".ckptfs", "hf", SINGLE))
            ctx.tap.ok(loaded is not None, "%s: .ckptfs/hf/model.safetensors strictly valid"
                       % rel, problems)
            if not loaded:
                continue
            view, data = loaded
            problems, left_out = [], []
            try:
                tree = tree_tensors(mnt)
            except ValueError as e:
                # Without the tree's dtypes there is nothing to compare the view with.
                ctx.tap.ok(False, "%s: every tree sidecar parses" % rel, [str(e)])
                continue
            want = {}
            for name, (sc, raw) in tree.items():
                if (sc.get("dtype") in DTYPE_BITS and not sc.get("incomplete")
                        and not sc.get("aside")):
                    want[name] = (sc, raw)
                else:
                    left_out.append(name)
            for name in sorted(set(want) - set(view.tensors)):
                problems.append("missing: %r" % name)
            for name in sorted(set(view.tensors) - set(want)):
                problems.append("extra: %r%s" % (name, " (left out by design)"
                                                 if name in left_out else ""))
            for name in sorted(set(want) & set(view.tensors)):
                sc, raw = want[name]
                dt, shape, _, _ = view.tensors[name]
                got = view.tensor_bytes(data, name)
                if dt != sc.get("dtype") or shape != sc.get("shape"):
                    problems.append("%r: %s%s, tree says %s%s" % (name, dt, shape,
                                                                 sc.get("dtype"), sc.get("shape")))
                elif guarded(problems, read_bytes, raw) != got:
                    problems.append("%r: bytes differ from the tree's %s" % (name, raw))
            ctx.tap.ok(not problems, "%s: view holds the %d complete safetensors-dtype "
                       "tensors of the tree with their bytes (%d left out)"
                       % (rel, len(want), len(left_out)), problems)
            problems = ["missing: %r" % n for n in sorted(set(expected) - set(view.tensors))]
            problems += ["extra: %r" % n for n in sorted(set(view.tensors) - set(expected))]
            for name in sorted(set(expected) & set(view.tensors)):
                rec = expected[name]
                dt, shape, _, _ = view.tensors[name]
                if (dt, shape) != (rec["dtype"], list(rec["shape"])) or \
                        sha(view.tensor_bytes(data, name)) != rec["sha256"]:
                    problems.append("%r: %s%s, manifest %s%s, or its sha256 differs"
                                    % (name, dt, shape, rec["dtype"], rec["shape"]))
            ctx.tap.ok(not problems, "%s: view holds exactly the manifest's %d complete "
                       "safetensors-dtype tensors, with their sha256" % (rel, len(expected)),
                       problems[:10])


# ---------------------------------------------------------------------------
# 2. Shards + index

def check_shard_set(tap, label, d, want, limit, min_shards, side_files=()):
    """d holds a sharded view of want (name -> record) made with max_shard_size=limit."""
    problems = []
    names = {f for f in os.listdir(d) if f not in side_files} - {".ckptfs"}
    shards = sorted(f for f in names if f.endswith(".safetensors"))
    matches = [SHARD_RE.match(f) for f in shards]
    if SINGLE in names:
        problems.append("model.safetensors present next to shards")
    if INDEX not in names:
        problems.append("no %s" % INDEX)
    if not all(matches):
        problems.append("shard names %r do not follow model-0000i-of-0000N" % shards)
    else:
        count = len(shards)
        if [int(m.group(1)) for m in matches] != list(range(1, count + 1)) or \
                {int(m.group(2)) for m in matches} != {count}:
            problems.append("shard numbering %r is not 1..%d of %d" % (shards, count, count))
        if count < min_shards:
            problems.append("%d shards, want at least %d" % (count, min_shards))
    extra = names - set(shards) - {INDEX}
    if extra:
        problems.append("unexpected files %r" % sorted(extra))
    tap.ok(not problems, "%s: %d shards model-0000i-of-%05d.safetensors + index"
           % (label, len(shards), len(shards)), problems)

    # The index: structure, total_size, formatting as transformers writes it.
    problems, index = [], None
    try:
        text = read_bytes(os.path.join(d, INDEX)).decode("utf-8")
        index = strict_json(text)
        total = sum(w["nbytes"] for w in want.values())
        if not isinstance(index, dict) or set(index) != {"metadata", "weight_map"}:
            problems.append("top-level keys %r" % (list(index) if isinstance(index, dict)
                                                   else index,))
        elif index["metadata"] != {"total_size": total} or \
                not is_uint(index["metadata"].get("total_size")):
            problems.append("metadata %r, want {'total_size': %d}" % (index["metadata"], total))
        elif not isinstance(index["weight_map"], dict) or \
                not all(isinstance(v, str) for v in index["weight_map"].values()):
            problems.append("weight_map is not a name->file object")
        # transformers escapes non-ASCII (ensure_ascii); raw UTF-8 is as good a spelling.
        if text not in (json.dumps(index, indent=2, sort_keys=True, ensure_ascii=a) + "\n"
                        for a in (True, False)):
            problems.append("not json.dumps(indent=2, sort_keys=True) + newline")
    except (OSError, ValueError, Invalid) as e:
        problems.append(str(e))
        index = None
    tap.ok(not problems, "%s: %s structure, total_size, indent 2, sorted keys"
           % (label, INDEX), problems)

    # Every shard on its own.
    views, union = {}, {}
    for f in shards:
        problems = []
        loaded = guarded(problems, load_view, os.path.join(d, f))
        if loaded:
            view, data = loaded
            views[f] = view
            if not view.tensors:
                problems.append("empty shard")
            problems += writer_style_problems(view)
            for name in view.tensors:
                if name in union:
                    problems.append("%r also in %s" % (name, union[name][0]))
                union[name] = (f, view, data)
        tap.ok(not problems, "%s: %s strictly valid, %d tensors"
               % (label, f, len(view.tensors) if loaded else 0), problems)

    problems = []
    wm = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(wm, dict):
        problems.append("no usable weight_map")
    else:
        if set(wm) != set(want):
            problems.append("weight_map names: missing %r, extra %r"
                            % (sorted(set(want) - set(wm))[:5], sorted(set(wm) - set(want))[:5]))
        for name, f in sorted(wm.items()):
            if name in union and union[name][0] != f:
                problems.append("%r mapped to %s, stored in %s" % (name, f, union[name][0]))
            elif name not in union:
                problems.append("%r mapped to %s, stored in no shard" % (name, f))
        if set(wm.values()) != set(shards):
            problems.append("weight_map files %r != shard files" % sorted(set(wm.values())))
    tap.ok(not problems, "%s: weight_map names exactly the tensors and their shards" % label,
           problems)

    problems = []
    for name in sorted(set(want) - set(union)):
        problems.append("missing: %r" % name)
    for name in sorted(set(union) - set(want)):
        problems.append("extra: %r" % name)
    for name in sorted(set(want) & set(union)):
        f, view, data = union[name]
        dt, shape, begin, end = view.tensors[name]
        w = want[name]
        if dt != w["dtype"] or shape != list(w["shape"]) or end - begin != w["nbytes"]:
            problems.append("%r: %s%s %d bytes, want %s%s %d" % (
                name, dt, shape, end - begin, w["dtype"], w["shape"], w["nbytes"]))
        elif sha(view.tensor_bytes(data, name)) != w["sha256"]:
            problems.append("%r: sha256 differs (in %s)" % (name, f))
    tap.ok(not problems, "%s: union of the shards == the %d tensors, sha256 equal"
           % (label, len(want)), problems)

    # Greedy packing in layout order: a shard stays within the limit unless it holds one
    # oversized tensor (zero-byte ones may ride along), and no shard could have taken the
    # next shard's first tensor.
    problems = []
    ordered = [views[f] for f in shards if f in views]
    for i, view in enumerate(ordered):
        used = view.size - view.data_start
        sized = [nm for nm, e in view.tensors.items() if e[3] > e[2]]
        if used > limit and len(sized) > 1:
            problems.append("%s: %d bytes > %d with %d non-empty tensors"
                            % (shards[i], used, limit, len(sized)))
        if i + 1 < len(ordered) and ordered[i + 1].tensors:
            first = ordered[i + 1].by_offset()[0][1]
            if used + (first[3] - first[2]) <= limit:
                problems.append("%s (%d bytes) could have taken the next %d-byte tensor"
                                % (shards[i], used, first[3] - first[2]))
    tap.ok(not problems and len(ordered) == len(shards),
           "%s: packed greedily within max_shard_size=%d" % (label, limit), problems)
    return views


def read_index(d):
    return read_bytes(os.path.join(d, INDEX))


def sharded_manifest(ctx):
    """(directory, manifest) of the "sharded" fixture; (directory, None) after a failed
    check when it is missing."""
    case_dir = os.path.join(ctx.fixtures, "sharded")
    if not os.path.isfile(os.path.join(case_dir, "manifest.json")):
        ctx.tap.ok(False, "sharded fixture present", ["no %s/manifest.json" % case_dir])
        return case_dir, None
    with open(os.path.join(case_dir, "manifest.json"), encoding="utf-8") as f:
        return case_dir, json.load(f)


def run_shard_tests(ctx, big_dir, big_want):
    tap = ctx.tap
    case_dir, manifest = sharded_manifest(ctx)
    if not manifest:
        return
    want, _ = manifest_want(manifest)
    total = sum(w["nbytes"] for w in want.values())
    biggest = max(w["nbytes"] for w in want.values())
    # Every closed shard plus the next tensor exceeds the limit and no shard exceeds it,
    # so total > 3 * limit guarantees at least four shards.
    limit = max(biggest, total // 4 - 1)
    source = os.path.normpath(os.path.join(case_dir, manifest["source"]))
    with mounted(ctx, source, "max_shard_size=%d" % limit, "sharded") as mnt:
        if mnt:
            hf = os.path.join(mnt, ".ckptfs", "hf")
            check_shard_set(tap, "sharded max_shard_size=%d" % limit, hf, want, limit, 3,
                            HF_SIDE_FILES)
            check_side_files(tap, "sharded max_shard_size=%d" % limit, hf, source)

    # Units: each spelling must give the same index as the plain byte count.
    for spelled, value in (("2KiB", 2048), ("2KB", 2000), ("2.5KB", 2500)):
        indexes = {}
        for opt in (spelled, str(value)):
            with mounted(ctx, source, "max_shard_size=" + opt, "sharded units %s" % opt) as mnt:
                if mnt:
                    hf = os.path.join(mnt, ".ckptfs", "hf")
                    problems = []
                    indexes[opt] = guarded(problems, read_index, hf)
                    if opt == spelled:
                        check_shard_set(tap, "sharded max_shard_size=%s" % opt, hf, want,
                                        value, 2, HF_SIDE_FILES)
        tap.ok(len(indexes) == 2 and None not in indexes.values() and
               indexes[spelled] == indexes[str(value)],
               "max_shard_size=%s gives the same shards as %d" % (spelled, value))

    # Boundary: shards appear only when the total exceeds the limit.
    for opt, single in ((str(total), True), (str(total - 1), False), ("5GB", True)):
        label = "sharded max_shard_size=%s (total %d)" % (opt, total)
        with mounted(ctx, source, "max_shard_size=" + opt, label) as mnt:
            if not mnt:
                continue
            hf = os.path.join(mnt, ".ckptfs", "hf")
            if single:
                check_listing(tap, label, hf, expected_listing(source, [SINGLE]))
                check_single_view(tap, label, os.path.join(hf, SINGLE), want)
            else:
                check_shard_set(tap, label, hf, want, total - 1, 2, HF_SIDE_FILES)

    # The dtypes case in tiny shards: every dtype, sub-byte ones included, stays aligned.
    dcase = os.path.join(ctx.fixtures, "dtypes")
    if os.path.isfile(os.path.join(dcase, "manifest.json")):
        with open(os.path.join(dcase, "manifest.json"), encoding="utf-8") as f:
            dman = json.load(f)
        dwant, _ = manifest_want(dman)
        dlimit = max(w["nbytes"] for w in dwant.values())
        with mounted(ctx, os.path.join(dcase, dman["source"]), "max_shard_size=%d" % dlimit,
                     "dtypes sharded") as mnt:
            if mnt:
                check_shard_set(tap, "dtypes max_shard_size=%d" % dlimit,
                                os.path.join(mnt, ".ckptfs", "hf"), dwant, dlimit, 3)

    # Odd names (control bytes, UTF-8, dots) and empty tensors in shards: once packed to the
    # biggest tensor, once with every non-empty tensor over the limit.
    ocase = os.path.join(ctx.fixtures, "odd")
    if os.path.isfile(os.path.join(ocase, "manifest.json")):
        with open(os.path.join(ocase, "manifest.json"), encoding="utf-8") as f:
            oman = json.load(f)
        owant, _ = manifest_want(oman)
        for olimit in (max(w["nbytes"] for w in owant.values()), 1):
            label = "odd max_shard_size=%d" % olimit
            with mounted(ctx, os.path.join(ocase, oman["source"]),
                         "max_shard_size=%d" % olimit, label) as mnt:
                if mnt:
                    check_shard_set(tap, label, os.path.join(mnt, ".ckptfs", "hf"), owant,
                                    olimit, 3)

    # A tensor larger than the limit gets a shard of its own.
    if big_dir:
        with mounted(ctx, big_dir, "max_shard_size=1MiB", "big 1MiB shards") as mnt:
            if mnt:
                hf = os.path.join(mnt, ".ckptfs", "hf")
                views = check_shard_set(tap, "big max_shard_size=1MiB", hf, big_want, 1 << 20,
                                        2, HF_SIDE_FILES)
                lone = [f for f, v in views.items() if "big.weight" in v.tensors]
                tap.ok(len(lone) == 1 and len(views[lone[0]].tensors) == 1,
                       "big: the 64 MiB tensor sits alone in its shard",
                       ["shards holding it: %r" % lone])

    for bad in ("abc", "12XB", "-1", "5GBx", "", "nan", "inf", "0", "0x10", " 5", "1e3"):
        expect_refused(ctx, source, "max_shard_size=" + bad, "max_shard_size", "sharded")


# ---------------------------------------------------------------------------
# 3. -o view=hf

def check_hf_root_docs(tap, label, mnt, ntensors):
    problems = []
    dot = os.path.join(mnt, ".ckptfs")
    try:
        got = set(os.listdir(dot))
        for f in ("summary.json", "metadata.json", "tensors.tsv"):
            if f not in got:
                problems.append("missing .ckptfs/%s" % f)
        json.loads(read_bytes(os.path.join(dot, "summary.json")))
        json.loads(read_bytes(os.path.join(dot, "metadata.json")))
        lines = read_bytes(os.path.join(dot, "tensors.tsv")).rstrip(b"\n").split(b"\n")
        if len(lines) != ntensors + 1:
            problems.append("tensors.tsv: %d lines, want %d" % (len(lines), ntensors + 1))
    except (OSError, ValueError) as e:
        problems.append(str(e))
    tap.ok(not problems, "%s: .ckptfs keeps summary.json, metadata.json, tensors.tsv (%d rows)"
           % (label, ntensors), problems)


def check_no_tensor_dirs(tap, label, mnt):
    problems = []
    for entry in os.scandir(mnt):
        if entry.is_dir(follow_symlinks=False) and entry.name != ".ckptfs":
            problems.append("directory at the root: %s" % entry.name)
        if entry.name.endswith(".json") and entry.name not in HF_SIDE_FILES | {INDEX}:
            problems.append("sidecar-like file at the root: %s" % entry.name)
    tap.ok(not problems, "%s: no tensor directories or sidecars at the root" % label, problems)


def run_view_tests(ctx):
    tap = ctx.tap
    case_dir, manifest = sharded_manifest(ctx)
    if not manifest:
        return
    want, _ = manifest_want(manifest)
    source = os.path.normpath(os.path.join(case_dir, manifest["source"]))
    total = sum(w["nbytes"] for w in want.values())

    label = "view=hf sharded"
    with mounted(ctx, source, "view=hf", label) as mnt:
        if mnt:
            check_listing(tap, label, mnt, expected_listing(source, [SINGLE, ".ckptfs"]))
            check_no_tensor_dirs(tap, label, mnt)
            check_single_view(tap, label, os.path.join(mnt, SINGLE), want)
            check_side_files(tap, label, mnt, source)
            check_hf_root_docs(tap, label, mnt, len(manifest["tensors"]))

    label = "view=hf,max_shard_size sharded"
    limit = total // 3
    with mounted(ctx, source, "view=hf,max_shard_size=%d" % limit, label) as mnt:
        if mnt:
            check_no_tensor_dirs(tap, label, mnt)
            check_shard_set(tap, label, mnt, want, limit, 3, HF_SIDE_FILES)
            check_side_files(tap, label, mnt, source)
            check_hf_root_docs(tap, label, mnt, len(manifest["tensors"]))

    dcase = os.path.join(ctx.fixtures, "dtypes")
    if os.path.isfile(os.path.join(dcase, "manifest.json")):
        with open(os.path.join(dcase, "manifest.json"), encoding="utf-8") as f:
            dman = json.load(f)
        label = "view=hf dtypes (single file)"
        with mounted(ctx, os.path.join(dcase, dman["source"]), "view=hf", label) as mnt:
            if mnt:
                check_listing(tap, label, mnt, {SINGLE, ".ckptfs"})
                check_single_view(tap, label, os.path.join(mnt, SINGLE), manifest_want(dman)[0])
                check_hf_root_docs(tap, label, mnt, len(dman["tensors"]))

    label = "view=tree sharded"
    with mounted(ctx, source, "view=tree", label) as mnt:
        if mnt:
            problems = []
            if not os.path.isdir(os.path.join(mnt, "model")):
                problems.append("no tensor directory 'model' at the root")
            if not os.path.isfile(os.path.join(mnt, ".ckptfs", "hf", SINGLE)):
                problems.append("no .ckptfs/hf/model.safetensors")
            if os.path.exists(os.path.join(mnt, SINGLE)):
                problems.append("model.safetensors at the root")
            tap.ok(not problems, "%s: tensor tree at the root, HF view in .ckptfs/hf" % label,
                   problems)

    for bad in ("bogus", ""):
        expect_refused(ctx, source, "view=" + bad, "view", "sharded")


# ---------------------------------------------------------------------------
# 4. mmap under concurrency

def hammer(path, expected, seed):
    """Fault random slices of path's mmap from several threads while pages are evicted
    under them; returns (problems, number of slices compared)."""
    problems, counts, mismatches = [], [0] * HAMMER_THREADS, []
    size = len(expected)
    fd = os.open(path, os.O_RDONLY)
    try:
        st = os.fstat(fd)
        if st.st_size != size:
            return ["st_size %d, expected %d" % (st.st_size, size)], 0
        mm = mmap.mmap(fd, size, prot=mmap.PROT_READ)
        mv, want = memoryview(mm), memoryview(expected)
        deadline = time.monotonic() + HAMMER_SECONDS
        stop = threading.Event()
        errors = []

        def worker(k):
            rng = random.Random(seed * 100 + k)
            try:
                while time.monotonic() < deadline and not stop.is_set():
                    off = rng.randrange(size)
                    length = rng.choice((1, 8, 4095, 4096, 65536, 1 << 20,
                                         rng.randrange(1, 300000)))
                    end = min(size, off + length)
                    if counts[k] % 2:
                        # hashlib releases the GIL on big buffers, so these page faults
                        # really run in parallel.
                        with mv[off:end] as s:
                            got = hashlib.sha256(s).digest()
                        same = got == hashlib.sha256(want[off:end]).digest()
                    else:
                        same = mm[off:end] == expected[off:end]
                    if not same:
                        mismatches.append((k, off, end - off))
                    counts[k] += 1
            except Exception as e:  # noqa: BLE001
                errors.append("thread %d: %s: %s" % (k, type(e).__name__, e))

        def evictor():
            # Drop our page-table entries and the page cache so faults keep reaching FUSE.
            while not stop.wait(0.2):
                try:
                    mm.madvise(mmap.MADV_DONTNEED)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                except OSError as e:
                    errors.append("evict: %s" % e)
                    return

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(HAMMER_THREADS)]
        ev = threading.Thread(target=evictor)
        for t in threads:
            t.start()
        ev.start()
        for t in threads:
            t.join()
        stop.set()
        ev.join()
        want.release()
        mv.release()
        mm.close()
        problems += errors
        for k, off, n in mismatches[:10]:
            problems.append("thread %d: %d bytes at offset %d differ" % (k, n, off))
        if mismatches:
            problems.append("%d mismatching slices in all" % len(mismatches))
        if min(counts) == 0:
            problems.append("a thread compared nothing: %r" % counts)
        return problems, sum(counts)
    finally:
        os.close(fd)


def memmap_checks(path, expected, view, numeric):
    """numpy.memmap over the whole file, and over tensors as typed arrays."""
    import numpy as np
    problems = []
    m = np.memmap(path, dtype=np.uint8, mode="r")
    try:
        if m.shape != (len(expected),):
            problems.append("memmap shape %r, want %d" % (m.shape, len(expected)))
        elif sha(m) != sha(expected):
            problems.append("sha256 of the whole file differs")
        for name, (npdt, want_arr) in numeric.items():
            _, shape, begin, _ = view.tensors[name]
            arr = np.ndarray(shape, dtype=npdt, buffer=m, offset=view.data_start + begin)
            if not np.array_equal(arr, want_arr):
                problems.append("%r: numpy values differ" % name)
    finally:
        m._mmap.close()
    return problems


def run_mmap_case(ctx, label, source, expected_tensor_bytes, numeric, side_source=None):
    """expected_tensor_bytes: name -> bytes the view must serve; numeric: name ->
    (numpy dtype, array) compared through typed memmaps."""
    tap = ctx.tap
    with mounted(ctx, source, None, label) as mnt:
        if not mnt:
            return
        hf = os.path.join(mnt, ".ckptfs", "hf")
        path = os.path.join(hf, SINGLE)
        problems = []
        view, expected = None, None
        try:
            # Only the header is read through the mount: the tensor bytes come from
            # the source, so the page cache holds nothing of them yet.
            head, size = read_prefix(path)
            view = parse_strict(head, size)
            if set(view.tensors) != set(expected_tensor_bytes):
                problems.append("tensors %r, want %r" % (sorted(view.tensors),
                                                         sorted(expected_tensor_bytes)))
            else:
                expected = head[:view.data_start] + b"".join(
                    expected_tensor_bytes[name] for name, _ in view.by_offset())
                if len(expected) != size:
                    problems.append("expected %d bytes, st_size %d" % (len(expected), size))
        except (OSError, Invalid) as e:
            problems.append(str(e))
        tap.ok(not problems and expected is not None,
               "%s: header valid; expected view bytes built from the source (%d bytes)"
               % (label, len(expected or b"")), problems)
        if expected is None or problems:
            return
        problems, n = [], 0
        try:
            problems, n = hammer(path, expected, seed=len(expected))
        except Exception as e:  # noqa: BLE001
            problems.append("%s: %s" % (type(e).__name__, e))
        tap.ok(not problems, "%s: %d threads x %.0f s of random mmap slices (%d compared, "
               "pages evicted under them): zero mismatches"
               % (label, HAMMER_THREADS, HAMMER_SECONDS, n), problems)
        problems = []
        try:
            problems = memmap_checks(path, expected, view, numeric)
        except Exception as e:  # noqa: BLE001
            problems.append("%s: %s" % (type(e).__name__, e))
        tap.ok(not problems, "%s: numpy.memmap of the whole file: sha256 equal%s"
               % (label, "; typed tensors equal" if numeric else ""), problems)
        if side_source:
            check_side_files(tap, label, hf, side_source)


def make_big_source(root):
    """An HF directory: a 64 MiB F32 tensor and small ones, deliberately unaligned."""
    import numpy as np
    rng = np.random.default_rng(3232)
    big = rng.standard_normal(16 << 20, dtype=np.float32)
    ln = rng.standard_normal(5, dtype=np.float32)
    arrays = {
        "big.weight": ("F32", big),
        "model.norm.weight": ("F32", ln),
        "lm_head.bias": ("F16", rng.standard_normal(3).astype("<f2")),
        "a.tiny": ("U8", rng.integers(0, 256, 3, dtype=np.uint8)),
        "b.steps": ("I64", np.array(123456789012, dtype="<i8")),
        "c.scale": ("F64", rng.standard_normal(2).astype("<f8")),
        "d.mask": ("BOOL", rng.integers(0, 2, 7).astype(bool)),
    }
    # Odd sizes first, so the source's wide tensors are misaligned.
    order = ["a.tiny", "lm_head.bias", "big.weight", "d.mask", "b.steps", "model.norm.weight",
             "c.scale"]
    tensors = [(n, arrays[n][0], list(arrays[n][1].shape), arrays[n][1].tobytes())
               for n in order]
    write_safetensors(os.path.join(root, SINGLE), tensors, misalign_to=3)
    with open(os.path.join(root, "config.json"), "w", encoding="utf-8") as f:
        f.write('{\n  "model_type": "test",\n  "hidden_size": 5\n}\n')
    with open(os.path.join(root, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        f.write('{"model_max_length": 8, "note": "\u00e9t\u00e9"}\n')
    by_name = {n: b for n, _, _, b in tensors}
    want = {n: {"dtype": dt, "shape": sh, "nbytes": len(b), "sha256": sha(b)}
            for n, dt, sh, b in tensors}
    numeric = {"big.weight": ("<f4", big), "c.scale": ("<f8", arrays["c.scale"][1]),
               "b.steps": ("<i8", arrays["b.steps"][1])}
    return by_name, want, numeric


def run_mmap_tests(ctx, big_dir, big_bytes, big_numeric):
    dcase = os.path.join(ctx.fixtures, "dtypes")
    mpath = os.path.join(dcase, "manifest.json")
    if os.path.isfile(mpath):
        with open(mpath, encoding="utf-8") as f:
            dman = json.load(f)
        src_bytes, numeric = {}, {}
        import numpy as np
        for t in dman["tensors"]:
            with open(os.path.join(dcase, t["file"]), "rb") as f:
                f.seek(t["offset"])
                b = f.read(t["nbytes"])
            src_bytes[t["name"]] = b
            if t.get("numpy_dtype") and t["numpy_dtype"] != "|b1":
                numeric[t["name"]] = (t["numpy_dtype"],
                                      np.frombuffer(b, dtype=t["numpy_dtype"]).reshape(t["shape"]))
        run_mmap_case(ctx, "mmap dtypes", os.path.join(dcase, dman["source"]), src_bytes,
                      numeric)
    else:
        ctx.tap.ok(False, "dtypes fixture present", ["no %s" % mpath])
    if big_dir:
        run_mmap_case(ctx, "mmap big (64 MiB F32 + small)", big_dir, big_bytes, big_numeric,
                      side_source=big_dir)


# ---------------------------------------------------------------------------

def main(tap, ckptfs, fixtures):
    ctx = Ctx(tap, ckptfs, fixtures)
    big_dir = tempfile.mkdtemp(prefix="ckptfs-t32-src.")
    try:
        cases = case_dirs(fixtures)
        tap.ok(bool(cases), "found fixture cases with manifest.json in %s" % fixtures)
        for case in cases:
            run_fixture_case(ctx, case)
        run_hostile_mount_cases(ctx)
        run_other_format_cases(ctx, set(cases))

        big_bytes, big_want, big_numeric = make_big_source(big_dir)
        run_shard_tests(ctx, big_dir, big_want)
        run_view_tests(ctx)
        run_mmap_tests(ctx, big_dir, big_bytes, big_numeric)
    finally:
        shutil.rmtree(big_dir, ignore_errors=True)
        ctx.san.cleanup()


if __name__ == "__main__":
    sys.exit(run(main))
