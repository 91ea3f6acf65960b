#!/usr/bin/python3
"""Write zstd seekable fixtures for ckptfs (a .zst source is read through its seek table).

usage: zstd_fixtures.py OUTDIR

Independent of core/: the checkpoints come from the safetensors and GGUF fixture
generators' own writers, each frame is compressed by the `zstd` command-line tool
(one run per batch of frames), and the seek table (zstd contrib/seekable_format:
entries of Compressed_Size, Decompressed_Size [, Checksum = low 32 bits of XXH64 of
the frame's content], then Number_Of_Frames, Seek_Table_Descriptor and the magic
0x8F92EAB1, inside a skippable frame 0x184D2A5E) is written here with struct.
Deterministic: the same bytes on every run (the zstd CLI is deterministic too).

Layout of OUTDIR:
  plain/          model.safetensors (about 7 MiB), model.gguf, small.safetensors
  CASE/           the checkpoint of plain/ as a seekable .zst, cut into frames some way,
                  + manifest.json: {"source": file, "plain": "plain/FILE", "format",
                  "frames": [[compressed, decompressed], ...], "tensors": [{name, dtype,
                  shape, nbytes, sha256, path}, ...]}
  nonseekable/    ordinary zstd files (no seek table): refused, saying how to get one
  hostile/        damaged seek tables and frames: cases.tsv (+ mount-names.json); and
                  late.json: files that mount but whose damaged frames (found only when
                  read) must give EIO for the tensors they hold, {file: {"plain": the
                  undamaged checkpoint, "bad": [names], "good": [names]}}
"""

import hashlib
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import fixture_lib  # noqa: E402
import gguf_fixtures  # noqa: E402
import safetensors_fixtures as stf  # noqa: E402
from fixture_lib import generate, tree_paths, write_json  # noqa: E402

SEEK_TABLE_MAGIC = 0x184D2A5E
SEEKABLE_MAGIC = 0x8F92EAB1
CHECKSUM_FLAG = 0x80
MiB = 1 << 20

CASES = ["plain", "aligned-1mib", "tiny-frames", "big-frames", "odd-frames", "gguf-frames",
         "empty", "nonseekable", "hostile"]


# ---------------------------------------------------------------------------
# XXH64, for the seek table's optional checksums (the stdlib has none)

P1, P2, P3 = 11400714785074694791, 14029467366897019727, 1609587929392839161
P4, P5 = 9650029242287828579, 2870177450012600261
M64 = (1 << 64) - 1


def _rotl(x, r):
    return ((x << r) | (x >> (64 - r))) & M64


def _round(acc, lane):
    return (_rotl((acc + lane * P2) & M64, 31) * P1) & M64


