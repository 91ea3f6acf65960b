"""ONNX models as trees (run by 970-onnx.t with the client venv's python, which has onnx).

Environment: CKPTFS (the ckptfs binary), FIXTURES (required by the harness, unused).

- A model whose initializers onnx's numpy_helper.from_array stores as raw_data (every dtype
  ckptfs and ONNX share, a 0-d and an empty tensor): every raw file of the mount equals
  numpy_helper.to_array of the initializer onnx.load returns, and sits in place (the sidecar's
  source is the .onnx file at the raw_data offset);
- initializers in typed fields (helper.make_tensor(raw=False): float_data, int32_data for
  int8/int16/uint8/bool/float16, int64_data with negative values, uint64_data, double_data):
  converted, equal to to_array;
- external data written by onnx.save_model (all tensors in one file, and one file per
  tensor): read in place from those files, equal to onnx.load's;
- hostile models: a location outside the model's folder, absolute or '..'; raw_data whose
  length disagrees with dims; a varint of 11 bytes; a length past the end; a truncated file;
  a negative dim; two graphs: each refused with a message naming the file and a byte offset.
"""

import json
import os
import subprocess
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from ckptfs_test import run_cases  # noqa: E402
from mount_checks import mounted, read_bytes, sidecar_path  # noqa: E402

CKPTFS = os.environ.get("CKPTFS")


def ckptfs(*args):
    p = subprocess.run([CKPTFS] + list(args), capture_output=True, timeout=120)
    return p.returncode, p.stdout, p.stderr.decode(errors="replace")


def model_of(inits, name="g"):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])
    node = helper.make_node("MatMul", ["x", "fc.weight"], ["y"])
    g = helper.make_graph([node], name, [x], [y], initializer=inits)
    return helper.make_model(g, producer_name="ckptfs-test", opset_imports=[
        helper.make_opsetid("", 17)])


def raw_arrays():
    rng = np.random.default_rng(97)
    a = {"fc.weight": rng.standard_normal((4, 3)).astype(np.float32)}
    for dt in (np.float16, np.float64, np.int8, np.int16, np.int32, np.int64, np.uint8,
               np.uint16, np.uint32, np.uint64, np.bool_):
        name = "layer." + np.dtype(dt).name
        if dt == np.bool_:
            a[name] = rng.integers(0, 2, (2, 3)).astype(bool)
        elif np.dtype(dt).kind == "f":
            a[name] = rng.standard_normal((3, 2)).astype(dt)
        else:
            info = np.iinfo(dt)
            a[name] = rng.integers(info.min, info.max, (5,), dtype=dt, endpoint=True)
    a["scalar"] = np.array(2.5, dtype=np.float32)
    a["empty"] = np.zeros((0, 3), dtype=np.float32)
    return a


def expect_tree(tap, label, src, inits, in_place=None):
    """Every initializer's raw file equals to_array; in_place(name) -> (file, offset) or None."""
    def checks(mnt):
        problems = []
        for t in inits:
            ref = np.ascontiguousarray(numpy_helper.to_array(t)).tobytes()
            path = t.name.replace(".", "/")
            try:
                data = read_bytes(os.path.join(mnt, path))
                sc = json.loads(read_bytes(os.path.join(mnt, sidecar_path(path))))
            except (OSError, ValueError) as e:
                problems.append("%s: %s" % (t.name, e))
                continue
            if data != ref:
                problems.append("%s: %d bytes, to_array has %d, differ" % (t.name, len(data),
                                                                           len(ref)))
            if sc.get("shape") != list(t.dims) or sc.get("name") != t.name:
                problems.append("%s: sidecar %r" % (t.name, sc))
            want = in_place(t) if in_place else None
            if want:
                s = sc.get("sources") or [{}]
                if (s[0].get("file"), s[0].get("offset")) != want:
                    problems.append("%s: source %r, want %r" % (t.name, s, want))
        tap.ok(not problems, "%s: every initializer equals onnx's to_array (%d)" %
               (label, len(inits)), problems)
        meta = json.loads(read_bytes(os.path.join(mnt, ".ckptfs", "metadata.json")))
        doc = meta.get("onnx", {})
        tap.ok(meta.get("format") == "onnx" and doc.get("producer_name") == "ckptfs-test" and
               doc.get("opset_import") == [{"domain": "", "version": 17}],
               "%s: metadata.json has the model's producer and opsets" % label, [meta])
    mounted(tap, CKPTFS, src, label, checks)


def raw(tap, work):
    arrays = raw_arrays()
    inits = [numpy_helper.from_array(v, k) for k, v in arrays.items()]
    m = model_of(inits)
    src = os.path.join(work, "raw.onnx")
    onnx.save_model(m, src)
    blob = open(src, "rb").read()
    loaded = onnx.load(src)

    def in_place(t):
        at = blob.find(t.raw_data) if t.raw_data else -1
        return ("raw.onnx", at) if at >= 0 and blob.count(t.raw_data) == 1 else None
    expect_tree(tap, "raw_data", src, list(loaded.graph.initializer), in_place)
    rc, out, err = ckptfs("cat", src, "layer.int64")
    tap.ok(rc == 0 and out == arrays["layer.int64"].tobytes(), "ckptfs cat without FUSE",
           [rc, err])


