#!/usr/bin/python3
"""Write LightwatchAI2 .lwt (LWATCHV1) test fixtures for ckptfs.

usage: lwt_fixtures.py OUTDIR

No .lwt writer or sample exists anywhere: the format is known only from the
LightwatchAI2 contract document, as derived in shared/formats/
gptrs-burnpack-lwt-tp.md section 3.  This generator writes the natural reading
of that document and each variant the notes list as ambiguous (length prefix
width, count prefix, 216/212-byte entries, index and data alignment, CRC-32
placement), with its own struct-based writer and zlib.crc32; it does not use
core/.  Deterministic: the same bytes on every run.

Layout of OUTDIR (each good case directory holds model.lwt + manifest.json):
  natural/ no-crc/ crc-header-hex/ crc-trailer/ u64-length/ count-prefix/
  packed-entries/ packed-data/ index-align8/ relative-data/ total-bytes-off/
  empty/ all-variants/ names/
  hostile/   damaged files, listed in cases.tsv (+ mount-names.json)
"""

import hashlib
import json
import os
import struct
import sys
import zlib

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
from fixture_lib import (FileHostile, Out, field_at, generate, numel, patched,  # noqa: E402
                         tree_paths, u32, u64, write_json)

MAGIC = b"LWATCHV1"


def align(x, a):
    return -(-x // a) * a


class T:
    def __init__(self, name, shape, data):
        self.name, self.shape, self.data = name, list(shape), data


def rand_t(rng, name, shape):
    return T(name, shape, rng.standard_normal(numel(shape)).astype("<f4").tobytes())


def entry_bytes(t, stride, pad=b"\0\0\0\0", offset=0, size=None, ndim=None, name=None,
                shape=None):
    name = t.name.encode("utf-8") if name is None else name
    shape = t.shape if shape is None else shape
    dims = list(shape) + [0] * (8 - len(shape))
    parts = [("name", name.ljust(128, b"\0")[:128]),
             ("ndim", struct.pack("<I", len(t.shape) if ndim is None else ndim))]
    if stride == 216:
        parts.append(("padding", pad))
    parts += [("shape", struct.pack("<8Q", *dims)), ("offset", struct.pack("<Q", offset)),
              ("size_bytes", struct.pack("<Q", len(t.data) if size is None else size))]
    return parts


def data_start_rule(index_at, index_end, size, data_len):
    """The reader's rule (choice 4 of lwt.c): the first start that leaves 0 or 4
    trailing bytes, else the natural one if the data fits after it."""
    starts = [(align(index_end, 64), "absolute"), (index_end, "none"),
              (index_at + align(index_end - index_at, 64), "relative")]
    fits = [(s, how) for s, how in starts if s + data_len <= size]
    good = [(s, how) for s, how in fits if size - s - data_len in (0, 4)]
    # Another start than the natural one only when it leaves exactly 0 or 4 bytes (with data).
    fits = [(s, how) for s, how in fits if how == "absolute" or not data_len]
    return (good or fits or [(None, None)])[0]


def write_lwt(tensors, header=None, width=32, count_prefix=None, index_align8=False,
              stride=216, data="absolute", placement="aligned", crc="both", trail=b"",
              pad=b"\0\0\0\0", entry_edit=None, json_text=None, tensor_count=None):
    """Returns (bytes, {name: absolute payload offset}, fields, layout dict).

    placement: "aligned" (each tensor at a multiple of 64 of the data section)
    or "packed" (back to back).  crc: None, "trailer", "header", "header-hex"
    or "both".  entry_edit(i, parts) may rewrite entry fields (hostile cases).
    """
    n = len(tensors)
    offsets, pos = [], 0
    for t in tensors:
        if placement == "aligned":
            pos = align(pos, 64)
        offsets.append(pos)
        pos += len(t.data)
    data_len = pos
    section = bytearray(data_len)
    for t, off in zip(tensors, offsets):
        section[off:off + len(t.data)] = t.data
    crc_value = zlib.crc32(bytes(section)) & 0xFFFFFFFF

    hdr = dict(header or {})
    hdr.setdefault("version", 1)
    hdr.setdefault("model_type", "gpt2")
    hdr.setdefault("dtype", "float32")
    hdr.setdefault("byte_order", "little")
    hdr["tensor_count"] = n if tensor_count is None else tensor_count
    hdr.setdefault("total_bytes", sum(len(t.data) for t in tensors))
    if crc in ("header", "both"):
        hdr["crc32"] = crc_value
    elif crc == "header-hex":
        hdr["crc32"] = "0x%08X" % crc_value
    elif crc == "header-hex-bare":
        hdr["crc32"] = "%08x" % crc_value
    text = json_text if json_text is not None else json.dumps(hdr, indent=2).encode("utf-8")

    out = Out()
    out.put("magic", MAGIC)
    out.put("header_len", struct.pack("<I" if width == 32 else "<Q", len(text)))
    out.put("header JSON", text)
    if index_align8:
        assert len(out.buf) % 8, "choose a header length that needs padding"
        filler = index_align8 if isinstance(index_align8, bytes) else b"\0"
        out.put("index padding", filler * (-len(out.buf) % 8))
    if count_prefix:
        out.put("count prefix", struct.pack("<I" if count_prefix == "u32" else "<Q", n))
    index_at = len(out.buf)
    for i, (t, off) in enumerate(zip(tensors, offsets)):
        parts = entry_bytes(t, stride, pad, off)
        if entry_edit:
            parts = entry_edit(i, parts)
        for label, b in parts:
            out.put("entry %d %s" % (i, label), b)
    index_end = len(out.buf)
    if data == "absolute":
        data_at = align(index_end, 64)
    elif data == "none":
        data_at = index_end
    else:
        data_at = index_at + align(index_end - index_at, 64)
    out.put("data padding", bytes(data_at - index_end))
    for i, off in enumerate(offsets):
        out.put("data padding %d" % i, bytes(data_at + off - len(out.buf)))
        out.put("tensor %d data" % i, tensors[i].data)
    tail = struct.pack("<I", crc_value) if crc in ("trailer", "both") else b""
    out.put("crc32 trailer", tail)
    out.put("trailing bytes", trail)
    buf = bytes(out.buf)

    detected = data_start_rule(index_at, index_end, len(buf), data_len)
    layout = {"header_len_width": width, "index_offset": index_at,
              "count_prefix": count_prefix or "none", "entry_size": stride,
              "data_offset": data_at, "data_alignment": detected[1], "data_bytes": data_len,
              "crc32": None}
    if json_text is None:
        assert detected[0] == data_at, "ambiguous fixture: the reader would pick another start"
    where = {"trailer": "trailer", "header": "header", "header-hex": "header",
             "header-hex-bare": "header",
             "both": "header+trailer"}.get(crc)
    if trail and where == "trailer":
        where = None     # the trailer is only recognised when exactly 4 bytes follow the data
    if where == "header+trailer" and trail:
        where = "header"
    if where:
        layout["crc32"] = {"value": "0x%08x" % crc_value, "stored_in": where, "verified": True}
    return buf, {t.name: data_at + off for t, off in zip(tensors, offsets)}, out.fields, \
        {"header": json.loads(text) if json_text is None else None, "layout": layout}


# ---------------------------------------------------------------------------
# Good cases

def gpt2_tensors(rng, layers=1, embd=6, vocab=10, block=5):
    # Names of the contract's table; small, deliberately non-multiple-of-16
    # shapes so per-tensor 64-byte alignment leaves padding.
    ts = [rand_t(rng, "transformer.wte.weight", [vocab, embd]),
          rand_t(rng, "transformer.wpe.weight", [block, embd])]
    for i in range(layers):
        h = "transformer.h.%d." % i
        ts += [rand_t(rng, h + "ln_1.weight", [embd]), rand_t(rng, h + "ln_1.bias", [embd]),
               rand_t(rng, h + "attn.c_attn.weight", [embd, 3 * embd]),
               rand_t(rng, h + "attn.c_attn.bias", [3 * embd]),
               rand_t(rng, h + "attn.c_proj.weight", [embd, embd]),
               rand_t(rng, h + "attn.c_proj.bias", [embd]),
               rand_t(rng, h + "ln_2.weight", [embd]), rand_t(rng, h + "ln_2.bias", [embd]),
               rand_t(rng, h + "mlp.c_fc.weight", [embd, 4 * embd]),
               rand_t(rng, h + "mlp.c_fc.bias", [4 * embd]),
               rand_t(rng, h + "mlp.c_proj.weight", [4 * embd, embd]),
               rand_t(rng, h + "mlp.c_proj.bias", [embd])]
    ts += [rand_t(rng, "transformer.ln_f.weight", [embd]),
           rand_t(rng, "transformer.ln_f.bias", [embd])]
    return ts


CONFIG = {"n_layer": 1, "n_head": 2, "n_embd": 6, "vocab_size": 10, "block_size": 5}


def write_case(out, case, tensors, warnings=(), **kw):
    kw.setdefault("header", {"config": CONFIG})
    data, offs, _, meta = write_lwt(tensors, **kw)
    d = os.path.join(out, case)
    os.makedirs(d)
    with open(os.path.join(d, "model.lwt"), "wb") as f:
        f.write(data)
    paths = tree_paths([t.name for t in tensors])
    recs = [{"name": t.name, "dtype": "F32", "shape": t.shape, "nbytes": len(t.data),
             "sha256": hashlib.sha256(t.data).hexdigest(), "numpy_dtype": "<f4",
             "path": paths[t.name], "file": "model.lwt", "offset": offs[t.name], "extra": {}}
            for t in tensors]
    doc = {"source": "model.lwt", "metadata": {"lightwatch-lwt": meta},
           "warnings": list(warnings), "tensors": recs}
    write_json(os.path.join(d, "manifest.json"), doc, ensure_ascii=False)


def gen_good(out):
    rng = np.random.default_rng(4301)
    base = gpt2_tensors(rng)
    write_case(out, "natural", base + [rand_t(rng, "scalar", []),
                                       rand_t(rng, "empty.rows", [0, 4])])
    write_case(out, "no-crc", base, crc=None)
    write_case(out, "crc-header-hex", base, crc="header-hex")
    write_case(out, "crc-trailer", base, crc="trailer", pad=b"\xde\xad\xbe\xef")
    write_case(out, "u64-length", base, width=64)
    write_case(out, "count-prefix", base, count_prefix="u32")
    write_case(out, "packed-entries", base, stride=212)
    write_case(out, "packed-data", base, data="none", placement="packed")
    # Header JSON of odd length, then zero padding up to a multiple of 8.
    write_case(out, "index-align8", base, index_align8=True,
               header={"config": CONFIG, "note": "x" * 3})
    write_case(out, "relative-data", base[:3], data="relative",
               header={"config": CONFIG, "pad": "y" * 30})
    write_case(out, "total-bytes-off", base[:2], header={"total_bytes": 497025024},
               warnings=["total_bytes"])
    write_case(out, "empty", [], crc=None)
    write_case(out, "all-variants", base, width=64, count_prefix="u64", stride=212,
               data="none", placement="packed", crc="trailer")
    write_case(out, "names", [rand_t(rng, "x" * 127, [2]),
                              rand_t(rng, "transformer.h.0", [1]),
                              rand_t(rng, "transformer.h.0.attn.bias", [1, 1, 3, 3]),
                              rand_t(rng, "caf\u00e9.\u6f22\u5b57", [3]),
                              rand_t(rng, "ctrl\x01.100%", [2]),
                              rand_t(rng, "deep.a.b.c.d.e.f.g", [1, 2, 1, 2, 1, 2, 1, 2])])


# ---------------------------------------------------------------------------
# Hostile cases

def gen_truncations(h, tensors):
    """Cut a natural file (CRC in the header and the trailer) where each field
    starts.  Every tensor is larger than 64 bytes, so a cut inside the data
    section cannot be mistaken for an unaligned data start."""
    assert all(len(t.data) > 64 for t in tensors)
    data, _, fields, _ = write_lwt(tensors, header={"config": CONFIG})
    index_at = field_at(fields, "entry 0 name")[0]
    seen = set()
    for label, off, _ in fields:
        if off in seen or off >= len(data):
            continue
        seen.add(off)
        if off < 8:
            needle = "format|magic"
        elif label in ("header_len", "header JSON"):
            needle = "header_len"
        elif label.startswith("entry"):
            # The count is checked against the room for packed entries first.
            needle = "tensor_count" if off - index_at < 212 * len(tensors) else "index"
        elif label == "crc32 trailer":
            h.add("cut-%04d" % off, data[:off], "", "trailer cut off: the header CRC still "
                  "checks", [t.name for t in tensors])
            continue
        else:
            needle = "past the end"
        h.add("cut-%04d" % off, data[:off], needle, "file cut at offset %d, where %s starts"
              % (off, label))


def edit(index, label, value):
    """entry_edit that replaces one field of entry `index`."""
    def f(i, parts):
        return [(lab, value if i == index and lab == label else b) for lab, b in parts]
    return f


def gen_hostile(out):
    h = FileHostile(os.path.join(out, "hostile"))
    rng = np.random.default_rng(4302)
    ts = [rand_t(rng, "transformer.wte.weight", [5, 6]),
          rand_t(rng, "transformer.ln_f.weight", [20]),
          rand_t(rng, "transformer.ln_f.bias", [17])]
    gen_truncations(h, ts)
    good, offs, fields, _ = write_lwt(ts)

    def p(label, new):
        return patched(good, fields, label, new)

    def w(desc, needle, name, **kw):
        h.add(name, write_lwt(ts, **kw)[0], needle, desc)

    h.add("bad-magic", b"LWATCHV2" + good[8:], "format", "magic LWATCHV2")
    h.add("magic-only", MAGIC, "header_len", "the magic and nothing else")
    h.add("header-len-huge", p("header_len", u32(0xFFFFFFF0)), "header_len",
          "header_len 2^32-16")
    h.add("header-len-past-eof", p("header_len", u32(len(good))), "header_len",
          "header_len one file long")
    # A u64 length of 2^32 or more has non-zero bytes 12..15 and so reads as a u32
    # (choice 1 of lwt.c): the largest u64 length that is recognised is 2^32-1.
    h.add("header-len-u64-huge", MAGIC + u64(2 ** 32 - 1) + good[12:], "header_len",
          "u64 header_len 2^32-1")
    h.add("header-len-u64-zero-json", MAGIC + u64(2 ** 63) + good[16:], "header JSON",
          "u64 header_len 2^63 reads as u32 0: empty JSON")
    for name, text, needle, desc in [
            ("header-not-json", b"{tensor_count: 3}", "header JSON", "unquoted key"),
            ("header-array", b"[3]", "object", "header is an array"),
            ("header-bad-utf8", b"{\"tensor_count\": 3, \"x\": \"\xff\"}", "header JSON",
             "invalid UTF-8"),
            ("header-deep", b"[" * 300 + b"]" * 300, "header JSON", "nested 300 deep"),
            ("header-no-count", b"{\"version\": 1}", "tensor_count", "no tensor_count"),
            ("header-count-negative", b"{\"tensor_count\": -1}", "tensor_count",
             "tensor_count -1"),
            ("header-count-float", b"{\"tensor_count\": 3.0}", "tensor_count",
             "tensor_count 3.0"),
            ("header-count-huge", b"{\"tensor_count\": 18446744073709551615}", "tensor_count",
             "tensor_count 2^64-1"),
            ("header-version-2", b"{\"version\": 2, \"tensor_count\": 3}", "version",
             "version 2"),
            ("header-version-string", b"{\"version\": \"1\", \"tensor_count\": 3}", "version",
             "version \"1\""),
            ("header-dtype-f16", b"{\"dtype\": \"float16\", \"tensor_count\": 3}", "dtype",
             "dtype float16"),
            ("header-big-endian", b"{\"byte_order\": \"big\", \"tensor_count\": 3}",
             "byte_order", "byte_order big"),
            ("header-crc-text", b"{\"tensor_count\": 3, \"crc32\": \"xyz\"}", "crc32",
             "crc32 \"xyz\""),
            ("header-crc-wide", b"{\"tensor_count\": 3, \"crc32\": 1099511627776}", "crc32",
             "crc32 2^40"),
    ]:
        h.add(name, write_lwt(ts, json_text=text, crc=None)[0], needle, desc)

    w("name with no NUL in 128 bytes", "NUL", "name-no-nul",
      entry_edit=edit(1, "name", b"n" * 128))
    w("empty name", "name", "name-empty", entry_edit=edit(0, "name", bytes(128)))
    w("name byte 0xff", "UTF-8", "name-bad-utf8",
      entry_edit=edit(2, "name", b"bad\xff".ljust(128, b"\0")))
    w("ndim 9", "ndim", "ndim-9", entry_edit=edit(0, "ndim", u32(9)))
    w("ndim 2^32-1", "ndim", "ndim-huge", entry_edit=edit(1, "ndim", u32(2 ** 32 - 1)))
    w("shape[2] set with ndim 2", "shape", "shape-beyond-ndim",
      entry_edit=edit(0, "shape", struct.pack("<8Q", 5, 6, 7, 0, 0, 0, 0, 0)))
    w("shape 2^32 x 2^32", "shape|overflow", "shape-overflow",
      entry_edit=edit(0, "shape", struct.pack("<8Q", 2 ** 32, 2 ** 32, 0, 0, 0, 0, 0, 0)))
    w("shape [2^62]: 4 bytes each overflows", "shape|overflow", "shape-bytes-overflow",
      entry_edit=edit(1, "shape", struct.pack("<8Q", 2 ** 62, 0, 0, 0, 0, 0, 0, 0)))
    w("size_bytes 4 short", "size_bytes", "size-short",
      entry_edit=edit(1, "size_bytes", u64(76)))
    w("size_bytes 2^64-1", "size_bytes", "size-huge",
      entry_edit=edit(2, "size_bytes", u64(2 ** 64 - 1)))
    second = offs["transformer.ln_f.weight"] - field_at(fields, "data padding")[0] - \
        field_at(fields, "data padding")[1]
    w("second tensor's offset moved by 4", "misaligned", "offset-misaligned",
      entry_edit=edit(1, "offset", u64(second + 4)))
    w("offset 2^40 (aligned, far past the end)", "past the end", "offset-past-eof",
      entry_edit=edit(2, "offset", u64(2 ** 40)))
    w("offset 2^64-64: offset + size overflows", "overflow", "offset-overflow",
      entry_edit=edit(2, "offset", u64(2 ** 64 - 64)))
    w("duplicate name", "duplicate", "duplicate-names",
      entry_edit=edit(2, "name", b"transformer.wte.weight".ljust(128, b"\0")))
    # CRC-32 damage.
    flip = bytearray(good)
    flip[field_at(fields, "tensor 1 data")[0] + 3] ^= 0x10
    h.add("crc-data-flipped", bytes(flip), "crc32", "one data bit flipped (header + trailer CRC)")
    h.add("crc-trailer-wrong", p("crc32 trailer", u32(0x12345678)), "crc32",
          "trailer CRC differs from the header's and the data's")
    t_only, _, t_fields, _ = write_lwt(ts, crc="trailer")
    flip = bytearray(t_only)
    flip[field_at(t_fields, "tensor 2 data")[0]] ^= 1
    h.add("crc-trailer-only-flipped", bytes(flip), "crc32", "trailer-only CRC, one bit flipped")
    bad_json = write_lwt(ts, crc=None, header={"crc32": 1})[0]
    h.add("crc-header-wrong", bad_json, "crc32", "header crc32 1, no trailer")
    h.add("count-minus-one", write_lwt(ts, tensor_count=2, crc="header")[0], "crc32",
          "tensor_count one short: the last entry is read as data and the CRC disagrees")
    h.add("index-pad-garbage", write_lwt(ts, index_align8=b"\xff", header={"note": "x"})[0],
          "", "index aligned to 8 after 0xff filler bytes", [t.name for t in ts])

    # Accepted: warnings only.
    names = [t.name for t in ts]
    h.add("trailing-10", write_lwt(ts, crc=None, trail=b"0123456789")[0], "",
          "10 bytes after the data section, no CRC", names)
    h.add("total-bytes-wrong", write_lwt(ts, header={"total_bytes": 1})[0], "",
          "total_bytes 1", names)
    h.add("zero-tensors-with-data", write_lwt([], crc=None, trail=b"leftover")[0], "",
          "tensor_count 0 and stray bytes", [])
    h.add("padding-garbage", write_lwt(ts, pad=b"\xff\xff\xff\xff")[0], "",
          "entry padding bytes 0xff", names)
    gen_bound_hostile(h, ts)
    h.finish()


def index_end_at(residue, tensors):
    """A header (a "pad" key of the right length) that makes the natural index of tensors
    (no CRC) end at residue modulo 64."""
    for n in range(64):
        header = {"pad": "p" * n}
        _, _, fields, _ = write_lwt(tensors, header=dict(header), crc=None)
        if (sum(field_at(fields, "header JSON")) + 216 * len(tensors)) % 64 == residue % 64:
            return header
    raise AssertionError("no header length works")


EMPTY = T("e", [0], b"")


def crc32_preimage(target):
    """4 bytes whose zlib CRC-32 is target: over a fixed length the CRC is affine in the
    message bits, so the 32 unknown bits solve a linear system over GF(2)."""
    base = zlib.crc32(bytes(4))
    cols = [zlib.crc32((1 << i).to_bytes(4, "little")) ^ base for i in range(32)]
    rows = []  # Gaussian elimination on (column bits | message bit)
    for i, c in enumerate(cols):
        rows.append((c, 1 << i))
    want, x = target ^ base, 0
    basis = {}
    for c, m in rows:
        for bit in reversed(range(32)):
            if not c >> bit & 1:
                continue
            if bit in basis:
                c, m = c ^ basis[bit][0], m ^ basis[bit][1]
            else:
                basis[bit] = (c, m)
                break
    for bit in reversed(range(32)):
        if want >> bit & 1:
            want, x = want ^ basis[bit][0], x ^ basis[bit][1]
    data = x.to_bytes(4, "little")
    assert zlib.crc32(data) == target
    return data


def gen_bound_good(out):
    """The accepted side of each bound, bytes checked against the manifest (bound-*)."""
    # Exactly tensor_count x 212 bytes after the header: one packed empty entry, no data.
    write_case(out, "bound-index-to-eof", [EMPTY], stride=212, data="none", placement="packed",
               crc=None)
    # An index ending at a multiple of 64, so every data start rule gives the same offset: the
    # last tensor ends exactly at the end of the file; one byte after it is a warning.
    a = T("a", [16], np.arange(16, dtype="<f4").tobytes())
    b = T("b", [0], b"")
    hdr = index_end_at(0, [a, b])
    write_case(out, "bound-data-to-eof", [a, b], header=dict(hdr), crc=None)
    write_case(out, "bound-data-eof-minus-1", [a, b], header=dict(hdr), crc=None, trail=b"\0",
               warnings=["1 bytes after the data section"])
    # An index ending two bytes before a multiple of 64 and one byte after it: the natural
    # data start lies one byte past the end of the file, so the data starts right after the
    # index (with the byte as trailing).
    write_case(out, "bound-start-past-eof", [EMPTY], header=index_end_at(62, [EMPTY]), crc=None,
               data="none", trail=b"\0", warnings=["1 bytes after the data section"])
    # crc32 as a hex string of exactly 8 digits.
    write_case(out, "bound-crc-hex-8", [a], crc="header-hex-bare")


def gen_bound_hostile(h, ts):
    """The refused side of each bound: one byte, entry or digit over (bound-*)."""
    h.add("bound-file-11", MAGIC + b"\0\0\0", "needs 4 bytes", "11-byte file")
    h.add("bound-file-12", MAGIC + u32(0), "header JSON", "12-byte file, header_len 0")
    for n, needle in ((100000000, "past the end"), (100000001, "limit")):
        h.add("bound-header-len-%d" % n, MAGIC + u32(n) + b"{}", needle,
              "header_len %d in a 14-byte file (limit 100000000)" % n)
    text = b'{"tensor_count": 0}'
    h.add("bound-header-to-eof", MAGIC + u32(len(text)) + text, "", "header JSON ends at the "
          "end of the file, tensor_count 0", [])
    h.add("bound-header-eof-plus-1", MAGIC + u32(len(text) + 1) + text, "past the end",
          "header_len one byte more than the file holds")
    h.add("bound-index-count-plus-1", write_lwt([EMPTY], stride=212, data="none",
                                                placement="packed", crc=None,
                                                tensor_count=2)[0],
          "needs at least 424 bytes", "tensor_count 2, 212 bytes of index after the header")
    for d, what in ((1, "over"), (-1, "under")):
        size = len(ts[1].data) + d
        h.add("bound-size-bytes-%s" % what, write_lwt(ts, entry_edit=edit(
            1, "size_bytes", u64(size)))[0],
            "size_bytes %d&does not match shape [20] of float32 (80 bytes)" % size,
            "size_bytes one byte %s 4 x numel" % what)
    a = T("a", [16], np.arange(16, dtype="<f4").tobytes())
    ab = [a, T("b", [0], b"")]
    good = write_lwt(ab, header=index_end_at(0, ab), crc=None)[0]
    h.add("bound-data-eof-plus-1", good[:-1], 'past the end of the file&tensor "a"',
          "the last tensor (a; an empty b follows it) ends one byte past the end of the file")
    # The same with 63 bytes of padding before the data: cut by one byte, the data would fit
    # if it started right after the index (every tensor shifted by 63 bytes).
    padded = write_lwt(ab, header=index_end_at(1, ab), crc=None)[0]
    h.add("bound-data-eof-plus-1-padded", padded[:-1], 'past the end of the file&tensor "a"',
          "natural file with 63 bytes of data padding, cut by one byte")
    crc = zlib.crc32(a.data) & 0xFFFFFFFF
    # The shortest hex string: one digit, for a tensor whose bytes have a CRC-32 of 0x5.
    small = T("s", [1], crc32_preimage(5))
    h.add("bound-crc-hex-1-digit", write_lwt([small], json_text=b'{"tensor_count": 1, '
                                             b'"crc32": "5"}', crc=None)[0], "", "crc32 \"5\"",
          ["s"])
    for name, text, needle, desc in (
            ("0x-9-digits", '"0x0%08x"' % crc, "not a 32-bit integer or hex",
             "crc32 \"0x\" + 9 hex digits"),
            ("9-digits", '"0%08x"' % crc, "not a 32-bit integer or hex", "crc32 of 9 hex digits"),
            ("2p32", "4294967296", "not a 32-bit integer", "crc32 2^32"),
            ("2p32-minus-1", "4294967295", "mismatch&0xffffffff",
             "crc32 2^32-1 (a 32-bit value, the wrong one)")):
        js = b'{"tensor_count": 1, "crc32": %s}' % text.encode()
        h.add("bound-crc-" + name, write_lwt([a], json_text=js, crc=None)[0], needle, desc)


# ---------------------------------------------------------------------------

CASES = ["natural", "no-crc", "crc-header-hex", "crc-trailer", "u64-length", "count-prefix",
         "packed-entries", "packed-data", "index-align8", "relative-data", "total-bytes-off",
         "empty", "all-variants", "names", "hostile", "bound-index-to-eof", "bound-data-to-eof",
         "bound-data-eof-minus-1", "bound-start-past-eof", "bound-crc-hex-8"]


def main(argv):
    return generate(argv, CASES, gen_good, gen_bound_good, gen_hostile)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
