#!/usr/bin/python3
"""Mount PyTorch DCP "HuggingFace storage" fixtures and check every view of them.

Environment:
  CKPTFS    path of the ckptfs binary
  FIXTURES  output root of the fixture generators; this test reads
            FIXTURES/dcphf, written by tests/gen/dcphf_fixtures.py

For every case with a manifest.json: the mount shows each tensor once with its
full shape; raw bytes (whole-file sha256 and 200 random preads per tensor)
equal the tensor assembled here, with numpy, from the chunk list in the
manifest; sidecars carry shape, dtype, the incomplete flag and one source per
chunk with its box; summary.json has the format and the incomplete count and
warnings; reads inside a hole fail with EIO while reads of fully covered pages
work; .ckptfs/hf holds exactly the complete tensors, checked with a strict
safetensors reader; big tensors are also read through mmap from 3 threads.
Every row of FIXTURES/dcphf/hostile/cases.tsv must be refused: exit status 2,
one stderr line containing the needle, nothing mounted, within 10 s.
"""

import ctypes
import errno
import hashlib
import json
import mmap
import os
import random
import stat
import sys
import threading

import numpy as np

CASE_TIMEOUT = 180
RANDOM_READS = 200
PAGE = 4096
MMAP_MIN_BYTES = 1 << 20
MMAP_THREADS = 3
MMAP_PAGES_PER_THREAD = 400

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
import hostile  # noqa: E402
from mount_checks import (ITEMSIZE, case_dirs, check_hf_view, check_tree,  # noqa: E402
                          field_problems, mounted, read_bytes, run)

LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.memcmp.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
LIBC.memcmp.restype = ctypes.c_int


# ---------------------------------------------------------------------------
# The expected tensor, assembled from the manifest's chunk list

class Expected:
    """Full row-major bytes and a per-byte coverage mask of one tensor."""

    def __init__(self, src_dir, t):
        es = ITEMSIZE[t["dtype"]]
        shape = list(t["shape"])
        full = np.zeros(shape + [es], dtype=np.uint8)
        mask = np.zeros(shape, dtype=bool)
        for c in t["chunks"]:
            n = es
            for s in c["sizes"]:
                n *= s
            with open(os.path.join(src_dir, c["file"]), "rb") as f:
                f.seek(c["data_offset"])
                raw = f.read(n)
            if len(raw) != n:
                raise ValueError("chunk in %s: short read" % c["file"])
            box = tuple(slice(o, o + s) for o, s in zip(c["offsets"], c["sizes"]))
            full[box] = np.frombuffer(raw, dtype=np.uint8).reshape(list(c["sizes"]) + [es])
            mask[box] = True
        self.data = full.tobytes()
        self.covered = np.repeat(mask.reshape(-1), es)
        self.complete = bool(self.covered.all())
        # Page-aligned byte runs whose every page is fully covered: the only
        # places an incomplete tensor can be read through the page cache.
        self.safe = []
        n = len(self.data)
        start = None
        for p in range(0, n, PAGE):
            ok = bool(self.covered[p:p + PAGE].all())
            if ok and start is None:
                start = p
            if not ok and start is not None:
                self.safe.append((start, p))
                start = None
        if start is not None:
            self.safe.append((start, n))


# ---------------------------------------------------------------------------
# Checks on one mounted case

def check_raw(tap, label, raw, t, exp):
    problems = []
    try:
        st = os.stat(raw)
        if not stat.S_ISREG(st.st_mode):
            problems.append("not a regular file")
        if st.st_size != t["nbytes"]:
            problems.append("st_size %d, want %d" % (st.st_size, t["nbytes"]))
        if len(exp.data) != t["nbytes"]:
            problems.append("TEST BUG: assembled %d bytes" % len(exp.data))
        if t["incomplete"] == exp.complete:
            problems.append("TEST BUG: manifest incomplete=%r" % t["incomplete"])
        if not t["incomplete"]:
            if hashlib.sha256(exp.data).hexdigest() != t["sha256"]:
                problems.append("TEST BUG: assembled bytes do not match the manifest sha256")
            data = read_bytes(raw)
            if len(data) != t["nbytes"]:
                problems.append("read %d bytes, want %d" % (len(data), t["nbytes"]))
            elif hashlib.sha256(data).hexdigest() != t["sha256"]:
                bad = next(i for i in range(len(data)) if data[i] != exp.data[i])
                problems.append("sha256 mismatch, first differing byte at %d" % bad)
    except OSError as e:
        problems.append(str(e))
    what = "size" if t["incomplete"] else "size and sha256"
    tap.ok(not problems, "%s raw file: %s" % (label, what), problems)


