"""Keras 3 weights as trees (run by 980-keras.t with the client venv's python: keras on the torch
backend, and h5py as the independent reader).

Environment: CKPTFS (the ckptfs binary), FIXTURES (required by the harness, unused).

- model.save_weights (.weights.h5) and model.save (.keras) of a small model with Dense,
  Embedding, BatchNormalization and a float16 layer: every dataset h5py lists is a raw file of
  the mount with h5py's bytes, dtype and shape; contiguous datasets are served in place (the
  sidecar's source is the file, at h5py's get_offset, plus the member's offset for .keras);
  the .keras model's config.json is in metadata.json;
- an HDF5 file written by h5py with chunked + gzip, chunked + shuffle, compact and
  never-written (fill value) datasets, int/uint/bool types: decoded through libhdf5, equal to
  h5py's;
- a .keras whose model.weights.h5 is deflated, a big-endian dataset, a string dataset and a
  damaged superblock: refused with a message naming the file.
"""

import json
import os
import subprocess
import sys
import zipfile

os.environ.setdefault("KERAS_BACKEND", "torch")

import h5py  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from ckptfs_test import run_cases  # noqa: E402
from mount_checks import mounted, read_bytes, sidecar_path  # noqa: E402

CKPTFS = os.environ.get("CKPTFS")
DTYPE = {"float16": "F16", "float32": "F32", "float64": "F64", "int8": "I8", "int16": "I16",
         "int32": "I32", "int64": "I64", "uint8": "U8", "uint16": "U16", "uint32": "U32",
         "uint64": "U64", "bool": "BOOL"}


def ckptfs(*args):
    p = subprocess.run([CKPTFS] + list(args), capture_output=True, timeout=120)
    return p.returncode, p.stdout, p.stderr.decode(errors="replace")


def datasets(h5file):
    """{path: (array, offset or None)} of every dataset, as h5py reads it."""
    out = {}

    def visit(name, obj):
        if isinstance(obj, h5py.Dataset):
            out[name] = (obj[()] if obj.shape != () else np.array(obj[()]), obj.id.get_offset())
    with h5py.File(h5file, "r") as f:
        f.visititems(visit)
    return out


def compare(tap, label, src, want, base=0, file_name=None):
    def checks(mnt):
        problems = []
        for name, (arr, offset) in want.items():
            arr = np.asarray(arr)
            try:
                data = read_bytes(os.path.join(mnt, name))
                sc = json.loads(read_bytes(os.path.join(mnt, sidecar_path(name))))
            except (OSError, ValueError) as e:
                problems.append("%s: %s" % (name, e))
                continue
            if data != np.ascontiguousarray(arr).tobytes():
                problems.append("%s: bytes differ from h5py's" % name)
            if sc.get("dtype") != DTYPE[arr.dtype.name] or sc.get("shape") != list(arr.shape):
                problems.append("%s: sidecar %r" % (name, {k: sc.get(k) for k in
                                                           ("dtype", "shape")}))
            s = (sc.get("sources") or [{}])[0]
            if file_name and offset is not None and arr.nbytes and \
                    (s.get("file"), s.get("offset")) != (file_name, base + offset):
                problems.append("%s: source %r, want %s at %d" % (name, s, file_name,
                                                                  base + offset))
        tap.ok(want and not problems, "%s: every dataset equals h5py's (%d), contiguous ones "
               "served in place" % (label, len(want)), problems)
    mounted(tap, CKPTFS, src, label, checks)


def keras_model():
    import keras
    keras.utils.set_random_seed(98)
    inp = keras.Input((6,), dtype="int32")
    x = keras.layers.Embedding(20, 8, name="embed")(inp)
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dense(5, name="dense")(x)
    x = keras.layers.BatchNormalization(name="bn")(x)
    x = keras.layers.Dense(3, name="half", dtype="float16")(x)
    return keras.Model(inp, x)


