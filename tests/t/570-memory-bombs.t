#!/usr/bin/python3
"""Small inputs that used to take huge memory: the peak RSS of `ckptfs info`, `ckptfs ls` and
of a mount (its daemon, after the whole tree is read) stays under 64 MiB + 4x the metadata bytes
of the input, whatever the input (the bound ckptfs(1) promises).

Inputs are written here, by Python, with no code shared with ckptfs:
  - torch zips whose pickle holds dicts used as dict keys nested N deep: every level's key is
    the JSON text of the level below, escaped (quotes and backslashes double per level);
  - torch zips whose pickle is one list of 4.9M None, of 4.9M True, of 2.45M small ints (each
    a node an item, 301 MiB, before);
  - a torch zip whose pickle references one 8 MiB string 200 times (memo): rendered naively
    metadata.json would hold 1.6 GB; it must stop at its limit, stay valid JSON, carry a
    truncation marker and say so in summary.json's warnings;
  - JSON headers and indexes dense in values ([0,0,0,...], {"a":0,...}) and a safetensors
    header of many minimal tensor entries: the JSON reader's memory per byte of input;
  - big normal headers: 100,000 real-shaped entries, 1,000,000 minimal ones (in offset order,
    whose HF view is served from the source, and with offsets shuffled against the names, whose
    view is rendered when read: 15% under the bound, the view checked against an independent
    writer, tensors.tsv against its lines), and an HF folder whose index maps 300,000 tensors:
    what the catalog, the tree and the HF view hold a tensor.
Peak RSS: the rusage of the finished ls/info child (ru_maxrss, which includes what this
process holds when it forks: big inputs are dropped before), and VmHWM of the mount's daemon
(run with -f) read from /proc after the tree was walked.
Under a sanitizer build (ASan keeps shadow memory and a quarantine) the bound is loosened to
512 MiB + 12x: still far below what the unbounded cases took (GBs).
"""

import json
import os
import resource
import struct
import subprocess
import sys
import tempfile
import time
import zlib

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from ckptfs_test import Tap, is_mounted, unmount  # noqa: E402

MIB = 1 << 20
TIMEOUT = 120


def read_in_pieces(path, size):
    """The file's bytes as the reads of `size` bytes returned them, in order."""
    pieces = []
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(size), b""):
            pieces.append(b)
    return pieces


# ---------------------------------------------------------------------------
# Inputs (independent writers: a stored-only zip with torch's record names, raw pickle opcodes)


def torch_zip(pickle_bytes):
    """A torch.save-style zip: archive/data.pkl and archive/version, stored, 64-byte aligned."""
    return stored_zip([("archive/data.pkl", pickle_bytes), ("archive/version", b"3\n")])


def short_str(s):
    b = s.encode()
    return b"X" + struct.pack("<I", len(b)) + b


def nested_key_pickle(depth):
    """{"a": {K(depth): None}} where K(0) = {} and K(d+1) = {K(d): None}."""
    def level(d):
        return b"}" if d == 0 else b"}" + level(d - 1) + b"Ns"
    return b"\x80\x02}" + short_str("a") + b"}" + level(depth) + b"Ns" + b"s."


def shared_string_pickle(size, refs):
    """{"a": [S, S, ... refs times]} with S one string of `size` bytes, memoized once."""
    body = b"\x80\x02}" + short_str("a") + b"](" + b"X" + struct.pack("<I", size) + b"x" * size
    body += b"q\x01" + b"h\x01" * (refs - 1) + b"e"
    return body + b"s."


def long_list_pickle(item, count, batch=1000):
    """{"a": [item] * count}, appended by MARK ... APPENDS in batches (the stack's bound)."""
    body = b"\x80\x02}" + short_str("a") + b"]"
    full, rest = divmod(count, batch)
    body += (b"(" + item * batch + b"e") * full
    if rest:
        body += b"(" + item * rest + b"e"
    return body + b"s."


def safetensors(header_bytes, data=b""):
    return struct.pack("<Q", len(header_bytes)) + header_bytes + data


# ---------------------------------------------------------------------------
# Measuring

def sanitized(ckptfs):
    with open(ckptfs, "rb") as f:
        return b"__asan_init" in f.read()


def bound(meta_bytes, asan):
    return (512 * MIB + 12 * meta_bytes) if asan else (64 * MIB + 4 * meta_bytes)


def address_limit(asan):
    """Without a sanitizer, children get 4 GiB of address space: a regression fails the test
    instead of eating the machine's memory (ASan reserves terabytes of shadow, so not there)."""
    if asan:
        return None
    return lambda: resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


def run_rss(argv, asan):
    """(rc, stdout, stderr, peak RSS in bytes) of a finished command, measured by
    peak_rss_tool: a child forked from this (large) Python process would carry its resident
    pages into the high-water mark across exec."""
    tool = os.path.join(os.environ["TOOLS"], "peak_rss_tool")
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            tempfile.NamedTemporaryFile() as rss_file:
        p = subprocess.Popen([tool, rss_file.name] + list(argv), stdin=subprocess.DEVNULL,
                             stdout=out, stderr=err, start_new_session=True,
                             preexec_fn=address_limit(asan))
        try:
            rc = p.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)
            p.wait()
            rc = None
        if rc is not None and rc > 128:
            rc = -(rc - 128)  # killed by a signal, as Popen reports it
        out.seek(0)
        err.seek(0)
        text = open(rss_file.name).read().strip()
        return rc, out.read(), err.read(), int(text or 0) * 1024


