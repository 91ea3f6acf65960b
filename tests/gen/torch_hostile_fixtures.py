#!/usr/bin/python3
"""Write hostile torch.save-style files for ckptfs: damaged zips, malicious and malformed
pickles, damaged legacy files.  No torch needed: zips are assembled with struct (the layout
torch's writer uses: records under <archive>/, 64-byte aligned data through an "FB" extra
field, zip64 end records), pickles with a small opcode assembler (the opcodes torch writes).

usage: torch_hostile_fixtures.py OUTDIR

OUTDIR/cases.tsv      path <TAB> refuse|mount <TAB> needle <TAB> description
                      (needle: words, "a|b" = either, one of which the single stderr line of a
                      refusal must contain)
OUTDIR/canaries.json  for the pickles whose payload would run a command: the file the payload
                      would create, and the record that holds the pickle, so a test can first
                      prove with Python's own pickle that the payload is live
Deterministic: the same bytes on every run.
"""

import hashlib
import os
import struct
import sys
import zlib

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
from fixture_lib import fresh_out, write_cases, write_json  # noqa: E402

ARCHIVE = "archive"
# Where a payload that ran would leave its file: inside OUTDIR (set by main), so that suites
# running at once on one machine (worktrees, make mutate's snapshot) never see each other's.
CANARY_DIR = None


# ---------------------------------------------------------------------------
# A pickle assembler: protocol 2 opcodes as torch writes them (protocol 4 on request)

class Pickle:
    def __init__(self, proto=2):
        self.b = bytearray(b"\x80" + bytes([proto]))

    def raw(self, data):
        self.b += data
        return self

    def mark(self):
        return self.raw(b"(")

    def glob(self, module, name):
        return self.raw(b"c" + module.encode() + b"\n" + name.encode() + b"\n")

    def str(self, s):
        e = s.encode("utf-8")
        return self.raw(b"X" + struct.pack("<I", len(e)) + e)

    def short_str(self, s):
        e = s.encode("utf-8")
        return self.raw(b"\x8c" + bytes([len(e)]) + e)

    def int(self, v):
        if 0 <= v < 256:
            return self.raw(b"K" + bytes([v]))
        if -2 ** 31 <= v < 2 ** 31:
            return self.raw(b"J" + struct.pack("<i", v))
        n = (v.bit_length() + 8) // 8
        return self.raw(b"\x8a" + bytes([n]) + v.to_bytes(n, "little", signed=True))

    def tuple_of(self, items):
        self.mark()
        for x in items:
            self.int(x)
        return self.raw(b"t")

    def empty_dict(self):
        return self.raw(b"}")

    def setitem(self):
        return self.raw(b"s")

    def reduce(self):
        return self.raw(b"R")

    def stop(self):
        return self.raw(b".")

    def ordered_dict(self):
        return self.glob("collections", "OrderedDict").raw(b")").reduce()

    def storage(self, cls, key, numel, location="cpu"):
        self.mark().str("storage").glob("torch", cls).str(key).str(location)
        if isinstance(numel, int):
            self.int(numel)
        else:
            numel(self)
        return self.raw(b"t").raw(b"Q")

    def tensor(self, cls, key, numel, offset, size, stride, rebuild="_rebuild_tensor_v2",
               size_op=None, stride_op=None):
        self.glob("torch._utils", rebuild).mark()
        self.storage(cls, key, numel)
        self.int(offset)
        (size_op or (lambda p: p.tuple_of(size)))(self)
        (stride_op or (lambda p: p.tuple_of(stride)))(self)
        self.raw(b"\x89")  # requires_grad False
        self.ordered_dict()
        return self.raw(b"t").reduce()

    def bytes(self):
        return bytes(self.b)


def state_dict(entries):
    """{name: emit(pickle)} as an OrderedDict pickle."""
    p = Pickle()
    p.ordered_dict()
    for name, emit in entries:
        p.str(name)
        emit(p)
        p.setitem()
    return p.stop().bytes()


def rebuild(cls, key, numel, offset, size, stride, **kw):
    return lambda p: p.tensor(cls, key, numel, offset, size, stride, **kw)


W_BYTES = struct.pack("<6f", 1, 2, 3, 4, 5, 6)
B_BYTES = struct.pack("<3q", -1, 0, 1)


def good_pickle():
    return state_dict([("w", rebuild("FloatStorage", "0", 6, 0, [2, 3], [3, 1])),
                       ("b", rebuild("LongStorage", "1", 3, 0, [3], [1]))])


def good_records(pkl=None):
    return [("data.pkl", good_pickle() if pkl is None else pkl), ("data/0", W_BYTES),
            ("data/1", B_BYTES), ("version", b"3\n")]


# ---------------------------------------------------------------------------
# A zip writer with torch's layout, which records where every structure starts

