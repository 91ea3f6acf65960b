#!/usr/bin/python3
"""ckptfs(1)'s STAGING examples are run as written (issue 28 item 9): both command sequences
of the section's "Examples:" block, with /mnt/ro and /mnt/stage pointed at scratch mount
points and the files at ones made here; every command must exit 0, and the outputs hold what
the commands say: small.safetensors the model's tensors and extra.bias (zeros), new.gguf the
source's tensors without output.weight and with token_embd renamed (read back by the test's
own safetensors parser and the independent GGUF reader).
"""
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
sys.path.insert(0, os.path.join(HERE, "..", "lib", "readers"))
from ckptfs_test import is_mounted, unmount  # noqa: E402
from mount_checks import run  # noqa: E402
from staging import write_st  # noqa: E402
import gguf_reader  # noqa: E402


def sequences(page):
    text = open(page).read()
    sec = text.split("\n.SH STAGING\n", 1)[1].split("\n.SH ", 1)[0]
    block = re.split(r"Examples[^\n]*:\n\.PP\n\.nf\n", sec, maxsplit=1)[1].split("\n.fi", 1)[0]
    out = []
    for part in block.split("\n.PP\n"):
        lines = [l.replace("\\-", "-").replace("\\(aq", "'") for l in part.splitlines()]
        out.append([re.sub(r"\s+#.*$", "", l) for l in lines if l.strip()])
    return out


def st_names(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
    return sorted(k for k in h if k != "__metadata__"), h


def body(tap, ckptfs, _root):
    work = tempfile.mkdtemp(prefix="ckptfs-t95.")
    ro, stage = os.path.join(work, "ro"), os.path.join(work, "stage")
    for d in (ro, stage):
        os.mkdir(d)
    write_st(os.path.join(work, "model.safetensors"), {
        "model.embed.weight": ("F32", [4, 2], bytes(32)),
        "model.norm.weight": ("F32", [2], bytes(8))})
    write_st(os.path.join(work, "src.safetensors"), {
        "token_embd.weight": ("F32", [4, 2], bytes(range(32))),
        "output.weight": ("F32", [4, 2], bytes(32)),
        "output_norm.weight": ("F32", [2], bytes(8))})
    env = dict(os.environ, PATH=os.path.dirname(ckptfs) + ":/usr/bin:" + os.environ.get("PATH", ""))
    subprocess.run([ckptfs, "convert", "src.safetensors", "model.gguf"], cwd=work, env=env,
                   capture_output=True, timeout=60)
    try:
        seqs = sequences(os.path.join(HERE, "..", "..", "man", "ckptfs.1"))
        tap.ok(len(seqs) == 2, "STAGING examples: %d sequences" % len(seqs), [seqs])
        for seq in seqs:
            for line in seq:
                cmd = line.replace("/mnt/ro", ro).replace("/mnt/stage", stage)
                p = subprocess.run(["bash", "-c", cmd], capture_output=True, env=env, cwd=work,
                                   timeout=120)
                tap.ok(p.returncode == 0, "ckptfs(1) STAGING: %s" % line[:70],
                       ["exit %d" % p.returncode, p.stderr.decode(errors="replace")[-300:]])
            os.makedirs(stage, exist_ok=True)  # a stage's unmount may take the mount point away
        names, h = st_names(os.path.join(work, "small.safetensors"))
        tap.ok(names == ["extra.bias", "model.embed.weight", "model.norm.weight"] and
               h["extra.bias"]["dtype"] == "F64",
               "small.safetensors: the model's tensors and extra.bias", [names])
        g = gguf_reader.read(os.path.join(work, "new.gguf"))
        got = sorted(t.name for t in g.tensors)
        tap.ok(got == ["output_norm.weight", "tok_embeddings.weight"],
               "new.gguf: output.weight removed, token_embd renamed tok_embeddings", [got])
    finally:
        for d in (ro, stage):
            if is_mounted(d):
                unmount(d)
        shutil.rmtree(work, ignore_errors=True)


sys.exit(run(body))