def typed(tap, work):
    rng = np.random.default_rng(7)
    f32 = rng.standard_normal(6).astype(np.float32)
    inits = [
        helper.make_tensor("fc.weight", TensorProto.FLOAT, [4, 3],
                           rng.standard_normal(12).astype(np.float32).tolist()),
        helper.make_tensor("t.f32", TensorProto.FLOAT, [2, 3], f32.tolist()),
        helper.make_tensor("t.f64", TensorProto.DOUBLE, [3], [1.5, -2.25, 1e300]),
        helper.make_tensor("t.i8", TensorProto.INT8, [4], [-128, -1, 0, 127]),
        helper.make_tensor("t.i16", TensorProto.INT16, [2], [-32768, 32767]),
        helper.make_tensor("t.u8", TensorProto.UINT8, [3], [0, 7, 255]),
        helper.make_tensor("t.bool", TensorProto.BOOL, [3], [True, False, True]),
        helper.make_tensor("t.i32", TensorProto.INT32, [2], [-2147483648, 2147483647]),
        helper.make_tensor("t.i64", TensorProto.INT64, [3], [-(1 << 63), -5, (1 << 63) - 1]),
        helper.make_tensor("t.u64", TensorProto.UINT64, [2], [0, (1 << 64) - 1]),
        helper.make_tensor("t.u32", TensorProto.UINT32, [2], [1, (1 << 32) - 1]),
        helper.make_tensor("t.f16", TensorProto.FLOAT16, [3],
                           np.array([1.0, -0.5, 65504], dtype=np.float16).tolist()),
    ]
    assert all(not t.raw_data for t in inits)  # the typed fields are what is tested
    src = os.path.join(work, "typed.onnx")
    onnx.save_model(model_of(inits), src)
    expect_tree(tap, "typed fields", src, list(onnx.load(src).graph.initializer))


def external(tap, work):
    arrays = raw_arrays()
    for one_file in (True, False):
        d = os.path.join(work, "ext-%s" % one_file)
        os.makedirs(d)
        m = model_of([numpy_helper.from_array(v, k) for k, v in arrays.items()])
        src = os.path.join(d, "model.onnx")
        onnx.save_model(m, src, save_as_external_data=True, all_tensors_to_one_file=one_file,
                        location="weights.bin" if one_file else None, size_threshold=0)
        stored = onnx.load(src, load_external_data=False)

        def in_place(t, stored=stored):
            for s in stored.graph.initializer:
                if s.name == t.name and s.data_location == TensorProto.EXTERNAL:
                    kv = {e.key: e.value for e in s.external_data}
                    return kv["location"], int(kv.get("offset", 0))
            return None
        label = "external data, %s" % ("one file" if one_file else "a file per tensor")
        expect_tree(tap, label, src, list(onnx.load(src).graph.initializer), in_place)


def varint(v):
    out = bytearray()
    while True:
        b = v & 0x7f
        v >>= 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def field(number, wire, payload):
    key = varint(number << 3 | wire)
    if wire == 2:
        return key + varint(len(payload)) + payload
    return key + payload


def hostile(tap, work):
    good = numpy_helper.from_array(np.arange(4, dtype=np.float32), "w")
    cases = {}

    def external_at(location):
        t = TensorProto()
        t.CopyFrom(good)
        t.ClearField("raw_data")
        t.data_location = TensorProto.EXTERNAL
        for k, v in (("location", location), ("offset", "0"), ("length", "16")):
            e = t.external_data.add()
            e.key, e.value = k, v
        return model_of([t]).SerializeToString()
    with open(os.path.join(work, "secret"), "wb") as f:
        f.write(b"S" * 64)
    os.makedirs(os.path.join(work, "h"), exist_ok=True)
    cases["location-dotdot"] = (external_at("../secret"), "climbs out")
    cases["location-absolute"] = (external_at(os.path.join(work, "secret")), "absolute")
    t = TensorProto()
    t.CopyFrom(good)
    t.raw_data = t.raw_data[:12]
    cases["raw-short"] = (model_of([t]).SerializeToString(), "raw_data holds 12 bytes")
    t = TensorProto()
    t.CopyFrom(good)
    del t.dims[:]
    t.dims.extend([-1])
    cases["negative-dim"] = (model_of([t]).SerializeToString(), "overflow")
    base = model_of([good]).SerializeToString()
    cases["varint-11"] = (field(1, 0, b"\xff" * 10 + b"\x01") + base, "varint")
    cases["length-past-end"] = (base + field(6, 2, b"")[:-1] + b"\x7f", "past the end")
    cases["truncated"] = (base[:len(base) - 9], "past the end")
    cases["two-graphs"] = (base + field(7, 2, model_of([good]).graph.SerializeToString()),
                           "two graph")
    problems = []
    for label, (data, needle) in cases.items():
        path = os.path.join(work, "h", label + ".onnx")
        with open(path, "wb") as f:
            f.write(data)
        rc, _, err = ckptfs("ls", path)
        if rc != 2 or needle not in err or path not in err or "byte offset" not in err:
            problems.append("%s: rc %r, %s" % (label, rc, err.strip()))
    tap.ok(not problems, "hostile ONNX models are refused (exit 2) naming the file, the "
           "reason and a byte offset (%d cases); none reads a file outside the model's folder"
           % len(cases), problems)


if __name__ == "__main__":
    sys.exit(run_cases("ckptfs-onnx-", raw, typed, external, hostile))
