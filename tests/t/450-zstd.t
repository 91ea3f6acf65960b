#!/usr/bin/python3
"""Seekable zstd sources: a .zst is read through its seek table, without decompressing it whole.

Environment: CKPTFS (the binary), FIXTURES (where tests/gen/zstd_fixtures.py wrote zstd/).

For every good case (frames of 1 MiB, of 1 byte, inside the header, larger than the reader's
cache, skippable and empty frames, frames without content size or checksum, a GGUF file):
random-offset preads from two threads, before anything is cached, equal the plain file's
bytes; every tensor has the manifest's size and sha256, also through mmap and through two
threads reading 1 MiB blocks in turn; every file of the mount equals the plain checkpoint's
mount (sidecars and documents with the source's name changed); `ckptfs cat` and `ckptfs
verify` read it too. Ordinary zstd files are refused with the way to a seekable one. Hostile
seek tables and frames are refused (exit 2, one line naming the field) or mount safely; damage
found only when a frame is read gives EIO for the tensors in it, the right bytes for the
others, and the daemon lives on. A tensor larger than the frame cache, converted here, is read
by sequential streams (decoded ahead by the daemon's workers) beside random readers.
"""

import errno
import hashlib
import json
import mmap
import os
import random
import struct
import sys
import tempfile
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib",
                                "readers"))
import gguf_reader  # noqa: E402
import hostile  # noqa: E402
from dequant import CONVERT  # noqa: E402
from ckptfs_test import run_capture  # noqa: E402
from mount_checks import case_dirs, mounted, read_bytes, read_json, run, tree_bytes  # noqa: E402

CLI_TIMEOUT = 60
RANDOM_READS = 300


def sha(data):
    return hashlib.sha256(data).hexdigest()


def plain_tensors(path):
    """{name: bytes} of a plain safetensors file, read here."""
    data = read_bytes(path)
    (hlen,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + hlen])
    header.pop("__metadata__", None)
    base = 8 + hlen
    return {n: data[base + e["data_offsets"][0]:base + e["data_offsets"][1]]
            for n, e in header.items()}