def torch_zip(records, archive=ARCHIVE, deflate=(), flags=None, zip64=True,
              align=64, eocd_patch=None):
    out = bytearray()
    central = []
    marks = []  # (offset, what): the start of each structure, for truncation
    for name, data in records:
        full = (archive + "/" + name if archive is not None else name).encode()
        method = 8 if name in deflate else 0
        body = zlib.compress(data)[2:-4] if method == 8 else data
        crc = zlib.crc32(data)
        start = len(out)
        marks.append((start, "local header of " + name))
        pad = (-(start + 30 + len(full) + 4)) % align if align else 0
        extra = b"FB" + struct.pack("<H", pad) + b"Z" * pad if align else b""
        fl = (flags or {}).get(name, 0x0800)
        out += struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, fl, method, 0, 0, crc, len(body),
                           len(data), len(full), len(extra))
        out += full + extra
        marks.append((len(out), "data of " + name))
        out += body
        central.append((full, fl, method, crc, len(body), len(data), start))
    cd_start = len(out)
    marks.append((cd_start, "central directory"))
    for full, fl, method, crc, csize, usize, off in central:
        marks.append((len(out), "central entry " + full.decode()))
        out += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, fl, method, 0, 0, crc,
                           csize, usize, len(full), 0, 0, 0, 0, 0, off)
        out += full
    cd_size = len(out) - cd_start
    n = len(central)
    fields = {"entries": n, "cd_size": cd_size, "cd_offset": cd_start}
    if eocd_patch:
        fields.update(eocd_patch)
    if zip64:
        z64 = len(out)
        marks.append((z64, "zip64 end record"))
        out += struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 45, 45, 0, 0, fields["entries"],
                           fields["entries"], fields["cd_size"], fields["cd_offset"])
        marks.append((len(out), "zip64 locator"))
        out += struct.pack("<IIQI", 0x07064B50, 0, fields.get("z64_offset", z64), 1)
    marks.append((len(out), "end record"))
    small = lambda v, lim: v if v < lim else lim
    out += struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, small(fields["entries"], 0xFFFF),
                       small(fields["entries"], 0xFFFF), small(fields["cd_size"], 0xFFFFFFFF),
                       small(fields["cd_offset"], 0xFFFFFFFF), 0)
    marks.append((len(out) - 12, "middle of the end record"))
    return bytes(out), marks


# ---------------------------------------------------------------------------
# Cases

class Cases:
    def __init__(self, out):
        self.out = out
        self.rows = []
        self.canaries = {}
        self.bound_bytes = {}  # mount case: {tensor: sha256 of the bytes it must show}

    def add(self, name, data, expect, needle, desc):
        with open(os.path.join(self.out, name), "wb") as f:
            f.write(data)
        self.rows.append((name, expect, needle, desc))

    def refuse(self, name, data, needle, desc):
        self.add(name, data, "refuse", needle, desc)

    def zip_pickle(self, name, pkl, needle, desc, **kw):
        self.refuse(name, torch_zip(good_records(pkl), **kw)[0], needle, desc)


def payload_cases(c):
    """Pickles that would run a command under a normal unpickler."""
    def add(case, build, needle):
        canary = os.path.join(CANARY_DIR, "ckptfs-torch-canary-" + case)
        p = Pickle(4 if case == "stack_global_os" else 2)
        p.empty_dict().str("w")
        build(p, canary)
        p.setitem().stop()
        name = "evil_%s.pt" % case
        c.refuse(name, torch_zip(good_records(p.bytes()))[0], needle,
                 "global %s would run a command: refused, nothing runs" % needle)
        c.canaries[name] = {"canary": canary, "record": ARCHIVE + "/data.pkl"}

    add("os_system", lambda p, f: p.glob("os", "system").mark().str("touch " + f)
        .raw(b"t").reduce(), "os.system")
    add("posix_system", lambda p, f: p.glob("posix", "system").mark().str("touch " + f)
        .raw(b"t").reduce(), "posix.system")
    add("builtins_eval", lambda p, f: p.glob("builtins", "eval").mark()
        .str("open(%r, 'w').close()" % f).raw(b"t").reduce(), "builtins.eval")
    add("subprocess_popen", lambda p, f: p.glob("subprocess", "Popen").mark().mark()
        .str("touch").str(f).raw(b"l").raw(b"t").reduce(), "subprocess.Popen")
    # os = __import__("os"); getattr(os, "system")("touch ...")
    add("builtins_import", lambda p, f: p.glob("builtins", "__import__").mark().str("os")
        .raw(b"t").reduce().raw(b"q\x00").raw(b"0").glob("builtins", "getattr").mark()
        .raw(b"h\x00").str("system").raw(b"t").reduce().mark().str("touch " + f).raw(b"t")
        .reduce(), "builtins.__import__")
    add("stack_global_os", lambda p, f: p.short_str("os").short_str("system").raw(b"\x93")
        .short_str("touch " + f).raw(b"\x85").reduce(), "os.system")


