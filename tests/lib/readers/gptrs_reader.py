"""A strict reader of gpt-rs GPTRSCHK v2 checkpoints and GPTRSTEN v2 tensor
archives for the writer tests. Written from the format notes
(shared/formats/gptrs-burnpack-lwt-tp.md section 1), sharing nothing with
core/ (it has its own BLAKE3, checked against the notes' test vectors).

Beyond what gpt-rs checks (1.5), it holds a file to what gpt-rs's savers
write (1.2, 1.7): names sorted bytewise and unique, payloads packed back to
back in index order from the end of the index, file ending at the last
payload, reserved byte 0, and in checkpoints every stored_base_id equal to
BLAKE3(name)[0..16] (never the "not stored" 0).

    f = read("model.gptrs"); f.container, f.config (dict or None),
    f.tensors (name, shape, dtype, base_id, offset, byte_len), f.tensor_bytes(t)
"""

import json
import struct

DTYPES = {0: ("F32", 4), 1: ("F16", 2), 2: ("BF16", 2), 3: ("I32", 4)}
GPT_FIELDS = ("vocab_size", "context_length", "embed_dim", "num_layers", "num_heads",
              "mlp_ratio")


class GptrsError(Exception):
    pass


# ---------------------------------------------------------------------------
# BLAKE3, default hash mode, from the BLAKE3 specification

_IV = (0x6A09E667, 0xBB67AE85, 0x3C6EF372, 0xA54FF53A,
       0x510E527F, 0x9B05688C, 0x1F83D9AB, 0x5BE0CD19)
_PERM = (2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8)
_CHUNK_START, _CHUNK_END, _PARENT, _ROOT = 1, 2, 4, 8
_M32 = 0xFFFFFFFF


def _rotr(x, n):
    return ((x >> n) | (x << (32 - n))) & _M32


def _g(s, a, b, c, d, x, y):
    s[a] = (s[a] + s[b] + x) & _M32
    s[d] = _rotr(s[d] ^ s[a], 16)
    s[c] = (s[c] + s[d]) & _M32
    s[b] = _rotr(s[b] ^ s[c], 12)
    s[a] = (s[a] + s[b] + y) & _M32
    s[d] = _rotr(s[d] ^ s[a], 8)
    s[c] = (s[c] + s[d]) & _M32
    s[b] = _rotr(s[b] ^ s[c], 7)


def _compress(cv, block, counter, block_len, flags):
    m = list(struct.unpack("<16I", block.ljust(64, b"\0")))
    s = list(cv) + list(_IV[:4]) + [counter & _M32, counter >> 32, block_len, flags]
    for r in range(7):
        _g(s, 0, 4, 8, 12, m[0], m[1])
        _g(s, 1, 5, 9, 13, m[2], m[3])
        _g(s, 2, 6, 10, 14, m[4], m[5])
        _g(s, 3, 7, 11, 15, m[6], m[7])
        _g(s, 0, 5, 10, 15, m[8], m[9])
        _g(s, 1, 6, 11, 12, m[10], m[11])
        _g(s, 2, 7, 8, 13, m[12], m[13])
        _g(s, 3, 4, 9, 14, m[14], m[15])
        if r < 6:
            m = [m[i] for i in _PERM]
    return [s[i] ^ s[i + 8] for i in range(8)] + [s[i + 8] ^ cv[i] for i in range(8)]


def _chunk_output(data, counter):
    """The last compression of a chunk, not yet run: (cv, block, counter, len, flags)."""
    cv = _IV
    blocks = [data[i:i + 64] for i in range(0, len(data), 64)] or [b""]
    for i, blk in enumerate(blocks):
        flags = (_CHUNK_START if i == 0 else 0) | (_CHUNK_END if i == len(blocks) - 1 else 0)
        if i == len(blocks) - 1:
            return (cv, blk, counter, len(blk), flags)
        cv = _compress(cv, blk, counter, 64, flags)[:8]