def box_of(src):
    box = src.get("box")
    if box is None:
        return None
    return (tuple(box.get("offsets", ())), tuple(box.get("sizes", ())))


def check_sidecar(tap, label, mnt, t, fmt, src_rel):
    problems = []
    try:
        sc = json.loads(read_bytes(os.path.join(mnt, t["path"] + ".json")))
        problems += field_problems(sc, {k: t[k] for k in ("name", "dtype", "shape", "nbytes")})
        if fmt == "dcp-hf" and sc.get("format") != "dcp-hf":
            problems.append("format %r, want dcp-hf" % sc.get("format"))
        if fmt != "dcp-hf" and sc.get("format") == "dcp-hf":
            problems.append("format dcp-hf, but the HF files should have won")
        if t["numpy_dtype"] and sc.get("numpy_dtype") != t["numpy_dtype"]:
            problems.append("numpy_dtype %r, want %r" % (sc.get("numpy_dtype"), t["numpy_dtype"]))
        inc = sc.get("incomplete", False)
        if inc is not t["incomplete"]:
            problems.append("incomplete %r, want %r" % (sc.get("incomplete"), t["incomplete"]))

        es = ITEMSIZE[t["dtype"]]
        chunks = {}
        for c in t["chunks"]:
            n = es
            for s in c["sizes"]:
                n *= s
            chunks[(c["file"], c["data_offset"])] = (n, (tuple(c["offsets"]), tuple(c["sizes"])))
        whole = (tuple([0] * len(t["shape"])), tuple(t["shape"]))
        sources = sc.get("sources")
        if not isinstance(sources, list):
            raise ValueError("sources is %r" % (sources,))
        seen_boxes = set()
        for s in sources:
            f = str(s.get("file"))
            key = next((k for k in chunks if f == k[0] or f.endswith("/" + k[0]) or
                        f == os.path.join(src_rel, k[0])), None)
            key = (key[0], s.get("offset")) if key else None
            if key not in chunks:
                problems.append("source %r is not a chunk of the manifest" % (s,))
                continue
            length, box = chunks[key]
            if s.get("length") != length:
                problems.append("source %s@%r: length %r, want %d"
                                % (f, s.get("offset"), s.get("length"), length))
            got = box_of(s)
            if got is None:
                if box != whole and t["shape"]:
                    problems.append("source %s@%r has no box but covers %r"
                                    % (f, s.get("offset"), box))
                got = box
            if got != box:
                problems.append("source %s@%r: box %r, want %r" % (f, s.get("offset"), got, box))
            seen_boxes.add(box)
        # Replicas may be listed once; every distinct non-empty box must appear.
        for length, box in chunks.values():
            if length and box not in seen_boxes:
                problems.append("no source for chunk box %r" % (box,))
    except (OSError, ValueError, AttributeError, TypeError) as e:
        problems.append("%s.json: %s" % (t["path"], e))
    tap.ok(not problems, "%s sidecar: shape, dtype, incomplete, sources with boxes" % label,
           problems)


def random_ranges(rnd, exp, count):
    n = len(exp.data)
    if not n:
        return []
    if exp.complete:
        regions = [(0, n)]
    else:
        regions = exp.safe
    if not regions:
        return []
    out = []
    for i in range(count):
        lo, hi = rnd.choice(regions)
        if exp.complete and i % 10 == 0:
            off = rnd.randrange(lo, hi + 64)        # reads at or past EOF
        else:
            off = rnd.randrange(lo, hi)
        span = hi - off if off < hi else 64
        length = rnd.randrange(1, max(2, min(span, 64 if i % 2 else 1 << 18) + 1))
        if not exp.complete:
            length = min(length, hi - off)
        out.append((off, length))
    return out


