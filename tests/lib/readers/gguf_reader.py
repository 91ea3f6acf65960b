"""A strict GGUF reader for the writer tests, written from the format notes
(shared/formats/safetensors-dcp-torch-gguf.md section 4), sharing nothing with
core/.

It accepts what ggml's own reader accepts and checks the layout rules a writer
must follow (section 4.3): tensors in info order, packed, each starting at a
multiple of the alignment, zero padding everywhere (ggml's writer also pads
after the last tensor, and reads the padded total, so the file must end there).
Nested arrays (the spec allows them, ggml refuses them), BOOL values other than
0 and 1, and string values that are not UTF-8 (ggml does not check) are read and
reported in `notes` instead of failing, so a KV copied from a source that has
them can still be compared. Keys and tensor names must be UTF-8.

    g = read("model.gguf")
    g.version, g.alignment, g.kvs (list of KV), g.tensors (list of Tensor)
    g.tensor_bytes(t) -> bytes of one tensor
"""

import struct

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
GGML_MAX_DIMS = 4
GGML_MAX_NAME = 64  # with the NUL: names have at most 63 bytes

# gguf_type: (name, fixed size or None)
VALUE_TYPES = [("UINT8", 1), ("INT8", 1), ("UINT16", 2), ("INT16", 2), ("UINT32", 4),
               ("INT32", 4), ("FLOAT32", 4), ("BOOL", 1), ("STRING", None), ("ARRAY", None),
               ("UINT64", 8), ("INT64", 8), ("FLOAT64", 8)]
STRING, ARRAY = 8, 9
SCALAR_FORMAT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<B",
                 10: "<Q", 11: "<q", 12: "<d"}

# ggml_type id -> (name, elements per block, bytes per block), section 4.5
GGML_TYPES = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2),
    26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17), 40: ("NVFP4", 64, 36), 41: ("Q1_0", 128, 18), 42: ("Q2_0", 64, 18),
}
GGML_TYPE_IDS = {v[0]: k for k, v in GGML_TYPES.items()}


class GGUFError(Exception):
    pass


class KV:
    def __init__(self, key, vtype, value, raw):
        self.key, self.type, self.value, self.raw = key, vtype, value, raw

    def __repr__(self):
        return "KV(%r, %s, %r)" % (self.key, VALUE_TYPES[self.type][0], self.value)


class Tensor:
    def __init__(self, name, ne, ggml_type, offset):
        self.name, self.ne, self.ggml_type, self.offset = name, ne, ggml_type, offset
        self.type_name, self.block, self.type_size = GGML_TYPES[ggml_type]
        self.shape = list(reversed(ne))  # row-major
        numel = 1
        for d in ne:
            numel *= d
        self.numel = numel
        self.nbytes = numel // self.block * self.type_size
        self.abs_offset = None


class GGUF:
    pass


class _Cursor:
    def __init__(self, buf):
        self.buf, self.pos = buf, 0

    def take(self, n, what):
        if n < 0 or self.pos + n > len(self.buf):
            raise GGUFError("%s at offset %d (%d bytes) runs past the end of the file (%d)"
                            % (what, self.pos, n, len(self.buf)))
        b = self.buf[self.pos:self.pos + n]
        self.pos += n
        return b

    def u32(self, what):
        return struct.unpack("<I", self.take(4, what))[0]

    def u64(self, what):
        return struct.unpack("<Q", self.take(8, what))[0]

    def string(self, what):
        n = self.u64(what + " length")
        b = self.take(n, what)
        try:
            return b.decode("utf-8")
        except UnicodeDecodeError:
            raise GGUFError("%s at offset %d is not UTF-8" % (what, self.pos - n))


def _value(c, vtype, depth, notes):
    if vtype >= len(VALUE_TYPES):
        raise GGUFError("value type %d at offset %d is unknown" % (vtype, c.pos - 4))
    if vtype == STRING:
        # the spec says UTF-8, ggml does not check: noted, not refused, so that a value
        # copied from such a source can still be compared
        n = c.u64("string length")
        b = c.take(n, "string")
        try:
            return b.decode("utf-8")
        except UnicodeDecodeError:
            notes.append("string value at offset %d is not UTF-8" % (c.pos - n))
            return b
    if vtype == ARRAY:
        et = c.u32("array element type")
        n = c.u64("array length")
        if et >= len(VALUE_TYPES):
            raise GGUFError("array element type %d at offset %d is unknown" % (et, c.pos - 12))
        if et == ARRAY:
            notes.append("nested array at offset %d" % (c.pos - 12))
            if depth > 16:
                raise GGUFError("arrays nested too deep at offset %d" % c.pos)
        size = VALUE_TYPES[et][1]
        if size and n * size > len(c.buf) - c.pos:
            raise GGUFError("array of %d at offset %d runs past the end" % (n, c.pos - 8))
        return (et, [_value(c, et, depth + 1, notes) for _ in range(n)])
    v = struct.unpack(SCALAR_FORMAT[vtype], c.take(VALUE_TYPES[vtype][1], "value"))[0]
    if vtype == 7 and v not in (0, 1):
        notes.append("BOOL value %d at offset %d" % (v, c.pos - 1))
    return v