def pickle_cases(c):
    # Opcodes that import or instantiate by themselves.
    c.zip_pickle("op_inst.pt", b"\x80\x02(ios\nsystem\n.", "INST",
                 "INST opcode (imports a class and calls it)")
    c.zip_pickle("op_obj.pt", Pickle().mark().glob("os", "system").raw(b"o").stop().bytes(),
                 "os.system", "OBJ opcode after a forbidden GLOBAL")
    c.zip_pickle("op_ext1.pt", b"\x80\x02\x82\x01.", "EXT1", "EXT1 (copyreg extension registry)")
    c.zip_pickle("builtin_getattr.pt",
                 Pickle().glob("__builtin__", "getattr").mark().glob("collections", "OrderedDict")
                 .str("fromkeys").raw(b"t").reduce().stop().bytes(), "builtins.getattr",
                 "protocol 2 spelling __builtin__.getattr")
    c.zip_pickle("op_unknown.pt", b"\x80\x02\xff.", "opcode", "unknown opcode 0xff")
    c.zip_pickle("op_protocol6.pt", b"\x80\x06}.", "protocol", "pickle protocol 6")
    c.zip_pickle("op_text_get.pt", b"\x80\x02}p0\n.", "PUT", "protocol 0 text PUT")
    c.zip_pickle("empty_pickle.pt", b"", "STOP|truncated", "data.pkl is empty")
    c.zip_pickle("no_stop.pt", good_pickle()[:-1], "STOP|truncated", "pickle without STOP")
    c.zip_pickle("truncated_pickle.pt", good_pickle()[:60], "truncated",
                 "pickle cut in the middle of an opcode")
    c.zip_pickle("underflow.pt", b"\x80\x02R.", "underflow", "REDUCE on an empty stack")
    c.zip_pickle("underflow_mark.pt", b"\x80\x02](a.", "underflow|MARK",
                 "APPEND with only a MARK above the list")
    c.zip_pickle("append_dict.pt", b"\x80\x02}K\x01a.", "dict|list", "APPEND to a dict")
    c.zip_pickle("setitems_odd.pt", b"\x80\x02}(K\x01u.", "odd", "SETITEMS with an odd count")
    c.zip_pickle("build_int.pt", b"\x80\x02K\x01}b.", "state|int", "BUILD on an int")
    c.zip_pickle("reduce_args.pt",
                 Pickle().glob("collections", "OrderedDict").int(1).reduce().stop().bytes(),
                 "tuple", "REDUCE whose arguments are not a tuple")
    c.zip_pickle("memo_get_missing.pt", b"\x80\x02h\x05.", "memo", "BINGET of an index never put")
    c.zip_pickle("memo_put_huge.pt", b"\x80\x02}r\xff\xff\xff\xff.", "memo",
                 "LONG_BINPUT 0xFFFFFFFF (a 32 GiB memo if trusted)")
    c.zip_pickle("memo_get_huge.pt", b"\x80\x02}q\x00j\xff\xff\xff\x7f.", "memo",
                 "LONG_BINGET far beyond the memo")
    c.zip_pickle("unicode_huge.pt", b"\x80\x02X\xff\xff\xff\xff.", "past the end|truncated",
                 "BINUNICODE length 0xFFFFFFFF")
    c.zip_pickle("unicode8_huge.pt", b"\x80\x04\x8d" + b"\xff" * 8 + b".",
                 "past the end|truncated", "BINUNICODE8 length 2^64-1")
    c.zip_pickle("frame_huge.pt", b"\x80\x04\x95" + b"\xff" * 8 + b"}.", "frame",
                 "FRAME longer than the pickle")
    c.zip_pickle("long4_negative.pt", b"\x80\x02\x8b\xff\xff\xff\xff.", "negative",
                 "LONG4 with a negative length")
    c.zip_pickle("binstring_negative.pt", b"\x80\x02T\xff\xff\xff\xff.", "negative",
                 "BINSTRING with a negative length")
    c.zip_pickle("global_no_newline.pt", b"\x80\x02c" + b"a" * 400, "newline",
                 "GLOBAL without a newline")
    # Depth and size bombs.
    c.zip_pickle("deep_stack.pt", b"\x80\x02" + b"]" * 1000000 + b"a" * 999999 + b".", "stack",
                 "1e6 nested lists built on the stack")
    c.zip_pickle("deep_marks.pt", b"\x80\x02" + b"(" * 1000000 + b"N.", "MARK",
                 "1e6 nested MARKs")
    deep = bytearray(b"\x80\x02}r\x00\x00\x00\x00")  # dict 0, memo 0
    for i in range(1, 200000):  # memo[i-1]["a"] = memo[i] = {}, keeping the stack flat
        deep += (b"j" + struct.pack("<I", i - 1) + b"X\x01\x00\x00\x00a}r"
                 + struct.pack("<I", i) + b"s0")
    deep += b"."
    c.zip_pickle("deep_memo_dicts.pt", bytes(deep), "deeper|nested",
                 "200000 nested dicts built through the memo (a flat stack): names a.a.a...")
    deep = bytearray(b"\x80\x02}X\x01\x00\x00\x00x]r\x00\x00\x00\x00")  # {"x": list 0}
    for i in range(1, 200000):  # memo[i-1].append(memo[i] = [])
        deep += b"j" + struct.pack("<I", i - 1) + b"]r" + struct.pack("<I", i) + b"a0"
    deep += b"s."
    c.add("deep_memo_lists.pt", torch_zip(good_records(bytes(deep)))[0], "mount", "-",
          "a value of 200000 nested lists: mounted, shown up to a depth limit")
    dag = bytearray(b"\x80\x02]q\x00")  # level 0: [], memo 0; level i = [level i-1] * 2
    for i in range(1, 90):
        dag += b"(h" + bytes([i - 1]) + b"h" + bytes([i - 1]) + b"lq" + bytes([i]) + b"0"
    dag += b"}X\x01\x00\x00\x00xh" + bytes([89]) + b"s."
    c.zip_pickle("dag_bomb.pt", bytes(dag), "expands|shared",
                 "a list of 2 references to a list of 2 references ... 89 levels (2^89 leaves)")
    cyc = b"\x80\x02}X\x01\x00\x00\x00x]q\x00h\x00as."  # x = L where L = [L]
    c.add("cyclic_list.pt", torch_zip(good_records(cyc))[0], "mount", "-",
          "a list that contains itself: mounted, shown up to a depth limit")

    # Tensors that lie about their storage.
    def sd(*entries):
        return state_dict(list(entries))

    c.zip_pickle("storage_missing.pt",
                 sd(("w", rebuild("FloatStorage", "7", 6, 0, [2, 3], [3, 1]))), "no record", "persistent id names a storage record that does not exist")
    c.zip_pickle("storage_numel_lie.pt",
                 sd(("w", rebuild("FloatStorage", "0", 600, 0, [2, 3], [3, 1]))), "storage",
                 "storage numel 600 but the record holds 6 floats")
    c.zip_pickle("storage_too_small.pt",
                 sd(("w", rebuild("FloatStorage", "0", 6, 0, [3, 4], [4, 1]))), "storage",
                 "shape 3x4 on a storage of 6 elements")
    c.zip_pickle("storage_offset_past.pt",
                 sd(("w", rebuild("FloatStorage", "0", 6, 5, [2], [1]))), "storage",
                 "storage_offset 5 + 2 elements on a storage of 6")
    c.zip_pickle("storage_offset_huge.pt",
                 sd(("w", rebuild("FloatStorage", "0", 6, 2 ** 62, [1], [1]))), "storage",
                 "storage_offset 2^62")
    c.zip_pickle("stride_negative.pt",
                 sd(("w", rebuild("FloatStorage", "0", 6, 5, [2, 3], [-3, 1]))), "negative",
                 "a negative stride")
    c.zip_pickle("stride_overflow.pt",
                 sd(("w", rebuild("FloatStorage", "0", 6, 0, [8, 3], [2 ** 62, 1]))), "overflow",
                 "stride 2^62 x 7 overflows 64 bits")
    c.zip_pickle("stride_huge.pt",
                 sd(("w", rebuild("FloatStorage", "0", 6, 0, [2, 3], [2 ** 40, 1]))), "storage",
                 "stride 2^40 reaches far outside the storage")
    c.zip_pickle("shape_overflow.pt",
                 sd(("w", rebuild("FloatStorage", "0", 6, 0, [2 ** 32, 2 ** 32, 2 ** 32],
                                  [0, 0, 0]))), "overflow", "shape product 2^96")
    c.zip_pickle("shape_negative.pt",
                 sd(("w", rebuild("FloatStorage", "0", 6, 0, [-2, 3], [3, 1]))), "negative",
                 "a negative size")
    c.zip_pickle("shape_40_dims.pt",
                 sd(("w", rebuild("FloatStorage", "0", 6, 0, [1] * 40, [1] * 40))), "dimensions",
                 "40 dimensions")
    c.zip_pickle("stride_rank_mismatch.pt",
                 sd(("w", rebuild("FloatStorage", "0", 6, 0, [2, 3], [1]))), "stride",
                 "stride has fewer entries than size")
    c.zip_pickle("size_not_int.pt",
                 sd(("w", rebuild("FloatStorage", "0", 6, 0, [2, 3], [3, 1],
                                  size_op=lambda p: p.mark().str("2").int(3).raw(b"t")))),
                 "size", "a size entry that is a string")
    c.zip_pickle("storage_class_lie.pt",
                 sd(("w", rebuild("FloatStorage", "0", 6, 0, [2, 3], [3, 1])),
                    ("v", rebuild("DoubleStorage", "0", 3, 0, [3], [1]))), "described",
                 "one storage key described with two classes")
    c.zip_pickle("quantized_storage.pt",
                 sd(("w", rebuild("QInt8Storage", "0", 24, 0, [24], [1]))), "quantized",
                 "a quantized storage class")
    qt = Pickle().empty_dict().str("q").glob("torch._utils", "_rebuild_qtensor").raw(b")") \
        .reduce().setitem().stop().bytes()
    c.zip_pickle("qtensor.pt", qt, "quantized", "_rebuild_qtensor")
    c.zip_pickle("persid_not_tuple.pt",
                 Pickle().empty_dict().str("w").glob("torch._utils", "_rebuild_tensor_v2")
                 .mark().str("0").raw(b"Q").int(0).tuple_of([6]).tuple_of([1]).raw(b"\x89")
                 .ordered_dict().raw(b"t").reduce().setitem().stop().bytes(),
                 "persistent id", "persistent id that is a string")
    c.zip_pickle("storage_numel_negative.pt",
                 sd(("w", rebuild("FloatStorage", "0", -6, 0, [2, 3], [3, 1]))), "numel",
                 "negative storage numel")
    c.zip_pickle("subclass_unknown.pt",
                 Pickle().empty_dict().str("w").glob("torch._tensor", "_rebuild_from_type_v2")
                 .mark().glob("torch._utils", "_rebuild_tensor_v2")
                 .glob("mylib.tensors", "EvilTensor").raw(b")}t").reduce().setitem().stop()
                 .bytes(), "mylib.tensors.EvilTensor", "tensor subclass from an unknown module")
    c.zip_pickle("v3_float4.pt",
                 Pickle().empty_dict().str("w").glob("torch._utils", "_rebuild_tensor_v3")
                 .mark().storage("UntypedStorage", "0", 24).int(0).tuple_of([24]).tuple_of([1])
                 .raw(b"\x89").ordered_dict().glob("torch", "float4_e2m1fn_x2").raw(b"t")
                 .reduce().setitem().stop().bytes(), "float4_e2m1fn_x2",
                 "_rebuild_tensor_v3 with an unsupported dtype")
    c.zip_pickle("rebuild_few_args.pt",
                 Pickle().empty_dict().str("w").glob("torch._utils", "_rebuild_tensor_v2")
                 .mark().int(0).raw(b"t").reduce().setitem().stop().bytes(), "arguments",
                 "_rebuild_tensor_v2 with one argument")
    # Duplicate names after flattening: {"a.b": t, "a": {"b": t}}.
    dup = Pickle().empty_dict().str("a.b")
    dup.tensor("FloatStorage", "0", 6, 0, [6], [1]).setitem()
    dup.str("a").empty_dict().str("b").tensor("FloatStorage", "0", 6, 0, [6], [1])
    dup.setitem().setitem().stop()
    c.zip_pickle("duplicate_names.pt", dup.bytes(), "duplicate", "two tensors named a.b")


