#!/usr/bin/python3
"""The README's first example is run as written (issue 28 item 9): a Llama-3-8B-shaped BF16
checkpoint is made here (sparse: only the headers and model.norm.weight hold bytes), the
commands of the README's first code block run with ./Llama-3-8B and /mnt/llama pointed at it
and at a scratch mount point, and each command's output must be the one the README shows
(compared word by word: ls prints columns on a terminal, one name a line into a pipe).
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
from ckptfs_test import is_mounted, unmount  # noqa: E402
from mount_checks import run  # noqa: E402

NORM = [1.0, 0.5, -2.0, 0.0625]  # exact in BF16


def bf16(x):
    return struct.unpack("<I", struct.pack("<f", x))[0] >> 16


def llama3_8b(d):
    """The tensors the example touches, with Llama-3-8B's shapes, as one sparse shard."""
    os.makedirs(d)
    shapes = {"model.layers.0.self_attn.q_proj.weight": [4096, 4096],
              "model.layers.0.self_attn.k_proj.weight": [1024, 4096],
              "model.layers.0.self_attn.v_proj.weight": [1024, 4096],
              "model.layers.0.self_attn.o_proj.weight": [4096, 4096],
              "model.norm.weight": [4096]}
    header, at = {}, 0
    for name, shape in shapes.items():
        n = 2 * shape[0] * (shape[1] if len(shape) > 1 else 1)
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [at, at + n]}
        at += n
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path = os.path.join(d, "model.safetensors")
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        f.truncate(8 + len(text) + at)
        f.seek(8 + len(text) + header["model.norm.weight"]["data_offsets"][0])
        f.write(struct.pack("<4H", *(bf16(x) for x in NORM)))
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"model_type": "llama", "torch_dtype": "bfloat16"}, f)


def first_block(readme):
    """[(command, expected output lines)] of the first ``` block."""
    text = open(readme).read()
    block = re.search(r"^```\n(.*?)^```", text, re.S | re.M).group(1)
    steps = []
    for line in block.splitlines():
        if line.startswith("$ "):
            steps.append([line[2:], []])
        elif steps and not steps[-1][1] and steps[-1][0].count("'") % 2:
            steps[-1][0] += "\n" + line  # a quoted command goes on
        elif steps:
            steps[-1][1].append(line)
    return steps


def body(tap, ckptfs, _root):
    work = tempfile.mkdtemp(prefix="ckptfs-t92.")
    src, mnt = os.path.join(work, "Llama-3-8B"), os.path.join(work, "mnt", "llama")
    os.makedirs(mnt)
    llama3_8b(src)
    # the python3 with numpy (Debian's) ahead of any other on PATH
    env = dict(os.environ, PATH=os.path.dirname(ckptfs) + ":/usr/bin:" + os.environ.get("PATH", ""))
    try:
        steps = first_block(os.path.join(HERE, "..", "..", "README.md"))
        tap.ok(len(steps) >= 5 and steps[0][0].startswith("ckptfs "),
               "the README's first block: %d commands" % len(steps), [steps])
        for cmd, want in steps:
            shown = cmd.replace("./Llama-3-8B", src).replace("/mnt/llama", mnt)
            shown = re.sub(r"\s+#[^'\n]*$", "", shown)  # a trailing comment
            p = subprocess.run(["bash", "-c", shown], capture_output=True, env=env, timeout=120,
                               cwd=work)
            got = p.stdout.decode(errors="replace").split()
            expect = " ".join(want).split()
            tap.ok(p.returncode == 0 and got == expect, "README: $ %s" % cmd.splitlines()[0][:70],
                   ["exit %d" % p.returncode, "got: %r" % got, "README: %r" % expect,
                    p.stderr.decode(errors="replace")[-300:]])
    finally:
        if is_mounted(mnt):
            unmount(mnt)
        shutil.rmtree(work, ignore_errors=True)


sys.exit(run(body))
