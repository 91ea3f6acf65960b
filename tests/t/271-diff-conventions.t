#!/usr/bin/python3
"""ckptfs diff across conventions (issue 30 item 3; fs/cli/cli_diff.c).

- Meta MP shards of the tiny Llama (tests/lib/llama_layouts.py: Meta's names and interleaved
  q/k rows, written with torch) against the HF folder they come from: --map meta-to-hf and
  (swapped) --map hf-to-meta report every tensor "same", wq/wk included (the Meta side is read
  through its HF view, which undoes the rotary permutation); a Meta checkpoint of other weights
  still differs.
- The HF folder against the GGUF convert wrote (F32, F16, Q8_0, Q4_0): --map hf-to-gguf
  matches llama.cpp's names, q/k rows and ggml's reversed dims: F32 is "same", F16 and Q8_0
  are "close" within their types' bounds (exit 0), Q4_0 is judged by --atol/--rtol, and the
  GGUF of other weights differs (exit 1).
"""
import json
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
from ckptfs_test import Tap, run_capture, skip_reason  # noqa: E402
import llama_layouts as Y  # noqa: E402
import llama_ref as L  # noqa: E402

CKPTFS = os.environ.get("CKPTFS")
FIXTURES = os.environ.get("FIXTURES")


def diff(a, b, *extra):
    rc, out, err = run_capture([CKPTFS, "diff", a, b, "--json"] + list(extra), 120)
    try:
        d = json.loads(out)
    except ValueError:
        d = None
    return rc, d, err


def verdicts(d):
    out = {}
    for t in (d or {}).get("tensors", []):
        out[t["status"]] = out.get(t["status"], 0) + 1
    return out


def main():
    why = skip_reason(CKPTFS, FIXTURES)
    if why:
        print("1..0 # SKIP %s" % why)
        return 0
    tap = Tap()
    work = tempfile.mkdtemp(prefix="ckptfs-diff-conv-")
    try:
        hf = os.path.join(work, "hf")
        w = L.make_folder(hf)
        n = len(w)
        meta, why = Y.meta_mp(os.path.join(work, "meta"), w)
        other, _ = Y.meta_mp(os.path.join(work, "meta-other"), L.weights(seed=99))
        if tap.ok(meta is not None and other is not None, "torch wrote Meta MP shards", [why]):
            rc, d, err = diff(meta, hf, "--map", "meta-to-hf")
            tap.ok(rc == 0 and verdicts(d) == {"same": n} and not d["removed"] and
                   not d["added"],
                   "meta-to-hf: all %d tensors same, wq/wk included" % n, [err, verdicts(d)])
            rc, d, err = diff(hf, meta, "--map", "hf-to-meta")
            tap.ok(rc == 0 and verdicts(d) == {"same": n}, "hf-to-meta: the same, swapped",
                   [err, verdicts(d)])
            rc, d, err = diff(other, hf, "--map", "meta-to-hf")
            tap.ok(rc == 1 and verdicts(d).get("differs") == n,
                   "meta-to-hf: other weights differ, every tensor", [err, verdicts(d)])
        ggufs = {}
        for t in ("f32", "f16", "q8_0", "q4_0"):
            ggufs[t] = os.path.join(work, "%s.gguf" % t)
            rc, _, err = run_capture([CKPTFS, "convert", hf, ggufs[t], "--dtype", t], 120)
            tap.ok(rc == 0, "convert --dtype %s" % t, [err])
        rc, d, err = diff(hf, ggufs["f32"], "--map", "hf-to-gguf")
        tap.ok(rc == 0 and verdicts(d) == {"same": n} and not d["removed"] and not d["added"],
               "hf-to-gguf F32: all %d same (names, q/k rows, dims)" % n, [err, verdicts(d)])
        for t in ("f16", "q8_0"):
            rc, d, err = diff(hf, ggufs[t], "--map", "hf-to-gguf")
            v = verdicts(d)
            tap.ok(rc == 0 and v.get("close") == 16 and v.get("same") == 5,
                   "hf-to-gguf %s: 16 matrices close within the type's bound, 5 norms same" % t,
                   [err, v])
        rc, d, err = diff(hf, ggufs["q4_0"], "--map", "hf-to-gguf")
        tap.ok(rc == 1 and verdicts(d).get("differs") == 16,
               "hf-to-gguf Q4_0 without a tolerance: its matrices differ", [err, verdicts(d)])
        rc, d, err = diff(hf, ggufs["q4_0"], "--map", "hf-to-gguf", "--atol", "0.35")
        tap.ok(rc == 0 and verdicts(d).get("close") == 16,
               "hf-to-gguf Q4_0 --atol 0.35: close", [err, verdicts(d)])
        hf2 = os.path.join(work, "hf-other")
        L.make_folder(hf2, seed=99)
        rc, d, err = diff(hf2, ggufs["q8_0"], "--map", "hf-to-gguf")
        tap.ok(rc == 1 and verdicts(d).get("differs") == n,
               "hf-to-gguf: the GGUF of other weights differs", [err, verdicts(d)])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    tap.done()
    return 0 if tap.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
