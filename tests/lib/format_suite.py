"""The whole mount test of a single-file format whose generator writes one manifest.json
per good case (420-gptrs.t, 430-lwt.t) and a hostile/ directory.

manifest.json: {"source": file, "metadata": {member: {key: value}}, "warnings": [needle],
"tensors": [{name, dtype, shape, nbytes, sha256, numpy_dtype, path, file, offset,
extra: {sidecar member: value}}]}.

Good cases: every tensor's bytes (size, sha256) and sidecar (name, dtype, shape, nbytes,
format, byte_order, numpy_dtype, the extra members, one source at file/offset) equal the
manifest; the tree holds exactly the expected files; .ckptfs/metadata.json carries the
format and the expected members; summary.json counts the tensors and has exactly the
expected warnings.  Hostile cases: see hostile.py.
"""

import json
import os

import hostile
from mount_checks import (bytes_problems, case_dirs, check_tree, field_problems, mounted,
                          read_bytes, read_json, run, sidecar_path, warning_problems)


def tensor_problems(mnt, t, fmt):
    problems = bytes_problems(os.path.join(mnt, t["path"]), t["nbytes"], t["sha256"])[0]
    try:
        sc = json.loads(read_bytes(os.path.join(mnt, sidecar_path(t["path"]))))
    except (OSError, ValueError) as e:
        return problems + [str(e)]
    want = {"name": t["name"], "dtype": t["dtype"], "shape": t["shape"], "nbytes": t["nbytes"],
            "format": fmt, "byte_order": "little", "numpy_dtype": t["numpy_dtype"]}
    want.update(t["extra"])
    problems += ["sidecar " + p for p in field_problems(sc, want)]
    src = sc.get("sources")
    if not (isinstance(src, list) and len(src) == 1 and src[0].get("file") == t["file"]
            and src[0].get("offset") == t["offset"] and src[0].get("length") == t["nbytes"]):
        problems.append("sources %r, want one %s at %d, %d bytes"
                        % (src, t["file"], t["offset"], t["nbytes"]))
    return problems


def doc_problems(mnt, manifest, fmt):
    problems = []
    try:
        meta = read_json(os.path.join(mnt, ".ckptfs", "metadata.json"))
        summary = read_json(os.path.join(mnt, ".ckptfs", "summary.json"))
    except (OSError, ValueError) as e:
        return [str(e)]
    if meta.get("format") != fmt:
        problems.append("metadata format %r" % meta.get("format"))
    for key, want in manifest["metadata"].items():
        got = meta.get(key)
        if not isinstance(got, dict):
            problems.append("metadata[%r] is %r" % (key, got))
            continue
        for k, v in want.items():
            if got.get(k) != v:
                problems.append("metadata[%r][%r]: got %r, want %r" % (key, k, got.get(k), v))
    if summary.get("tensor_count") != len(manifest["tensors"]):
        problems.append("summary tensor_count %r" % summary.get("tensor_count"))
    return problems + warning_problems(summary, manifest.get("warnings", []))


def run_good(tap, ckptfs, root, case, fmt):
    case_dir = os.path.join(root, case)
    manifest = read_json(os.path.join(case_dir, "manifest.json"))

    def checks(mnt):
        for t in manifest["tensors"]:
            p = tensor_problems(mnt, t, fmt)
            tap.ok(not p, "%s: %s bytes and sidecar" % (case, t["name"]), p)
        check_tree(tap, case, mnt, manifest["tensors"])
        p = doc_problems(mnt, manifest, fmt)
        tap.ok(not p, "%s: metadata.json and summary.json" % case, p)

    mounted(tap, ckptfs, os.path.join(case_dir, manifest["source"]), case, checks,
            unmount_desc="%s: unmount")


def main(subdir, fmt, min_good=5, min_hostile=25):
    """The test of FIXTURES/subdir, whose sidecars and metadata.json say format fmt."""
    def body(tap, ckptfs, root):
        cases = case_dirs(root)
        tap.ok(len(cases) >= min_good, "found %d good cases in %s" % (len(cases), root))
        for case in cases:
            run_good(tap, ckptfs, root, case, fmt)
        hostile.run_cases(tap, ckptfs, os.path.join(root, "hostile"), min_cases=min_hostile,
                          named=True)

    return run(body, subdir)
