#!/usr/bin/python3
"""Where tensors of adversarial names appear in the tree, against a model of the rules of
ckptfs(5) "Name escaping" written here from the man page (no code shared with core/):

- names that meet (a.b next to a/b, and a prefix + x next to a name with the prefix's dots),
  numbered %~2, %~3 in byte order of the names; a tensor whose path is also a directory
  (a.b next to a.b.c, also when a-b or a+b sort between them) shown as .raw, its sidecar not;
- '%', control bytes, NUL, empty components (leading, trailing and double dots), components
  of 224 and 225+ bytes (shortened with the FNV-1a hash, never cutting an escape in half),
  long components that meet after shortening;
- per-rank prefixes (".ckptfs/ranks/N/", "optim/") put in front as they are;
- 4,000 random names over a small alphabet of ".", "/", "-", "+", "%", "a", "b": every
  collision the rules have, at once.

Paths come from treepath_tool (core's catalog for any bytes and prefixes); a mount of a
safetensors file of the UTF-8 names checks that the mounted tree holds exactly the raw files
and sidecars the model says (directories included) and that each raw file holds its tensor.
Environment: CKPTFS, FIXTURES, TOOLS.
"""

import json
import os
import random
import struct
import subprocess
import sys

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
from ckptfs_test import run_cases, unmount  # noqa: E402
from mount_checks import mount  # noqa: E402

CKPTFS = os.environ.get("CKPTFS")
TOOL = os.path.join(os.environ.get("TOOLS", ""), "treepath_tool")


# ---------------------------------------------------------------------------
# The model (ckptfs(5), "Name escaping")

def fnv1a64(data):
    """FNV-1a 64 as ckptfs(5) gives it: its offset basis is 1469598103934665603 (FNV's own is
    14695981039346656037, one digit more); paths made with it are kept as they are."""
    h = 1469598103934665603
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def component(raw):
    """A name component (bytes) as the tree shows it (bytes)."""
    if not raw:
        return b"%_"
    pieces = [b"%%%02X" % c if c == 0x25 or c < 0x20 or c == 0x7F else bytes([c]) for c in raw]
    escaped = b"".join(pieces)
    if len(escaped) <= 224:
        return escaped
    kept, used = [], 0
    for p in pieces:  # the first 200 bytes, an escape kept whole or not at all
        if used + len(p) > 200:
            break
        kept.append(p)
        used += len(p)
    return b"".join(kept) + b"%#" + b"%016x" % fnv1a64(raw)


def model_paths(entries):
    """entries: [(prefix bytes or None, name bytes)] -> {entry: (raw path, sidecar path)}."""
    order = sorted(entries, key=lambda e: (e[0] is not None, e[0] or b"", e[1]))
    base = {}
    for e in order:
        prefix, name = e
        parts = name.replace(b"/", b".").split(b".")
        base[e] = (prefix or b"") + b"/".join(component(c) for c in parts)
    seen, numbered = {}, {}
    for e in order:
        p = base[e]
        seen[p] = seen.get(p, 0) + 1
        numbered[e] = p if seen[p] == 1 else p + b"%%~%d" % seen[p]
    dirs = set()
    for p in numbered.values():
        for i, c in enumerate(p):
            if c == 0x2F:
                dirs.add(p[:i])
    return {e: (p + (b".raw" if p in dirs else b""), p + b".json") for e, p in numbered.items()}


# ---------------------------------------------------------------------------
# Names

def adversarial():
    long_a = b"q" * 300
    names = [
        b"a.b", b"a/b", b"a.b.c", b"a-b", b"a+b", b"a.b-x", b"a.b/c", b"a/b.c%~2",
        b"x.y", b"x.y.z", b"x.y-z", b"x.y-z.w", b"x", b"x.", b"x..y", b".x", b".", b"..",
        b"", b"p%q", b"p%25q", b"p.q%", b"nul\0z", b"tab\tz\x7f", b"caf\xc3\xa9.w",
        b"m.%_", b"m./", b"m//n", b"m/.n", b"r.s.t.u.v", b"r.s", b"r.s.t", b"r/s/t/u/v.raw",
        b"q" * 224, b"q" * 225, b"k." + b"q" * 224 + b".v", long_a, long_a + b".leaf",
        long_a + b"/leaf", b"%" * 80, b"%" * 75 + b"q", b"q" + b"%" * 75, b"z" * 199 + b"%%",
        b"z" * 198 + b"%" * 9, b"\x01" * 76, b"same" + b"e" * 250, b"same" + b"e" * 251,
    ]
    entries = [(None, n) for n in names]
    # Two long components that share their first 200 bytes but differ after: distinct paths
    # (their hashes differ); the same long component twice (a.L, a/L): numbered.
    entries += [(None, b"h" * 230 + b"1"), (None, b"h" * 230 + b"2"),
                (None, b"L." + b"w" * 240), (None, b"L/" + b"w" * 240)]
    for prefix in (b".ckptfs/ranks/0/", b".ckptfs/ranks/1/", b"optim/"):
        for n in (b"a.b", b"a.b.c", b"x", b"w%", b"", b"q" * 230):
            entries.append((prefix, n))
    # "optim/" + "x" meets the plain name "optim.x", and "optim/a" + "b" meets "optim.a.b"
    entries += [(None, b"optim.x"), (None, b"optim.a.b"), (None, b"optim.a.b.c.d")]
    return entries


