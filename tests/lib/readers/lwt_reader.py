"""A strict reader of LightwatchAI2 .lwt (LWATCHV1) files in the canonical
layout, for the writer tests. Written from the format notes
(shared/formats/gptrs-burnpack-lwt-tp.md, sections 3.2-3.4), sharing nothing
with core/. Unlike ckptfs's tolerant reader it accepts exactly one layout, the
natural reading the notes propose for writers:

  "LWATCHV1" | u32 header_len | header JSON | tensor_count entries of 216 bytes
  | zeros to the next multiple of 64 of the file | data section (each tensor at
  a multiple of 64 from its start, in index order, zeros between) | u32 CRC-32

  entry: char name[128] (NUL-terminated, NUL-padded) | u32 ndim (<= 8) |
         4 zero bytes | u64 shape[8] (unused 0) | u64 offset | u64 size_bytes

The CRC-32 (zlib, IEEE) covers the data section up to the end of the last
tensor and must be stored both in the trailer and as the header's integer
"crc32". total_bytes must be the sum of size_bytes.

    f = read("model.lwt"); f.header, f.tensors (name, shape, offset, size),
    f.tensor_bytes(t)
"""

import json
import struct
import zlib

MAGIC = b"LWATCHV1"
ENTRY = 216
NAME_FIELD = 128
MAX_NDIM = 8
ALIGN = 64


class LWTError(Exception):
    pass


def _align(x):
    return -(-x // ALIGN) * ALIGN


def _no_duplicates(pairs):
    d = {}
    for k, v in pairs:
        if k in d:
            raise LWTError("header JSON has the key %r twice" % k)
        d[k] = v
    return d


def _no_constants(name):
    raise LWTError("header JSON holds %s, which is not JSON" % name)


class Tensor:
    def __init__(self, name, shape, offset, size):
        self.name, self.shape, self.offset, self.size = name, shape, offset, size
        self.dtype = "F32"


class LWT:
    def tensor_bytes(self, t):
        at = self.data_at + t.offset
        return self.buf[at:at + t.size]


def read(path):
    with open(path, "rb") as f:
        return parse(f.read())


def _int(header, key):
    v = header.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise LWTError("header %s is %r, not a non-negative integer" % (key, v))
    return v


def parse(buf):
    f = LWT()
    f.buf = buf
    if len(buf) < 12 or buf[:8] != MAGIC:
        raise LWTError("magic is not LWATCHV1")
    hlen = struct.unpack_from("<I", buf, 8)[0]
    if 12 + hlen > len(buf):
        raise LWTError("header_len %d runs past the end of the file" % hlen)
    if hlen == 0 or buf[12:13] != b"{":
        raise LWTError("the header JSON does not start right after a u32 header_len")
    try:
        text = buf[12:12 + hlen].decode("utf-8")
        header = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constants)
    except (UnicodeDecodeError, ValueError) as e:
        raise LWTError("header JSON: %s" % e)
    if not isinstance(header, dict):
        raise LWTError("header JSON is not an object")
    f.header = header
    if header.get("version") != 1 or isinstance(header.get("version"), bool):
        raise LWTError("header version is %r, not 1" % header.get("version"))
    if header.get("dtype") != "float32":
        raise LWTError("header dtype is %r, not float32" % header.get("dtype"))
    if header.get("byte_order") != "little":
        raise LWTError("header byte_order is %r, not little" % header.get("byte_order"))
    count = _int(header, "tensor_count")
    total = _int(header, "total_bytes")
    crc = _int(header, "crc32")
    if crc > 0xFFFFFFFF:
        raise LWTError("header crc32 %d is over 32 bits" % crc)

    index_at = 12 + hlen
    if index_at + ENTRY * count > len(buf):
        raise LWTError("the index of %d entries runs past the end of the file" % count)
    f.tensors, names, expected, data_len = [], set(), 0, 0
    for k in range(count):
        e = buf[index_at + ENTRY * k:index_at + ENTRY * (k + 1)]
        field = e[:NAME_FIELD]
        nul = field.find(b"\0")
        if nul < 1:
            raise LWTError("entry %d: name is empty or has no NUL in 128 bytes" % k)
        if field[nul:] != bytes(NAME_FIELD - nul):
            raise LWTError("entry %d: bytes after the name's NUL are not zeros" % k)
        try:
            name = field[:nul].decode("utf-8")
        except UnicodeDecodeError:
            raise LWTError("entry %d: name is not UTF-8" % k)
        if name in names:
            raise LWTError("entry %d: duplicate name %r" % (k, name))
        names.add(name)
        ndim, pad = struct.unpack_from("<I4s", e, NAME_FIELD)
        if ndim > MAX_NDIM:
            raise LWTError("tensor %r: ndim %d > 8" % (name, ndim))
        if pad != bytes(4):
            raise LWTError("tensor %r: the 4 padding bytes after ndim are not zeros" % name)
        dims = struct.unpack_from("<8Q", e, 136)
        if any(dims[ndim:]):
            raise LWTError("tensor %r: shape beyond ndim is not 0" % name)
        offset, size = struct.unpack_from("<QQ", e, 200)
        numel = 1
        for d in dims[:ndim]:
            numel *= d
        if size != 4 * numel:
            raise LWTError("tensor %r: size_bytes %d is not 4 x %d" % (name, size, numel))
        if offset != _align(expected):
            raise LWTError("tensor %r: offset %d, expected %d (in order, 64-aligned)"
                           % (name, offset, _align(expected)))
        expected = offset + size
        data_len = max(data_len, expected)
        f.tensors.append(Tensor(name, list(dims[:ndim]), offset, size))
    if total != sum(t.size for t in f.tensors):
        raise LWTError("header total_bytes %d is not the sum of size_bytes" % total)

    index_end = index_at + ENTRY * count
    f.data_at = _align(index_end)
    if buf[index_end:f.data_at] != bytes(f.data_at - index_end):
        raise LWTError("padding before the data section is not zeros")
    if len(buf) != f.data_at + data_len + 4:
        raise LWTError("file size %d is not data start %d + data %d + 4-byte CRC trailer"
                       % (len(buf), f.data_at, data_len))
    prev_end = 0
    for t in f.tensors:
        gap = buf[f.data_at + prev_end:f.data_at + t.offset]
        if gap != bytes(len(gap)):
            raise LWTError("padding before tensor %r is not zeros" % t.name)
        prev_end = t.offset + t.size
    section = buf[f.data_at:f.data_at + data_len]
    f.crc = zlib.crc32(section) & 0xFFFFFFFF
    trailer = struct.unpack_from("<I", buf, f.data_at + data_len)[0]
    if trailer != f.crc:
        raise LWTError("CRC-32 trailer 0x%08x does not match the data (0x%08x)" % (trailer, f.crc))
    if crc != f.crc:
        raise LWTError("header crc32 0x%08x does not match the data (0x%08x)" % (crc, f.crc))
    return f
