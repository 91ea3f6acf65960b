#!/usr/bin/python3
"""ckptfs diff A B: pairs of checkpoints written here with known differences (one changed
element, a transposed tensor, a renamed tensor, a dtype change, NaN in one or both, noise on
every element, added and removed tensors, a packed dtype), checked against numpy; renames by
--map (a file, and the Meta <-> Hugging Face Llama names); two formats of one checkpoint (an HF
directory and the GGUF written from it by ckptfs convert); the fast path (the same file: not
read); exit statuses 0/1/2 as diff(1); the --plot SVG.
"""
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from mount_checks import check_help, run  # noqa: E402

TIMEOUT = 120
np.seterr(all="ignore")


def ck(ckptfs, *args):
    p = subprocess.run([ckptfs] + [str(a) for a in args], capture_output=True, timeout=TIMEOUT)
    return p.returncode, p.stdout, p.stderr


def bf16(x):
    """float32 -> bfloat16 bits, round to nearest even."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def write_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def f32(a):
    a = np.asarray(a, np.float32)
    return ("F32", a.shape, a.tobytes())


def result(out):
    doc = json.loads(out)
    return doc, {t["name"]: t for t in doc["tensors"]}


def close(a, b, rel=1e-12):
    return a is not None and b is not None and abs(a - b) <= rel * max(abs(b), 1e-300)


def main(tap, ckptfs, fixtures):
    rng = np.random.default_rng(27)
    tmp = tempfile.mkdtemp(prefix="ckptfs-t27.")
    w = rng.standard_normal((8, 16)).astype(np.float32)
    w2 = w.copy()
    w2[3, 5] += np.float32(0.25)
    t = rng.standard_normal((3, 4)).astype(np.float32)
    noise_a = rng.standard_normal(10000).astype(np.float32)
    noise_b = (noise_a + rng.standard_normal(10000).astype(np.float32) * np.float32(1e-3)
               ).astype(np.float32)
    exact = (rng.integers(-64, 64, 64) / 8).astype(np.float32)  # exact in bfloat16
    nan_a = np.array([1, np.nan, 3, np.nan, np.inf], np.float32)
    nan_b = np.array([1, np.nan, 3, 4, np.inf], np.float32)
    a = {"w": f32(w), "t": f32(t), "noise": f32(noise_a), "r": f32(exact), "d": f32(exact),
         "nan": f32(nan_a), "only_a": f32([1]), "same": f32(t),
         "f4": ("F4", [8], bytes([0x12, 0x34, 0x56, 0x78]))}
    b = {"w": f32(w2), "t": f32(t.T.copy()), "noise": f32(noise_b), "r2": f32(exact),
         "d": ("BF16", [64], bf16(exact).tobytes()), "nan": f32(nan_b), "only_b": f32([2]),
         "same": f32(t), "f4": ("F4", [8], bytes([0x12, 0x34, 0x57, 0x78]))}
    pa, pb = os.path.join(tmp, "a.safetensors"), os.path.join(tmp, "b.safetensors")
    write_safetensors(pa, a)
    write_safetensors(pb, b)

    rc, out, err = ck(ckptfs, "diff", "--json", pa, pb)
    tap.ok(rc == 1, "A and B differ: exit 1", [rc, err])
    doc, by = result(out)
    tap.ok(doc["equal"] is False and doc["removed"] == ["only_a", "r"] and
           doc["added"] == ["only_b", "r2"], "removed only_a, r; added only_b, r2",
           [doc["removed"], doc["added"]])
    x = by["w"]
    tap.ok(x["status"] == "differs" and x["beyond"] == 1 and x["max_abs"] == 0.25 and
           close(x["max_rel"], 0.25 / abs(float(w2[3, 5]))) and
           close(x["rms"], math.sqrt(0.25 ** 2 / 128)) and x["count"] == 128,
           "one changed element: beyond 1, max abs 0.25, rms 0.25/sqrt(128)", [x])
    x = by["t"]
    tap.ok(x["status"] == "shape" and x["shape_a"] == [3, 4] and x["shape_b"] == [4, 3],
           "transposed: a shape change [3,4] -> [4,3]", [x])
    x = by["noise"]
    da, db = noise_a.astype(np.float64), noise_b.astype(np.float64)
    d = da - db
    want = {"max_abs": np.abs(d).max(), "max_rel": (np.abs(d) / np.abs(db)).max(),
            "rms": math.sqrt(math.fsum(d * d) / d.size),
            "cosine": math.fsum(da * db) / math.sqrt(math.fsum(da * da) * math.fsum(db * db))}
    bad = ["%s: got %r want %r" % (k, x.get(k), v) for k, v in want.items()
           if not close(x.get(k), float(v))]
    tap.ok(not bad and x["beyond"] == int((np.abs(d) > 0).sum()),
           "noise on every element: max abs/rel, RMS, cosine = numpy/fsum", bad)
    atol = float(np.abs(d).max()) * 0.5
    beyond = int((np.abs(d) > atol + 1e-3 * np.abs(db)).sum())
    rc, out, err = ck(ckptfs, "diff", "--json", "--atol", repr(atol), "--rtol", "1e-3", pa, pb)
    tap.ok(result(out)[1]["noise"]["beyond"] == beyond,
           "--atol/--rtol: beyond counts |a-b| > atol + rtol*|b| (%d)" % beyond)
    x = by["d"]
    tap.ok(x["status"] == "dtype" and x["dtype_a"] == "F32" and x["dtype_b"] == "BF16" and
           x["beyond"] == 0 and x["max_abs"] == 0, "F32 -> BF16 of exact values: a dtype change",
           [x])
    x = by["nan"]
    tap.ok(x["status"] == "differs" and x["beyond"] == 1 and x["nonfinite_mismatch"] == 1 and
           x["max_abs"] == 0, "NaN vs NaN and Inf vs Inf agree, NaN vs 4 does not", [x])
    x = by["same"]
    tap.ok(x["status"] == "same" and x["bytes_identical"] and not x["not_read"],
           "equal tensors of two files: identical bytes (read)", [x])
    x = by["f4"]
    tap.ok(x["status"] == "differs" and x["bytes_only"] and x["beyond"] == 1,
           "F4 (values not decoded): compared byte by byte, 1 byte differs", [x])

    # Text form: a line per tensor and the totals.
    rc, out, err = ck(ckptfs, "diff", pa, pb)
    text = out.decode()
    tap.ok(rc == 1 and "differs  w: max abs 0.25" in text and "shape    t: shape [3,4] -> [4,3]"
           in text and "removed  only_a: only in A" in text and "added    only_b: only in B" in
           text and "7 compared" in text.splitlines()[-1], "text lines and totals", [text])
    rc, out, _ = ck(ckptfs, "diff", "-q", pa, pb)
    tap.ok(rc == 1 and "same     same" not in out.decode(), "-q leaves out equal tensors")

    # --map: r is r2; --ignore-dtype: d is judged by its values.
    mp = os.path.join(tmp, "map.txt")
    with open(mp, "w") as f:
        f.write("# renames\nr r2\n")
    rc, out, err = ck(ckptfs, "diff", "--json", "--map", mp, "--ignore-dtype", pa, pb)
    doc, by = result(out)
    tap.ok("r" not in doc["removed"] and by["r"]["b_name"] == "r2" and
           by["r"]["status"] == "same" and by["d"]["status"] == "close",
           "--map renames r to r2; --ignore-dtype makes d close", [by.get("r"), by.get("d")])

    with open(mp, "w") as f:
        f.write("layers.* model.layers.*.*\n")
    rc, _, err = ck(ckptfs, "diff", "--map", mp, pa, pb)
    tap.ok(rc == 2 and b"same number of *" in err, "--map with unequal stars: exit 2", [rc, err])

    # Meta and Hugging Face Llama names.
    meta, hf = {}, {}
    hf_names = {"tok_embeddings.weight": "model.embed_tokens.weight", "norm.weight":
                "model.norm.weight", "output.weight": "lm_head.weight"}
    for i in range(2):
        for m, h in (("attention.wq", "self_attn.q_proj"), ("attention.wo", "self_attn.o_proj"),
                     ("feed_forward.w1", "mlp.gate_proj"), ("feed_forward.w2", "mlp.down_proj"),
                     ("attention_norm", "input_layernorm"),
                     ("ffn_norm", "post_attention_layernorm")):
            hf_names["layers.%d.%s.weight" % (i, m)] = "model.layers.%d.%s.weight" % (i, h)
    for m, h in hf_names.items():
        v = f32(rng.standard_normal(6))
        meta[m], hf[h] = v, v
    pm, ph = os.path.join(tmp, "meta.safetensors"), os.path.join(tmp, "hf.safetensors")
    write_safetensors(pm, meta)
    write_safetensors(ph, hf)
    rc, out, err = ck(ckptfs, "diff", "--map", "meta-to-hf", pm, ph)
    rc2, out2, err2 = ck(ckptfs, "diff", "--map", "hf-to-meta", ph, pm)
    tap.ok(rc == 0 and rc2 == 0 and "%d compared: %d same" % (len(meta), len(meta)) in out.decode()
           and "0 removed, 0 added" in out2.decode(),
           "--map meta-to-hf and hf-to-meta match all %d Llama tensors" % len(meta),
           [rc, err, out[-300:], rc2, err2])
    rc, out, _ = ck(ckptfs, "diff", pm, ph)
    tap.ok(rc == 1, "without --map the Llama names differ: exit 1")

    # One checkpoint in two formats: an HF directory and the GGUF written from it.
    hfdir = os.path.join(tmp, "hfdir")
    os.mkdir(hfdir)
    shutil.copy(ph, os.path.join(hfdir, "model.safetensors"))
    gg = os.path.join(tmp, "model.gguf")
    rc, _, err = ck(ckptfs, "convert", hfdir, gg)
    rc2, out, err2 = ck(ckptfs, "diff", hfdir, gg)
    tap.ok(rc == 0 and rc2 == 0 and "0 differ" in out.decode(),
           "an HF directory and the GGUF converted from it: equal, exit 0", [err, err2, out[-300:]])

    # A DCP checkpoint (tensors split over 4 ranks) and the safetensors file written from it.
    dcp = os.path.join(fixtures, "dcphf", "dim1x4")
    conv = os.path.join(tmp, "dcp.safetensors")
    rc, _, err = ck(ckptfs, "convert", dcp, conv)
    rc2, out, err2 = ck(ckptfs, "diff", "--json", dcp, conv)
    try:
        doc = json.loads(out)
        ok = rc == 0 and rc2 == 0 and doc["equal"] and len(doc["tensors"]) >= 5 and all(
            t["status"] == "same" and not t["not_read"] for t in doc["tensors"])
    except ValueError:
        ok = False
    tap.ok(ok, "a DCP folder split over ranks and the safetensors converted from it: same",
           [rc, err, rc2, err2, out[-300:]])

    # The fast path: the same file is not read.
    rc, out, err = ck(ckptfs, "diff", "--json", pa, pa)
    doc, by = result(out)
    tap.ok(rc == 0 and doc["equal"] and all(t["not_read"] for t in doc["tensors"]),
           "a checkpoint and itself: equal, every tensor not read", [rc, err])

    # Trouble: exit 2.
    rc, _, err = ck(ckptfs, "diff", pa, os.path.join(tmp, "missing"))
    tap.ok(rc == 2, "a missing B: exit 2", [rc, err])
    rc, _, err = ck(ckptfs, "diff", "--atol", "-1", pa, pb)
    tap.ok(rc == 2, "a negative --atol: exit 2", [rc, err])
    rc, _, err = ck(ckptfs, "diff", pa)
    tap.ok(rc == 2, "one operand: exit 2", [rc, err])

    # --plot: relative change per layer of each family.
    la, lb = {}, {}
    for i in range(6):
        v = rng.standard_normal(32).astype(np.float32)
        la["blk.%d.attn_q.weight" % i] = f32(v)
        lb["blk.%d.attn_q.weight" % i] = f32(v * np.float32(1 + 0.01 * i))
    pla, plb = os.path.join(tmp, "la.safetensors"), os.path.join(tmp, "lb.safetensors")
    write_safetensors(pla, la)
    write_safetensors(plb, lb)
    svg = os.path.join(tmp, "diff.svg")
    rc, _, err = ck(ckptfs, "diff", "--plot", svg, pla, plb)
    try:
        root = ET.parse(svg).getroot()
        ns = "{http://www.w3.org/2000/svg}"
        texts = ["".join(e.itertext()) for e in root.iter(ns + "text")]
        pts = [e.get("points") for e in root.iter(ns + "polyline")]
        ok = rc == 1 and "blk.*.attn_q.weight" in texts and len(pts) == 1 and \
            len(pts[0].split()) == 6  # a zero change (layer 0) keeps the axis linear
        ys = [float(p.split(",")[1]) for p in pts[0].split()]
        ok = ok and all(ys[k] > ys[k + 1] for k in range(len(ys) - 1))  # rising change
    except (ET.ParseError, OSError, IndexError, ValueError) as e:
        ok, texts = False, [str(e)]
    tap.ok(ok, "--plot: one panel, the relative change rising with the layer", [rc, err, texts[:8]])

    check_help(tap, ckptfs, "diff")
    shutil.rmtree(tmp, ignore_errors=True)

if __name__ == "__main__":
    sys.exit(run(main))