def random_names(seed, count):
    rnd = random.Random(seed)
    alphabet = [b".", b"/", b"-", b"+", b"%", b"a", b"b", b"ab"]
    out = set()
    while len(out) < count:
        out.add(b"".join(rnd.choice(alphabet) for _ in range(rnd.randrange(1, 9))))
    return [(None, n) for n in sorted(out)]


# ---------------------------------------------------------------------------
# Checks

def core_paths(entries):
    """{entry: (raw path, sidecar path)} as treepath_tool reports them, or (None, stderr)."""
    text = "".join("%s %s\n" % (p.hex() if p is not None else "-", n.hex()) for p, n in entries)
    r = subprocess.run([TOOL], input=text.encode(), capture_output=True, timeout=120)
    if r.returncode != 0:
        return None, r.stderr.decode(errors="replace")
    lines = r.stdout.decode().splitlines()
    if len(lines) != len(entries):
        return None, "%d lines for %d names" % (len(lines), len(entries))
    out = {}
    for e, line in zip(entries, lines):
        raw, side = line.split(" ")
        out[e] = (bytes.fromhex(raw), bytes.fromhex(side))
    return out, ""


def compare(tap, entries, what):
    got, err = core_paths(entries)
    if got is None:
        tap.ok(False, "%s: treepath_tool runs" % what, [err[:300]])
        return
    want = model_paths(entries)
    bad = [(e, got[e], want[e]) for e in entries if got[e] != want[e]]
    tap.ok(not bad, "%s: %d paths and sidecars as the model of ckptfs(5) makes them"
           % (what, len(entries)), ["%r: got %r, want %r" % b for b in bad[:5]])


def path_cases(tap, work):
    if not os.access(TOOL, os.X_OK):
        tap.skip("tree paths of adversarial names", "TOOLS has no treepath_tool (make tools)")
        return
    compare(tap, adversarial(), "adversarial names and prefixes")
    compare(tap, random_names(84, 4000), "4,000 random names over . / - + % a b")
    # Names in every order of input: the result depends on the names only.
    entries = adversarial()
    random.Random(1).shuffle(entries)
    compare(tap, entries, "adversarial names, shuffled")


def write_safetensors(path, names):
    """U8 tensors of 1 byte each: tensor i holds the byte i % 251."""
    header = {}
    for i, n in enumerate(names):
        header[n.decode()] = {"dtype": "U8", "shape": [1], "data_offsets": [i, i + 1]}
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + bytes(i % 251 for i in range(len(names))))


def mounted_files(mnt):
    files, dirs = set(), set()
    for dirpath, dirnames, filenames in os.walk(os.fsencode(mnt)):
        rel = os.path.relpath(dirpath, os.fsencode(mnt))
        rel = b"" if rel == b"." else rel + b"/"
        if rel.startswith(b".ckptfs/"):
            continue
        dirs.update(rel + d for d in dirnames if rel + d != b".ckptfs")
        files.update(rel + f for f in filenames if not f.endswith(b".npy"))
    return files, dirs


def mount_case(tap, work):
    """The mounted tree of the UTF-8 names (safetensors keys) against the model."""
    names = [n for p, n in adversarial() if p is None and b"\0" not in n]
    names += [n for p, n in random_names(85, 1500)]
    names = sorted(set(n for n in names if n.decode("utf-8", "replace").encode() == n))
    src = os.path.join(work, "names.safetensors")
    write_safetensors(src, names)
    want = model_paths([(None, n) for n in names])
    want_files = {p for pair in want.values() for p in pair}
    want_dirs = {p[:i] for p in want_files for i, c in enumerate(p) if c == 0x2F}
    mnt = os.path.join(work, "mnt")
    os.makedirs(mnt)
    if not mount(tap, CKPTFS, src, mnt, "%d adversarial names: mounts" % len(names)):
        return
    try:
        files, dirs = mounted_files(mnt)
        tap.ok(files == want_files, "the tree holds exactly the %d raw files and sidecars the "
               "model makes" % len(want_files),
               ["missing %r" % sorted(want_files - files)[:5],
                "extra %r" % sorted(files - want_files)[:5]])
        tap.ok(dirs == want_dirs, "and exactly its %d directories" % len(want_dirs),
               ["missing %r" % sorted(want_dirs - dirs)[:5],
                "extra %r" % sorted(dirs - want_dirs)[:5]])
        bad = []
        for i, n in enumerate(names):
            raw, side = want[(None, n)]
            with open(os.path.join(os.fsencode(mnt), raw), "rb") as f:
                if f.read() != bytes([i % 251]):
                    bad.append(n)
            with open(os.path.join(os.fsencode(mnt), side), "rb") as f:
                if json.load(f).get("name") != n.decode():
                    bad.append(n)
        tap.ok(not bad, "each raw file holds its tensor's byte, each sidecar names it",
               [repr(bad[:5])])
    finally:
        unmount(mnt)


def main():
    return run_cases("ckptfs-t84.", path_cases, mount_case)


if __name__ == "__main__":
    sys.exit(main())
