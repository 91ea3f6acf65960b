#!/usr/bin/python3
"""Every non-weight file of a model folder travels with it (issue 29, items 19 and 23):
- an HF folder holding, besides model.safetensors and config.json, sentencepiece.bpe.model,
  tokenizer.tiktoken, processor_config.json, LICENSE and README.md: `convert HFDIR out/`
  writes each of them byte for byte, and the mount's .ckptfs/hf/, `-o view=hf` and serve's
  repo carry them (a dot file such as .gitattributes is not a model file and stays out);
- `stage --from model.nemo` shows model_config.yaml, and the unchanged stage commits: into one
  .safetensors (the yaml named as left out, a single file has no room), and into OUT/ with
  model_config.yaml byte for byte as the archive holds it (read with Python's tarfile);
- a folder of 300 text files beside the weights carries only the usual side files (a bound:
  each is a source opened at open), with a warning.

Environment: CKPTFS, FIXTURES (layouts/tars/model.nemo).
"""

import json
import os
import shutil
import struct
import sys
import tarfile
import tempfile
import urllib.request

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from ckptfs_test import Tap, is_mounted, run_capture, unmount  # noqa: E402
from serve_util import Server  # noqa: E402

SIDE = {"config.json": b'{"model_type": "llama"}\n',
        "sentencepiece.bpe.model": bytes(range(256)) * 3,
        "tokenizer.tiktoken": b"IQ== 0\nIg== 1\n",
        "processor_config.json": b'{"processor_class": "X"}\n',
        "LICENSE": b"Apache License 2.0\n",
        "README.md": b"# a model\n"}


def write_hf(d):
    os.makedirs(d)
    t = np.arange(16, dtype="<f4")
    h = json.dumps({"w": {"dtype": "F32", "shape": [16], "data_offsets": [0, t.nbytes]}})
    h += " " * (-len(h) % 8)
    with open(os.path.join(d, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h.encode() + t.tobytes())
    for name, data in SIDE.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
    with open(os.path.join(d, ".gitattributes"), "w") as f:
        f.write("*.safetensors filter=lfs\n")


def files_in(d):
    out = {}
    for name in sorted(os.listdir(d)) if os.path.isdir(d) else []:
        p = os.path.join(d, name)
        if os.path.isfile(p):
            with open(p, "rb") as f:
                out[name] = f.read()
    return out


def carried(got):
    return [n for n, data in SIDE.items() if got.get(n) != data]


def hf_folder(tap, ckptfs, work):
    src = os.path.join(work, "hf")
    write_hf(src)
    out = os.path.join(work, "conv") + "/"
    rc, _, err = run_capture([ckptfs, "convert", src, out], 60)
    got = files_in(out)
    tap.ok(rc == 0 and not carried(got), "convert HFDIR out/: every side file byte for byte",
           [rc, err, "missing or different: %s" % carried(got)])
    tap.ok(".gitattributes" not in got, "convert: .gitattributes is not carried")
    for opts, sub, label in (((), ".ckptfs/hf", "the mount's .ckptfs/hf/"),
                             (("-o", "view=hf"), "", "-o view=hf")):
        mnt = tempfile.mkdtemp(prefix="m.", dir=work)
        rc, _, err = run_capture([ckptfs, src, mnt] + list(opts), 60)
        got = files_in(os.path.join(mnt, sub)) if rc == 0 else {}
        tap.ok(rc == 0 and not carried(got), "%s carries every side file" % label,
               [rc, err, carried(got)])
        unmount(mnt)
    with Server(ckptfs, ["hf=" + src]) as s:
        with urllib.request.urlopen(s.url + "/api/models/ckptfs/hf/tree/main", timeout=30) as r:
            listed = {e["path"] for e in json.loads(r.read())}
        bad = []
        for name, data in SIDE.items():
            try:
                with urllib.request.urlopen(s.url + "/ckptfs/hf/resolve/main/" + name,
                                            timeout=30) as r:
                    if r.read() != data:
                        bad.append(name)
            except OSError as e:
                bad.append("%s: %s" % (name, e))
        tap.ok(set(SIDE) <= listed and not bad, "serve: the repo lists and serves every side file",
               [sorted(listed), bad])


def crowded_folder(tap, ckptfs, work):
    """A folder of 300 text files beside its weights (no model's top): each side file is a
    source opened at open, so past 256 only the usual names are carried, and a warning says so."""
    src = os.path.join(work, "crowded")
    write_hf(src)
    for i in range(300):
        with open(os.path.join(src, "note%03d.txt" % i), "w") as f:
            f.write("n\n")
    out = os.path.join(work, "crowded-conv") + "/"
    rc, _, err = run_capture([ckptfs, "convert", src, out], 60)
    got = files_in(out)
    notes = [n for n in got if n.startswith("note")]
    tap.ok(rc == 0 and not notes and got.get("config.json") == SIDE["config.json"],
           "300 text files beside the weights: convert carries the usual side files only",
           [rc, err, "notes carried: %d" % len(notes), sorted(got)[:8]])
    rc, out_info, err = run_capture([ckptfs, "info", src], 60)
    tap.ok(b"side files beside the weights, over 256" in out_info + err,
           "info warns that the side files past the bound were not carried",
           [rc, (out_info + err)[-400:]])


def nemo_stage(tap, ckptfs, work, fixtures):
    nemo = os.path.join(fixtures, "layouts", "tars", "model.nemo")
    if not os.path.exists(nemo):
        tap.skip("stage --from model.nemo", "%s missing (make fixtures)" % nemo)
        return
    with tarfile.open(nemo) as tf:
        name = [m for m in tf.getnames() if m.lstrip("./") == "model_config.yaml"][0]
        yaml = tf.extractfile(name).read()
    for out_name in ("nemo.safetensors", "nemo-dir/"):
        out = os.path.join(work, out_name)
        mnt = tempfile.mkdtemp(prefix="s.", dir=work)
        rc, _, err = run_capture([ckptfs, "stage", out, mnt, "--from", nemo], 60)
        shown = os.path.exists(os.path.join(mnt, "model_config.yaml"))
        tap.ok(rc == 0 and shown, "stage %s --from model.nemo shows model_config.yaml" % out_name,
               [rc, err])
        rc, so, err = run_capture([ckptfs, "commit", mnt], 120)
        tap.ok(rc == 0, "the unchanged stage of model.nemo commits into %s" % out_name,
               [rc, so, err])
        if out_name.endswith("/"):
            tap.ok(files_in(out).get("model_config.yaml") == yaml,
                   "OUT/model_config.yaml is the archive's, byte for byte")
        else:
            said = so + err
            tap.ok(b"model_config.yaml" in said and b"not written" in said,
                   "one .safetensors: model_config.yaml named as left out", [said])
        run_capture([ckptfs, "umount", mnt], 60)
        unmount(mnt)


def main():
    ckptfs, fixtures = os.environ.get("CKPTFS", ""), os.environ.get("FIXTURES", "")
    if not os.access(ckptfs, os.X_OK) or not os.path.exists("/dev/fuse"):
        print("1..0 # SKIP CKPTFS or /dev/fuse missing")
        return 0
    tap = Tap()
    work = tempfile.mkdtemp(prefix="ckptfs-t88.")
    try:
        hf_folder(tap, ckptfs, work)
        crowded_folder(tap, ckptfs, work)
        nemo_stage(tap, ckptfs, work, fixtures)
    finally:
        for d in os.listdir(work):
            p = os.path.join(work, d)
            if os.path.isdir(p) and is_mounted(p):
                unmount(p)
        shutil.rmtree(work, ignore_errors=True)
    tap.done()
    return 0 if tap.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