def zip_cases(c):
    good, marks = torch_zip(good_records())
    c.add("good.pt", good, "mount", "-", "the well-formed base of the zip cases")
    seen = set()
    for off, what in marks:
        if off <= 4 or off >= len(good) or off in seen:
            continue
        seen.add(off)
        c.refuse("trunc_%05d.pt" % off, good[:off], "end of central directory|truncated",
                 "truncated at %d (%s)" % (off, what))
    c.refuse("trunc_4.pt", good[:4], "central directory|not a checkpoint|truncated",
             "only the local header signature")

    def z(name, needle, desc, records=None, **kw):
        c.refuse(name, torch_zip(records or good_records(), **kw)[0], needle, desc)

    big = 2 ** 60
    z("cd_offset_past_eof.pt", "central directory", "zip64 central directory offset 2^60",
      eocd_patch={"cd_offset": big})
    z("cd_offset_past_eof_classic.pt", "central directory",
      "classic end record only, central directory offset past the end",
      zip64=False, eocd_patch={"cd_offset": 0xFFFFFF00})
    z("cd_size_huge.pt", "central directory", "central directory size 2^60",
      eocd_patch={"cd_size": big})
    z("entries_huge.pt", "entry count", "zip64 entry count 2^60",
      eocd_patch={"entries": big})
    z("entries_65535.pt", "entry count|central directory", "classic entry count 65535",
      zip64=False, eocd_patch={"entries": 0xFFFF})
    z("entries_too_many.pt", "central directory", "one entry more than the directory holds",
      eocd_patch={"entries": 5})
    z("zip64_locator_past_eof.pt", "zip64", "zip64 locator pointing past the end",
      eocd_patch={"z64_offset": big})
    z("deflated_pickle.pt", "data.pkl", "data.pkl compressed with deflate",
      deflate={"data.pkl"})
    z("deflated_storage.pt", "data/0", "storage record data/0 compressed with deflate",
      deflate={"data/0"})
    z("encrypted_storage.pt", "encrypted", "storage record flagged encrypted",
      flags={"data/0": 0x0801})
    z("no_data_pkl.pt", "data.pkl", "no data.pkl record",
      records=[("data/0", W_BYTES), ("version", b"3\n")])
    z("top_level_pickle.pt", "data.pkl", "data.pkl outside any archive folder",
      records=good_records(), archive=None)
    z("byteorder_big.pt", "big", "byteorder record says big",
      records=good_records() + [("byteorder", b"big")])
    z("byteorder_junk.pt", "byteorder", "byteorder record holds junk",
      records=good_records() + [("byteorder", b"middle")])
    z("version_99.pt", "version", "format version 99",
      records=[r if r[0] != "version" else ("version", b"99\n") for r in good_records()])
    z("duplicate_record.pt", "twice", "data/0 twice in the central directory",
      records=good_records() + [("data/0", W_BYTES)])
    c.refuse("two_archives.pt", _two_folder_zip(), "ambiguous|two pickles",
             "archive/data.pkl and other/data.pkl")

    # Byte patches on the good file.
    def patch(name, needle, desc, pos, data):
        b = bytearray(good)
        b[pos:pos + len(data)] = data
        c.refuse(name, bytes(b), needle, desc)

    central = {what: off for off, what in marks}
    local_w = central["local header of data/0"]
    cd_w = central["central entry archive/data/0"]
    patch("local_sig_bad.pt", "local header", "bad local header signature of data/0",
          local_w, b"PK\x09\x09")
    patch("local_extra_huge.pt", "past the end|local header",
          "local header of data/0 with an extra field of 65535 bytes", local_w + 28,
          struct.pack("<H", 0xFFFF))
    patch("local_name_other.pt", "different record", "local header names another record",
          local_w + 30 + len("archive/data/"), b"9")
    patch("local_offset_past_eof.pt", "local header offset",
          "central entry of data/0 points past the end", cd_w + 42,
          struct.pack("<I", 0xFFFFFF00))
    patch("central_sig_bad.pt", "signature", "bad central directory signature", cd_w,
          b"PK\x09\x09")
    patch("central_name_len_huge.pt", "central directory",
          "central entry name length runs past the directory", cd_w + 28,
          struct.pack("<H", 0xFFFF))
    patch("central_size_lie.pt", "past the end",
          "central entry says data/0 is 0xFFFFFFF0 bytes", cd_w + 20,
          struct.pack("<II", 0xFFFFFFF0, 0xFFFFFFF0))
    patch("zip64_extra_missing.pt", "zip64", "sizes 0xFFFFFFFF without a zip64 extra field",
          cd_w + 20, struct.pack("<II", 0xFFFFFFFF, 0xFFFFFFFF))
    patch("multi_disk.pt", "multi-disk|disk", "central entry on disk 3", cd_w + 34,
          struct.pack("<H", 3))
    c.refuse("not_a_zip_pk.pt", b"PK\x03\x04" + b"\0" * 200, "end of central directory",
             "zip local header signature then zeros")