def _subtree_output(data, counter):
    if len(data) <= 1024:
        return _chunk_output(data, counter)
    # the left subtree: the largest power of two of chunks that leaves some input on the right
    chunks = -(-len(data) // 1024)
    left = 1
    while left * 2 < chunks:
        left *= 2
    lcv = _run(_subtree_output(data[:left * 1024], counter))[:8]
    rcv = _run(_subtree_output(data[left * 1024:], counter + left))[:8]
    return (_IV, struct.pack("<16I", *(lcv + rcv)), 0, 64, _PARENT)


def _run(out, extra_flags=0):
    cv, block, counter, block_len, flags = out
    return _compress(cv, block, counter, block_len, flags | extra_flags)


def blake3(data):
    """32-byte BLAKE3 digest."""
    return struct.pack("<8I", *_run(_subtree_output(bytes(data), 0), _ROOT)[:8])


# The notes' test vectors (section 1.3), checked on import so a wrong hash
# cannot make the tests agree with a wrong writer.
for _name, _hex in (("", "af1349b9f5f9a1a6a0404dea36dcc949"),
                    ("abc", "6437b3ac38465133ffb63b75273a8db5"),
                    ("lm_head", "585d23eebd91ff137aef590d2ec762a9"),
                    ("blocks.0.attention.w_qkv", "e72a6ef8ed8165a87745cd77f2ec344c")):
    assert blake3(_name.encode())[:16].hex() == _hex, _name


# ---------------------------------------------------------------------------

class Tensor:
    pass


class Gptrs:
    def tensor_bytes(self, t):
        return self.buf[t.offset:t.offset + t.byte_len]


def _no_duplicates(pairs):
    d = {}
    for k, v in pairs:
        if k in d:
            raise GptrsError("config_json has the key %r twice" % k)
        d[k] = v
    return d


def check_model_config(cfg):
    """What gpt-rs's ModelConfig deserializer requires (section 1.4)."""
    if not isinstance(cfg, dict) or not isinstance(cfg.get("kind"), str):
        raise GptrsError("config_json is not a ModelConfig: no \"kind\" string")
    rt = cfg.get("runtime")
    if "runtime" in cfg and rt is not None and not isinstance(rt, dict):
        raise GptrsError("config_json runtime is neither an object nor null")
    if cfg["kind"] == "gpt":
        c = cfg.get("config")
        if not isinstance(c, dict):
            raise GptrsError("kind gpt without a GptConfig object")
        for k in GPT_FIELDS:
            if not isinstance(c.get(k), int) or isinstance(c.get(k), bool) or c[k] < 0:
                raise GptrsError("GptConfig %s is %r" % (k, c.get(k)))
        if not isinstance(c.get("dropout"), (int, float)) or isinstance(c.get("dropout"), bool):
            raise GptrsError("GptConfig dropout is %r" % c.get("dropout"))


def read(path):
    with open(path, "rb") as f:
        return parse(f.read())


def parse(buf):
    f = Gptrs()
    f.buf = buf
    pos = [0]

    def take(n, what):
        if pos[0] + n > len(buf):
            raise GptrsError("%s at offset %d runs past the end of the file" % (what, pos[0]))
        b = buf[pos[0]:pos[0] + n]
        pos[0] += n
        return b

    def u32(what):
        return struct.unpack("<I", take(4, what))[0]

    def u64(what):
        return struct.unpack("<Q", take(8, what))[0]

    magic = take(8, "magic")
    if magic not in (b"GPTRSCHK", b"GPTRSTEN"):
        raise GptrsError("magic %r is neither GPTRSCHK nor GPTRSTEN" % magic)
    f.container = magic.decode()
    checkpoint = magic == b"GPTRSCHK"
    if u32("version") != 2:
        raise GptrsError("version is not 2")
    f.config = None
    if checkpoint:
        n = u32("config_len")
        text = take(n, "config_json")
        try:
            f.config = json.loads(text.decode("utf-8"), object_pairs_hook=_no_duplicates)
        except (UnicodeDecodeError, ValueError) as e:
            raise GptrsError("config_json: %s" % e)
        check_model_config(f.config)
    index_len = u32("index_len")
    index_end = pos[0] + index_len
    if index_end > len(buf):
        raise GptrsError("index_len %d runs past the end of the file" % index_len)
    data_start = index_end

    def itake(n, what):
        if pos[0] + n > index_end:
            raise GptrsError("%s at offset %d runs past the index" % (what, pos[0]))
        return take(n, what)

    def iu32(what):
        return struct.unpack("<I", itake(4, what))[0]

    def iu64(what):
        return struct.unpack("<Q", itake(8, what))[0]

    count = iu32("tensor_count")
    f.tensors = []
    expected, prev = data_start, None
    for i in range(count):
        t = Tensor()
        raw = itake(iu32("name_len"), "name")
        try:
            t.name = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise GptrsError("tensor %d name is not UTF-8" % i)
        if checkpoint:
            if not raw.isascii():
                raise GptrsError("tensor %r: checkpoint names must be ASCII" % t.name)
            t.base_id = itake(16, "stored_base_id")
            if t.base_id != blake3(raw)[:16]:
                raise GptrsError("tensor %r: stored_base_id %s is not BLAKE3(name)[0..16] %s"
                                 % (t.name, t.base_id.hex(), blake3(raw)[:16].hex()))
        rank = iu32("rank")
        t.shape = [iu64("dims") for _ in range(rank)]
        tag = iu32("dtype_tag")
        if tag not in DTYPES:
            raise GptrsError("tensor %r: dtype_tag %d" % (t.name, tag))
        t.dtype, size = DTYPES[tag]
        if itake(1, "reserved") != b"\0":
            raise GptrsError("tensor %r: reserved byte is not 0" % t.name)
        t.offset = iu64("offset")
        t.byte_len = iu64("byte_len")
        numel = 1
        for d in t.shape:
            numel *= d
        if t.byte_len != numel * size:
            raise GptrsError("tensor %r: byte_len %d is not %d x %d" % (t.name, t.byte_len,
                                                                         numel, size))
        if prev is not None and not prev < raw:
            raise GptrsError("tensor %r: names are not sorted bytewise and unique" % t.name)
        prev = raw
        if t.offset != expected:
            raise GptrsError("tensor %r: offset %d, expected %d (packed in index order)"
                             % (t.name, t.offset, expected))
        expected += t.byte_len
        f.tensors.append(t)
    if pos[0] != index_end:
        raise GptrsError("%d bytes after the last index entry" % (index_end - pos[0]))
    if len(buf) != expected:
        raise GptrsError("file size %d is not the end of the last payload (%d)"
                         % (len(buf), expected))
    return f
