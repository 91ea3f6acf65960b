#!/usr/bin/python3
"""DeepSpeed ZeRO 1/2/3 checkpoints: the fp32 weights zero_to_fp32 would return, assembled on
read from the ranks' flat partitions; the module's own weights under module/, Adam's moments
under optim/.

Fixtures: tests/fixtures/deepspeed (committed; tests/gen/deepspeed_fixtures.py writes them with
torch 1.13 in DeepSpeed's file and pickle layout, DeepSpeed's classes and enums included, and
records the sha256 of the master weights it partitioned). Per case every tensor is checked twice:
against that manifest, and against tests/lib/readers/zero_reader.py, an independent Python +
numpy (no torch) reader that follows zero_to_fp32.py step by step. Hostile: a short partition,
param_shapes past the partitions, a rank's optimizer file missing, the model states missing,
`latest` naming a path outside (../, absolute, ..), a compressed zip record: each refused naming
what is wrong.
"""
import hashlib
import os
import shutil
import sys
import tempfile
import zipfile

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
sys.path.insert(0, os.path.join(HERE, "..", "lib", "readers"))
import zero_reader  # noqa: E402
from ckptfs_test import run_capture  # noqa: E402
from mount_checks import (bytes_problems, check_hf_view, mounted, read_bytes,  # noqa: E402
                          read_json, sidecar_path, start, finish)

COMMITTED = os.path.join(HERE, "..", "fixtures", "deepspeed")


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


def check_case(tap, ckptfs, name, case):
    src = os.path.join(COMMITTED, name)
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

    mounted(tap, ckptfs, src, name, checks)


def refused(tap, ckptfs, src, words, desc):
    rc, _, err = run_capture([ckptfs, "info", src], 60)
    msg = err.decode("utf-8", "replace")
    tap.ok(rc not in (0, None) and all(w in msg for w in words), desc,
           ["exit %r" % rc, "stderr: " + msg.strip(), "want words: %r" % (words,)])


def copy_case(tmp, label):
    d = os.path.join(tmp, label)
    shutil.copytree(os.path.join(COMMITTED, "zero2_fp16_ws2"), d)
    return d, os.path.join(d, "global_step100")


def main():
    started = start()
    if not started:
        return 0
    tap, ckptfs, _ = started
    manifest = read_json(os.path.join(COMMITTED, "manifest.json"))
    for name, case in sorted(manifest["cases"].items()):
        check_case(tap, ckptfs, name, case)
    for name, h in sorted(manifest["hostile"].items()):
        src = os.path.join(COMMITTED, "hostile", name)
        try:
            zero_reader.consolidate(zero_reader.step_dir(src))
            ref = "zero_reader accepted it"
        except (ValueError, KeyError, IndexError) as e:
            ref = None
            tap.diag("zero_reader: %s" % e)
        refused(tap, ckptfs, src, h["error"], "hostile %s: refused naming %s (zero_reader: %s)"
                % (name, ", ".join(h["error"]), ref or "refused too"))
    tmp = tempfile.mkdtemp(prefix="ckptfs-t79.")
    try:
        d, step = copy_case(tmp, "missing_rank")
        os.unlink(os.path.join(step, "zero_pp_rank_1_mp_rank_00_optim_states.pt"))
        refused(tap, ckptfs, d, ["zero_pp_rank_1_mp_rank_00_optim_states.pt", "missing"],
                "rank 1's optimizer states missing: refused naming the file")
        d, step = copy_case(tmp, "missing_model")
        os.unlink(os.path.join(step, "mp_rank_00_model_states.pt"))
        refused(tap, ckptfs, d, ["mp_rank_00_model_states.pt", "missing"],
                "model states missing: refused naming the file")
        for label, tag in (("dotdot", "../missing_rank/global_step100"), ("absolute", "/etc"),
                           ("parent", "..")):
            d, _ = copy_case(tmp, "latest_" + label)
            with open(os.path.join(d, "latest"), "w") as f:
                f.write(tag)
            refused(tap, ckptfs, d, ["latest", tag], "latest = %r: refused, never followed" % tag)
        d, step = copy_case(tmp, "compressed")
        victim = os.path.join(step, "zero_pp_rank_1_mp_rank_00_optim_states.pt")
        with zipfile.ZipFile(victim) as zin:
            items = [(i, zin.read(i.filename)) for i in zin.infolist()]
        with zipfile.ZipFile(victim, "w") as zout:
            for info, data in items:
                info.compress_type = (zipfile.ZIP_DEFLATED if "/data/" in info.filename
                                      else zipfile.ZIP_STORED)
                zout.writestr(info, data)
        refused(tap, ckptfs, d, ["zero_pp_rank_1_mp_rank_00_optim_states.pt", "compressed"],
                "a deflated storage record: refused naming the file and record")
    finally:
        shutil.rmtree(tmp)
    return finish(tap)


if __name__ == "__main__":
    sys.exit(main())