def read(path, layout=True):
    with open(path, "rb") as f:
        buf = f.read()
    return parse(buf, layout)


def parse(buf, layout=True):
    """layout=False reads the header only (KVs and tensor infos of any writer's file)."""
    g = GGUF()
    g.buf = buf
    g.notes = []
    c = _Cursor(buf)
    if c.take(4, "magic") != MAGIC:
        raise GGUFError("magic is not GGUF")
    g.version = c.u32("version")
    if g.version not in (2, 3):
        raise GGUFError("version %d is not 2 or 3" % g.version)
    n_tensors = c.u64("tensor_count")
    n_kv = c.u64("kv_count")
    if n_tensors >= 1 << 63 or n_kv >= 1 << 63:
        raise GGUFError("counts are negative as int64")
    if n_kv * 13 > len(buf) or n_tensors * 24 > len(buf):
        raise GGUFError("counts exceed what the file could hold")

    g.kvs, keys = [], set()
    g.alignment = DEFAULT_ALIGNMENT
    for i in range(n_kv):
        start = c.pos
        key = c.string("key")
        if not key:
            raise GGUFError("KV %d: empty key at offset %d" % (i, start))
        if key in keys:
            raise GGUFError("KV %d: duplicate key %r at offset %d" % (i, key, start))
        keys.add(key)
        vtype = c.u32("value type")
        value = _value(c, vtype, 0, g.notes)
        g.kvs.append(KV(key, vtype, value, buf[start:c.pos]))
        if key == "general.alignment":
            if vtype != 4:
                raise GGUFError("general.alignment has type %s, not UINT32"
                                % VALUE_TYPES[vtype][0])
            if value == 0 or value & (value - 1) or value % 8:
                raise GGUFError("general.alignment %d is not a power of two >= 8" % value)
            g.alignment = value

    g.tensors, names = [], set()
    for i in range(n_tensors):
        at = c.pos
        name = c.string("tensor name")
        if len(name.encode("utf-8")) >= GGML_MAX_NAME:
            raise GGUFError("tensor %d name %r at offset %d has %d bytes (max %d)"
                            % (i, name, at, len(name.encode("utf-8")), GGML_MAX_NAME - 1))
        if "\0" in name:
            raise GGUFError("tensor %d name at offset %d holds a NUL" % (i, at))
        if name in names:
            raise GGUFError("duplicate tensor name %r at offset %d" % (name, at))
        names.add(name)
        n_dims = c.u32("n_dims")
        if n_dims > GGML_MAX_DIMS:
            raise GGUFError("tensor %r: n_dims %d > %d" % (name, n_dims, GGML_MAX_DIMS))
        ne = [c.u64("ne") for _ in range(n_dims)]
        if any(d >= 1 << 63 for d in ne):
            raise GGUFError("tensor %r: ne %r is negative as int64" % (name, ne))
        gt = c.u32("type")
        if gt not in GGML_TYPES:
            raise GGUFError("tensor %r: ggml type %d is unknown" % (name, gt))
        offset = c.u64("offset")
        t = Tensor(name, ne, gt, offset)
        if (ne[0] if ne else 1) % t.block:
            raise GGUFError("tensor %r: ne[0] %d is not a multiple of the %s block %d"
                            % (name, ne[0] if ne else 1, t.type_name, t.block))
        if t.numel >= 1 << 63:
            raise GGUFError("tensor %r: too many elements" % name)
        g.tensors.append(t)

    def padded(n):
        return -(-n // g.alignment) * g.alignment

    g.header_end = c.pos
    g.data_offset = padded(c.pos)
    if not layout:
        return g
    if buf[c.pos:g.data_offset] != bytes(g.data_offset - c.pos):
        raise GGUFError("padding before the data section at %d is not zeros" % c.pos)
    expected = 0
    for t in g.tensors:
        # ggml's reader: each offset is the padded running total, in info order
        if t.offset != expected:
            raise GGUFError("tensor %r has offset %d, expected %d (packed, in order)"
                            % (t.name, t.offset, expected))
        t.abs_offset = g.data_offset + t.offset
        end = t.abs_offset + t.nbytes
        if end > len(buf):
            raise GGUFError("tensor %r data runs past the end of the file" % t.name)
        pad_end = g.data_offset + padded(t.offset + t.nbytes)
        if buf[end:pad_end] != bytes(pad_end - end):
            raise GGUFError("padding after tensor %r is not zeros" % t.name)
        expected = padded(t.offset + t.nbytes)
    if len(buf) != g.data_offset + expected:
        raise GGUFError("file size %d is not the end of the padded data section (%d)"
                        % (len(buf), g.data_offset + expected))
    return g


def tensor_bytes(g, t):
    return g.buf[t.abs_offset:t.abs_offset + t.nbytes]


GGUF.tensor_bytes = tensor_bytes


def kv(g, key):
    for k in g.kvs:
        if k.key == key:
            return k
    return None


GGUF.kv = kv
