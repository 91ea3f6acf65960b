#!/usr/bin/python3
"""Meta model-parallel checkpoints (consolidated.NN.pth + params.json): consolidated on read, and
the HF view that convert_llama_weights_to_hf.py would write.

Fixtures: tests/fixtures/meta_mp (committed; tests/gen/meta_mp_fixtures.py writes them with
torch 1.13, rank files split as fairscale's layers split, and computes with torch what must be
seen: the full tensors, and the conversion script's output including its rotary permute of
q/k rows). Per case: every Meta tensor's bytes and sidecar at the root (including the split dim
the sidecar names); .ckptfs/hf/model.safetensors read with a strict safetensors reader holds
exactly the script's tensors with its bytes; .ckptfs/hf/config.json carries the values the
script gives LlamaConfig. Hostile: a rank file missing at the start, in the middle or at the end, a rank with
a slice of another shape, a replicated norm that differs: each refused naming the file.
"""
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from ckptfs_test import run_capture  # noqa: E402
from mount_checks import mounted, read_json, start, finish  # noqa: E402
import committed_checks  # noqa: E402

COMMITTED = os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "fixtures",
                         "meta_mp")


def check_case(tap, ckptfs, name, case):
    src = os.path.join(COMMITTED, name)
    mounted(tap, ckptfs, src, name, committed_checks.meta_mp_checks(tap, name, case))


def refused(tap, ckptfs, src, words, desc):
    rc, out, err = run_capture([ckptfs, "info", src], 60)
    msg = err.decode("utf-8", "replace")
    tap.ok(rc not in (0, None) and all(w in msg for w in words), desc,
           ["exit %r" % rc, "stderr: " + msg.strip(), "want words: %r" % (words,)])


def main():
    started = start()
    if not started:
        return 0
    tap, ckptfs, _ = started
    manifest = read_json(os.path.join(COMMITTED, "manifest.json"))
    for name, case in sorted(manifest["cases"].items()):
        check_case(tap, ckptfs, name, case)
    for name, h in sorted(manifest["hostile"].items()):
        refused(tap, ckptfs, os.path.join(COMMITTED, "hostile", name), h["error"],
                "hostile %s: refused naming %s" % (name, ", ".join(h["error"])))
    tmp = tempfile.mkdtemp(prefix="ckptfs-t69.")
    try:
        gap = os.path.join(tmp, "gap")
        shutil.copytree(os.path.join(COMMITTED, "llama1_mp4"), gap)
        os.unlink(os.path.join(gap, "consolidated.01.pth"))
        refused(tap, ckptfs, gap, ["consolidated.01.pth", "missing"],
                "rank 01 of 4 missing: refused naming consolidated.01.pth")
        fifo = os.path.join(tmp, "fifo")
        shutil.copytree(os.path.join(COMMITTED, "llama1_mp4"), fifo)
        os.unlink(os.path.join(fifo, "consolidated.01.pth"))
        os.mkfifo(os.path.join(fifo, "consolidated.01.pth"))
        refused(tap, ckptfs, fifo, ["consolidated.01.pth", "missing"],
                "rank 01 a FIFO: not waited on, refused as missing")
        last = os.path.join(tmp, "last")
        shutil.copytree(os.path.join(COMMITTED, "llama2_mp2"), last)
        os.unlink(os.path.join(last, "consolidated.01.pth"))
        refused(tap, ckptfs, last, ["consolidated.00.pth", "params.json", "rank file missing"],
                "last rank missing: the shapes do not fit params.json, refused naming the file")
        first = os.path.join(tmp, "first")
        shutil.copytree(os.path.join(COMMITTED, "llama2_mp2"), first)
        os.unlink(os.path.join(first, "consolidated.00.pth"))
        refused(tap, ckptfs, first, ["consolidated.00.pth", "missing"],
                "rank 00 missing (only .01 and params.json): refused, not mounted as rank 1's "
                "half-width slices")
        # The rank limit at its bound and one past (issue 29: a mutant of it survived): rank
        # 1023 is a rank (refused for the ranks missing before it), rank 1024 is over the limit.
        for rank, needle, desc in (
                (1024, ["consolidated.1024.pth", "more than 1024 ranks"], "over the rank limit"),
                (1023, ["consolidated.02.pth", "missing", "consolidated.1023.pth"],
                 "the last rank the limit allows, so the gap before it is what is refused")):
            d = os.path.join(tmp, "rank%d" % rank)
            shutil.copytree(os.path.join(COMMITTED, "llama2_mp2"), d)
            shutil.copyfile(os.path.join(d, "consolidated.01.pth"),
                            os.path.join(d, "consolidated.%02d.pth" % rank))
            refused(tap, ckptfs, d, needle, "rank %d: %s" % (rank, desc))
    finally:
        shutil.rmtree(tmp)
    return finish(tap)


if __name__ == "__main__":
    sys.exit(main())