def bound_cases(c):
    """The zip reader's and the tensor checks' bounds: at the bound (mounts; bound-bytes.json
    holds the size and sha256 of the bytes each tensor must show), one under and one over (refused with
    the specific complaint). bound_*.pt"""
    def mount(name, data, tensors, desc):
        c.add(name, data, "mount", "-", desc)
        c.bound_bytes[name] = {k: {"sha256": hashlib.sha256(v).hexdigest(), "nbytes": len(v)}
                               for k, v in tensors.items()}

    good, marks = torch_zip(good_records(), zip64=False)
    at = {what: off for off, what in marks}
    eocd = at["end record"]
    cd_size = eocd - at["central directory"]
    # The end record needs 22 bytes: 21 cannot hold it. (A 22-byte zip is its end record, which
    # starts "PK\\5\\6", while only files starting "PK\\3\\4" reach the zip reader: the bound
    # itself cannot be a fixture.)
    empty = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 0, 0, 0, 0, 0)
    # The zip probe needs the 4 bytes of a local header signature: exactly those are a zip
    # (too short for its end record).
    c.refuse("bound_zip_4_bytes.pt", b"PK\x03\x04", "fewer than the 22",
             "4 bytes: a local header signature and nothing else")
    c.refuse("bound_zip_21_bytes.pt", b"PK\x03\x04" + empty[4:21], "fewer than the 22",
             "21 bytes: local signature, then an end record cut short")

    def eocd_patch(pos, fmt, value):
        b = bytearray(good)
        struct.pack_into(fmt, b, eocd + pos, value)
        return bytes(b)

    # The central directory's size against its end record: one byte more is refused.
    c.refuse("bound_cd_size_plus_1.pt", eocd_patch(12, "<I", cd_size + 1),
             "runs past its end record", "central directory size one byte more than it holds")
    # Entry count against the directory size (46 bytes at least each): the most that could fit
    # passes that check (and the directory runs out of entries), one more does not.
    most = cd_size // 46
    for n, needle in ((most, "runs past the end of the directory"), (most + 1, "cannot fit")):
        b = bytearray(eocd_patch(8, "<H", n))
        struct.pack_into("<H", b, eocd + 10, n)
        c.refuse("bound_entries_%d_in_%d.pt" % (n, cd_size), bytes(b), needle,
                 "%d entries declared in a %d-byte central directory" % (n, cd_size))
    # A local header offset that leaves exactly the 30 bytes of a local header before the end
    # (read: a bad signature), and one that leaves 29.
    cd_w = at["central entry archive/data/0"]
    for left, needle in ((30, "bad signature"), (29, "local header offset")):
        b = bytearray(good)
        struct.pack_into("<I", b, cd_w + 42, len(good) - left)
        c.refuse("bound_local_offset_end_minus_%d.pt" % left, bytes(b), needle,
                 "data/0's local header offset %d bytes before the end of the zip" % left)
    # A record's data against the end of the zip: the last record (the one before the
    # directory) grown to end exactly at the end of the file holds the directory as well, so
    # it is too long for a version record; one byte more runs past the end.
    cd_v = at["central entry archive/version"]
    data_v = at["data of version"]
    for extra, needle in ((0, "bytes, more than the limit"), (1, "run past the end of the zip")):
        b = bytearray(good)
        n = len(good) - data_v + extra
        struct.pack_into("<II", b, cd_v + 20, n, n)
        c.refuse("bound_last_record_to_eof_plus_%d.pt" % extra, bytes(b), needle,
                 "the last record's sizes reach %d byte(s) past the end of the file" % extra
                 if extra else "the last record's sizes reach exactly the end of the file")
    # The zip64 end record must end where its locator starts: one byte later it overlaps it.
    z, zmarks = torch_zip(good_records())
    z64 = {what: off for off, what in zmarks}["zip64 end record"]
    c.refuse("bound_zip64_record_plus_1.pt",
             torch_zip(good_records(), eocd_patch={"z64_offset": z64 + 1})[0],
             "where no zip64 end of central directory record fits",
             "zip64 locator pointing one byte after the zip64 end record")
    # A central directory of 0 bytes may start at its end record (and holds no data.pkl).
    empty_cd = bytearray(good[:eocd + 22])
    struct.pack_into("<HHII", empty_cd, eocd + 8, 0, 0, 0, eocd)
    c.refuse("bound_cd_empty_at_end.pt", bytes(empty_cd), "0 records",
             "entries 0, directory size 0, starting at the end record")
    # After the last entry, 45 bytes left for a 46-byte entry header.
    b = bytearray(good[:eocd]) + b"J" * 45
    tail = bytearray(good[eocd:])
    struct.pack_into("<HHI", tail, 8, 5, 5, cd_size + 45)
    c.refuse("bound_cd_entry_45_bytes.pt", bytes(b + tail),
             "central directory entry 4 at offset %d runs past the end of the directory" % eocd,
             "5 entries declared, the last 45 bytes long")
    # A stored record whose compressed size is one more than its size.
    b = bytearray(good)
    struct.pack_into("<I", b, cd_w + 20, len(W_BYTES) + 1)
    c.refuse("bound_stored_csize_plus_1.pt", bytes(b),
             "compressed size %d differs from its size %d" % (len(W_BYTES) + 1, len(W_BYTES)),
             "stored data/0 with a compressed size one more than its size")
    # The version record is read into 64 bytes: 63 fit ("3" and a newline, then what follows
    # the line is not read), 64 do not.
    for n in (63, 64):
        recs = [r if r[0] != "version" else ("version", b"3\n" + b"x" * (n - 2))
                for r in good_records()]
        if n == 63:
            mount("bound_version_record_63.pt", torch_zip(recs)[0],
                  {"w": W_BYTES, "b": B_BYTES}, "a version record of 63 bytes")
        else:
            c.refuse("bound_version_record_64.pt", torch_zip(recs)[0],
                     "is 64 bytes, more than the limit of 63", "a version record of 64 bytes")
    # Storage element count against the record's bytes: equal mounts, one element more or
    # fewer is refused.
    b_ = rebuild("LongStorage", "1", 3, 0, [3], [1])
    mount("bound_storage_exact.pt", torch_zip(good_records())[0],
          {"w": W_BYTES, "b": B_BYTES}, "storage numel 6 in a 24-byte record")
    for numel in (5, 7):
        pkl = state_dict([("w", rebuild("FloatStorage", "0", numel, 0, [1], [1])), ("b", b_)])
        c.zip_pickle("bound_storage_numel_%d.pt" % numel, pkl,
                     "declares %d elements of 4 bytes&holds 24 bytes" % numel,
                     "storage numel %d, record of 6 floats" % numel)
    # The view against its storage: the last element addressed is the storage's last (mounts),
    # or one past it.
    pkl = state_dict([("w", rebuild("FloatStorage", "0", 6, 1, [5], [1])), ("b", b_)])
    mount("bound_view_last_element.pt", torch_zip(good_records(pkl))[0],
          {"w": W_BYTES[4:], "b": B_BYTES}, "view [5] at offset 1 of a 6-element storage")
    pkl = state_dict([("w", rebuild("FloatStorage", "0", 6, 2, [5], [1])), ("b", b_)])
    c.zip_pickle("bound_view_past_last.pt", pkl, "holds 6 elements&reaches element 6",
                 "view [5] at offset 2 of a 6-element storage")
    pkl = state_dict([("w", rebuild("FloatStorage", "0", 6, 0, [2, 2], [3, 2])), ("b", b_)])
    mount("bound_view_stride_last_element.pt", torch_zip(good_records(pkl))[0],
          {"w": struct.pack("<4f", 1, 3, 4, 6), "b": B_BYTES},
          "view [2,2] strides [3,2]: elements 0, 2, 3 and 5 of a 6-element storage")
    pkl = state_dict([("w", rebuild("FloatStorage", "0", 6, 0, [2, 2], [3, 3])), ("b", b_)])
    c.zip_pickle("bound_view_stride_past_last.pt", pkl, "reaches element 6",
                 "view [2,2] strides [3,3] of a 6-element storage: its last element is 6")
    # Dims: a size tuple of 32 entries mounts, 33 do not.
    for nd in (32, 33):
        pkl = state_dict([("w", rebuild("FloatStorage", "0", 6, 0, [1] * nd, [1] * nd)),
                          ("b", b_)])
        if nd == 32:
            mount("bound_dims_32.pt", torch_zip(good_records(pkl))[0],
                  {"w": W_BYTES[:4], "b": B_BYTES}, "size of 32 dims of 1")
        else:
            c.zip_pickle("bound_dims_33.pt", pkl, "size has 33 dimensions",
                         "size of 33 dims of 1 (the tensor check, not the catalog's)")


