#!/usr/bin/python3
"""Writing the zstd seekable format: `ckptfs convert SRC OUT.EXT.zst` and a staging commit to
OUT.safetensors.zst.

Environment: CKPTFS, FIXTURES (tests/gen/zstd_fixtures.py wrote zstd/, the other generators
lwt/ and gguf/).

Every OUT.EXT.zst is checked with a reader written here from the seekable format's spec: the
footer and the seek table (skippable frame 0x184D2A5E, 8-byte entries, Seekable_Magic_Number
0x8F92EAB1) tile the file exactly; each frame, cut out of the file by its Compressed_Size and
decompressed alone by `zstd -d`, gives Decompressed_Size bytes, at most the writer's 64 KiB
(readers take frames up to 1 MiB, as earlier versions wrote), and ends at a tensor boundary
unless it is full; `zstd -dc OUT` equals what `ckptfs convert SRC OUT.EXT`
writes, byte for byte, and that plain output, read by the tests' own readers, holds the
tensors of the source's generator manifest; OUT mounts and every file equals the plain
output's mount. Committed OUTs are read by this test's parser (after `zstd -dc`). Also: a .zst
source converted again, a GGUF, an .lwt (whose CRC is computed before anything is written), an
HF directory asked for as .zst and a name without a format refused, and a staging mount
--from a .zst source committed to a plain file and to OUT.safetensors.zst.
"""

import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib",
                                "readers"))
import burnpack_reader  # noqa: E402
import gguf_reader  # noqa: E402
import lwt_reader  # noqa: E402
from ckptfs_test import is_mounted, run_capture, unmount  # noqa: E402
from mount_checks import mounted, read_bytes, read_json, run, tree_bytes  # noqa: E402
from staging import commit, daemon_pid, spool_of, stage, wait_gone  # noqa: E402

CONVERT_TIMEOUT = 120
FRAME_TARGET = 64 << 10  # what the writer fills (core/io/zstd_seekable.h)
SEEK_TABLE_MAGIC = 0x184D2A5E
SEEKABLE_MAGIC = 0x8F92EAB1


# ---------------------------------------------------------------------------
# An independent reader of the seekable format

def read_seekable(path):
    """[(compressed frame bytes, decompressed size)] of a seekable zstd file; raises
    ValueError when the seek table does not describe the file exactly."""
    data = read_bytes(path)
    if len(data) < 17:
        raise ValueError("%d bytes: no room for a seek table" % len(data))
    count, desc, magic = struct.unpack("<IBI", data[-9:])
    if magic != SEEKABLE_MAGIC:
        raise ValueError("Seekable_Magic_Number 0x%08x" % magic)
    if desc & 0x7C:
        raise ValueError("reserved descriptor bits 0x%02x" % desc)
    es = 12 if desc & 0x80 else 8
    table_at = len(data) - 9 - count * es - 8
    if table_at < 0:
        raise ValueError("Number_Of_Frames %d does not fit" % count)
    skip_magic, frame_size = struct.unpack_from("<II", data, table_at)
    if skip_magic != SEEK_TABLE_MAGIC or frame_size != count * es + 9:
        raise ValueError("seek table frame header 0x%08x, %d" % (skip_magic, frame_size))
    frames, at = [], 0
    for k in range(count):
        c, d = struct.unpack_from("<II", data, table_at + 8 + k * es)
        frames.append((data[at:at + c], d))
        at += c
    if at != table_at:
        raise ValueError("frames end at %d, the seek table starts at %d" % (at, table_at))
    return frames


def decompress_each(frames):
    """Each frame decompressed on its own by the zstd CLI."""
    with tempfile.TemporaryDirectory() as d:
        names = []
        for i, (blob, _) in enumerate(frames):
            names.append(os.path.join(d, "f%06d.zst" % i))
            with open(names[-1], "wb") as f:
                f.write(blob)
        for at in range(0, len(names), 500):
            subprocess.run(["zstd", "-d", "-q", "-f"] + names[at:at + 500], check=True)
        return [read_bytes(n[:-4]) for n in names]


