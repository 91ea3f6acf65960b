"""What the fixture generators (tests/gen/*_fixtures.py) share: the command line and
the output directory, field-by-field byte writers for hostile cases, the ckptfs tree
rules, and the hostile cases' cases.tsv / mount-names.json / canaries.json.

Generators import it by path, as they import each other:
    sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
It uses the standard library only, and nothing of core/.
"""

import io
import json
import os
import re
import shutil
import struct
import sys
import zipfile


# ---------------------------------------------------------------------------
# Command line and output directory

def generate(argv, cases, *steps, self_test=None):
    """main() of a generator that writes the directories `cases` into OUTDIR: self_test()
    first, then the stale case directories are removed (only those, never OUTDIR itself,
    so stale files from an older generator never linger), then each step(OUTDIR) in order."""
    if len(argv) != 2:
        sys.stderr.write("usage: %s OUTDIR\n" % argv[0])
        return 2
    out = argv[1]
    if self_test:
        self_test()
    for case in cases:
        if os.path.isdir(os.path.join(out, case)):
            shutil.rmtree(os.path.join(out, case))
    os.makedirs(out, exist_ok=True)
    for step in steps:
        step(out)
    return 0


def fresh_dir(out):
    """out, emptied: removed with everything in it and made again."""
    if os.path.isdir(out):
        shutil.rmtree(out)
    os.makedirs(out)


def fresh_out(argv, usage):
    """OUTDIR of `GENERATOR OUTDIR`, emptied (fresh_dir); None after printing usage."""
    if len(argv) != 2:
        print(usage, file=sys.stderr)
        return None
    fresh_dir(argv[1])
    return argv[1]


def committed_out(argv, committed, doc):
    """Where a generator of committed fixtures writes: `--out OUT`, or with no argument
    the committed directory itself; None (after printing doc) for anything else."""
    if len(argv) == 3 and argv[1] == "--out":
        return argv[2]
    if len(argv) == 1:
        return committed
    print(doc, file=sys.stderr)
    return None


def committed_torch_main(argv, what, committed, doc, build):
    """main() of a generator whose fixtures need python3-torch and are committed: the
    Makefile's call (one output directory) only says so; `--out OUT` or no argument builds."""
    if len(argv) == 2 and argv[1] != "--out":
        print("%s fixtures are committed in %s (regenerate them with %s, which needs "
              "python3-torch); nothing to write into %s" % (what, committed, argv[0], argv[1]))
        return 0
    out = committed_out(argv, committed, doc)
    if out is None:
        return 2
    import torch  # only now: the Makefile's call above must work without torch
    fresh_dir(out)
    build(torch, out)
    return out


# ---------------------------------------------------------------------------
# Bytes

def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def u32(v):
    return struct.pack("<I", v)


def u64(v):
    return struct.pack("<Q", v)


class Out:
    """A file written field by field; fields are (label, offset, size), so hostile cases
    can patch or cut at them."""

    def __init__(self):
        self.buf = bytearray()
        self.fields = []

    def put(self, label, data):
        self.fields.append((label, len(self.buf), len(data)))
        self.buf += data

    def u32(self, label, v):
        self.put(label, u32(v))

    def u64(self, label, v):
        self.put(label, u64(v))


def field_at(fields, label):
    for lab, off, size in fields:
        if lab == label:
            return off, size
    raise KeyError(label)


def patched(data, fields, label, new):
    """data with the start of field `label` overwritten by `new`."""
    off, size = field_at(fields, label)
    assert len(new) <= size, label
    return data[:off] + new + data[off + len(new):]


def torch_save_zip(pkl):
    """A torch.save-style archive (archive/data.pkl, archive/version) around any pickle."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        for name, data in (("archive/data.pkl", pkl), ("archive/version", b"3\n")):
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            z.writestr(info, data)
    return buf.getvalue()


# ---------------------------------------------------------------------------
# The ckptfs tree rules (ckptfs(5)), restated independently of the C code

def escape_component(comp):
    """Escape one name component (bytes) into a path component (str)."""
    if not comp:
        return "%_"
    out = bytearray()
    for b in comp:
        out += b"%%%02X" % b if b == 0x25 or b < 0x20 or b == 0x7F else bytes([b])
    # Only ASCII bytes were replaced, so valid UTF-8 stays valid UTF-8.
    return out.decode("utf-8")


def tree_paths(names):
    """{name: path of its raw file, relative}; the sidecar is the path without ".raw",
    plus ".json"."""
    comps_of, seen = {}, {}
    # Collisions are resolved in bytewise name order, so the result does not
    # depend on the order of the names in the file.
    for name in sorted(names, key=lambda n: n.encode("utf-8")):
        comps = [escape_component(c) for c in re.split(rb"[./]", name.encode("utf-8"))]
        key = tuple(comps)
        seen[key] = seen.get(key, 0) + 1
        if seen[key] > 1:
            comps[-1] += "%%~%d" % seen[key]
        comps_of[name] = tuple(comps)
    dirs = {comps[:i] for comps in comps_of.values() for i in range(1, len(comps))}
    # A tensor that is also a directory keeps its directory; its bytes move next to it
    # as .raw.  The sidecar never clashes (no '.' in components).
    return {name: "/".join(c) + (".raw" if c in dirs else "") for name, c in comps_of.items()}


# ---------------------------------------------------------------------------
# Hostile cases

def write_json(path, doc, indent=1, newline=True, **kw):
    """doc as JSON (json.dump's keywords kw), and a newline."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=indent, **kw)
        if newline:
            f.write("\n")


def write_cases(root, rows, columns=("path", "expect", "needle", "description")):
    """root/cases.tsv: a header naming the columns, then one tab-separated line a row."""
    with open(os.path.join(root, "cases.tsv"), "w", encoding="utf-8") as f:
        f.write("\t".join(columns) + "\n")
        for row in rows:
            assert len(row) == len(columns) and not any("\t" in x or "\n" in x for x in row), row
            f.write("\t".join(row) + "\n")


class Hostile:
    """The hostile/ directory of a generator: rows of cases.tsv (path, expect, needle,
    description) and, for "mount" cases, the tensor names they expose."""

    def __init__(self, root):
        self.root = root
        self.rows = []
        self.names = {}   # mount case -> tensor names, for reachability checks
        os.makedirs(root)

    def row(self, path, expect, needle, desc):
        assert "\t" not in desc and "\n" not in desc
        self.rows.append((path, expect, needle, desc))

    def finish(self):
        write_cases(self.root, self.rows)
        write_json(os.path.join(self.root, "mount-names.json"), self.names, sort_keys=True)


class FileHostile(Hostile):
    """Hostile cases that are single files."""

    def add(self, name, data, needle, desc, mount_names=None):
        """A file that must be refused, or with mount_names mount and show those tensors."""
        with open(os.path.join(self.root, name), "wb") as f:
            f.write(data)
        if mount_names is not None:
            self.names[name] = mount_names
        self.row(name, "mount" if mount_names is not None else "refuse", needle, desc)