def drop_cache(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def random_reads(tap, label, files, seed):
    """files: [(mount path, expected bytes)]. Two threads pread random ranges (1 byte to
    256 KiB) with FADV_RANDOM, before the mount has cached anything."""
    problems = []

    def worker(k):
        rng = random.Random(seed * 10 + k)
        fds = {}
        try:
            for path, _ in files:
                fds[path] = os.open(path, os.O_RDONLY)
                os.posix_fadvise(fds[path], 0, 0, os.POSIX_FADV_RANDOM)
            weights = [max(1, len(want)) for _, want in files]
            for _ in range(RANDOM_READS):
                path, want = rng.choices(files, weights)[0]
                if not want:
                    continue
                off = rng.randrange(len(want))
                n = rng.choice((1, 7, 4096, 65536, 262144))
                got = os.pread(fds[path], n, off)
                if got != want[off:off + n]:
                    problems.append("%s: %d bytes at %d differ" % (path, n, off))
                    return
        except OSError as e:
            problems.append("thread %d: %s" % (k, e))
        finally:
            for fd in fds.values():
                os.close(fd)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    tap.ok(not problems, "%s: %d random preads from 2 threads equal the plain bytes"
           % (label, 2 * RANDOM_READS), problems[:5])


def interleaved_read(path, size):
    """The file read by two threads taking 1 MiB blocks in turn, like readahead workers."""
    blocks, errors = {}, []

    def worker(k):
        try:
            fd = os.open(path, os.O_RDONLY)
            try:
                for i in range(k, (size + (1 << 20) - 1) >> 20, 2):
                    blocks[i] = os.pread(fd, 1 << 20, i << 20)
            finally:
                os.close(fd)
        except OSError as e:
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return b"".join(blocks[i] for i in sorted(blocks))


# ---------------------------------------------------------------------------

def reference_tensors(tap, root, m, cache):
    """{manifest path: bytes} of every tensor of the plain checkpoint, read by this test's own
    readers (safetensors here, GGUF by tests/lib/readers/gguf_reader.py), never by ckptfs.
    One TAP line: the reference was built and agrees with the generator's manifest; a
    reference that cannot be built fails it (and the comparisons then fail, not pass)."""
    plain = os.path.join(root, m["plain"])
    if plain not in cache:
        problems, by_name = [], {}
        try:
            if m["format"] == "gguf":
                g = gguf_reader.read(plain)
                by_name = {t.name: gguf_reader.tensor_bytes(g, t) for t in g.tensors}
            else:
                by_name = plain_tensors(plain)
        except (OSError, ValueError, KeyError, struct.error, gguf_reader.GGUFError) as e:
            problems.append("%s: %s" % (m["plain"], e))
        cache[plain] = by_name, problems
    by_name, problems = cache[plain]
    problems = list(problems)
    got = {}
    for t in m["tensors"]:
        data = by_name.get(t["name"])
        if data is None or len(data) != t["nbytes"] or sha(data) != t["sha256"]:
            problems.append("%s: %s" % (t["name"], "missing" if data is None else
                                        "%d bytes, sha256 differs from the manifest" % len(data)))
        else:
            got[t["path"]] = data
    tap.ok(not problems, "reference: %d tensors of %s read by the tests' own reader equal the "
           "manifest" % (len(got), m["plain"]), problems[:5])
    return got


def plain_mount(tap, ckptfs, path, cache):
    """Every file of the plain checkpoint's mount: the reference for the files that are not
    tensor bytes (sidecars, documents), which a .zst must not change either. Its mount and
    unmount are TAP lines: a reference mount that fails fails the test."""
    if path not in cache:
        got = {}
        mounted(tap, ckptfs, path, "reference %s" % os.path.basename(path),
                lambda mnt: got.update(tree_bytes(mnt)))
        tap.ok(bool(got), "reference mount of %s has files (%d)" % (path, len(got)))
        cache[path] = got
    return cache[path]


def run_good(tap, ckptfs, root, case, plain_cache, reader_cache):
    d = os.path.join(root, case)
    m = read_json(os.path.join(d, "manifest.json"))
    src = os.path.join(d, m["source"])
    plain = os.path.join(root, m["plain"])
    want = reference_tensors(tap, root, m, reader_cache)
    reference = plain_mount(tap, ckptfs, plain, plain_cache)
    tensors = m["tensors"]

    def checks(mnt):
        if tensors:
            files = [(os.path.join(mnt, t["path"]), want.get(t["path"], b""))
                     for t in tensors if t["nbytes"]]
            random_reads(tap, case, files, len(case))
        problems = []
        for t in tensors:
            raw = os.path.join(mnt, t["path"])
            try:
                data = read_bytes(raw)
                if len(data) != t["nbytes"] or sha(data) != t["sha256"]:
                    problems.append("%s: %d bytes, sha256 differs" % (t["name"], len(data)))
            except OSError as e:
                problems.append("%s: %s" % (t["name"], e))
        tap.ok(not problems, "%s: %d tensors: sizes and sha256 of the manifest"
               % (case, len(tensors)), problems)
        if tensors:
            big = max(tensors, key=lambda t: t["nbytes"])
            raw = os.path.join(mnt, big["path"])
            problems = []
            try:
                with open(raw, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as mm:
                    if sha(mm[:]) != big["sha256"]:
                        problems.append("mmap: sha256 differs")
                drop_cache(raw)
                if sha(interleaved_read(raw, big["nbytes"])) != big["sha256"]:
                    problems.append("interleaved 1 MiB reads: sha256 differs")
            except OSError as e:
                problems.append(str(e))
            tap.ok(not problems, "%s: %s through mmap and 2 threads of 1 MiB reads"
                   % (case, big["name"]), problems)
        got = tree_bytes(mnt, ((os.path.realpath(src), os.path.realpath(plain)),
                         (m["source"], os.path.basename(plain))))
        problems = ["missing " + p for p in sorted(set(reference) - set(got))]
        problems += ["unexpected " + p for p in sorted(set(got) - set(reference))]
        problems += ["differs: " + p for p in sorted(set(got) & set(reference))
                     if got[p] != reference[p]]
        problems += ["tensor %s: not the reader's bytes" % p for p in want
                     if got.get(p) != want[p]]
        tap.ok(not problems, "%s: all %d files equal the plain %s's mount"
               % (case, len(got), os.path.basename(plain)), problems[:10])

    mounted(tap, ckptfs, src, case, checks)

    if not tensors:
        return
    t = tensors[len(tensors) // 2]
    rc, out, err = run_capture([ckptfs, "cat", src, t["name"]], CLI_TIMEOUT)
    tap.ok(rc == 0 and sha(out) == t["sha256"], "%s: ckptfs cat %s" % (case, t["name"]),
           ["exit %r" % rc, err.decode(errors="replace")])
    with tempfile.TemporaryDirectory() as work:
        manifest = os.path.join(work, "manifest.json")
        rc1, _, err1 = run_capture([ckptfs, "verify", plain, "--write-manifest", manifest],
                                   CLI_TIMEOUT)
        rc2, out2, err2 = run_capture([ckptfs, "verify", src, "--manifest", manifest],
                                      CLI_TIMEOUT)
    tap.ok(rc1 == 0 and rc2 == 0 and b"%d OK" % len(tensors) in out2,
           "%s: ckptfs verify against the plain file's manifest" % case,
           ["exit %r, %r" % (rc1, rc2), err1.decode(errors="replace"),
            out2.decode(errors="replace")[-300:], err2.decode(errors="replace")])


def run_options(tap, ckptfs, root, reader_cache):
    """-o splice (the kernel cannot splice decompressed bytes: they are copied) and
    -o as_dtype=f32 (GGUF blocks converted on read) give the plain file's bytes, as this
    test's own readers and dequantizers (tests/lib/readers/dequant.py) compute them."""
    for case, opts in (("aligned-1mib", "splice"), ("gguf-frames", "as_dtype=f32,splice")):
        d = os.path.join(root, case)
        m = read_json(os.path.join(d, "manifest.json"))
        raw = reference_tensors(tap, root, m, reader_cache)
        want = {}
        for t in m["tensors"]:
            if t["path"] not in raw:
                continue
            convert = CONVERT.get(t["dtype"]) if "as_dtype=f32" in opts else None
            path = t["path"]
            if convert:
                # A converted tensor is shown under its F32 name (NAME.raw stays NAME.raw).
                want[path] = convert(raw[path]).tobytes()
            else:
                want[path] = raw[path]
        got = {}
        mounted(tap, ckptfs, os.path.join(d, m["source"]), "%s -o %s" % (case, opts),
                lambda mnt: got.update({p: read_bytes(os.path.join(mnt, p)) for p in want}),
                options=["-o", opts])
        converted = sum(1 for t in m["tensors"] if "as_dtype" in opts and t["dtype"] in CONVERT)
        bad = [p for p in want if got.get(p) != want[p]]
        tap.ok(len(want) == len(m["tensors"]) and want and not bad,
               "%s -o %s: %d tensors (%d converted) equal the reference" %
               (case, opts, len(want), converted), bad)


def run_changed(tap, ckptfs, root):
    """A .zst that changes under the mount: reads fail with EIO, never other bytes."""
    d = os.path.join(root, "aligned-1mib")
    m = read_json(os.path.join(d, "manifest.json"))
    t = max(m["tensors"], key=lambda x: x["nbytes"])
    with tempfile.TemporaryDirectory() as work:
        src = os.path.join(work, m["source"])
        with open(os.path.join(d, m["source"]), "rb") as f, open(src, "wb") as g:
            g.write(f.read())

        def checks(mnt):
            with open(src, "ab") as f:
                f.write(b"\0")
            try:
                read_bytes(os.path.join(mnt, t["path"]))
                tap.ok(False, "source grown under the mount: read fails with EIO")
            except OSError as e:
                tap.ok(e.errno == errno.EIO, "source grown under the mount: read fails with EIO",
                       [str(e)])

        mounted(tap, ckptfs, src, "changed source", checks)


def run_nonseekable(tap, ckptfs, root):
    d = os.path.join(root, "nonseekable")
    for name in read_json(os.path.join(d, "cases.json")):
        src = os.path.join(d, name)
        hostile.check_refuse(tap, ckptfs, d, {"path": name, "options": "",
                                              "needle": "without a seek table&zstd -d&ckptfs "
                                              "convert", "description": "ordinary zstd"})
        rc, _, err = run_capture([ckptfs, "ls", src], CLI_TIMEOUT)
        tap.ok(rc == 2 and b"not seekable" in err, "%s: ckptfs ls refuses it too" % name,
               ["exit %r" % rc, err.decode(errors="replace")])


def run_late(tap, ckptfs, root):
    hdir = os.path.join(root, "hostile")
    late = read_json(os.path.join(hdir, "late.json"))
    tap.ok(len(late) >= 5, "hostile/late.json lists %d files" % len(late))
    for name, spec in sorted(late.items()):
        src = os.path.join(hdir, name)
        want = plain_tensors(os.path.join(root, spec["plain"]))

        def checks(mnt):
            problems = []
            for t in spec["bad"]:
                try:
                    read_bytes(os.path.join(mnt, t))
                    problems.append("%s: read without error" % t)
                except OSError as e:
                    if e.errno != errno.EIO:
                        problems.append("%s: %s, want EIO" % (t, e))
            for t in spec["good"]:
                try:
                    if read_bytes(os.path.join(mnt, t)) != want[t]:
                        problems.append("%s: bytes differ" % t)
                except OSError as e:
                    problems.append("%s: %s" % (t, e))
            try:
                read_json(os.path.join(mnt, ".ckptfs", "summary.json"))
            except (OSError, ValueError) as e:
                problems.append("after the errors: summary.json: %s" % e)
            tap.ok(not problems, "%s: EIO for %s, the right bytes for %s, still serving"
                   % (name, spec["bad"], spec["good"]), problems)

        mounted(tap, ckptfs, src, name, checks)
        rc, _, err = run_capture([ckptfs, "cat", src, spec["bad"][0]], CLI_TIMEOUT)
        text = err.decode(errors="replace").strip()
        tap.ok(rc == 2 and "zstd frame" in text and "\n" not in text,
               "%s: ckptfs cat %s fails naming the zstd frame" % (name, spec["bad"][0]),
               ["exit %r" % rc, text])


def run_streams(tap, ckptfs):
    """A .zst written by `ckptfs convert` (64 KiB frames) of a tensor larger than the reader's
    frame cache (16 MiB), read by `ckptfs cat` and, mounted, by two sequential streams (both
    decode ahead on worker threads) while two threads do random preads, the page cache dropped
    between passes: every byte equals numpy's."""
    import numpy as np
    with tempfile.TemporaryDirectory() as work:
        rng = np.random.default_rng(45)
        data = (rng.standard_normal(6 << 20) * 0.02).astype("<f4").tobytes()  # 24 MiB
        header = json.dumps({"w": {"dtype": "F32", "shape": [len(data) // 4],
                                   "data_offsets": [0, len(data)]}}).encode()
        header += b" " * (-len(header) % 8)
        plain = os.path.join(work, "s.safetensors")
        with open(plain, "wb") as f:
            f.write(struct.pack("<Q", len(header)) + header + data)
        rc, _, err = run_capture([ckptfs, "convert", plain, plain + ".zst"], CLI_TIMEOUT)
        tap.ok(rc == 0, "convert a 24 MiB tensor to .zst", [err.decode(errors="replace")])
        # The commands decode ahead too (they never fork): the whole tensor through `cat`.
        rc, out, err = run_capture([ckptfs, "cat", plain + ".zst", "w"], CLI_TIMEOUT)
        tap.ok(rc == 0 and out == data, "ckptfs cat of the 24 MiB .zst tensor (decoded ahead) "
               "equals numpy's bytes", ["rc %d, %d of %d bytes" % (rc, len(out), len(data)),
                                        err.decode(errors="replace")[:300]])

        def checks(mnt):
            path = os.path.join(mnt, "w")
            problems = []

            def stream(k):
                rng2 = random.Random(k)
                try:
                    for _ in range(2):
                        drop_cache(path)
                        with open(path, "rb", buffering=0) as f:
                            at = 0
                            while at < len(data):
                                n = rng2.choice((4096, 131072, 1 << 20))
                                got = f.read(n)
                                if got != data[at:at + n]:
                                    problems.append("stream %d: %d bytes at %d differ" % (k, n, at))
                                    return
                                at += len(got)
                except OSError as e:
                    problems.append("stream %d: %s" % (k, e))

            def scatter(k):
                rng2 = random.Random(100 + k)
                try:
                    fd = os.open(path, os.O_RDONLY)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
                    try:
                        for i in range(RANDOM_READS):
                            if i % 50 == 0:
                                drop_cache(path)
                            off = rng2.randrange(len(data))
                            n = rng2.choice((1, 4096, 65536, 262144))
                            if os.pread(fd, n, off) != data[off:off + n]:
                                problems.append("random %d: %d bytes at %d differ" % (k, n, off))
                                return
                    finally:
                        os.close(fd)
                except OSError as e:
                    problems.append("random %d: %s" % (k, e))

            threads = [threading.Thread(target=stream, args=(k,)) for k in range(2)]
            threads += [threading.Thread(target=scatter, args=(k,)) for k in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            tap.ok(not problems, "2 sequential streams (decoded ahead) and 2 random readers "
                   "of a 24 MiB .zst tensor equal numpy's bytes", problems[:5])

        mounted(tap, ckptfs, plain + ".zst", "streams", checks)


def body(tap, ckptfs, root):
    cases = case_dirs(root)
    tap.ok(len(cases) >= 6, "found %d good cases in %s" % (len(cases), root))
    plain_cache, reader_cache = {}, {}
    for case in cases:
        run_good(tap, ckptfs, root, case, plain_cache, reader_cache)
    run_options(tap, ckptfs, root, reader_cache)
    run_changed(tap, ckptfs, root)
    run_streams(tap, ckptfs)
    run_nonseekable(tap, ckptfs, root)
    hostile.run_cases(tap, ckptfs, os.path.join(root, "hostile"), min_cases=35, named=True)
    run_late(tap, ckptfs, root)


if __name__ == "__main__":
    sys.exit(run(body, "zstd", "zstd_fixtures.py"))
