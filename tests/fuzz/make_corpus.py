#!/usr/bin/python3
"""Write the seed corpora of the fuzz harnesses: tests/fuzz/corpus/<harness>/.

Usage: tests/fuzz/make_corpus.py FIXTURES [OUT]

FIXTURES is a directory the tests/gen/*_fixtures.py generators wrote (as `make fixtures` does:
safetensors cases at the top, every other generator in FIXTURES/NAME). Seeds are small valid
files (< 64 KiB, the harnesses' -max_len) plus a few hostile cases of each generator; directory
formats and split files become packs (see tests/fuzz/fuzz_common.h). The planner and HF-view
harnesses read structured bytes, so their seeds are deterministic pseudo-random strings. The
output is deterministic: running this again on the same fixtures gives the same files.
"""

import hashlib
import os
import pickle
import random
import re
import shutil
import struct
import sys
import zipfile

MAX_LEN = 65536
HOSTILE_PER_HARNESS = 16
SKIP = {"manifest.json", "cases.tsv", "canaries.json", "mount-names.json"}
NAME_OK = re.compile(r"^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)?$")
HERE = os.path.dirname(os.path.realpath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def pack(files):
    """files: [(name, bytes)] -> a pack, or None if a name is unusable or it is too big."""
    out = bytearray(b"CKFZPACK")
    for name, data in files:
        raw = name.encode()
        if not NAME_OK.match(name) or any(p in (".", "..") for p in name.split("/")):
            return None
        out += bytes([len(raw)]) + raw + struct.pack("<I", len(data)) + data
    return bytes(out) if len(out) <= MAX_LEN else None


def dir_files(root):
    """Regular files of root and its subdirectories (one level), sorted, minus test metadata."""
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        depth = 0 if rel == "." else rel.count("/") + 1
        if depth >= 1:
            dirnames[:] = []
        dirnames.sort()
        for f in sorted(filenames):
            if f in SKIP:
                continue
            path = os.path.join(dirpath, f)
            name = f if rel == "." else rel + "/" + f
            if os.path.isfile(path) and not os.path.islink(path):
                with open(path, "rb") as fh:
                    files.append((name, fh.read()))
    return files


def read(path):
    with open(path, "rb") as f:
        return f.read()


class Corpus:
    def __init__(self, out, harness):
        self.dir = os.path.join(out, harness)
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(self.dir)
        self.names = set()

    def add(self, label, data):
        if data is None or len(data) > MAX_LEN:
            return False
        label = re.sub(r"[^A-Za-z0-9._-]+", "_", label).strip("_")[:80] or "seed"
        name = label
        if name in self.names:
            name = "%s-%s" % (label, hashlib.sha1(data).hexdigest()[:8])
        self.names.add(name)
        with open(os.path.join(self.dir, name), "wb") as f:
            f.write(data)
        return True

    def add_file(self, label, path):
        if os.path.isfile(path) and os.path.getsize(path) <= MAX_LEN:
            return self.add(label, read(path))
        return False

    def add_dir(self, label, root):
        return self.add(label, pack(dir_files(root)))

    def count(self):
        return len(self.names)


def small_files(directory, pattern=None, limit=HOSTILE_PER_HARNESS):
    """Up to `limit` files of directory (smallest first, then by name) matching pattern."""
    if not os.path.isdir(directory):
        return []
    found = []
    for f in sorted(os.listdir(directory)):
        p = os.path.join(directory, f)
        if f in SKIP or not os.path.isfile(p) or os.path.getsize(p) > MAX_LEN:
            continue
        if pattern and not re.search(pattern, f):
            continue
        found.append((os.path.getsize(p), f, p))
    found.sort()
    return [(f, p) for _, f, p in found[:limit]]


def small_dirs(directory, limit=HOSTILE_PER_HARNESS):
    if not os.path.isdir(directory):
        return []
    found = []
    for d in sorted(os.listdir(directory)):
        p = os.path.join(directory, d)
        if os.path.isdir(p):
            data = pack(dir_files(p))
            if data is not None:
                found.append((len(data), d, p))
    found.sort()
    return [(d, p) for _, d, p in found[:limit]]


def case_dirs(directory):
    """Subdirectories holding a manifest.json (the valid cases of a generator)."""
    if not os.path.isdir(directory):
        return []
    return [(d, os.path.join(directory, d)) for d in sorted(os.listdir(directory))
            if os.path.isfile(os.path.join(directory, d, "manifest.json"))]


def pickles_of_zip(path):
    """The .pkl members of a torch zip file."""
    out = []
    try:
        with zipfile.ZipFile(path) as z:
            for info in z.infolist():
                if info.filename.endswith(".pkl") and info.file_size <= MAX_LEN:
                    out.append((info.filename, z.read(info)))
    except (zipfile.BadZipFile, OSError, NotImplementedError, RuntimeError, ValueError):
        pass
    return out


class Opaque:
    """A class pickled by reference: the restricted reader must refuse its global."""


def stdlib_pickles():
    shared = [1, 2]
    nested = []
    cur = nested
    for _ in range(80):
        nxt = []
        cur.append(nxt)
        cur = nxt
    cyclic = [0]
    cyclic.append(cyclic)
    values = {
        "scalars": [None, True, False, 0, -1, 2**31, -2**63, 2**64, -2**200, 1.5, float("inf"),
                    float("nan"), "", "s\u00e9\u2603", b"", b"\x00\xff" * 40, bytearray(b"ab")],
        "containers": {"t": (1, (2, 3)), "l": [shared, shared], "s": {1, 2},
                       "fs": frozenset({3}), 4: "int key", (1, 2): "tuple key"},
        "nested": nested,
        "cyclic": cyclic,
        "big_dict": {"k%d" % i: i for i in range(300)},
        "opaque": Opaque,
    }
    out = []
    for proto in (2, 3, 4, 5):
        for name, v in sorted(values.items(), key=lambda kv: kv[0]):
            try:
                out.append(("stdlib-%s-p%d" % (name, proto), pickle.dumps(v, protocol=proto)))
            except (pickle.PicklingError, TypeError, AttributeError):
                pass
    return out


def random_seeds(corpus, label, count, length):
    rng = random.Random(label)
    for i in range(count):
        corpus.add("%s-%02d" % (label, i), bytes(rng.randrange(256) for _ in range(length)))


def main():
    if len(sys.argv) not in (2, 3):
        sys.stderr.write(__doc__)
        return 2
    fx = os.path.abspath(sys.argv[1])
    out = os.path.abspath(sys.argv[2]) if len(sys.argv) == 3 else os.path.join(HERE, "corpus")
    torch_dir = os.path.join(REPO, "tests", "fixtures", "torch")
    counts = {}

    c = Corpus(out, "safetensors")
    for case in ("dtypes", "odd", "sharded", "both"):
        for f, p in small_files(os.path.join(fx, case), r"\.safetensors$", 8):
            c.add_file("%s-%s" % (case, f), p)
    for f, p in small_files(os.path.join(fx, "hostile"), r"\.safetensors$"):
        c.add_file("hostile-" + f, p)
    counts["safetensors"] = c.count()

    c = Corpus(out, "gguf")
    for case, p in case_dirs(os.path.join(fx, "gguf")):
        files = [f for f in os.listdir(p) if f.endswith(".gguf")]
        if len(files) == 1:
            c.add_file(case, os.path.join(p, files[0]))
        else:
            c.add_dir(case, p)
    for f, p in small_files(os.path.join(fx, "gguf", "hostile"), r"\.gguf$"):
        c.add_file("hostile-" + f, p)
    for d, p in small_dirs(os.path.join(fx, "gguf", "hostile"), 4):
        c.add_dir("hostile-" + d, p)
    counts["gguf"] = c.count()

    c = Corpus(out, "torch_zip")
    for f, p in small_files(torch_dir, r"\.pt$", 32):
        c.add_file(f, p)
    for f, p in small_files(os.path.join(fx, "torch_hostile"), r"\.pt$"):
        c.add_file("hostile-" + f, p)
    counts["torch_zip"] = c.count()

    c = Corpus(out, "pickle")
    for f, p in small_files(torch_dir, r"\.pt$", 32):
        for member, data in pickles_of_zip(p):
            c.add("%s-%s" % (f, member.split("/")[-1]), data)
    for f, p in small_files(os.path.join(fx, "torch_hostile"), r"\.pt$", 64):
        for member, data in pickles_of_zip(p):
            c.add("hostile-%s-%s" % (f, member.split("/")[-1]), data)
    for label, data in stdlib_pickles():
        c.add(label, data)
    counts["pickle"] = c.count()

    for harness, gen, name in (("gptrs", "gptrs", "model.bin"), ("burnpack", "burnpack/good",
                                                                  "model.bpk"),
                               ("lwt", "lwt", "model.lwt")):
        c = Corpus(out, harness)
        for case, p in case_dirs(os.path.join(fx, gen)):
            c.add_file(case, os.path.join(p, name))
        hostile = os.path.join(fx, gen.split("/")[0], "hostile")
        for f, p in small_files(hostile):
            c.add_file("hostile-" + f, p)
        counts[harness] = c.count()

    c = Corpus(out, "tar")
    for f, p in small_files(os.path.join(fx, "layouts", "tars"), r"\.(tar|nemo)$", 8):
        c.add_file(f, p)
    for f, p in small_files(os.path.join(fx, "layouts", "hostile"), r"\.(tar|nemo)$"):
        c.add_file("hostile-" + f, p)
    counts["tar"] = c.count()

    c = Corpus(out, "mlfw_tp")
    for case, p in case_dirs(os.path.join(fx, "mlfw")):
        for f, q in small_files(p, r"\.ckpt$", 2):
            c.add_file("%s-%s" % (case, f), q)
    for f, p in small_files(os.path.join(fx, "mlfw", "hostile"), r"^central"):
        c.add_file("hostile-" + f, p)
    counts["mlfw_tp"] = c.count()

    c = Corpus(out, "mlfw_dir")
    for case, p in case_dirs(os.path.join(fx, "mlfw")):
        if os.path.isdir(os.path.join(p, "ckpt")):
            c.add_dir(case, os.path.join(p, "ckpt"))
    for d, p in small_dirs(os.path.join(fx, "mlfw", "hostile")):
        c.add_dir("hostile-" + d, p)
    counts["mlfw_dir"] = c.count()

    # Committed torch fixtures (tests/fixtures/, written with torch by their generators).
    committed = os.path.join(REPO, "tests", "fixtures")
    c = Corpus(out, "meta_mp")
    for case, p in small_dirs(os.path.join(committed, "meta_mp")):
        c.add_dir(case, p)
    for d, p in small_dirs(os.path.join(committed, "meta_mp", "hostile")):
        c.add_dir("hostile-" + d, p)
    counts["meta_mp"] = c.count()

    c = Corpus(out, "deepspeed")
    for case, p in small_dirs(os.path.join(committed, "deepspeed")):
        c.add_dir(case, p)
    for d, p in small_dirs(os.path.join(committed, "deepspeed", "hostile")):
        c.add_dir("hostile-" + d, p)
    counts["deepspeed"] = c.count()

    c = Corpus(out, "hf_dir")
    for case in ("sharded", "both"):
        c.add_dir(case, os.path.join(fx, case))
    c.add("single", pack([("model.safetensors", read(os.path.join(fx, "dtypes",
                                                                   "model.safetensors")))]))
    for d, p in small_dirs(os.path.join(fx, "hostile")):
        if d.startswith("hf-"):
            c.add_dir("hostile-" + d, p)
    counts["hf_dir"] = c.count()

    c = Corpus(out, "dcp_hf")
    for case, p in case_dirs(os.path.join(fx, "dcphf")):
        c.add_dir(case, p)
    for d, p in small_dirs(os.path.join(fx, "dcphf", "hostile")):
        c.add_dir("hostile-" + d, p)
    counts["dcp_hf"] = c.count()

    c = Corpus(out, "planner")
    random_seeds(c, "planner", 24, 96)
    # A dim-1 split of a [4,6] F32 tensor over both files, and a column-major whole tensor.
    c.add("grid-dim1", bytes([2, 2, 4, 6, 0, 0, 1, 3, 2, 2, 0, 0, 0, 3, 2, 1, 0, 0, 0, 0]) +
          bytes(range(64)))
    c.add("whole-colmajor", bytes([3, 2, 3, 5, 2, 1, 0, 2, 0, 0, 3, 0]) + bytes(range(64)))
    counts["planner"] = c.count()

    c = Corpus(out, "hfview")
    random_seeds(c, "hfview", 24, 128)
    counts["hfview"] = c.count()

    for k in sorted(counts):
        print("%-12s %3d seeds" % (k, counts[k]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