def check_random_reads(tap, label, raw, case, t, exp):
    problems = []
    rnd = random.Random("%s/%s" % (case, t["name"]))
    ranges = random_ranges(rnd, exp, RANDOM_READS)
    if not ranges:
        return
    try:
        fd = os.open(raw, os.O_RDONLY)
        try:
            for off, length in ranges:
                got = os.pread(fd, length, off)
                want = exp.data[off:off + length]
                if got != want:
                    problems.append("pread(%d, %d): %d bytes, %s"
                                    % (off, length, len(got),
                                       "short" if len(got) != len(want) else "bytes differ"))
                    if len(problems) > 5:
                        break
        finally:
            os.close(fd)
    except OSError as e:
        problems.append(str(e))
    tap.ok(not problems, "%s: %d random preads equal the assembled bytes" % (label, len(ranges)),
           problems)


def check_hole(tap, label, raw, t, exp):
    """Reads touching the hole fail with EIO; fully covered pages still read;
    the file keeps its size afterwards."""
    problems = []
    holes = np.flatnonzero(~exp.covered)
    first, last = int(holes[0]), int(holes[-1])
    try:
        fd = os.open(raw, os.O_RDONLY)
        try:
            for off, length in ((first, 1), (last, 1), ((first + last) // 2, 16)):
                try:
                    got = os.pread(fd, length, off)
                    problems.append("pread(%d, %d) inside the hole returned %d bytes, want EIO"
                                    % (off, length, len(got)))
                except OSError as e:
                    if e.errno != errno.EIO:
                        problems.append("pread(%d, %d) inside the hole: %s, want EIO"
                                        % (off, length, e))
            try:
                with open(raw, "rb") as f:
                    f.read()
                problems.append("reading the whole file succeeded, want EIO")
            except OSError as e:
                if e.errno != errno.EIO:
                    problems.append("reading the whole file: %s, want EIO" % e)
            for lo, hi in exp.safe:
                length = min(PAGE, hi - lo)
                for off in (lo, hi - length):
                    got = os.pread(fd, length, off)
                    if got != exp.data[off:off + length]:
                        problems.append("pread(%d, %d) outside the hole: %d bytes, want the "
                                        "chunk's bytes" % (off, length, len(got)))
            size = os.fstat(fd).st_size
            if size != t["nbytes"]:
                problems.append("after the failed reads st_size is %d, want %d"
                                % (size, t["nbytes"]))
        finally:
            os.close(fd)
    except OSError as e:
        problems.append(str(e))
    desc = "EIO inside the hole"
    if exp.safe:
        desc += ", %d covered page run(s) read fine" % len(exp.safe)
    tap.ok(not problems, "%s: %s" % (label, desc), problems)


def check_mmap_threads(tap, label, raw, t, exp):
    problems = []
    n = t["nbytes"]
    want = np.frombuffer(exp.data, dtype=np.uint8)
    want_addr = want.ctypes.data
    try:
        with open(raw, "rb") as f:
            mm = mmap.mmap(f.fileno(), n, prot=mmap.PROT_READ)
        view = np.frombuffer(mm, dtype=np.uint8)
        addr = view.ctypes.data
        errors = []
        lock = threading.Lock()

        def worker(seed):
            rnd = random.Random(seed)
            npages = (n + PAGE - 1) // PAGE
            for _ in range(MMAP_PAGES_PER_THREAD):
                p = rnd.randrange(npages)
                off = p * PAGE
                length = min(PAGE, n - off)
                # memcmp through ctypes drops the GIL: the page faults of the
                # three threads really run at the same time.
                if LIBC.memcmp(addr + off, want_addr + off, length) != 0:
                    with lock:
                        errors.append("page %d differs" % p)
                        return

        threads = [threading.Thread(target=worker, args=("%s/%d" % (t["name"], k),))
                   for k in range(MMAP_THREADS)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        problems += errors[:5]
        # A final full comparison of the mapping.
        if LIBC.memcmp(addr, want_addr, n) != 0:
            problems.append("the whole mapping differs from the assembled bytes")
        del view
        mm.close()
    except (OSError, ValueError) as e:
        problems.append(str(e))
    tap.ok(not problems, "%s: mmap read from %d threads at random pages" % (label, MMAP_THREADS),
           problems)


def check_summary(tap, case, mnt, manifest):
    problems = []
    tensors = manifest["tensors"]
    try:
        summary = json.loads(read_bytes(os.path.join(mnt, ".ckptfs", "summary.json")))
        fmt = summary.get("format")
        if manifest["format"] == "dcp-hf":
            if fmt != "dcp-hf":
                problems.append("format %r, want dcp-hf" % fmt)
        elif fmt == "dcp-hf":
            problems.append("format dcp-hf, but the top-level HF files should have won")
        if summary.get("tensor_count") != len(tensors):
            problems.append("tensor_count %r, want %d" % (summary.get("tensor_count"),
                                                          len(tensors)))
        if summary.get("incomplete_tensors") != manifest["incomplete_tensors"]:
            problems.append("incomplete_tensors %r, want %d"
                            % (summary.get("incomplete_tensors"), manifest["incomplete_tensors"]))
        warnings = summary.get("warnings")
        if not isinstance(warnings, list):
            problems.append("warnings is %r" % (warnings,))
            warnings = []
        for t in tensors:
            if t["incomplete"] and not any(t["name"] in str(w) for w in warnings):
                problems.append("no warning names incomplete tensor %s" % t["name"])
        json.loads(read_bytes(os.path.join(mnt, ".ckptfs", "metadata.json")))
        lines = read_bytes(os.path.join(mnt, ".ckptfs", "tensors.tsv")).splitlines()
        if len(lines) != len(tensors) + 1:
            problems.append("tensors.tsv has %d lines, want %d" % (len(lines), len(tensors) + 1))
    except (OSError, ValueError) as e:
        problems.append(str(e))
    tap.ok(not problems, "%s: summary.json format, counts, incomplete warnings; metadata.json, "
           "tensors.tsv" % case, problems)


def run_case(tap, ckptfs, root, case):
    case_dir = os.path.join(root, case)
    with open(os.path.join(case_dir, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    src = os.path.normpath(os.path.join(case_dir, manifest["source"]))
    tensors = manifest["tensors"]
    expected = {t["name"]: Expected(src, t) for t in tensors}

    def checks(mnt):
        for t in tensors:
            label = "%s: %s" % (case, t["name"])
            raw = os.path.join(mnt, t["path"])
            exp = expected[t["name"]]
            check_raw(tap, label, raw, t, exp)
            check_sidecar(tap, label, mnt, t, manifest["format"], manifest["source"])
            check_random_reads(tap, label, raw, case, t, exp)
            if t["incomplete"]:
                check_hole(tap, label, raw, t, exp)
            elif t["nbytes"] >= MMAP_MIN_BYTES:
                check_mmap_threads(tap, label, raw, t, exp)
        check_tree(tap, case, mnt, tensors, "every tensor appears once (raw file + sidecar)")
        check_summary(tap, case, mnt, manifest)
        check_hf_view(tap, case, mnt, {t["name"]: t for t in tensors if not t["incomplete"]},
                      ".ckptfs/hf holds exactly the complete tensors, same bytes")

    mounted(tap, ckptfs, src, case, checks, mount_desc="%s: mount %s" % (case, manifest["source"]),
            timeout=CASE_TIMEOUT)


def main(tap, ckptfs, root):
    cases = case_dirs(root)
    tap.ok(bool(cases), "found %d DCP-HF fixture cases in %s" % (len(cases), root))
    for case in cases:
        run_case(tap, ckptfs, root, case)
    hostile.run_cases(tap, ckptfs, os.path.join(root, "hostile"))


if __name__ == "__main__":
    sys.exit(run(main, "dcphf", "dcphf_fixtures.py"))