def vm_hwm(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return None


def walk_tree(mnt):
    """Reads every file of the mount; returns the number of bytes read."""
    total = 0
    for dirpath, _, files in os.walk(mnt):
        for name in files:
            with open(os.path.join(dirpath, name), "rb") as f:
                while True:
                    b = f.read(1 << 20)
                    if not b:
                        break
                    total += len(b)
    return total


def start_mount(ckptfs, src, mnt, asan):
    """(daemon, its stderr file, None) once `ckptfs SRC MNT -f` is mounted, or
    (None, None, stderr text) when it is not."""
    os.makedirs(mnt, exist_ok=True)
    errf = tempfile.TemporaryFile()
    p = subprocess.Popen([ckptfs, src, mnt, "-f"], stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=errf, start_new_session=True,
                         preexec_fn=address_limit(asan))
    deadline = time.time() + TIMEOUT
    while not is_mounted(mnt) and p.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    if not is_mounted(mnt):
        if p.poll() is None:
            p.kill()
        p.wait()
        errf.seek(0)
        return None, None, errf.read().decode(errors="replace")
    return p, errf, None


def mount_rss(ckptfs, src, mnt, asan):
    """(mounted, peak RSS of the daemon after the tree was read, stderr text, files)."""
    p, errf, failed = start_mount(ckptfs, src, mnt, asan)
    if failed is not None:
        return False, None, failed, {}
    files = {}
    try:
        walk_tree(mnt)
        for name in ("metadata.json", "summary.json"):
            with open(os.path.join(mnt, ".ckptfs", name), "rb") as f:
                files[name] = f.read()
        hwm = vm_hwm(p.pid)
    finally:
        unmount(mnt)
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    errf.seek(0)
    return True, hwm, errf.read().decode(errors="replace"), files


def check_rss(tap, ckptfs, src, meta_bytes, what, asan, mnt, expect_refusal=None):
    """ls, info and a mount of src each within the bound; a refusal must name the cause.
    Returns the mount's files (metadata.json, summary.json) when it mounted."""
    limit = bound(meta_bytes, asan)
    for cmd in ("ls", "info"):
        rc, _, err, rss = run_rss([ckptfs, cmd, src], asan)
        ok_rc = rc == 0 if expect_refusal is None else rc == 2 and expect_refusal in err.decode()
        tap.ok(ok_rc, "%s: ckptfs %s %s" % (what, cmd, "works" if expect_refusal is None else
                                            "refuses naming %r" % expect_refusal),
               ["exit %r: %s" % (rc, err.decode(errors="replace")[:300])])
        tap.ok(rss < limit, "%s: ckptfs %s peak RSS %.1f MiB < %.1f MiB" %
               (what, cmd, rss / MIB, limit / MIB))
    mounted, hwm, err, files = mount_rss(ckptfs, src, mnt, asan)
    if expect_refusal is None:
        tap.ok(mounted, "%s: mounts" % what, [err[:300]])
    else:
        tap.ok(not mounted and expect_refusal in err, "%s: mount refused naming %r" %
               (what, expect_refusal), [err[:300]])
    if mounted:
        tap.ok(hwm is not None and hwm < limit, "%s: mount peak RSS (VmHWM) %.1f MiB < %.1f MiB"
               % (what, (hwm or 0) / MIB, limit / MIB))
    return files


# ---------------------------------------------------------------------------

def pickle_cases(tap, ckptfs, tmp, asan):
    # 14: each level of keys nested in keys escapes the level below once more.
    for depth in (8, 25, 60):
        pkl = nested_key_pickle(depth)
        src = os.path.join(tmp, "nested%d.pt" % depth)
        with open(src, "wb") as f:
            f.write(torch_zip(pkl))
        # Shallow keys name what is under them; past 8 KiB of key text the file is refused.
        refusal = None if depth == 8 else "dict key at offset"
        files = check_rss(tap, ckptfs, src, len(pkl), "dict keys nested %d deep" % depth, asan,
                          os.path.join(tmp, "mnt"), refusal)
        if depth == 8 and files:
            meta = json.loads(files["metadata.json"])
            keys = list(meta.get("pickle", {}))
            tap.ok(len(keys) == 1 and keys[0].startswith("a.{") and keys[0].count("{") == 9,
                   "dict keys nested 8 deep: metadata.json names the value by its key text",
                   [repr(keys)[:200]])

    # Issue 29 #16: one list of 4.9M None (a byte each) took 301 MiB, a node an item; and its
    # siblings, True/False and small ints (BININT1, two bytes each).
    for item, count, what in ((b"N", 4900000, "None"), (b"\x88", 4900000, "True"),
                              (b"K\x07", 2450000, "7 (BININT1)")):
        pkl = long_list_pickle(item, count)
        src = os.path.join(tmp, "long_list.pt")
        with open(src, "wb") as f:
            f.write(torch_zip(pkl))
        check_rss(tap, ckptfs, src, len(pkl), "one list of %d x %s" % (count, what), asan,
                  os.path.join(tmp, "mnt"))
        os.unlink(src)

    # 15: one 8 MiB string referenced 200 times.
    pkl = shared_string_pickle(8 * MIB, 200)
    src = os.path.join(tmp, "shared.pt")
    with open(src, "wb") as f:
        f.write(torch_zip(pkl))
    pkl_len = len(pkl)
    del pkl
    files = check_rss(tap, ckptfs, src, pkl_len, "8 MiB string referenced 200 times", asan,
                      os.path.join(tmp, "mnt"))
    if files:
        text = files["metadata.json"]
        try:
            meta = json.loads(text)
            valid = True
        except ValueError as e:
            meta, valid = {}, False
            tap.diag("metadata.json: %s" % e)
        tap.ok(valid, "shared string: metadata.json is valid JSON")
        tap.ok(len(text) <= 17 * MIB, "shared string: metadata.json is %.1f MiB (limit 16 MiB)"
               % (len(text) / MIB))
        items = meta.get("pickle", {}).get("a", []) if valid else []
        full = [x for x in items if x == "x" * (8 * MIB)]
        marker = [x for x in items if isinstance(x, str) and x.startswith("<truncated")]
        tap.ok(1 <= len(full) <= 2 and len(marker) == 1 and items[-1] == marker[0],
               "shared string: the list keeps whole copies while they fit, then one marker",
               ["%d items, %d whole, markers %r" % (len(items), len(full), marker[:2])])
        warnings = json.loads(files["summary.json"]).get("warnings", [])
        tap.ok(any("truncated" in w and "metadata.json" in w for w in warnings),
               "shared string: summary.json warns that metadata.json is truncated",
               [repr(warnings)[:300]])


def json_cases(tap, ckptfs, tmp, asan):
    # 16: JSON of N bytes used to take 33N (64 bytes a value, one value every 2 bytes). A
    # document denser than ckptfs's limit is refused before anything is allocated.
    n = 8 * MIB  # values: 16 MiB of "0,"
    dense = (b'{"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"z":['
             + b"0," * (n - 1) + b"0]}")
    src = os.path.join(tmp, "dense.safetensors")
    with open(src, "wb") as f:
        f.write(safetensors(dense, b"\0" * 4))
    dense_len = len(dense)
    del dense  # a child's peak RSS counts what this process holds when it forks
    check_rss(tap, ckptfs, src, dense_len, "safetensors header of 16 MiB of [0,0,...]", asan,
              os.path.join(tmp, "mnt"), "too many values")
    hf = os.path.join(tmp, "hf")
    os.makedirs(hf)
    one = b'{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'
    with open(os.path.join(hf, "model-00001-of-00001.safetensors"), "wb") as f:
        f.write(safetensors(one, b"\0" * 4))
    index = (b'{"metadata":{"total_size":4,"junk":[' + b"0," * (n - 1)
             + b'0]},"weight_map":{"w":"model-00001-of-00001.safetensors"}}')
    with open(os.path.join(hf, "model.safetensors.index.json"), "wb") as f:
        f.write(index)
    index_len = len(index)
    del index
    check_rss(tap, ckptfs, hf, index_len, "index of 16 MiB of [0,0,...]", asan,
              os.path.join(tmp, "mnt"), "too many values")
    # Within the density limit, a header of minimal entries mounts (about 7 bytes a value).
    entries = ",".join('"t%06d":{"dtype":"F32","shape":[1],"data_offsets":[%d,%d]}'
                       % (i, 4 * i, 4 * i + 4) for i in range(20000)).encode()
    small = b"{" + entries + b"}"
    src = os.path.join(tmp, "small-entries.safetensors")
    with open(src, "wb") as f:
        f.write(safetensors(small, b"\0" * 4 * 20000))
    check_rss(tap, ckptfs, src, len(small), "20000 minimal tensor entries", asan,
              os.path.join(tmp, "mnt"))
    # Its entries are in the order and form the view writes them: the mount serves them from
    # the source. What it serves must be the file safetensors' writer would make.
    want_header = b'{"__metadata__":{"format":"pt"},' + small[1:]
    want_header += b" " * (-len(want_header) % 8)
    want = struct.pack("<Q", len(want_header)) + want_header + b"\0" * 4 * 20000
    got = read_mounted(ckptfs, src, os.path.join(tmp, "mnt"), ".ckptfs/hf/model.safetensors")
    tap.ok(got == want, "20000 minimal tensor entries: the HF view is the reference writer's "
           "file, byte for byte", ["got %r bytes" % (None if got is None else len(got))])


def read_mounted(ckptfs, src, mnt, rel):
    """The bytes of one file of a mount of src, or None."""
    os.makedirs(mnt, exist_ok=True)
    p = subprocess.Popen([ckptfs, src, mnt, "-f"], stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    deadline = time.time() + TIMEOUT
    while not is_mounted(mnt) and p.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    if not is_mounted(mnt):
        if p.poll() is None:
            p.kill()
        p.wait()
        return None
    try:
        with open(os.path.join(mnt, rel), "rb") as f:
            return f.read()
    finally:
        unmount(mnt)
        p.wait(timeout=30)


def light_mount_rss(ckptfs, src, mnt, asan, verify=None, checks=None):
    """(mounted, VmHWM after reading what scales with the input, stderr, verify's results). A
    walk of every file of a million-tensor mount takes minutes through FUSE; what a mount holds
    for its input is built when it starts (catalog, tree, HF view) or on the first read of a
    document, so this reads the documents, the HF view's header, lists the root and one
    directory, and reads every file of that directory (not .ckptfs/stats.json: it reads every
    tensor). verify(mnt), run first, reads what it checks through the same mount: its results
    go to the list checks."""
    p, errf, failed = start_mount(ckptfs, src, mnt, asan)
    if failed is not None:
        return False, None, failed
    try:
        if verify is not None:
            checks.extend(verify(mnt))
        for name in ("summary.json", "metadata.json", "tensors.tsv"):
            with open(os.path.join(mnt, ".ckptfs", name), "rb") as f:
                f.read()
        hf = os.path.join(mnt, ".ckptfs", "hf")
        for name in os.listdir(hf):
            with open(os.path.join(hf, name), "rb") as f:
                f.read(1 << 20)
        first = sorted(n for n in os.listdir(mnt) if not n.startswith("."))[0]
        d = os.path.join(mnt, first)
        if os.path.isdir(d):
            for dirpath, _, files in os.walk(d):
                for name in files:
                    with open(os.path.join(dirpath, name), "rb") as f:
                        f.read()
                break
        hwm = vm_hwm(p.pid)
    finally:
        unmount(mnt)
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    errf.seek(0)
    return True, hwm, errf.read().decode(errors="replace")


def check_big(tap, ckptfs, src, meta_bytes, what, asan, mnt, verify=None, margin=1.0):
    """ls, info and a mount of many tensors within the bound, times margin (0.85: 15% of it to
    spare; not under a sanitizer, whose bound is loosened anyway). verify(mnt) returns (ok,
    description, diagnostics) checks of the mount's files, read before its peak is taken."""
    limit = bound(meta_bytes, asan) * (1.0 if asan else margin)
    of = "" if asan or margin == 1.0 else " (%d%% of the bound)" % round(100 * margin)
    for cmd in ("ls", "info"):
        rc, _, err, rss = run_rss([ckptfs, cmd, src], asan)
        tap.ok(rc == 0, "%s: ckptfs %s works" % (what, cmd), [err.decode()[:300]])
        tap.ok(rss < limit, "%s: ckptfs %s peak RSS %.1f MiB < %.1f MiB%s" %
               (what, cmd, rss / MIB, limit / MIB, of))
    checks = []
    mounted, hwm, err = light_mount_rss(ckptfs, src, mnt, asan, verify, checks)
    tap.ok(mounted, "%s: mounts" % what, [err[:300]])
    if not mounted:
        return
    for ok, text, diag in checks:
        tap.ok(ok, "%s: %s" % (what, text), diag)
    tap.ok(hwm is not None and hwm < limit, "%s: mount peak RSS (VmHWM) %.1f MiB < %.1f MiB%s"
           % (what, (hwm or 0) / MIB, limit / MIB, of))


def write_safetensors(path, entries, data_len):
    header = ("{" + ",".join(entries) + "}").encode()
    with open(path, "wb") as f:
        f.write(safetensors(header))
        f.truncate(8 + len(header) + data_len)
    return len(header)


def catalog_cases(tap, ckptfs, tmp, asan):
    """Big normal headers: 100,000 real-shaped entries (an 11 MiB header, one directory per
    expert), 1,000,000 minimal ones (a 68 MiB header: the least header text a tensor can have,
    so the most tensors per byte), and an HF directory whose index maps 300,000 tensors."""
    m = 100000
    src = os.path.join(tmp, "real.safetensors")
    size = write_safetensors(src, (
        '"model.layers.%d.mlp.experts.%d.down_proj.weight":{"dtype":"BF16","shape":[16,16],'
        '"data_offsets":[%d,%d]}' % (i // 1000, i % 1000, 512 * i, 512 * i + 512)
        for i in range(m)), 512 * m)
    check_big(tap, ckptfs, src, size, "100,000 tensors", asan, os.path.join(tmp, "mnt"))
    os.unlink(src)

    million_cases(tap, ckptfs, tmp, asan)
    one_tensor_dirs_case(tap, ckptfs, tmp, asan)

    hf = os.path.join(tmp, "bighf")
    os.makedirs(hf)
    m, shards = 300000, 2
    weight_map = []
    meta = 0
    for s in range(shards):
        name = "model-%05d-of-%05d.safetensors" % (s + 1, shards)
        ids = range(s, m, shards)
        meta += write_safetensors(os.path.join(hf, name), (
            '"model.layers.%d.mlp.experts.%d.w":{"dtype":"F32","shape":[1],'
            '"data_offsets":[%d,%d]}' % (i // 1000, i % 1000, 4 * k, 4 * k + 4)
            for k, i in enumerate(ids)), 4 * len(ids))
        weight_map += ['"model.layers.%d.mlp.experts.%d.w": "%s"' % (i // 1000, i % 1000, name)
                       for i in ids]
    index = ('{"metadata": {"total_size": %d}, "weight_map": {%s}}'
             % (4 * m, ", ".join(sorted(weight_map)))).encode()
    del weight_map
    with open(os.path.join(hf, "model.safetensors.index.json"), "wb") as f:
        f.write(index)
    meta += len(index)
    del index
    check_big(tap, ckptfs, hf, meta, "HF index of 300,000 tensors", asan,
              os.path.join(tmp, "mnt"))


def hf_header(names_offsets):
    """The safetensors header the reference writer makes of F32 [1] tensors (all one dtype, so
    in name order), with its 8-byte length: what .ckptfs/hf/model.safetensors starts with."""
    text = ('{"__metadata__":{"format":"pt"},' + ",".join(
        '"%s":{"dtype":"F32","shape":[1],"data_offsets":[%d,%d]}' % (n, at, at + 4)
        for n, at in names_offsets) + "}").encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def read_at(path, off, n):
    with open(path, "rb") as f:
        f.seek(off)
        return f.read(n)


def view_checks(mnt, header, data):
    """The HF view's model.safetensors against the header (and data section) an independent
    writer makes: its 8-byte length read alone, as safetensors does, its first and last MiB,
    odd-sized reads at odd offsets, and the sha256 of the whole header read in 1 MiB pieces."""
    import hashlib
    import random
    path = os.path.join(mnt, ".ckptfs", "hf", "model.safetensors")
    out = []
    first, last = read_at(path, 0, MIB), read_at(path, len(header) - MIB, MIB)
    out.append((read_at(path, 0, 8) == header[:8] and first == header[:MIB] and
                last == header[-MIB:], "HF view header: length, first and last MiB as an "
                "independent writer makes them", ["%d-byte header" % len(header)]))
    rnd = random.Random(16)
    bad = []
    with open(path, "rb") as f:
        for _ in range(200):
            off, n = rnd.randrange(len(header)), rnd.randrange(1, 200000)
            f.seek(off)
            b = f.read(n)[:max(0, len(header) - off)]
            if b != header[off:off + n]:
                bad.append((off, n))
        h = hashlib.sha256()
        f.seek(0)
        left = len(header)
        while left:
            b = f.read(min(MIB, left))
            if not b:
                break
            h.update(b)
            left -= len(b)
        got = h.hexdigest()
        f.seek(len(header))
        body = f.read(len(data) + 1)
    want = hashlib.sha256(header).hexdigest()
    out.append((not bad, "HF view header: 200 reads at random offsets", [repr(bad[:5])]))
    out.append((got == want, "HF view header: sha256 of all %d bytes" % len(header),
                ["got %s, want %s" % (got, want)]))
    out.append((body == data, "HF view data section: the tensors' bytes in view order",
                ["%d bytes, want %d" % (len(body), len(data))]))
    return out


def tsv_checks(mnt, names, nbytes):
    """.ckptfs/tensors.tsv (rendered by pages) against the text it must be, whole and read in
    odd-sized pieces."""
    import hashlib
    want = b"name\tdtype\tshape\tnbytes\tpath\n" + b"".join(
        b"%s\tF32\t[1]\t%d\t%s\n" % (n, nbytes, n) for n in names)
    path = os.path.join(mnt, ".ckptfs", "tensors.tsv")
    with open(path, "rb") as f:
        whole = f.read()
    h = hashlib.sha256()
    for b in read_in_pieces(path, 65521):
        h.update(b)
    ok = whole == want and h.hexdigest() == hashlib.sha256(want).hexdigest()
    return [(ok and os.stat(path).st_size == len(want),
             ".ckptfs/tensors.tsv: every line, whole and in 65521-byte reads",
             ["%d bytes, want %d" % (len(whole), len(want))])]


def one_tensor_dirs_case(tap, ckptfs, tmp, asan):
    """300,000 tensors named like model.layers.123.mlp.experts.456.w: 300,000 directories of
    one tensor each (a 31 MB header). Maps of every path and every directory made the catalog
    134 MiB and the mount 173 (94% of the bound); held to 70% of it. The mount must show
    tensors where the rules put them: a few directories' files read through it."""
    m = 300000
    src = os.path.join(tmp, "dirs300k.safetensors")
    size = write_safetensors(src, (
        '"model.layers.%d.mlp.experts.%d.w":{"dtype":"F32","shape":[1],"data_offsets":[%d,%d]}'
        % (i // 1000, i % 1000, 4 * i, 4 * i + 4) for i in range(m)), 0)
    with open(src, "ab") as f:
        f.write(struct.pack("<%dI" % m, *range(m)))

    def verify(mnt):
        bad = []
        for i in (0, 1, 999, 1000, 123456, m - 1):
            d = os.path.join(mnt, "model", "layers", str(i // 1000), "mlp", "experts",
                             str(i % 1000))
            with open(os.path.join(d, "w"), "rb") as f:
                raw = f.read()
            with open(os.path.join(d, "w.json")) as f:
                side = json.load(f)
            if (sorted(os.listdir(d)) != ["w", "w.json", "w.npy"] or
                    raw != struct.pack("<I", i) or
                    side.get("name") != "model.layers.%d.mlp.experts.%d.w" % (i // 1000, i % 1000)):
                bad.append(i)
        return [(not bad, "the tensors' files where the rules put them, with their bytes",
                 ["tensors %r" % bad])]

    check_big(tap, ckptfs, src, size, "300,000 one-tensor directories", asan,
              os.path.join(tmp, "mnt"), verify=verify, margin=0.7)
    os.unlink(src)


def million_cases(tap, ckptfs, tmp, asan):
    """1,000,000 minimal tensors (a 68 MiB header: the most tensors per byte of metadata): in
    offset order, the HF view's header and data are the source's; with the offsets shuffled
    against the names, the view renders its header and plans its data when read. Both must stay
    15% under the bound."""
    import array
    import random
    m = 1000000
    names = [b"t%07d" % i for i in range(m)]
    mnt = os.path.join(tmp, "mnt")
    src = os.path.join(tmp, "million.safetensors")
    size = write_safetensors(src, ('"t%07d":{"dtype":"F32","shape":[1],"data_offsets":[%d,%d]}'
                                   % (i, 4 * i, 4 * i + 4) for i in range(m)), 4 * m)
    check_big(tap, ckptfs, src, size, "1,000,000 tensors", asan, mnt, margin=0.85,
              verify=lambda mnt: tsv_checks(mnt, names, 4))
    os.unlink(src)

    # Tensor i (name order) lies at 4 * perm[i] and holds the u32 i: the view's data section,
    # in name order, is then 0, 1, 2, ...
    perm = random.Random(57).sample(range(m), m)
    src = os.path.join(tmp, "shuffled.safetensors")
    size = write_safetensors(src, ('"t%07d":{"dtype":"F32","shape":[1],"data_offsets":[%d,%d]}'
                                   % (i, 4 * perm[i], 4 * perm[i] + 4) for i in range(m)), 0)
    stored = array.array("I", bytes(4 * m))
    for i, p in enumerate(perm):
        stored[p] = i
    with open(src, "ab") as f:
        f.write(stored.tobytes())
    del stored, perm
    header = hf_header((n.decode(), 4 * i) for i, n in enumerate(names))
    data = array.array("I", range(m)).tobytes()
    check_big(tap, ckptfs, src, size, "1,000,000 tensors, offsets shuffled", asan, mnt,
              margin=0.85, verify=lambda mnt: view_checks(mnt, header, data))
    os.unlink(src)


# ---------------------------------------------------------------------------
# Documents the mount computes on demand (appended cases)

def vm_field(pid, field):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return None


def stats_cases(tap, ckptfs, tmp, asan):
    """.ckptfs/stats.json of 200,000 tensors: reading it used to keep its text (~300 B a
    tensor) besides the per-tensor results (96 B) for the life of the mount; it is now rendered
    from the results when read. The document must still be what `ckptfs stats --json -a`
    prints, byte for byte, whole and read in odd-sized pieces."""
    import random
    m = 200000
    src = os.path.join(tmp, "stats.safetensors")
    rnd = random.Random(7)
    size = write_safetensors(src, ('"t%07d":{"dtype":"F32","shape":[4],"data_offsets":[%d,%d]}'
                                   % (i, 16 * i, 16 * i + 16) for i in range(m)), 0)
    with open(src, "r+b") as f:
        f.seek(8 + size)
        f.write(struct.pack("<%df" % (4 * m), *(rnd.gauss(0, 1) for _ in range(4 * m))))
    limit = bound(size, asan)
    mnt = os.path.join(tmp, "mnt")
    p, _, failed = start_mount(ckptfs, src, mnt, asan)
    if not tap.ok(failed is None, "stats.json of 200,000 tensors: mounts", [failed or ""]):
        return
    try:
        path = os.path.join(mnt, ".ckptfs", "stats.json")
        with open(os.path.join(mnt, ".ckptfs", "summary.json"), "rb") as f:
            f.read()
        before, rss_before = vm_field(p.pid, "VmHWM"), vm_field(p.pid, "VmRSS")
        with open(path, "rb") as f:
            whole = f.read()
        after, rss = vm_field(p.pid, "VmHWM"), vm_field(p.pid, "VmRSS")
        pieces = read_in_pieces(path, 4093)
        stat_size = os.stat(path).st_size
    finally:
        unmount(mnt)
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    rc, cli, err, _ = run_rss([ckptfs, "stats", "--json", "-a", src], asan)
    # The mount's document pads its figures to a fixed width (its size is known before it is
    # computed); the same JSON values as the CLI's.
    same = rc == 0 and whole and json.loads(whole) == json.loads(cli)
    tap.ok(same and b"".join(pieces) == whole and stat_size == len(whole),
           "stats.json of 200,000 tensors: the JSON `ckptfs stats --json -a` prints "
           "(whole, in 4093-byte reads, and its size in a stat)",
           ["exit %r, %d vs %d bytes, pieces %s, stat %d" % (rc, len(whole), len(cli),
                                                             b"".join(pieces) == whole, stat_size),
            err.decode()[:200]])
    doc = json.loads(whole) if whole else {}
    t = doc.get("tensors", [])
    vals = struct.unpack("<4f", open(src, "rb").read()[8 + size + 16 * 123:8 + size + 16 * 124])
    tap.ok(len(t) == m and t[123]["name"] == "t0000123" and t[123]["max"] == max(vals)
           and t[123]["min"] == min(vals), "stats.json of 200,000 tensors: every tensor, "
           "figures as the file holds them", [repr(t[123] if len(t) > 123 else None)[:300]])
    # What a mount of minimal entries holds before stats.json is read is held to the bound by the
    # cases above; here, what reading stats.json adds to it.
    grown, kept = (after - before) / m, (rss - rss_before) / m
    figures = ["VmHWM %.1f -> %.1f MiB, VmRSS %.1f -> %.1f MiB (bound %.1f MiB)"
               % (before / MIB, after / MIB, rss_before / MIB, rss / MIB, limit / MIB)]
    what = " (not checked under ASan)" if asan else ""
    # The growth is over the mount's earlier high-water mark, which fell when the HF view came
    # to serve its header from the source: what is left of it is the render's working set.
    # Below the text's own size, and below the 264 B a tensor of the old whole-text render.
    tap.ok(asan or grown < 240, "stats.json of 200,000 tensors: the mount's peak grows %.0f B a "
           "tensor when it is read (the results are 96; the text is %.0f)%s"
           % (grown, len(whole) / m, what), figures)
    tap.ok(asan or kept < 200, "stats.json of 200,000 tensors: the mount keeps %.0f B a tensor "
           "once it was read (the results are 96)%s" % (kept, what), figures)
    os.unlink(src)


def stored_zip(records):
    """A stored-only zip of (name, bytes), each record's data 64-byte aligned as torch.save
    aligns them."""
    out, central = bytearray(), []
    for name, data in records:
        full = name.encode()
        start = len(out)
        pad = (-(start + 30 + len(full) + 4)) % 64
        extra = b"FB" + struct.pack("<H", pad) + b"Z" * pad
        crc = zlib.crc32(data)
        out += struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0x0800, 0, 0, 0, crc, len(data),
                           len(data), len(full), len(extra)) + full + extra + data
        central.append((full, crc, len(data), start))
    cd = len(out)
    for full, crc, size, off in central:
        out += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0x0800, 0, 0, 0, crc, size,
                           size, len(full), 0, 0, 0, 0, 0, off) + full
    out += struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(central), len(central), len(out) - cd,
                       cd, 0)
    return bytes(out)


def views_pickle(names, numel):
    """An OrderedDict of 1-D float32 tensors of `numel` elements, tensor i viewing elements
    [i*numel, (i+1)*numel) of ONE storage "0", as torch.save pickles a state dict of views
    (protocol 2, globals and the storage tuple's strings memoized, like Python's pickler)."""
    def memo_get(i):
        return b"h" + bytes([i]) if i < 256 else b"j" + struct.pack("<I", i)
    b = bytearray(b"\x80\x02ccollections\nOrderedDict\nq\x00)Rq\x01(")
    total = numel * len(names)
    for i, name in enumerate(names):
        if i and i % 1000 == 0:
            b += b"u("  # SETITEMS in batches of 1000, as Python's pickler writes them
        b += short_str(name)
        if i == 0:
            b += (b"ctorch._utils\n_rebuild_tensor_v2\nq\x02((" + short_str("storage") +
                  b"q\x03ctorch\nFloatStorage\nq\x04" + short_str("0") + b"q\x05" +
                  short_str("cpu") + b"q\x06J" + struct.pack("<i", total) + b"tq\x07Q")
        else:
            b += memo_get(2) + b"(" + memo_get(7) + b"Q"
        b += (b"J" + struct.pack("<i", i * numel) + b"J" + struct.pack("<i", numel) +
              b"\x85K\x01\x85\x89" + memo_get(0) + b")RtR")
    b += b"u."
    return bytes(b)


def shared_storage_cases(tap, ckptfs, tmp, asan):
    """30,000 tensors viewing one storage (a flat parameter buffer): each sidecar named up to 32
    of the others, ~1.1 KB of names a tensor (1.7 GB held for 300,000 such tensors); now 4 and
    "...", with storage_users saying how many."""
    m, numel = 30000, 2
    names = ["model.layers.%d.mlp.experts.%d.w" % (i // 1000, i % 1000) for i in range(m)]
    pkl = views_pickle(names, numel)
    data = struct.pack("<%df" % (m * numel), *range(m * numel))
    src = os.path.join(tmp, "views.pt")
    with open(src, "wb") as f:
        f.write(stored_zip([("archive/data.pkl", pkl), ("archive/data/0", data),
                            ("archive/version", b"3\n")]))
    del data
    check_big(tap, ckptfs, src, len(pkl), "30,000 views of one storage", asan,
              os.path.join(tmp, "mnt"))
    rc, out, err = run_rss([ckptfs, "cat", src, "model.layers.7.mlp.experts.123.w"], asan)[:3]
    tap.ok(rc == 0 and out == struct.pack("<2f", 7123 * 2, 7123 * 2 + 1),
           "30,000 views of one storage: a view reads its own elements", [err.decode()[:200]])
    mnt = os.path.join(tmp, "mnt")
    os.makedirs(mnt, exist_ok=True)
    errf = tempfile.TemporaryFile()
    p = subprocess.Popen([ckptfs, src, mnt, "-f"], stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=errf, start_new_session=True)
    deadline = time.time() + TIMEOUT
    while not is_mounted(mnt) and p.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    sidecar = {}
    try:
        if is_mounted(mnt):
            with open(os.path.join(mnt, "model", "layers", "7", "mlp", "experts", "123",
                                   "w.json"), "rb") as f:
                sidecar = json.loads(f.read())
        else:
            errf.seek(0)
            tap.diag("not mounted: %s" % errf.read().decode(errors="replace")[:300])
    except (OSError, ValueError) as e:
        tap.diag("sidecar: %r" % e)
    finally:
        if is_mounted(mnt):
            unmount(mnt)
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    shared = sidecar.get("shared_with", [])
    tap.ok(len(shared) == 5 and shared[-1] == "..." and
           all(n in names and n != names[7123] for n in shared[:4]) and
           sidecar.get("storage_users") == m and sidecar.get("storage_offset") == 7123 * numel,
           "30,000 views of one storage: the sidecar names 4 others and \"...\", "
           "storage_users 30000", [repr(sidecar)[:400]])


# The parser keeps only fetched memo entries and hands each dict pair to the reader, which turns
# the tensors and DCP entries it has read into compact records (the rest of their tree is
# recycled as it goes): neither pickle stands whole as a tree any more. The torch reader fills
# the catalog only once the tree is freed, and its sidecar extras are records rendered when a
# sidecar is read (the first users of a shared storage kept once per storage, not ~290 B of text
# a tensor), so the torch zip of 300,000 views is held to 85% of the bound, as the million-tensor
# headers are.


def pickle_dom_cases(tap, ckptfs, tmp, asan):
    """Pickles of many tensors: ls, info and a mount within the bound (the torch zip within 85%
    of it): a torch.save zip of 300,000 views and a DCP .metadata of 100,000 tensors (written
    with tests/gen/dcp_fixtures.py's stand-ins of torch's DCP classes, as its hostile cases
    are)."""
    if asan:  # minutes of a sanitized parse, and the bound is loosened there: nothing to learn
        for what in ("torch zip of 300,000 views", "DCP .metadata of 100,000 tensors"):
            tap.skip("%s: ckptfs ls, info and a mount within the bound" % what,
                     "a sanitizer build (the bound is loosened there)")
        return
    m = 300000
    names = ["model.layers.%d.mlp.experts.%d.w" % (i // 1000, i % 1000) for i in range(m)]
    pkl = views_pickle(names, 2)
    src = os.path.join(tmp, "views300k.pt")
    with open(src, "wb") as f:
        f.write(stored_zip([("archive/data.pkl", pkl), ("archive/data/0", bytes(8 * m)),
                            ("archive/version", b"3\n")]))
    cases = [(src, len(pkl), "torch zip of 300,000 views", m, 0.85)]
    del pkl
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "gen"))
    import pickle
    import dcp_fixtures
    base = os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "fixtures", "dcp",
                        "v2x_layout")
    with open(os.path.join(base, "manifest.json")) as f:
        spec = json.load(f)["rebuild"]
    norm = next(e for e in spec["entries"] if e["fqn"] == "model.norm.weight")
    n = 100000
    entries = []
    for i in range(n):
        e = dict(norm, chunks=[dict(norm["chunks"][0])])
        e["fqn"] = "model.layers.%d.experts.%d.w" % (i // 1000, i % 1000)
        entries.append(e)
    d = os.path.join(tmp, "dcp100k")
    os.makedirs(d)
    for name in os.listdir(base):
        if name.endswith(".distcp"):
            with open(os.path.join(base, name), "rb") as fi, \
                    open(os.path.join(d, name), "wb") as fo:
                fo.write(fi.read())
    meta = pickle.dumps(dcp_fixtures.build_metadata(dcp_fixtures.Standins(None), {
        "entries": entries, "version": "1.0.0", "storage_meta": None}), protocol=4)
    with open(os.path.join(d, ".metadata"), "wb") as f:
        f.write(meta)
    cases.append((d, len(meta), "DCP .metadata of 100,000 tensors", n, 1.0))
    del meta, entries
    for path, size, what, count, margin in cases:
        limit = bound(size, asan) * margin
        of = "" if margin == 1.0 else " (%d%% of the bound)" % round(100 * margin)
        rc, out, err, rss = run_rss([ckptfs, "ls", path], asan)
        lines = out.count(b"\n")
        tap.ok(rc == 0 and lines == count, "%s: ckptfs ls lists every tensor" % what,
               ["exit %r, %d lines: %s" % (rc, lines, err.decode(errors="replace")[:300])])
        tap.ok(rss < limit, "%s: ckptfs ls peak RSS %.1f MiB < %.1f MiB%s"
               % (what, rss / MIB, limit / MIB, of))
        rc, _, err, rss = run_rss([ckptfs, "info", path], asan)
        tap.ok(rc == 0, "%s: ckptfs info works" % what, [err.decode(errors="replace")[:300]])
        tap.ok(rss < limit, "%s: ckptfs info peak RSS %.1f MiB < %.1f MiB%s"
               % (what, rss / MIB, limit / MIB, of))
        mounted, hwm, err = light_mount_rss(ckptfs, path, os.path.join(tmp, "mnt"), asan)
        tap.ok(mounted, "%s: mounts" % what, [err[:300]])
        if mounted:
            tap.ok(hwm is not None and hwm < limit,
                   "%s: mount peak RSS (VmHWM) %.1f MiB < %.1f MiB%s"
                   % (what, (hwm or 0) / MIB, limit / MIB, of))


def main():
    ckptfs = os.environ.get("CKPTFS", "")
    if not ckptfs or not os.access(ckptfs, os.X_OK):
        print("1..0 # SKIP CKPTFS (%r) is not an executable" % ckptfs)
        return 0
    if not os.path.exists("/dev/fuse"):
        print("1..0 # SKIP /dev/fuse is missing")
        return 0
    tap = Tap()
    asan = sanitized(ckptfs)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            pickle_cases(tap, ckptfs, tmp, asan)
            json_cases(tap, ckptfs, tmp, asan)
            catalog_cases(tap, ckptfs, tmp, asan)
            stats_cases(tap, ckptfs, tmp, asan)
            shared_storage_cases(tap, ckptfs, tmp, asan)
            pickle_dom_cases(tap, ckptfs, tmp, asan)
        finally:
            mnt = os.path.join(tmp, "mnt")
            if os.path.isdir(mnt) and is_mounted(mnt):
                unmount(mnt)
    tap.done()
    return 1 if tap.failed else 0


if __name__ == "__main__":
    sys.exit(main())