def safetensors_boundaries(data):
    """Offsets where the header ends and each tensor of a safetensors file starts or ends."""
    (hlen,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + hlen])
    header.pop("__metadata__", None)
    cuts = {8 + hlen}
    for e in header.values():
        cuts.update(8 + hlen + x for x in e["data_offsets"])
    return cuts


def zst_problems(zst, plain_bytes, boundaries=None):
    """What is wrong with OUT.zst as a seekable file of plain_bytes."""
    try:
        frames = read_seekable(zst)
    except (OSError, ValueError) as e:
        return ["seek table: %s" % e]
    problems = []
    try:
        parts = decompress_each(frames)
    except subprocess.CalledProcessError as e:
        return ["zstd -d of a frame failed: %s" % e]
    at = 0
    for k, ((_, dsize), part) in enumerate(zip(frames, parts)):
        if len(part) != dsize:
            problems.append("frame %d: %d bytes, Decompressed_Size %d" % (k, len(part), dsize))
        if dsize > FRAME_TARGET:
            problems.append("frame %d: %d bytes, more than 64 KiB" % (k, dsize))
        at += len(part)
        last = k == len(frames) - 1
        if (boundaries is not None and not last and dsize < FRAME_TARGET
                and at not in boundaries):
            problems.append("frame %d (%d bytes) ends at %d, not at a tensor boundary"
                            % (k, dsize, at))
    if b"".join(parts) != plain_bytes:
        problems.append("the frames' content differs from the plain output")
    whole = subprocess.run(["zstd", "-dc", zst], stdout=subprocess.PIPE).stdout
    if whole != plain_bytes:
        problems.append("zstd -dc OUT differs from the plain output")
    return problems


# ---------------------------------------------------------------------------
# The references: the generators' manifests, and outputs read by the tests' own readers

def sha(data):
    return hashlib.sha256(data).hexdigest()


def manifest_shas(path, plain=None):
    """{name: sha256} of a generator's manifest (with plain: of the zstd case whose plain
    checkpoint is that file). Raises ValueError when there is none."""
    if plain:
        for case in sorted(os.listdir(os.path.dirname(path))):
            mp = os.path.join(os.path.dirname(path), case, "manifest.json")
            if os.path.isfile(mp) and read_json(mp).get("plain") == plain:
                path = mp
                break
        else:
            raise ValueError("no zstd case has plain %s" % plain)
    shas = {t["name"]: t["sha256"] for t in read_json(path)["tensors"]}
    if not shas:
        raise ValueError("%s lists no tensors" % path)
    return shas


def safetensors_shas(data):
    (hlen,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + hlen])
    header.pop("__metadata__", None)
    base = 8 + hlen
    return {n: sha(data[base + e["data_offsets"][0]:base + e["data_offsets"][1]])
            for n, e in header.items()}


def output_shas(path, ext):
    """{name: sha256} of a converted file read by this test's parser (safetensors) or the
    strict readers of tests/lib/readers (GGUF, LWT, Burnpack), never by ckptfs."""
    if ext == ".safetensors":
        return safetensors_shas(read_bytes(path))
    if ext == ".gguf":
        g = gguf_reader.read(path)
        return {t.name: sha(g.tensor_bytes(t)) for t in g.tensors}
    if ext == ".lwt":
        f = lwt_reader.read(path)
        return {t.name: sha(f.tensor_bytes(t)) for t in f.tensors}
    if ext == ".bpk":
        b = burnpack_reader.read(path)
        return {t.name: sha(b.data(t)) for t in b.tensors}
    raise ValueError("no reader for %s" % ext)


def same_mounts(tap, ckptfs, label, zst, plain):
    got, want = {}, {}
    mounted(tap, ckptfs, plain, label + " (plain)", lambda m: want.update(tree_bytes(m)))
    mounted(tap, ckptfs, zst, label, lambda m: got.update(
        tree_bytes(m, ((os.path.realpath(zst), os.path.realpath(plain)),
                 (os.path.basename(zst), os.path.basename(plain))))))
    problems = ["missing " + p for p in sorted(set(want) - set(got))]
    problems += ["unexpected " + p for p in sorted(set(got) - set(want))]
    problems += ["differs: " + p for p in sorted(set(got) & set(want)) if got[p] != want[p]]
    tap.ok(want and not problems, "%s: all %d files of its mount equal the plain output's"
           % (label, len(want)), problems[:10])


