#!/usr/bin/python3
"""Burnpack (.bpk): mount every generated fixture and the real Burn sample, compare them with
the manifests of tests/gen/burnpack_fixtures.py, and run every hostile case.

Environment:
  CKPTFS    path of the ckptfs binary
  FIXTURES  fixture root; this test reads FIXTURES/burnpack

good/CASE/manifest.json: every tensor's raw bytes (size, sha256), its sidecar (name, dtype,
shape, nbytes, numpy_dtype, burn_dtype, param_id, quantized, burn_shape, source offset), the
exact set of files in the tree, and the "burnpack" member of .ckptfs/metadata.json.
hostile/cases.tsv: "refuse" cases must exit with status 2 within 10 s, print one stderr line
holding the needle (case-insensitive, "a|b" accepts either) and mount nothing; "mount" cases
must mount, and every file in them must read fully.
"""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
import hostile  # noqa: E402
from mount_checks import (bytes_problems, check_tree, field_problems, mounted,  # noqa: E402
                          read_json, run, warning_problems)


# ---------------------------------------------------------------------------
# Good cases


def check_tensor(tap, case, mnt, t):
    label = "%s: %s" % (case, t["name"])
    raw = os.path.join(mnt, t["path"])
    problems = bytes_problems(raw, t["nbytes"], t["sha256"])[0]
    tap.ok(not problems, "%s: raw bytes (size, sha256)" % label, problems)

    try:
        sc = read_json(raw + ".json")
    except (OSError, ValueError) as e:
        tap.ok(False, "%s: sidecar" % label, [str(e)])
        return
    problems = field_problems(sc, {k: t[k] for k in ("name", "dtype", "shape", "nbytes",
                                                     "burn_dtype")})
    if sc.get("format") != "burnpack":
        problems.append("format: got %r" % (sc.get("format"),))
    if sc.get("numpy_dtype") != t["numpy_dtype"]:
        problems.append("numpy_dtype: got %r, want %r" % (sc.get("numpy_dtype"), t["numpy_dtype"]))
    if t["param_id"] is None:
        if "param_id" in sc:
            problems.append("param_id %r, want none" % (sc["param_id"],))
    elif sc.get("param_id") != t["param_id"] or isinstance(sc.get("param_id"), bool):
        problems.append("param_id: got %r, want %r" % (sc.get("param_id"), t["param_id"]))
    if t["quantized"]:
        if sc.get("quantized") is not True or sc.get("burn_shape") != t["burn_shape"]:
            problems.append("quantized/burn_shape: got %r/%r, want true/%r"
                            % (sc.get("quantized"), sc.get("burn_shape"), t["burn_shape"]))
    elif "quantized" in sc or "burn_shape" in sc:
        problems.append("quantized/burn_shape on a plain tensor")
    src = sc.get("sources")
    if not (isinstance(src, list) and len(src) == 1 and src[0].get("offset") == t["offset"]
            and src[0].get("length") == t["nbytes"]):
        problems.append("sources: got %r, want offset %d length %d"
                        % (src, t["offset"], t["nbytes"]))
    tap.ok(not problems, "%s: sidecar" % label, problems)


def check_docs(tap, case, mnt, manifest):
    problems = []
    try:
        meta = read_json(os.path.join(mnt, ".ckptfs", "metadata.json"))
        if meta.get("format") != "burnpack":
            problems.append("format %r" % (meta.get("format"),))
        if meta.get("burnpack") != manifest["doc"]:
            problems.append("burnpack: got %s" % json.dumps(meta.get("burnpack")))
            problems.append("want %s" % json.dumps(manifest["doc"]))
        summary = read_json(os.path.join(mnt, ".ckptfs", "summary.json"))
        if summary.get("tensor_count") != len(manifest["tensors"]):
            problems.append("summary tensor_count %r" % (summary.get("tensor_count"),))
        if "warnings" in manifest:
            problems += warning_problems(summary, manifest["warnings"])
    except (OSError, ValueError) as e:
        problems.append(str(e))
    tap.ok(not problems, "%s: .ckptfs/metadata.json \"burnpack\", summary and warnings" % case, problems)


def run_good(tap, ckptfs, good, case):
    case_dir = os.path.join(good, case)
    manifest = read_json(os.path.join(case_dir, "manifest.json"))
    if "skip" in manifest:
        tap.skip_unless_ci("%s: mount and compare" % case, manifest["skip"])
        return

    def checks(mnt):
        for t in manifest["tensors"]:
            check_tensor(tap, case, mnt, t)
        check_tree(tap, case, mnt, manifest["tensors"],
                   "tree holds exactly the manifest's files")
        check_docs(tap, case, mnt, manifest)

    # absolute sources stay absolute
    mounted(tap, ckptfs, os.path.join(case_dir, manifest["source"]), case, checks)


def main(tap, ckptfs, root):
    good = os.path.join(root, "good")
    cases = sorted(os.listdir(good)) if os.path.isdir(good) else []
    tap.ok(len(cases) >= 10, "found %d Burnpack fixture cases in %s" % (len(cases), good))
    for case in cases:
        run_good(tap, ckptfs, good, case)
    # Burnpack mounts show regular files only.
    hostile.run_cases(tap, ckptfs, os.path.join(root, "hostile"), min_cases=100, named=True,
                      symlinks=False)


if __name__ == "__main__":
    sys.exit(run(main, "burnpack"))
