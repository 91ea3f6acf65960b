#!/usr/bin/python3
"""NeMo Automodel step directories (model/, optim/, model/consolidated/, model/.hf_metadata/, PEFT
adapters): mount each fixture and check the layout and the HF view.

Environment:
  CKPTFS    path of the ckptfs binary
  FIXTURES  output root of the generators; this test reads FIXTURES/nemo, written by
            tests/gen/nemo_fixtures.py

Per case (manifest.json): the format; every tensor's size, sha256 and sidecar (name, dtype, shape,
and every source under the expected file: the shards, not the consolidated copy, back model/
when both exist); the tree holds exactly the tensors (model/ or adapter/, optim/); summary counts
and warnings; metadata.json's "nemo" members; .ckptfs/hf/ holds exactly the expected config,
tokenizer and adapter files (same bytes as their sources) plus a model.safetensors that a strict
safetensors reader loads, holding exactly the model's tensors (never optimizer state) with the
same bytes. Every row of FIXTURES/nemo/hostile/cases.tsv is refused: exit status 2, one stderr
line with the needle, nothing mounted, within 10 s.
"""

import hashlib
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
import hostile  # noqa: E402
from mount_checks import (bytes_problems, case_dirs, check_tree, field_problems,  # noqa: E402
                          mounted, parse_safetensors, read_bytes, read_json, run,
                          warning_problems)


def subset_matches(got, want):
    if isinstance(want, dict):
        return isinstance(got, dict) and all(k in got and subset_matches(got[k], v)
                                             for k, v in want.items())
    return got == want


def check_tensor(tap, case, mnt, t):
    raw = os.path.join(mnt, t["path"])
    problems = bytes_problems(raw, t["nbytes"], t["sha256"])[0]
    try:
        sc = read_json(raw + ".json")
        problems += field_problems(sc, {k: t[k] for k in ("name", "dtype", "shape", "nbytes")})
        files = [s.get("file", "") for s in sc.get("sources", [])]
        if not files or any(not f.startswith(t["source_prefix"]) for f in files):
            problems.append("sources %r, want all under %r" % (files, t["source_prefix"]))
    except (OSError, ValueError) as e:
        problems.append(str(e))
    tap.ok(not problems, "%s: %s bytes and sidecar (sources under %s)"
           % (case, t["path"], t["source_prefix"]), problems)


def check_documents(tap, case, mnt, man):
    problems = []
    try:
        summary = read_json(os.path.join(mnt, ".ckptfs", "summary.json"))
        model = sum(not t["aside"] for t in man["tensors"])
        aside = sum(t["aside"] for t in man["tensors"])
        if summary.get("format") != man["format"]:
            problems.append("format %r, want %r" % (summary.get("format"), man["format"]))
        if summary.get("tensor_count") != model:
            problems.append("tensor_count %r, want %d" % (summary.get("tensor_count"), model))
        if summary.get("tensors_outside_the_model", 0) != aside:
            problems.append("tensors_outside_the_model %r, want %d"
                            % (summary.get("tensors_outside_the_model"), aside))
        problems += warning_problems(summary, man["warnings"])
        nemo = read_json(os.path.join(mnt, ".ckptfs", "metadata.json")).get("nemo")
        if not subset_matches(nemo, man["nemo"]):
            problems.append("nemo %r" % (nemo,))
            problems.append("want %r" % (man["nemo"],))
    except (OSError, ValueError) as e:
        problems.append(str(e))
    tap.ok(not problems, "%s: summary (format, counts, warnings) and metadata.json nemo" % case,
           problems)


def check_hf_view(tap, case, mnt, src, man):
    problems = []
    hf = os.path.join(mnt, ".ckptfs", "hf")
    try:
        names = set(os.listdir(hf))
        want = set(man["hf_files"]) | {"model.safetensors"}
        problems += ["missing %s" % n for n in sorted(want - names)]
        problems += ["unexpected %s" % n for n in sorted(names - want)]
        for name, digest in sorted(man["hf_files"].items()):
            if name in names and hashlib.sha256(read_bytes(os.path.join(hf, name))).hexdigest() \
                    != digest:
                problems.append("%s: bytes differ from its source" % name)
        if "config.json" in names:
            cfg = read_json(os.path.join(hf, "config.json"))
            if cfg.get("model_type") != "llama":
                problems.append("config.json model_type %r" % cfg.get("model_type"))
        view = parse_safetensors(read_bytes(os.path.join(hf, "model.safetensors")))
        by_name = {t["name"]: t for t in man["tensors"] if not t["aside"]}
        if sorted(view) != man["hf_tensors"]:
            problems.append("model.safetensors holds %r, want %r" % (sorted(view),
                                                                     man["hf_tensors"]))
        for name, (dt, shape, data) in sorted(view.items()):
            t = by_name.get(name)
            if t and (dt != t["dtype"] or shape != t["shape"] or
                      hashlib.sha256(data).hexdigest() != t["sha256"]):
                problems.append("%s: %s%r or its bytes differ" % (name, dt, shape))
        if "adapter_model.safetensors" in names:
            adapter = parse_safetensors(read_bytes(os.path.join(hf, "adapter_model.safetensors")))
            if sorted(adapter) != man["hf_tensors"]:
                problems.append("adapter_model.safetensors holds %r" % sorted(adapter))
    except (OSError, ValueError, KeyError, UnicodeDecodeError) as e:
        problems.append("%s: %s" % (type(e).__name__, e))
    tap.ok(not problems, "%s: .ckptfs/hf has %s + a loadable model.safetensors with exactly the "
           "model's %d tensors" % (case, ", ".join(sorted(man["hf_files"])) or "no other files",
                                   len(man["hf_tensors"])), problems)


def run_case(tap, ckptfs, root, case):
    man = read_json(os.path.join(root, case, "manifest.json"))
    src = os.path.join(root, case, man["source"])

    def checks(mnt):
        for t in man["tensors"]:
            check_tensor(tap, case, mnt, t)
        tops = sorted({t["path"].split("/")[0] for t in man["tensors"]})
        check_tree(tap, case, mnt, man["tensors"], "tree holds exactly the tensors (top level: "
                   "%s)" % ", ".join(tops), every_file=True)
        check_documents(tap, case, mnt, man)
        check_hf_view(tap, case, mnt, src, man)

    mounted(tap, ckptfs, src, case, checks, mount_desc="%s: mounts %s" % (case, man["source"]),
            unmount_desc="%s: unmounts")


def main(tap, ckptfs, root):
    cases = case_dirs(root)
    tap.ok(len(cases) >= 10, "found %d NeMo fixture cases in %s" % (len(cases), root))
    for case in cases:
        run_case(tap, ckptfs, root, case)
    hostile.run_cases(tap, ckptfs, os.path.join(root, "hostile"), min_cases=3)


if __name__ == "__main__":
    sys.exit(run(main, "nemo", "nemo_fixtures.py"))