def convert(ckptfs, src, out):
    return run_capture([ckptfs, "convert", src, out], CONVERT_TIMEOUT)


def check_convert(tap, ckptfs, work, label, src, ext, want, frames_at_tensors=False):
    """want: {name: sha256} of src's tensors from its generator's manifest."""
    base = os.path.join(work, label.replace(" ", "-"))
    plain, zst = base + ext, base + ext + ".zst"
    rc1, _, err1 = convert(ckptfs, src, plain)
    rc2, _, err2 = convert(ckptfs, src, zst)
    if not tap.ok(rc1 == 0 and rc2 == 0, "%s: convert to %s and %s.zst" % (label, ext, ext),
                  ["exit %r, %r" % (rc1, rc2), err1.decode(errors="replace"),
                   err2.decode(errors="replace")]):
        return None
    try:
        got = output_shas(plain, ext)
    except Exception as e:  # the readers' own error classes, struct and JSON errors
        got = {"<unreadable>": "%s: %s" % (type(e).__name__, e)}
    tap.ok(got == want, "%s: the %s output read by the tests' own reader holds the "
           "manifest's %d tensors" % (label, ext, len(want)),
           ["missing: %s" % sorted(set(want) - set(got))[:5],
            "extra: %s" % sorted(set(got) - set(want))[:5],
            "differ: %s" % sorted(n for n in got if n in want and got[n] != want[n])[:5]])
    data = read_bytes(plain)
    cuts = safetensors_boundaries(data) if frames_at_tensors else None
    p = zst_problems(zst, data, cuts)
    nframes = len(read_seekable(zst)) if not p else 0
    tap.ok(not p, "%s: %s.zst is seekable, %d frames of <= 64 KiB%s, its content is the %s file"
           % (label, ext, nframes, " cut at tensors" if cuts else "", ext), p)
    tap.ok(not [n for n in os.listdir(work) if ".partial-" in n],
           "%s: no temporary file left" % label, os.listdir(work))
    same_mounts(tap, ckptfs, label, zst, plain)
    return zst


def check_refusals(tap, ckptfs, work, src):
    for out, needle in (("hf.zst/", "Hugging Face directory"),
                        ("model.zst", "cannot tell the output format")):
        rc, _, err = convert(ckptfs, src, os.path.join(work, out))
        text = err.decode(errors="replace").strip()
        tap.ok(rc == 2 and needle in text and "\n" not in text and
               not os.path.exists(os.path.join(work, out)),
               "convert to %s refused: %s" % (out, needle), ["exit %r" % rc, text])
    rc, _, err = run_capture([ckptfs, "convert", "--max-shard-size", "1MB", src,
                              os.path.join(work, "sharded.safetensors.zst")], CONVERT_TIMEOUT)
    tap.ok(rc == 2 and b"Hugging Face directory" in err,
           "convert --max-shard-size to .safetensors.zst refused",
           ["exit %r" % rc, err.decode(errors="replace")])


# ---------------------------------------------------------------------------
# Staging

def committed_shas(path):
    """{name: sha256} of a committed OUT (.safetensors or .safetensors.zst, decompressed by
    the zstd CLI), read by this test's parser."""
    if path.endswith(".zst"):
        data = subprocess.run(["zstd", "-dc", path], stdout=subprocess.PIPE).stdout
    else:
        data = read_bytes(path)
    return safetensors_shas(data)


