#!/usr/bin/python3
"""Meta model-parallel checkpoints (consolidated.NN.pth + params.json): consolidated on read, and
the HF view that convert_llama_weights_to_hf.py would write.

Fixtures: tests/fixtures/meta_mp (committed; tests/gen/meta_mp_fixtures.py writes them with
torch 1.13, rank files split as fairscale's layers split, and computes with torch what must be
seen: the full tensors, and the conversion script's output including its rotary permute of
q/k rows). Per case: every Meta tensor's bytes and sidecar at the root (including the split dim
the sidecar names); .ckptfs/hf/model.safetensors read with a strict safetensors reader holds
exactly the script's tensors with its bytes; .ckptfs/hf/config.json carries the values the
script gives LlamaConfig. Hostile: a rank file missing in the middle or at the end, a rank with
a slice of another shape, a replicated norm that differs: each refused naming the file.
"""
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from ckptfs_test import run_capture  # noqa: E402
from mount_checks import (bytes_problems, check_hf_view, mounted, read_json,  # noqa: E402
                          sidecar_path, start, finish)

COMMITTED = os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "fixtures",
                         "meta_mp")


def check_case(tap, ckptfs, name, case):
    src = os.path.join(COMMITTED, name)

    def checks(mnt):
        problems = []
        for tname, t in sorted(case["meta"].items()):
            raw = os.path.join(mnt, tname.replace(".", "/"))
            p, _ = bytes_problems(raw, t["nbytes"], t["sha256"])
            problems += ["%s: %s" % (tname, x) for x in p]
            try:
                sc = read_json(sidecar_path(raw))
                if sc["name"] != tname or sc["dtype"] != t["dtype"] or sc["shape"] != t["shape"]:
                    problems.append("%s: sidecar says %s %s %r" % (tname, sc["name"], sc["dtype"],
                                                                   sc["shape"]))
                if case["mp"] > 1 and "model_parallel" not in sc:
                    problems.append("%s: sidecar has no model_parallel" % tname)
            except (OSError, ValueError, KeyError) as e:
                problems.append("%s: sidecar: %s" % (tname, e))
        tap.ok(not problems, "%s: %d Meta tensors consolidated over %d rank(s): bytes, sidecars"
               % (name, len(case["meta"]), case["mp"]), problems)
        summary = read_json(os.path.join(mnt, ".ckptfs", "summary.json"))
        tap.ok(summary.get("format") == "meta-mp" and summary.get("tensor_count") == len(case["meta"]),
               "%s: summary.json: format meta-mp, %d tensors" % (name, len(case["meta"])),
               ["summary: %r" % {k: summary.get(k) for k in ("format", "tensor_count")}])
        check_hf_view(tap, name, mnt, case["hf"],
                      "HF view = convert_llama_weights_to_hf.py's tensors (q/k permuted), bytes")
        problems = []
        try:
            cfg = read_json(os.path.join(mnt, ".ckptfs", "hf", "config.json"))
            for k, v in case["config"].items():
                if cfg.get(k) != v:
                    problems.append("%s: %r, want %r" % (k, cfg.get(k), v))
        except (OSError, ValueError) as e:
            problems.append(str(e))
        tap.ok(not problems, "%s: HF view config.json from params.json and the tensors" % name,
               problems)

    mounted(tap, ckptfs, src, name, checks)


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
        last = os.path.join(tmp, "last")
        shutil.copytree(os.path.join(COMMITTED, "llama2_mp2"), last)
        os.unlink(os.path.join(last, "consolidated.01.pth"))
        refused(tap, ckptfs, last, ["consolidated.00.pth", "params.json", "rank file missing"],
                "last rank missing: the shapes do not fit params.json, refused naming the file")
    finally:
        shutil.rmtree(tmp)
    return finish(tap)


if __name__ == "__main__":
    sys.exit(main())