def keras_files(tap, work):
    m = keras_model()
    h5 = os.path.join(work, "model.weights.h5")
    m.save_weights(h5)
    compare(tap, "save_weights", h5, datasets(h5), 0, "model.weights.h5")
    kfile = os.path.join(work, "model.keras")
    m.save(kfile)
    with zipfile.ZipFile(kfile) as z:
        info = z.getinfo("model.weights.h5")
        stored = info.compress_type == zipfile.ZIP_STORED
        inner = os.path.join(work, "inner.weights.h5")
        with open(inner, "wb") as f:
            f.write(z.read("model.weights.h5"))
        config = json.loads(z.read("config.json"))
        with open(kfile, "rb") as f:
            f.seek(info.header_offset + 26)
            n, extra = np.frombuffer(f.read(4), "<u2")
        member_at = info.header_offset + 30 + int(n) + int(extra)
    if not stored:
        rc, _, err = ckptfs("ls", kfile)
        tap.ok(rc == 2 and "compressed" in err and "unzip" in err,
               "model.save wrote a deflated model.weights.h5: refused with the way out",
               [rc, err])
        return
    compare(tap, "model.save (.keras)", kfile, datasets(inner), member_at, "model.keras")

    def meta_checks(mnt):
        meta = json.loads(read_bytes(os.path.join(mnt, ".ckptfs", "metadata.json")))
        tap.ok(meta.get("format") == "keras" and
               meta.get("keras", {}).get("config") == config,
               ".keras: metadata.json holds the model's config.json", [meta.get("format")])
    mounted(tap, CKPTFS, kfile, ".keras metadata", meta_checks)


def h5_layouts(tap, work):
    rng = np.random.default_rng(5)
    path = os.path.join(work, "layouts.h5")
    with h5py.File(path, "w") as f:
        f.create_dataset("plain/f32", data=rng.standard_normal((7, 5)).astype(np.float32))
        f.create_dataset("chunked/gzip", data=rng.standard_normal((64, 33)).astype(np.float64),
                         chunks=(16, 8), compression="gzip")
        f.create_dataset("chunked/shuffle", data=np.arange(1000, dtype=np.int32),
                         chunks=(100,), shuffle=True, compression="gzip")
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_layout(h5py.h5d.COMPACT)  # small data kept in the object header
        space = h5py.h5s.create_simple((2, 3))
        compact = h5py.h5d.create(f.id, b"compact", h5py.h5t.STD_I16LE, space, dcpl=dcpl)
        compact.write(h5py.h5s.ALL, h5py.h5s.ALL, np.arange(6, dtype=np.int16).reshape(2, 3))
        f.create_dataset("unwritten", shape=(4, 4), dtype=np.float32, fillvalue=1.5)
        f.create_dataset("types/u8", data=np.arange(9, dtype=np.uint8))
        f.create_dataset("types/u64", data=np.array([0, 2**64 - 1], dtype=np.uint64))
        f.create_dataset("types/bool", data=np.array([True, False, True]))
        f.create_dataset("types/i64", data=np.array([-(2**63), 5], dtype=np.int64))
        f.create_dataset("types/f16", data=rng.standard_normal(5).astype(np.float16))
        f.create_dataset("scalar", data=np.float32(2.5))
    want = datasets(path)
    compare(tap, "h5py layouts", path, want, 0, "layouts.h5")


def hostile(tap, work):
    problems = []
    bad = os.path.join(work, "bigendian.h5")
    with h5py.File(bad, "w") as f:
        f.create_dataset("w", data=np.arange(4, dtype=">f4"))
    strings = os.path.join(work, "strings.h5")
    with h5py.File(strings, "w") as f:
        f.create_dataset("s", data=np.array([b"abc", b"de"]))
    broken = os.path.join(work, "broken.h5")
    data = open(bad, "rb").read()
    with open(broken, "wb") as f:
        f.write(data[:8] + b"\xff" * 64 + data[72:])
    deflated = os.path.join(work, "deflated.keras")
    with zipfile.ZipFile(deflated, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("metadata.json", "{}")
        z.writestr("config.json", "{}")
        z.write(bad, "model.weights.h5")
    for path, needle in ((bad, "datatype"), (strings, "datatype"), (broken, "libhdf5"),
                         (deflated, "compressed")):
        rc, _, err = ckptfs("ls", path)
        if rc != 2 or needle not in err or path not in err:
            problems.append("%s: rc %r, %s" % (os.path.basename(path), rc, err.strip()))
    tap.ok(not problems, "a big-endian or string dataset, a damaged superblock and a deflated "
           ".keras member are refused naming the file (exit 2)", problems)


if __name__ == "__main__":
    sys.exit(run_cases("ckptfs-keras-", keras_files, h5_layouts, hostile))
