"""Checks of the committed layout fixtures (tests/fixtures/meta_mp, tests/fixtures/deepspeed)
against their manifests, as functions of a mount point: tests/t/150-meta-mp.t and 790-deepspeed.t
run them on local mounts, tests/t/46..48 on mounts of the same fixtures from URLs."""

import os
import sys

from mount_checks import (bytes_problems, check_hf_view, read_bytes, read_json,  # noqa: E402
                          sidecar_path)

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, os.path.join(HERE, "readers"))
import zero_reader  # noqa: E402

COMMITTED = os.path.join(HERE, "..", "fixtures")


def meta_mp_checks(tap, name, case):
    """Meta model-parallel case `case` of meta_mp/manifest.json."""
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

    return checks


def tensor_problems(mnt, prefix, want):
    problems = []
    for name, t in sorted(want.items()):
        raw = os.path.join(mnt, prefix, name.replace(".", "/"))
        p, _ = bytes_problems(raw, t["nbytes"], t["sha256"])
        problems += ["%s%s: %s" % (prefix, name, x) for x in p]
        try:
            sc = read_json(sidecar_path(raw))
            if sc["dtype"] != t["dtype"] or sc["shape"] != t["shape"]:
                problems.append("%s%s: sidecar %s %r, want %s %r" % (
                    prefix, name, sc["dtype"], sc["shape"], t["dtype"], t["shape"]))
        except (OSError, ValueError, KeyError) as e:
            problems.append("%s%s: sidecar: %s" % (prefix, name, e))
    return problems


def deepspeed_checks(tap, name, case, src):
    """DeepSpeed case `case` of deepspeed/manifest.json; src is its local folder (read by the
    independent zero_to_fp32 reader)."""
    ref = zero_reader.consolidate(zero_reader.step_dir(src))

    def checks(mnt):
        p = tensor_problems(mnt, "", case["fp32"])
        tap.ok(not p, "%s: %d fp32 tensors = the master weights (generator's sha256)"
               % (name, len(case["fp32"])), p)
        p = []
        if sorted(ref) != sorted(case["fp32"]):
            p.append("reader has %s, manifest %s" % (sorted(ref), sorted(case["fp32"])))
        for tname, arr in ref.items():
            raw = os.path.join(mnt, tname.replace(".", "/"))
            try:
                if read_bytes(raw) != arr.tobytes():
                    p.append("%s: bytes differ from zero_reader's" % tname)
            except OSError as e:
                p.append("%s: %s" % (tname, e))
        tap.ok(not p, "%s: the same bytes as the independent zero_to_fp32 reader" % name, p)
        p = tensor_problems(mnt, "module", case["module"])
        tap.ok(not p, "%s: module/: %d 16-bit weights of the module" % (name, len(case["module"])),
               p)
        p = tensor_problems(mnt, "optim", case["optim"])
        tap.ok(not p, "%s: optim/: %d Adam moments assembled like the weights"
               % (name, len(case["optim"])), p)
        summary = read_json(os.path.join(mnt, ".ckptfs", "summary.json"))
        meta = read_json(os.path.join(mnt, ".ckptfs", "metadata.json"))
        ds = meta.get("deepspeed", {})
        tap.ok(summary.get("format") == "deepspeed-zero" and
               summary.get("tensor_count") == len(case["fp32"]) and
               ds.get("zero_stage") == case["stage"] and ds.get("world_size") == case["world"] and
               ds.get("tag") == case["tag"],
               "%s: summary (format, %d model tensors) and metadata (stage %d, %d ranks, tag)"
               % (name, len(case["fp32"]), case["stage"], case["world"]),
               ["summary %r" % {k: summary.get(k) for k in ("format", "tensor_count")},
                "deepspeed %r" % ds])
        stage = str(meta.get("optim_states", {}).get("optimizer_state_dict.zero_stage"))
        tap.ok("ZeroStageEnum" in stage,
               "%s: ZeroStageEnum carried as inert data in metadata.json" % name, [stage])
        check_hf_view(tap, name, mnt, case["fp32"], "HF view holds the fp32 state dict")

    return checks
