#!/usr/bin/python3
"""Who may read what: the mount and `convert` never widen access beyond the sources'.

mount  an HF directory of two shards, one 0600 and one 0644, config.json 0600 (reached through
       a symlink, as in HF caches) and tokenizer.json 0644, mounted with -o allow_other:
       a tensor file, its sidecar and .npy take the mode of the shard they come from (0400 or
       0444), the HF view's model.safetensors (bytes of both) 0400, the index and .ckptfs/*
       0400, directories 0500, config.json 0400, tokenizer.json 0444; and a process running
       as another user (uid 65534) can neither list the tree nor read the view.
pieces a tensor-parallel tensor whose second rank file is 0600 (the first 0644) is 0400, and
       so is its HF view, in a default mount and with -o as_dtype=f32.
convert the same directory converted (umask 022) to OUT/ gives shards and index 0600, config.json
       0600 (the symlink's target mode), tokenizer.json 0644, OUT/ 0700; to OUT.safetensors,
       OUT.gguf and OUT.safetensors.zst 0600; from sources all 0644 under umask 077, 0600.
"""
import errno
import json
import os
import shutil
import stat
import struct
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from ckptfs_test import run_capture  # noqa: E402
from mount_checks import mounted, run  # noqa: E402

NOBODY = 65534


def safetensors_bytes(tensors):
    header, off = {}, 0
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(t[3] for t in tensors)


def write(path, data, mode):
    with open(path, "wb") as f:
        f.write(data)
    os.chmod(path, mode)


def make_hf_dir(scratch, private_shard=True):
    src = tempfile.mkdtemp(prefix="hf.", dir=scratch)
    os.chmod(src, 0o755)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((64, 64), np.float32)
    b = rng.standard_normal((64, 64)).astype("<f2")
    shards = {"model-00001-of-00002.safetensors": [("secret", "F32", a.shape, a.tobytes())],
              "model-00002-of-00002.safetensors": [("public", "F16", b.shape, b.tobytes())]}
    for i, (name, tensors) in enumerate(sorted(shards.items())):
        write(os.path.join(src, name), safetensors_bytes(tensors),
              0o600 if i == 0 and private_shard else 0o644)
    index = {"metadata": {}, "weight_map": {t[0]: f for f, ts in shards.items() for t in ts}}
    write(os.path.join(src, "model.safetensors.index.json"), json.dumps(index).encode(), 0o644)
    target = os.path.join(scratch, "config-target.json")
    write(target, b'{"model_type": "llama"}\n', 0o600 if private_shard else 0o644)
    os.symlink(target, os.path.join(src, "config.json"))
    write(os.path.join(src, "tokenizer.json"), b'{"version": "1.0"}\n', 0o644)
    return src


