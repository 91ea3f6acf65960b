#!/usr/bin/python3
"""ckptfs(1)'s EXAMPLES are run as written (issue 28 item 9): the lines of the section's .nf
block, rendered from the roff source (\\- is -, \\e is \\), run in order with model.safetensors
and /mnt/m pointed at a checkpoint made here and a scratch mount point; each must exit 0, the
jq line must print the embedding's shape and the awk line the BF16 bytes, both computed here.
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
from staging import write_st  # noqa: E402


def examples(page):
    text = open(page).read()
    sec = text.split("\n.SH EXAMPLES\n", 1)[1].split("\n.SH ", 1)[0]
    block = re.search(r"^\.nf\n(.*?)^\.fi", sec, re.S | re.M).group(1)
    return [l.replace("\\-", "-").replace("\\e", "\\") for l in block.splitlines() if l.strip()]


def body(tap, ckptfs, _root):
    work = tempfile.mkdtemp(prefix="ckptfs-t94.")
    mnt = os.path.join(work, "m")
    os.mkdir(mnt)
    bf = 2 * 4 * 6
    write_st(os.path.join(work, "model.safetensors"), {
        "model.embed_tokens.weight": ("F32", [10, 4], bytes(range(160))),
        "model.norm.weight": ("BF16", [4, 6], bytes(bf)),
        "lm_head.weight": ("F32", [10, 4], bytes(range(90, 250))),
    })
    env = dict(os.environ, PATH=os.path.dirname(ckptfs) + ":/usr/bin:" + os.environ.get("PATH", ""))
    want = {1: "[10,4]", 3: str(bf)}
    try:
        lines = examples(os.path.join(HERE, "..", "..", "man", "ckptfs.1"))
        tap.ok(len(lines) == 5 and lines[0].startswith("ckptfs "), "EXAMPLES: %d lines" % len(lines),
               [lines])
        for k, line in enumerate(lines):
            cmd = line.replace("/mnt/m", mnt)
            p = subprocess.run(["bash", "-c", cmd], capture_output=True, env=env, cwd=work,
                               timeout=60)
            out = p.stdout.decode(errors="replace").strip()
            tap.ok(p.returncode == 0 and (k not in want or out == want[k]),
                   "ckptfs(1) EXAMPLES: %s" % line[:70],
                   ["exit %d" % p.returncode, "out %r, want %r" % (out, want.get(k)),
                    p.stderr.decode(errors="replace")[-300:]])
    finally:
        if is_mounted(mnt):
            unmount(mnt)
        shutil.rmtree(work, ignore_errors=True)


sys.exit(run(body))