def _two_folder_zip():
    """The good records under two archive folders: which pickle is the checkpoint?"""
    recs = good_records()
    out = bytearray()
    central = []
    for folder in ("archive", "other"):
        for name, data in recs:
            full = (folder + "/" + name).encode()
            off = len(out)
            out += struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0x800, 0, 0, 0, zlib.crc32(data),
                               len(data), len(data), len(full), 0) + full + data
            central.append((full, data, off))
    cd = len(out)
    for full, data, off in central:
        out += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0x800, 0, 0, 0,
                           zlib.crc32(data), len(data), len(data), len(full), 0, 0, 0, 0, 0,
                           off) + full
    size = len(out) - cd
    out += struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(central), len(central), size, cd, 0)
    return bytes(out)


def legacy_cases(c):
    magic = Pickle().int(0x1950A86A20F9469CFC6C).stop().bytes()
    proto = Pickle().int(1001).stop().bytes()

    def info(little=True):
        p = Pickle().empty_dict().mark().str("protocol_version").int(1001)
        p.str("little_endian").raw(b"\x88" if little else b"\x89").raw(b"u")
        return p.stop().bytes()

    def obj(key="1000", numel=3):
        p = Pickle().empty_dict().str("w")
        p.glob("torch._utils", "_rebuild_tensor_v2").mark()
        p.mark().str("storage").glob("torch", "FloatStorage").str(key).str("cpu").int(numel)
        p.raw(b"N").raw(b"t").raw(b"Q").int(0).tuple_of([numel]).tuple_of([1]).raw(b"\x89")
        p.ordered_dict().raw(b"t").reduce().setitem()
        return p.stop().bytes()

    def keys(*ks):
        p = Pickle().raw(b"]").mark()
        for k in ks:
            p.str(k)
        return p.raw(b"e").stop().bytes()

    body = struct.pack("<q", 3) + struct.pack("<3f", 1, 2, 3)
    good = magic + proto + info() + obj() + keys("1000") + body
    c.add("legacy_good.pt", good, "mount", "-", "the well-formed base of the legacy cases")
    c.refuse("legacy_big_endian.pt", magic + proto + info(False) + obj() + keys("1000") + body,
             "big-endian", "legacy sys_info says big-endian")
    c.refuse("legacy_protocol.pt", magic + Pickle().int(1002).stop().bytes() + info() + obj()
             + keys("1000") + body, "protocol version", "legacy protocol version 1002")
    c.refuse("legacy_count_past_eof.pt", magic + proto + info() + obj() + keys("1000")
             + struct.pack("<q", 2 ** 40) + struct.pack("<3f", 1, 2, 3), "element count",
             "legacy storage element count 2^40")
    c.refuse("legacy_count_lie.pt", magic + proto + info() + obj() + keys("1000")
             + struct.pack("<q", 2) + struct.pack("<3f", 1, 2, 3), "declares",
             "legacy count 2 but the persistent id says 3")
    c.refuse("legacy_count_plus_1.pt", magic + proto + info() + obj() + keys("1000")
             + struct.pack("<q", 4) + struct.pack("<4f", 1, 2, 3, 4),
             "declares 3 elements of 4 bytes&holds 4 elements",
             "legacy count 4 (with its 4 floats) but the persistent id says 3")
    c.refuse("legacy_unused_key.pt", magic + proto + info() + obj() + keys("999", "1000")
             + body + body, "used by no tensor", "legacy key list names an unused storage")
    c.refuse("legacy_missing_key.pt", magic + proto + info() + obj() + keys() + body,
             "storage list", "legacy key list lacks the tensor's storage")
    c.refuse("legacy_truncated.pt", good[:len(magic) + len(proto) + 20], "truncated",
             "legacy file cut inside sys_info")
    c.refuse("legacy_evil.pt", magic + proto + info()
             + Pickle().glob("os", "system").str("true").raw(b"\x85").reduce().stop().bytes(),
             "os.system", "legacy object pickle calling os.system")


def main(argv):
    out = fresh_out(argv, __doc__)
    if out is None:
        return 2
    global CANARY_DIR
    CANARY_DIR = os.path.join(os.path.abspath(out), ".canaries")
    os.makedirs(CANARY_DIR)
    c = Cases(out)
    payload_cases(c)
    pickle_cases(c)
    zip_cases(c)
    bound_cases(c)
    legacy_cases(c)
    write_cases(out, c.rows)
    write_json(os.path.join(out, "bound-bytes.json"), c.bound_bytes, sort_keys=True)
    write_json(os.path.join(out, "canaries.json"), c.canaries, sort_keys=True)
    print("wrote %d torch hostile cases to %s" % (len(c.rows), out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
