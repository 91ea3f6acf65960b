"""An independent reader for Burn's Burnpack (.bpk) files, for tests.

Written from the format notes (shared/formats/gptrs-burnpack-lwt-tp.md, section 2) with its own
CBOR decoder; it shares no code with core/ or with the fixture generators.

    bp = read("model.bpk")                  # strict: the bytes Burn >= 0.20.0-pre.5 writes
    bp = read("old.bpk", strict=False)      # what Burn's reader (and ckptfs) accepts
    for t in bp.tensors: t.name, t.dtype, t.shape, t.param_id, bp.data(t)

Strict mode checks everything the writer recipe (notes 2.7) pins down, so that a file that
passes is the only byte sequence Burn would write for its content:
  - header "NRUB", version 1, metadata_size within Burn's limit and the file;
  - CBOR: definite lengths, shortest integer heads, floats in the narrowest exact width, text
    map keys, no tags, no undefined, no duplicate keys, consumed to the last byte;
  - top-level map keys exactly "tensors" [, "metadata"] [, "scalars"] in that order, metadata
    and scalars omitted when empty, metadata text -> text, scalars {Int|UInt|Float|Bool: v};
  - tensors keyed in bytewise name order, descriptors {dtype, shape, data_offsets[, param_id]}
    in that order, Burn dtypes only, byte length = numel x element size (QFloat excepted);
  - layout: data section at align(10 + M, 256) after zero padding, each tensor (in data order)
    at align(previous end, 256) with zero gaps, nothing after the last one.
Non-strict mode accepts indefinite lengths, tags, any integer widths, any key order, unknown
keys, version 0, and the older unaligned layout (detected as the notes 2.5 suggest).
"""

import math
import struct

MAGIC = b"NRUB"
HEADER = 10
ALIGN = 256
MAX_METADATA = 100 * 1024 * 1024
MAX_DEPTH = 128
MAX_TENSORS = 100000
MAX_TENSOR_BYTES = 10 << 30