def staged_commit(tap, ckptfs, work, label, out, src, want):
    """`ckptfs stage OUT MNT --from SRC`, read every tensor through the stage, commit,
    unmount: OUT holds want's tensors ({name: sha256})."""
    mnt = tempfile.mkdtemp(prefix="ckptfs-t64-stage.")
    rc, _, err = stage(ckptfs, out, mnt, "--from", src)
    text = err.decode(errors="replace")
    if not tap.ok(rc == 0 and is_mounted(mnt), "%s: ckptfs stage --from %s"
                  % (label, os.path.basename(src)), ["exit %r" % rc, text]):
        unmount(mnt)
        return False
    pid = daemon_pid(spool_of(out))
    try:
        problems = []
        for name, digest in sorted(want.items()):  # plain names: the path is name with '/'
            try:
                if hashlib.sha256(read_bytes(os.path.join(mnt, name.replace(".", "/")))) \
                        .hexdigest() != digest:
                    problems.append("%s: bytes through the stage differ" % name)
            except OSError as e:
                problems.append("%s: %s" % (name, e))
        tap.ok(not problems, "%s: the source's tensors read through the stage" % label, problems)
        rc, cout, cerr = commit(ckptfs, mnt)
        tap.ok(rc == 0, "%s: ckptfs commit" % label,
               ["exit %r" % rc, cout.decode(errors="replace"), cerr.decode(errors="replace")])
    finally:
        clean = unmount(mnt)
        tap.ok(clean and wait_gone(pid), "%s: unmount, daemon exits" % label)
    try:
        got = committed_shas(out)
    except (OSError, ValueError, struct.error) as e:
        got = {"<unreadable>": str(e)}
    tap.ok(got == want, "%s: OUT holds the source's %d tensors" % (label, len(want)),
           ["missing: %s" % sorted(set(want) - set(got))[:5],
            "differ: %s" % sorted(n for n in got if got[n] != want.get(n))[:5]])
    return True


def body(tap, ckptfs, root):
    zroot = os.path.join(root, "zstd")
    work = tempfile.mkdtemp(prefix="ckptfs-t64.")
    try:
        model = os.path.join(zroot, "plain", "model.safetensors")
        try:
            model_want = manifest_shas(os.path.join(zroot, "x"), "plain/model.safetensors")
            gguf_want = manifest_shas(os.path.join(zroot, "x"), "plain/model.gguf")
            lwt_want = manifest_shas(os.path.join(root, "lwt", "natural", "manifest.json"))
        except (OSError, ValueError, KeyError) as e:
            tap.ok(False, "references: the generators' manifests", [str(e)])
            return
        zsrc = check_convert(tap, ckptfs, work, "safetensors", model, ".safetensors",
                             model_want, frames_at_tensors=True)
        if zsrc:
            check_convert(tap, ckptfs, work, "from its own .zst", zsrc, ".safetensors",
                          model_want, frames_at_tensors=True)
        check_convert(tap, ckptfs, work, "from a foreign .zst",
                      os.path.join(zroot, "odd-frames", "model.safetensors.zst"), ".safetensors",
                      manifest_shas(os.path.join(zroot, "odd-frames", "manifest.json")),
                      frames_at_tensors=True)
        check_convert(tap, ckptfs, work, "gguf", os.path.join(zroot, "plain", "model.gguf"),
                      ".gguf", gguf_want)
        check_convert(tap, ckptfs, work, "gguf from .zst",
                      os.path.join(zroot, "gguf-frames", "model.gguf.zst"), ".gguf", gguf_want)
        check_convert(tap, ckptfs, work, "lwt", os.path.join(root, "lwt", "natural", "model.lwt"),
                      ".lwt", lwt_want)
        check_convert(tap, ckptfs, work, "burnpack", model, ".bpk", model_want)
        check_refusals(tap, ckptfs, work, model)

        want = model_want
        zin = os.path.join(zroot, "big-frames", "model.safetensors.zst")
        staged_commit(tap, ckptfs, work, "stage from .zst to .safetensors",
                      os.path.join(work, "staged.safetensors"), zin, want)
        out = os.path.join(work, "staged.safetensors.zst")
        if staged_commit(tap, ckptfs, work, "stage to .safetensors.zst", out, model, want):
            tap.ok(not zst_problems(out, subprocess.run(["zstd", "-dc", out],
                                                        stdout=subprocess.PIPE).stdout),
                   "stage to .safetensors.zst: OUT is seekable, frames <= 64 KiB")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(run(body))