def xxh64(data, seed=0):
    n, i = len(data), 0
    if n >= 32:
        v = [(seed + P1 + P2) & M64, (seed + P2) & M64, seed, (seed - P1) & M64]
        lanes = np.frombuffer(data, dtype="<u8", count=(n // 32) * 4).reshape(-1, 4).tolist()
        for a, b, c, d in lanes:
            v[0] = _round(v[0], a)
            v[1] = _round(v[1], b)
            v[2] = _round(v[2], c)
            v[3] = _round(v[3], d)
        i = len(lanes) * 32
        h = (_rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)) & M64
        for x in v:
            h = ((h ^ _round(0, x)) * P1 + P4) & M64
    else:
        h = (seed + P5) & M64
    h = (h + n) & M64
    while i + 8 <= n:
        h = (_rotl(h ^ _round(0, struct.unpack_from("<Q", data, i)[0]), 27) * P1 + P4) & M64
        i += 8
    if i + 4 <= n:
        h = (_rotl(h ^ ((struct.unpack_from("<I", data, i)[0] * P1) & M64), 23) * P2 + P3) & M64
        i += 4
    while i < n:
        h = (_rotl(h ^ ((data[i] * P5) & M64), 11) * P1) & M64
        i += 1
    h = ((h ^ (h >> 33)) * P2) & M64
    h = ((h ^ (h >> 29)) * P3) & M64
    return h ^ (h >> 32)


def self_test():
    assert xxh64(b"") == 0xEF46DB3751D8E999
    # A zstd frame with a content checksum ends in the low 32 bits of XXH64(content).
    data = bytes(range(256)) * 5 + b"tail"
    frame = zstd_frames([data], ["--check"])[0]
    assert struct.unpack("<I", frame[-4:])[0] == xxh64(data) & 0xFFFFFFFF


# ---------------------------------------------------------------------------
# Frames and the seek table

def zstd_frames(chunks, opts=(), stdin=False):
    """Each chunk compressed into one zstd frame by the zstd CLI.  With stdin, the
    frames are made from a pipe, so their headers lack the content size."""
    out = []
    if stdin:
        for c in chunks:
            out.append(subprocess.run(["zstd", "-q", "-c"] + list(opts), input=c,
                                      stdout=subprocess.PIPE, check=True).stdout)
        return out
    with tempfile.TemporaryDirectory() as d:
        names = []
        for i, c in enumerate(chunks):
            names.append(os.path.join(d, "f%06d" % i))
            with open(names[-1], "wb") as f:
                f.write(c)
        for at in range(0, len(names), 500):
            subprocess.run(["zstd", "-q", "-f", "--no-progress"] + list(opts) + names[at:at + 500],
                           check=True)
        for n in names:
            with open(n + ".zst", "rb") as f:
                out.append(f.read())
    return out


def skippable(payload, magic=0x184D2A50):
    return struct.pack("<II", magic, len(payload)) + payload


class Seekable:
    """A seekable file being assembled: entries of (compressed bytes, content)."""

    def __init__(self):
        self.entries = []

    def add(self, frames, chunks):
        self.entries += list(zip(frames, chunks))
        return self

    def add_raw(self, frame, content):
        self.entries.append((frame, content))
        return self

    def table(self, checksums=False, descriptor=None, count=None):
        """(table bytes, [(label, offset in table, size)]) for hostile patches."""
        fields, body = [], b""

        def put(label, data):
            nonlocal body
            fields.append((label, len(body), len(data)))
            body += data
        put("Skippable_Magic_Number", struct.pack("<I", SEEK_TABLE_MAGIC))
        es = 12 if checksums else 8
        put("Frame_Size", struct.pack("<I", len(self.entries) * es + 9))
        for k, (frame, content) in enumerate(self.entries):
            put("Compressed_Size %d" % k, struct.pack("<I", len(frame)))
            put("Decompressed_Size %d" % k, struct.pack("<I", len(content)))
            if checksums:
                put("Checksum %d" % k, struct.pack("<I", xxh64(content) & 0xFFFFFFFF))
        put("Number_Of_Frames", struct.pack("<I", len(self.entries) if count is None else count))
        desc = (CHECKSUM_FLAG if checksums else 0) if descriptor is None else descriptor
        put("Seek_Table_Descriptor", bytes([desc]))
        put("Seekable_Magic_Number", struct.pack("<I", SEEKABLE_MAGIC))
        return body, fields

    def frames_bytes(self):
        return b"".join(f for f, _ in self.entries)

    def build(self, checksums=False, descriptor=None):
        return self.frames_bytes() + self.table(checksums, descriptor)[0]

    def sizes(self):
        return [[len(f), len(c)] for f, c in self.entries]


def cut(data, bounds):
    """data split at the given offsets (sorted, inside data)."""
    edges = [0] + list(bounds) + [len(data)]
    return [data[a:b] for a, b in zip(edges, edges[1:]) if b > a]


def every(data, size, start=0, stop=None):
    stop = len(data) if stop is None else stop
    return list(range(start + size, stop, size))


# ---------------------------------------------------------------------------
# The plain checkpoints

def weights(rng, shape, dtype="<f4", levels=16):
    """Values on a coarse grid: compressible like real weights, not like zeros."""
    n = int(np.prod(shape)) if shape else 1
    return (rng.integers(-levels, levels, n) / 8.0).astype(dtype).tobytes()


def plain_safetensors(path, rng):
    T = stf.T
    tensors = [
        T("model.embed_tokens.weight", "F32", [1280, 1152], weights(rng, [1280, 1152])),
        T("model.layers.0.self_attn.q_proj.weight", "F16", [256, 256],
          weights(rng, [256, 256], "<f2")),
        T("model.layers.0.self_attn.q_proj.bias", "BF16", [256], rng.bytes(512)),
        T("model.layers.0.mlp.up_proj.weight", "F32", [384, 512], weights(rng, [384, 512])),
        T("model.layers.0.mlp.down_proj.weight", "F32", [512, 300], weights(rng, [512, 300])),
        T("model.layers.1.scale", "F64", [], np.array([0.5], "<f8").tobytes()),
        T("model.layers.1.mask", "BOOL", [3, 5], bytes(rng.integers(0, 2, 15).astype("u1"))),
        T("model.layers.1.codes", "I8", [1000], rng.bytes(1000)),
        T("model.norm.weight", "F32", [1152], weights(rng, [1152])),
        T("z.empty", "F32", [0], b""),
    ]
    return stf.write_safetensors(path, tensors, metadata={"format": "pt"})


def plain_small(path, rng):
    """Four tensors, one per frame of the hostile cases."""
    T = stf.T
    tensors = [T("a", "F32", [2000], weights(rng, [2000])),
               T("b", "F32", [3000], weights(rng, [3000])),
               T("c", "I32", [1500], rng.bytes(6000)),
               T("d", "F16", [4000], weights(rng, [4000], "<f2"))]
    return stf.write_safetensors(path, tensors, buffer_order=tensors)


def plain_gguf(path, rng):
    G = gguf_fixtures
    tensors = [G.Tensor("token_embd.weight", "F32", [512, 300], weights(rng, [300, 512])),
               G.Tensor("blk.0.attn_q.weight", "F16", [256, 256], weights(rng, [256, 256], "<f2")),
               G.Tensor("blk.0.ffn_up.weight", "Q8_0", [256, 64], rng.bytes(64 * 8 * 34)),
               G.Tensor("output_norm.weight", "F32", [512], weights(rng, [512]))]
    kvs = [("general.architecture", G.STRING, "llama"), ("llama.block_count", G.U32, 1)]
    return G.write_gguf(path, kvs, tensors)


def manifest_tensors(records):
    paths = tree_paths([r["name"] for r in records])
    return [{"name": r["name"], "dtype": r["dtype"], "shape": r["shape"], "nbytes": r["nbytes"],
             "sha256": r["sha256"], "path": paths[r["name"]]} for r in records]


# ---------------------------------------------------------------------------
# Good cases

def write_case(out, case, name, s, plain, fmt, records, checksums=False, descriptor=None):
    d = os.path.join(out, case)
    os.makedirs(d)
    with open(os.path.join(d, name), "wb") as f:
        f.write(s.build(checksums, descriptor))
    write_json(os.path.join(d, "manifest.json"),
               {"source": name, "plain": "plain/" + plain, "format": fmt, "frames": s.sizes(),
                "checksums": checksums, "tensors": manifest_tensors(records)},
               ensure_ascii=False)


def gen_good(out):
    rng = np.random.default_rng(45)
    os.makedirs(os.path.join(out, "plain"))
    st_path = os.path.join(out, "plain", "model.safetensors")
    st_records = plain_safetensors(st_path, rng)
    gg_records = plain_gguf(os.path.join(out, "plain", "model.gguf"), rng)
    plain_small(os.path.join(out, "plain", "small.safetensors"), rng)
    with open(st_path, "rb") as f:
        data = f.read()
    with open(os.path.join(out, "plain", "model.gguf"), "rb") as f:
        gguf = f.read()
    (hlen,) = struct.unpack("<Q", data[:8])

    # Frames of exactly 1 MiB, wherever the tensors are: most reads straddle frames.
    chunks = cut(data, every(data, MiB))
    write_case(out, "aligned-1mib", "model.safetensors.zst",
               Seekable().add(zstd_frames(chunks, ["-3"]), chunks), "model.safetensors",
               "safetensors", st_records)

    # 1-byte frames inside the header length, a boundary inside the header JSON, 4 KiB
    # frames, then 1 MiB ones; the seek table carries checksums.
    bounds = list(range(1, 9)) + [37, hlen // 2] + every(data, 4096, 8 + hlen, 8 + hlen + 65536)
    bounds += every(data, MiB, 8 + hlen + 65536)
    chunks = cut(data, sorted(set(b for b in bounds if 0 < b < len(data))))
    write_case(out, "tiny-frames", "model.safetensors.zst",
               Seekable().add(zstd_frames(chunks, ["-1"]), chunks), "model.safetensors",
               "safetensors", st_records, checksums=True)

    # Frames larger than 1 MiB: 2.5 MiB (cached whole by the reader), then the rest, about
    # 4.6 MiB (too large for its cache: streamed).
    chunks = cut(data, [int(2.5 * MiB)])
    write_case(out, "big-frames", "model.safetensors.zst",
               Seekable().add(zstd_frames(chunks, ["-3"]), chunks), "model.safetensors",
               "safetensors", st_records)

    # Every kind of frame a foreign writer may leave: a skippable frame first and one in
    # the middle (entries of 0 decompressed bytes), frames made from a pipe (no content size
    # in their headers), frames without a content checksum, levels 19 and 9, an empty zstd
    # frame; the descriptor's unused bits set (to be ignored).
    s = Seekable()
    s.add_raw(skippable(b"ckptfs test: leading skippable frame"), b"")
    first = cut(data[:300000], [100, 5000])
    s.add(zstd_frames(first, ["-3"], stdin=True), first)
    s.add_raw(skippable(b"\x00" * 7, 0x184D2A5F), b"")
    s.add(zstd_frames([b""], ["-3"], stdin=True), [b""])
    mid = cut(data[300000:3 * MiB], [MiB])
    s.add(zstd_frames(mid, ["--no-check", "-3"]), mid)
    rest = cut(data[3 * MiB:], every(data[3 * MiB:], 700000))
    s.add(zstd_frames(rest[:1], ["-19"]), rest[:1])
    s.add(zstd_frames(rest[1:], ["-9"]), rest[1:])
    write_case(out, "odd-frames", "model.safetensors.zst", s, "model.safetensors",
               "safetensors", st_records, descriptor=0x03)

    chunks = cut(gguf, every(gguf, 65536))
    write_case(out, "gguf-frames", "model.gguf.zst",
               Seekable().add(zstd_frames(chunks, ["-3", "--no-check"]), chunks), "model.gguf",
               "gguf", gg_records)

    # A checkpoint without tensors, in one frame.
    empty = os.path.join(out, "plain", "empty.safetensors")
    stf.write_safetensors(empty, [])
    with open(empty, "rb") as f:
        e = f.read()
    write_case(out, "empty", "empty.safetensors.zst", Seekable().add(zstd_frames([e]), [e]),
               "empty.safetensors", "safetensors", [])


# ---------------------------------------------------------------------------
# Ordinary zstd files, and hostile ones

def gen_nonseekable(out):
    d = os.path.join(out, "nonseekable")
    os.makedirs(d)
    with open(os.path.join(out, "plain", "small.safetensors"), "rb") as f:
        data = f.read()
    whole = zstd_frames([data])[0]
    two = zstd_frames(cut(data, [len(data) // 2]))
    files = {"whole.safetensors.zst": whole,
             "two-frames.safetensors.zst": b"".join(two),
             "skippable-first.safetensors.zst": skippable(b"note") + whole}
    for name, blob in files.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(blob)
    write_json(os.path.join(d, "cases.json"), sorted(files))


def patch32(blob, at, value):
    return blob[:at] + struct.pack("<I", value & 0xFFFFFFFF) + blob[at + 4:]


def gen_hostile(out):
    h = fixture_lib.FileHostile(os.path.join(out, "hostile"))
    with open(os.path.join(out, "plain", "small.safetensors"), "rb") as f:
        data = f.read()
    (hlen,) = struct.unpack("<Q", data[:8])
    # One frame per tensor (a 8000 bytes, b 12000, c 6000, d 8000), the header with a.
    base = 8 + hlen
    bounds = [base + 8000, base + 20000, base + 26000]
    chunks = cut(data, bounds)
    frames = zstd_frames(chunks, ["-3"])
    s = Seekable().add(frames, chunks)
    body = s.frames_bytes()
    table, fields = s.table()
    good = body + table
    t0 = len(body)  # where the seek table starts

    def at(label):
        return t0 + fixture_lib.field_at(fields, label)[0]

    def add(name, blob, needle, desc):
        h.add(name + ".safetensors.zst", blob, needle, desc)

    # Truncated at every field boundary of the seek table, and inside the footer.
    for label, off, size in fields:
        add("trunc-before-" + label.replace(" ", "-").lower(), good[:t0 + off],
            "seek table", "cut before %s: no seek table at the end" % label)
    add("trunc-last-byte", good[:-1], "seek table", "last byte of the magic missing")
    add("trunc-magic-only", good[:4], "seek table", "only the frame magic")
    add("trunc-frames", good[:len(frames[0]) // 2], "seek table", "cut inside frame 0")
    add("tiny", good[:3], "not a checkpoint", "3 bytes: no magic to recognize")

    foot = len(good) - 9
    add("count-huge", patch32(good, foot, 0xFFFFFFFF), "Number_Of_Frames",
        "Number_Of_Frames 2^32-1: more entries than the file holds")
    add("count-plus-one", patch32(good, foot, 5), "Number_Of_Frames|Skippable_Magic_Number",
        "one frame more than the table lists")
    add("count-minus-one", patch32(good, foot, 3), "Skippable_Magic_Number|Number_Of_Frames",
        "one frame less than the table lists")
    add("count-zero", patch32(good, foot, 0), "Skippable_Magic_Number|Number_Of_Frames",
        "no frames, but entries before the footer")
    for desc in (0x04, 0x40, 0x7C):
        blob = good[:foot + 4] + bytes([desc]) + good[foot + 5:]
        add("reserved-bits-%02x" % desc, blob, "Seek_Table_Descriptor",
            "reserved descriptor bits 0x%02x set" % desc)
    blob = good[:foot + 4] + bytes([CHECKSUM_FLAG]) + good[foot + 5:]
    add("checksum-flag-without-checksums", blob,
        "Number_Of_Frames|Skippable_Magic_Number|Frame_Size",
        "Checksum_Flag set on 8-byte entries")
    add("frame-size-plus-one", patch32(good, at("Frame_Size"), len(s.entries) * 8 + 10),
        "Frame_Size", "Frame_Size one more than the table")
    add("frame-size-zero", patch32(good, at("Frame_Size"), 0), "Frame_Size", "Frame_Size 0")
    add("skippable-magic", patch32(good, at("Skippable_Magic_Number"), 0x184D2A50),
        "Skippable_Magic_Number", "the seek table's frame has another skippable magic")
    add("seekable-magic", patch32(good, len(good) - 4, 0x8F92EAB2), "seek table",
        "wrong Seekable_Magic_Number: not seekable")
    add("csize-plus-one", patch32(good, at("Compressed_Size 0"), len(frames[0]) + 1),
        "Compressed_Size", "frame sizes add up to one more than the frames")
    add("csize-minus-one", patch32(good, at("Compressed_Size 3"), len(frames[3]) - 1),
        "Compressed_Size", "frame sizes add up to one less than the frames")
    add("csize-huge", patch32(good, at("Compressed_Size 1"), 0xFFFFFFFF), "Compressed_Size",
        "a frame of 4 GiB in a small file")
    add("csize-zero", patch32(good, at("Compressed_Size 2"), 0), "Compressed_Size",
        "Compressed_Size 0 with content")
    add("extra-bytes", frames[0] + frames[1] + b"xyz" + frames[2] + frames[3] + table,
        "Compressed_Size", "3 bytes between frames that no entry counts")
    add("dsize-plus-one", patch32(patch32(good, at("Decompressed_Size 0"), len(chunks[0]) + 1),
                                  at("Decompressed_Size 1"), len(chunks[1]) - 1),
        "Decompressed_Size", "frame 0 holds one byte less than its entry says")
    add("dsize-minus-one", patch32(patch32(good, at("Decompressed_Size 0"), len(chunks[0]) - 1),
                                   at("Decompressed_Size 1"), len(chunks[1]) + 1),
        "Decompressed_Size", "frame 0 holds one byte more than its entry says")
    add("dsize-huge", patch32(good, at("Decompressed_Size 0"), 0xFFFFFFF0), "data_offsets",
        "frame 0 says 4 GiB of content: the header does not cover it")
    bad = bytearray(good)
    for i in range(len(frames[0]) // 2, len(frames[0]) // 2 + 8):
        bad[i] ^= 0x5A
    add("frame0-corrupt", bytes(bad), "zstd frame 0", "frame 0's compressed data damaged")
    add("frame0-no-magic", b"\0\0\0\0" + good[4:], "not a checkpoint",
        "frame 0 is not zstd: the file is not recognized as zstd at all")
    add("frame0-cut", frames[0][:-6] + b"".join(frames[1:]) +
        patch32(table, fixture_lib.field_at(fields, "Compressed_Size 0")[0], len(frames[0]) - 6),
        "zstd frame 0", "frame 0 ends early (its entry says so too)")
    add("table-only", Seekable().build(), "header length", "no frames: empty content")
    h.add("unused-bits.safetensors.zst", good[:foot + 4] + bytes([0x03]) + good[foot + 5:],
          "", "the descriptor's unused bits are to be ignored", mount_names=["a", "b", "c", "d"])

    # Bounds (bound-*): a table of one 0-byte frame fills exactly the 25 bytes it needs (its
    # empty content is what is refused), a count of 2 needs 8 more; the last frame's
    # Compressed_Size one byte past the seek table, and one short of it.
    one_empty = Seekable().add_raw(b"", b"").build()
    assert len(one_empty) == 25
    add("bound-count-exact-room", one_empty, "header length",
        "Number_Of_Frames 1 in a 25-byte file: the table fits, the content is empty")
    add("bound-count-room-plus-1", one_empty[:-9] + patch32(one_empty[-9:], 0, 2),
        "Number_Of_Frames 2&needs 16 bytes&than the 8 bytes",
        "Number_Of_Frames 2 where one entry fits")
    add("bound-count-room-7", one_empty[:8] + bytes(7) + one_empty[-9:],
        "Number_Of_Frames 1&needs 8 bytes&than the 7 bytes",
        "Number_Of_Frames 1 with 7 bytes between the table's header and the footer")
    last = len(body) - len(frames[3])
    add("bound-csize-last-past-table", patch32(good, at("Compressed_Size 3"), len(frames[3]) + 1),
        "Compressed_Size %d of frame 3&runs past the seek table" % (len(frames[3]) + 1),
        "the last frame's Compressed_Size one byte past the seek table (frame at %d)" % last)
    add("bound-csize-sum-minus-1", patch32(good, at("Compressed_Size 3"), len(frames[3]) - 1),
        "add up to %d bytes&starts at offset %d" % (len(body) - 1, len(body)),
        "the last frame's Compressed_Size one less: the sizes add up to one byte short")
    h.finish()

    # Damage found only when the frame is read: mounts, those tensors give EIO.
    late = {}

    def add_late(name, blob, bad_names):
        with open(os.path.join(h.root, name), "wb") as f:
            f.write(blob)
        late[name] = {"plain": "plain/small.safetensors", "bad": bad_names,
                      "good": [n for n in "abcd" if n not in bad_names]}

    add_late("late-dsize-shifted.safetensors.zst",
             patch32(patch32(good, at("Decompressed_Size 1"), len(chunks[1]) + 16),
                     at("Decompressed_Size 2"), len(chunks[2]) - 16), ["b", "c"])
    bad = bytearray(good)
    start = len(frames[0]) + len(frames[1]) + len(frames[2]) // 2
    for i in range(start, start + 4):
        bad[i] ^= 0xFF
    add_late("late-corrupt.safetensors.zst", bytes(bad), ["c"])
    garbage = bytes((i * 37 + 11) & 0xFF for i in range(len(frames[1])))
    add_late("late-garbage-frame.safetensors.zst", frames[0] + garbage + b"".join(frames[2:]) +
             table, ["b"])
    add_late("late-truncated.safetensors.zst",
             b"".join(frames[:3]) + frames[3][:-10] +
             patch32(table, fixture_lib.field_at(fields, "Compressed_Size 3")[0],
                     len(frames[3]) - 10), ["d"])
    # A frame too large for the reader's cache (streamed), damaged near its end.
    T = stf.T
    big = [T("a", "F32", [10], weights(np.random.default_rng(1), [10])),
           T("b", "U8", [6 * MiB], bytes(range(256)) * (6 * MiB // 256)),
           T("c", "F32", [10], weights(np.random.default_rng(2), [10]))]
    path = os.path.join(out, "plain", "bigframe.safetensors")
    stf.write_safetensors(path, big, buffer_order=big)
    with open(path, "rb") as f:
        bdata = f.read()
    bh = 8 + struct.unpack("<Q", bdata[:8])[0]
    bchunks = cut(bdata, [bh + 40, bh + 40 + 6 * MiB])
    bframes = zstd_frames(bchunks, ["-3"])
    mid = bytearray(bframes[1])
    for i in range(len(mid) - 40, len(mid) - 36):
        mid[i] ^= 0xFF
    bs = Seekable().add([bframes[0], bytes(mid), bframes[2]], bchunks)
    with open(os.path.join(h.root, "late-big-frame.safetensors.zst"), "wb") as f:
        f.write(bs.build())
    late["late-big-frame.safetensors.zst"] = {"plain": "plain/bigframe.safetensors",
                                              "bad": ["b"], "good": ["a", "c"]}
    write_json(os.path.join(h.root, "late.json"), late, sort_keys=True)


def main(argv):
    if not shutil.which("zstd"):
        sys.stderr.write("zstd_fixtures.py: the zstd command is missing (apt-get install zstd)\n")
        return 1
    return generate(argv, CASES, gen_good, gen_nonseekable, gen_hostile, self_test=self_test)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