# Burn's unit dtypes and their element sizes (notes 2.3).
UNIT_SIZES = {"F64": 8, "F32": 4, "Flex32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4,
              "I16": 2, "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1, "Bool": 1}
BOOL_STORE_SIZES = {"Native": 1, "U8": 1, "U32": 4}


class BurnpackError(ValueError):
    pass


# ---------------------------------------------------------------------------
# CBOR (RFC 8949)


class Float(float):
    """A decoded float that remembers its width in bits (16, 32 or 64)."""

    def __new__(cls, value, bits):
        f = float.__new__(cls, value)
        f.bits = bits
        return f


class Tagged:
    def __init__(self, tag, value):
        self.tag, self.value = tag, value


class _Undefined:
    def __repr__(self):
        return "undefined"


UNDEFINED = _Undefined()
_BREAK = object()


def _fits(x, fmt):
    try:
        return struct.unpack(fmt, struct.pack(fmt, x))[0] == x
    except (OverflowError, struct.error):
        return False


class _Decoder:
    def __init__(self, buf, strict, base):
        self.buf, self.strict, self.base = buf, strict, base
        self.pos = 0

    def fail(self, msg, at=None):
        raise BurnpackError("CBOR at file offset %d: %s"
                            % (self.base + (self.pos if at is None else at), msg))

    def take(self, n):
        if n > len(self.buf) - self.pos:
            self.fail("item runs past the end of the metadata (%d bytes wanted, %d left)"
                      % (n, len(self.buf) - self.pos))
        b = self.buf[self.pos:self.pos + n]
        self.pos += n
        return b

    def argument(self, ai, at):
        if ai < 24:
            return ai
        if ai > 27:
            self.fail("reserved additional information %d" % ai, at)
        width = 1 << (ai - 24)
        v = int.from_bytes(self.take(width), "big")
        if self.strict and v < (24 if width == 1 else 1 << (4 * width)):
            self.fail("integer head %d in %d bytes is not the shortest encoding" % (v, width), at)
        return v

    def item(self, depth):
        if depth > MAX_DEPTH:
            self.fail("nesting deeper than %d" % MAX_DEPTH)
        at = self.pos
        ib = self.take(1)[0]
        major, ai = ib >> 5, ib & 31
        if ai == 31 and major in (2, 3, 4, 5):
            if self.strict:
                self.fail("indefinite length (Burn writes definite lengths only)", at)
            return self.indefinite(major, depth, at)
        if major == 7:
            return self.simple(ai, at)
        if ai == 31:
            self.fail("indefinite length on major type %d" % major, at)
        n = self.argument(ai, at)
        if major == 0:
            return n
        if major == 1:
            return -1 - n
        if major == 2:
            return bytes(self.take(n))
        if major == 3:
            return self.text(self.take(n), at)
        if major == 4:
            if n > len(self.buf) - self.pos:
                self.fail("array count %d exceeds the bytes left" % n, at)
            return [self.value(depth + 1) for _ in range(n)]
        if major == 5:
            if n > (len(self.buf) - self.pos) // 2:
                self.fail("map count %d exceeds the bytes left" % n, at)
            out = {}
            for _ in range(n):
                self.member(out, depth)
            return out
        # major 6: a tag
        if self.strict:
            self.fail("tag %d (Burn writes no tags)" % n, at)
        return Tagged(n, self.value(depth + 1))

    def text(self, b, at):
        try:
            return bytes(b).decode("utf-8")
        except UnicodeDecodeError:
            self.fail("text string is not valid UTF-8", at)

    def member(self, out, depth):
        at = self.pos
        k = self.value(depth + 1)
        if isinstance(k, Tagged):
            k = k.value
        if self.strict and not isinstance(k, str):
            self.fail("map key %r is not a text string" % (k,), at)
        try:
            hash(k)
        except TypeError:
            k = repr(k)
        if k in out:
            self.fail("duplicate map key %r" % (k,), at)
        out[k] = self.value(depth + 1)

    def value(self, depth):
        v = self.item(depth)
        if v is _BREAK:
            self.fail("unexpected break")
        return v

    def indefinite(self, major, depth, at):
        if major in (2, 3):
            chunks = []
            while True:
                c_at = self.pos
                c = self.item(depth + 1)
                if c is _BREAK:
                    break
                if not isinstance(c, bytes if major == 2 else str):
                    self.fail("string chunk of the wrong type", c_at)
                chunks.append(c)
            return (b"" if major == 2 else "").join(chunks)
        if major == 4:
            out = []
            while True:
                v = self.item(depth + 1)
                if v is _BREAK:
                    return out
                out.append(v)
        out = {}
        while True:
            if self.pos < len(self.buf) and self.buf[self.pos] == 0xFF:
                self.pos += 1
                return out
            self.member(out, depth)

    def simple(self, ai, at):
        if ai == 20:
            return False
        if ai == 21:
            return True
        if ai == 22:
            return None
        if ai == 23:
            if self.strict:
                self.fail("undefined (serde has no such value)", at)
            return UNDEFINED
        if ai == 31:
            return _BREAK
        if ai in (25, 26, 27):
            bits = {25: 16, 26: 32, 27: 64}[ai]
            raw = self.take(bits // 8)
            x = struct.unpack({16: ">e", 32: ">f", 64: ">d"}[bits], raw)[0]
            if self.strict:
                narrower = 16 if math.isnan(x) or math.isinf(x) else \
                    16 if _fits(x, ">e") else 32 if _fits(x, ">f") else 64
                if narrower < bits:
                    self.fail("float %r in %d bits fits in %d bits (not the shortest)"
                              % (x, bits, narrower), at)
            return Float(x, bits)
        self.fail("simple value %d" % ai, at)


def decode_cbor(buf, strict=True, base=0):
    """Decode exactly one CBOR item filling buf; base is buf's offset in the file (messages)."""
    d = _Decoder(memoryview(buf), strict, base)
    v = d.value(0)
    if d.pos != len(buf):
        d.fail("%d bytes after the CBOR item" % (len(buf) - d.pos))
    return v


def untag(v):
    while isinstance(v, Tagged):
        v = v.value
    return v


# ---------------------------------------------------------------------------
# Burnpack


def align(v):
    return (v + ALIGN - 1) // ALIGN * ALIGN


def utf8_key(s):
    return s.encode("utf-8")


class Tensor:
    def __init__(self, name, dtype, shape, start, end, param_id):
        self.name, self.dtype, self.shape = name, dtype, shape
        self.start, self.end, self.param_id = start, end, param_id
        self.offset = None  # absolute, set once the layout is known

    @property
    def nbytes(self):
        return self.end - self.start

    @property
    def quantized(self):
        return isinstance(self.dtype, dict) and "QFloat" in self.dtype

    def __repr__(self):
        return "Tensor(%r, %r, %r, [%d, %d), param_id=%r)" % (
            self.name, self.dtype, self.shape, self.start, self.end, self.param_id)


class Burnpack:
    def __init__(self, path, raw):
        self.path, self.raw = path, raw
        self.version = self.metadata_size = self.data_start = None
        self.layout = None
        self.top_keys = []
        self.tensors = []
        self.by_name = {}
        self.metadata = None
        self.scalars = None
        self.unknown_keys = {}

    def data(self, t):
        if isinstance(t, str):
            t = self.by_name[t]
        return bytes(self.raw[t.offset:t.offset + t.nbytes])


def element_size(dtype, strict):
    """Bytes per element, or None for QFloat (packed)."""
    d = untag(dtype)
    if isinstance(d, str):
        if d in UNIT_SIZES:
            return UNIT_SIZES[d]
        raise BurnpackError("dtype %r is not a Burn dtype" % (d,))
    if isinstance(d, dict) and len(d) == 1:
        (k, v), = d.items()
        v = untag(v)
        if k == "Bool":
            if v in BOOL_STORE_SIZES:
                return BOOL_STORE_SIZES[v]
            raise BurnpackError("dtype Bool storage %r is not Native, U8 or U32" % (v,))
        if k == "QFloat":
            if strict and not isinstance(v, dict):
                raise BurnpackError("QFloat scheme %r is not a map" % (v,))
            return None
    raise BurnpackError("dtype %r is not a Burn dtype" % (d,))


def _uint(v, what, bits=64):
    v = untag(v)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0 or v >= 1 << bits:
        raise BurnpackError("%s %r is not an unsigned %d-bit integer" % (what, v, bits))
    return v


def _check_order(keys, what):
    if [utf8_key(k) for k in keys] != sorted(utf8_key(k) for k in keys):
        raise BurnpackError("%s keys are not in bytewise order: %r" % (what, list(keys)[:8]))


def _descriptor(name, d, strict):
    d = untag(d)
    if not isinstance(d, dict):
        raise BurnpackError("tensor %r: descriptor is not a map" % name)
    keys = list(d)
    if strict and keys not in (["dtype", "shape", "data_offsets"],
                               ["dtype", "shape", "data_offsets", "param_id"]):
        raise BurnpackError("tensor %r: descriptor keys %r, want dtype, shape, data_offsets"
                            "[, param_id] in that order" % (name, keys))
    for k in ("dtype", "shape", "data_offsets"):
        if k not in d:
            raise BurnpackError("tensor %r: descriptor has no %r" % (name, k))
    dtype = untag(d["dtype"])
    size = element_size(dtype, strict)
    shape = untag(d["shape"])
    if not isinstance(shape, list):
        raise BurnpackError("tensor %r: shape %r is not an array" % (name, shape))
    shape = [_uint(x, "tensor %r: shape dim" % name) for x in shape]
    offs = untag(d["data_offsets"])
    if not isinstance(offs, list) or len(offs) != 2:
        raise BurnpackError("tensor %r: data_offsets %r is not an array of 2" % (name, offs))
    start, end = (_uint(x, "tensor %r: data_offsets entry" % name) for x in offs)
    if end < start:
        raise BurnpackError("tensor %r: data_offsets [%d, %d) end before they start"
                            % (name, start, end))
    if end - start > MAX_TENSOR_BYTES:
        raise BurnpackError("tensor %r: %d bytes, over Burn's 10 GiB limit" % (name, end - start))
    param_id = None
    if "param_id" in d:
        p = untag(d["param_id"])
        if p is None and not strict:
            param_id = None
        else:
            param_id = _uint(p, "tensor %r: param_id" % name)
    if size is not None:
        numel = 1
        for x in shape:
            numel *= x
        if numel * size != end - start:
            raise BurnpackError("tensor %r: %d bytes but shape %r of %r needs %d"
                                % (name, end - start, shape, dtype, numel * size))
    return Tensor(name, dtype, shape, start, end, param_id)


def _metadata(v, strict):
    v = untag(v)
    if not isinstance(v, dict):
        raise BurnpackError("metadata is not a map")
    if strict:
        if not v:
            raise BurnpackError("metadata is present but empty (Burn omits it)")
        _check_order(v, "metadata")
        for k, x in v.items():
            if not isinstance(x, str):
                raise BurnpackError("metadata %r: value %r is not text" % (k, x))
    return v


SCALAR_KINDS = ("Int", "UInt", "Float", "Bool")


def _scalars(v, strict):
    v = untag(v)
    if not isinstance(v, dict):
        raise BurnpackError("scalars is not a map")
    if strict:
        if not v:
            raise BurnpackError("scalars is present but empty (Burn omits it)")
        _check_order(v, "scalars")
        for k, x in v.items():
            if not isinstance(x, dict) or len(x) != 1 or list(x)[0] not in SCALAR_KINDS:
                raise BurnpackError("scalar %r: %r is not {Int|UInt|Float|Bool: value}" % (k, x))
            (kind, val), = x.items()
            ok = {"Int": lambda y: isinstance(y, int) and not isinstance(y, bool)
                  and -(1 << 63) <= y < 1 << 63,
                  "UInt": lambda y: isinstance(y, int) and not isinstance(y, bool)
                  and 0 <= y < 1 << 64,
                  "Float": lambda y: isinstance(y, Float),
                  "Bool": lambda y: isinstance(y, bool)}[kind](val)
            if not ok:
                raise BurnpackError("scalar %r: %s value %r is out of its type" % (k, kind, val))
    return v


def parse(raw, path="<bytes>", strict=True):
    bp = Burnpack(path, raw)
    size = len(raw)
    if size < HEADER:
        raise BurnpackError("file is %d bytes, shorter than the 10-byte header" % size)
    if raw[:4] != MAGIC:
        raise BurnpackError("magic %r is not NRUB" % bytes(raw[:4]))
    bp.version, bp.metadata_size = struct.unpack("<HI", raw[4:10])
    if bp.version > 1 or (strict and bp.version != 1):
        raise BurnpackError("version %d (want 1)" % bp.version)
    m = bp.metadata_size
    if m > MAX_METADATA:
        raise BurnpackError("metadata_size %d exceeds Burn's 100 MiB limit" % m)
    if HEADER + m > size:
        raise BurnpackError("metadata_size %d runs past the end of the file" % m)
    top = untag(decode_cbor(raw[HEADER:HEADER + m], strict, HEADER))
    if not isinstance(top, dict):
        raise BurnpackError("the metadata is not a CBOR map")
    bp.top_keys = list(top)
    if strict:
        want = ["tensors"] + [k for k in ("metadata", "scalars") if k in top]
        if bp.top_keys != want:
            raise BurnpackError("top-level keys %r, want %r" % (bp.top_keys, want))
    if "tensors" not in top:
        raise BurnpackError("no \"tensors\" key")
    tmap = untag(top["tensors"])
    if not isinstance(tmap, dict):
        raise BurnpackError("tensors is not a map")
    if len(tmap) > MAX_TENSORS:
        raise BurnpackError("%d tensors, over Burn's limit of %d" % (len(tmap), MAX_TENSORS))
    for k in tmap:
        if not isinstance(k, str):
            raise BurnpackError("tensor name %r is not text" % (k,))
    if strict:
        _check_order(tmap, "tensors")
    bp.tensors = [_descriptor(k, v, strict) for k, v in tmap.items()]
    bp.by_name = {t.name: t for t in bp.tensors}
    if "metadata" in top:
        bp.metadata = _metadata(top["metadata"], strict)
    if "scalars" in top:
        bp.scalars = _scalars(top["scalars"], strict)
    bp.unknown_keys = {k: v for k, v in top.items() if k not in ("tensors", "metadata", "scalars")}
    _layout(bp, strict)
    return bp


def _layout(bp, strict):
    raw, size = bp.raw, len(bp.raw)
    u = HEADER + bp.metadata_size
    a = align(u)
    max_end = max((t.end for t in bp.tensors), default=0)
    if strict:
        bp.layout, bp.data_start = "aligned", a
    else:
        # notes 2.5: decide between the aligned and the older packed layout
        if u == a or (all(t.start % ALIGN == 0 for t in bp.tensors) and
                      (size == a + max_end or size != u + max_end) and
                      not any(raw[u:min(a, size)])):
            bp.layout, bp.data_start = "aligned", a
        else:
            bp.layout, bp.data_start = "unaligned", u
    ds = bp.data_start
    if size < ds + max_end:
        raise BurnpackError("the data section at %d needs %d bytes, the file has %d"
                            % (ds, max_end, max(size - ds, 0)))
    for t in bp.tensors:
        t.offset = ds + t.start
    order = sorted(bp.tensors, key=lambda t: (t.start, t.end))
    prev = None
    for t in order:
        if prev is not None and t.start < prev.end and t.nbytes and prev.nbytes:
            raise BurnpackError("tensors %r and %r overlap" % (prev.name, t.name))
        prev = t if prev is None or t.end >= prev.end else prev
    if not strict:
        return
    if any(raw[u:a]):
        raise BurnpackError("padding bytes [%d, %d) after the CBOR are not all zero" % (u, a))
    end = 0
    for t in order:
        want = align(end)
        if t.start != want:
            raise BurnpackError("tensor %r starts at %d of the data section, want align(%d, 256)"
                                " = %d" % (t.name, t.start, end, want))
        if t.offset % ALIGN:
            raise BurnpackError("tensor %r at file offset %d is not 256-aligned"
                                % (t.name, t.offset))
        if any(raw[ds + end:ds + t.start]):
            raise BurnpackError("gap before tensor %r is not all zero" % t.name)
        end = t.end
    if size != ds + end:
        raise BurnpackError("file is %d bytes, want data_start %d + last end %d = %d"
                            % (size, ds, end, ds + end))


def read(path, strict=True):
    with open(path, "rb") as f:
        raw = f.read()
    try:
        return parse(raw, path, strict)
    except BurnpackError as e:
        raise BurnpackError("%s: %s" % (path, e)) from None