def mode_of(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def as_other_user(fn_src):
    """Runs a Python snippet as uid/gid 65534; its stdout, e.g. 'EACCES'."""
    def drop():
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
    p = subprocess.run([sys.executable, "-c", fn_src], preexec_fn=drop, capture_output=True,
                       text=True, timeout=60)
    return p.stdout.strip() or p.stderr.strip()


PROBE = """
import errno, os, sys
def probe(fn):
    try:
        fn()
        return "ok"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
mnt = %r
print(probe(lambda: os.listdir(mnt)), probe(lambda: open(os.path.join(mnt, %r), "rb").read(16)))
"""


def check_modes(tap, label, want, mnt):
    bad = []
    for rel, mode in want.items():
        try:
            got = mode_of(os.path.join(mnt, rel))
        except OSError as e:
            bad.append("%s: %s" % (rel, e))
            continue
        if got != mode:
            bad.append("%s: %04o, want %04o" % (rel, got, mode))
    tap.ok(not bad, "%s: every file takes the most restrictive mode of its sources" % label, bad)


def body(tap, ckptfs, fixtures):
    scratch = tempfile.mkdtemp(prefix="ckptfs-t54.")
    os.chmod(scratch, 0o755)
    try:
        mount_case(tap, ckptfs, scratch)
        pieces_case(tap, ckptfs, fixtures, scratch)
        convert_case(tap, ckptfs, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def mount_case(tap, ckptfs, scratch):
    src = make_hf_dir(scratch)
    want = {"secret": 0o400, "secret.json": 0o400, "secret.npy": 0o400,
            "public": 0o444, "public.json": 0o444, "public.npy": 0o444,
            ".ckptfs/hf/model.safetensors": 0o400,
            ".ckptfs/summary.json": 0o400, ".ckptfs/metadata.json": 0o400,
            ".ckptfs/tensors.tsv": 0o400, ".ckptfs/hf/config.json": 0o400,
            ".ckptfs/hf/tokenizer.json": 0o444, ".ckptfs": 0o500, ".ckptfs/hf": 0o500, ".": 0o500}

    def check(mnt):
        check_modes(tap, "mount", want, mnt)
        got = as_other_user(PROBE % (mnt, ".ckptfs/hf/model.safetensors"))
        tap.ok(got == "EACCES EACCES",
               "mount: another user can neither list the tree nor read the HF view",
               ["listdir, read: %s" % got])

    mounted(tap, ckptfs, src, "mount (allow_other)", check, options=("-o", "allow_other"))

    # Everything public but config.json: the tree is open to others, config.json is not.
    src = make_hf_dir(scratch, private_shard=False)
    os.chmod(os.path.join(scratch, "config-target.json"), 0o600)

    def check_open(mnt):
        check_modes(tap, "mount, private config", {
            ".": 0o555, ".ckptfs/hf/model.safetensors": 0o444, ".ckptfs/summary.json": 0o444,
            ".ckptfs/hf/config.json": 0o400, "secret": 0o444}, mnt)
        got = as_other_user(PROBE % (mnt, ".ckptfs/hf/config.json"))
        tap.ok(got.startswith("ok ") and got.endswith("EACCES"),
               "mount, private config: another user lists the tree but cannot read config.json",
               ["listdir, read: %s" % got])

    mounted(tap, ckptfs, src, "mount, private config", check_open,
            options=("-o", "allow_other"))


def pieces_case(tap, ckptfs, fixtures, scratch):
    fixture = os.path.join(fixtures, "mlfw", "dir2", "ckpt")
    if not os.path.isdir(fixture):
        tap.skip("pieces: tensor-parallel tensor modes", "%s is missing" % fixture)
        return
    src = os.path.join(scratch, "tp")
    shutil.copytree(fixture, src)
    for name in os.listdir(src):
        os.chmod(os.path.join(src, name), 0o644)
    os.chmod(os.path.join(src, "shard_rank1.pt"), 0o600)
    want = {"model/embed_tokens/weight": 0o400, "model/embed_tokens/weight.json": 0o400,
            ".ckptfs/hf/model.safetensors": 0o400}
    for opts in ((), ("-o", "as_dtype=f32")):
        label = "pieces%s" % ("" if not opts else " " + opts[1])
        mounted(tap, ckptfs, src, label,
                lambda mnt, label=label: check_modes(tap, label, want, mnt), options=opts)


def convert(ckptfs, src, out, mask):
    def set_umask():
        os.umask(mask)
    # The folder's config.json is a stand-in, not a llama.cpp model: a GGUF is a plain container.
    extra = ["--profile", "container"] if out.endswith(".gguf") else []
    p = subprocess.run([ckptfs, "convert", src, out] + extra, preexec_fn=set_umask,
                       capture_output=True, text=True, timeout=120)
    return p.returncode, p.stderr.strip()


def convert_case(tap, ckptfs, scratch):
    src = make_hf_dir(scratch)
    out = os.path.join(scratch, "out")
    rc, err = convert(ckptfs, src, out + "/", 0o022)
    if tap.ok(rc == 0, "convert DIR OUT/", [err]):
        want = {"model-00001-of-00001.safetensors": 0o600, "config.json": 0o600,
                "tokenizer.json": 0o644, ".": 0o700}
        names = sorted(os.listdir(out))
        shards = [n for n in names if n.endswith(".safetensors")]
        want = {k: v for k, v in want.items() if not k.endswith(".safetensors")}
        want.update({n: 0o600 for n in shards + [n for n in names if n.endswith("index.json")]})
        check_modes(tap, "convert DIR OUT/", want, out)
    for name in ("one.safetensors", "one.gguf", "one.safetensors.zst"):
        path = os.path.join(scratch, name)
        rc, err = convert(ckptfs, src, path, 0o022)
        tap.ok(rc == 0 and mode_of(path) == 0o600,
               "convert DIR %s from a 0600 shard: 0600" % name,
               ["exit %d: %s" % (rc, err), "mode %04o" % mode_of(path) if rc == 0 else ""])
    public = make_hf_dir(scratch, private_shard=False)
    path = os.path.join(scratch, "masked.safetensors")
    rc, err = convert(ckptfs, public, path, 0o077)
    tap.ok(rc == 0 and mode_of(path) == 0o600, "convert: 0644 sources under umask 077: 0600",
           ["exit %d: %s" % (rc, err), "mode %04o" % mode_of(path) if rc == 0 else ""])
    path = os.path.join(scratch, "open.safetensors")
    rc, err = convert(ckptfs, public, path, 0o022)
    tap.ok(rc == 0 and mode_of(path) == 0o644, "convert: 0644 sources under umask 022: 0644",
           ["exit %d: %s" % (rc, err), "mode %04o" % mode_of(path) if rc == 0 else ""])


sys.exit(run(body))
