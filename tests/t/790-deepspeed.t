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
import json
import os
import shutil
import struct
import sys
import tempfile
import zipfile

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
sys.path.insert(0, os.path.join(HERE, "..", "lib", "readers"))
import zero_reader  # noqa: E402
from ckptfs_test import run_capture  # noqa: E402
from mount_checks import mounted, read_json, start, finish  # noqa: E402
import committed_checks  # noqa: E402

COMMITTED = os.path.join(HERE, "..", "fixtures", "deepspeed")


def check_case(tap, ckptfs, name, case):
    src = os.path.join(COMMITTED, name)
    mounted(tap, ckptfs, src, name, committed_checks.deepspeed_checks(tap, name, case, src))


def refused(tap, ckptfs, src, words, desc):
    rc, _, err = run_capture([ckptfs, "info", src], 60)
    msg = err.decode("utf-8", "replace")
    tap.ok(rc not in (0, None) and all(w in msg for w in words), desc,
           ["exit %r" % rc, "stderr: " + msg.strip(), "want words: %r" % (words,)])


def copy_case(tmp, label):
    d = os.path.join(tmp, label)
    shutil.copytree(os.path.join(COMMITTED, "zero2_fp16_ws2"), d)
    return d, os.path.join(d, "global_step100")


def write_safetensors(path, fill):
    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + struct.pack("<2f", fill, fill))


def unrelated_latest(tap, ckptfs, tmp):
    """A file named `latest` alone is no DeepSpeed checkpoint: a folder of safetensors with one
    (naming nothing, or a directory of unrelated files) mounts as a folder; the DeepSpeed cases
    above (latest naming global_step100/ of ranks' files) are still taken as DeepSpeed."""
    for label, tag, step_files in (("nothing", "run 7 finished\n", None),
                                   ("notes", "global_step5\n", ["notes.txt"]),
                                   ("empty_step", "global_step5", [])):
        d = os.path.join(tmp, "latest_" + label)
        os.makedirs(d)
        write_safetensors(os.path.join(d, "a.safetensors"), 1.5)
        write_safetensors(os.path.join(d, "b.safetensors"), -2.0)
        with open(os.path.join(d, "latest"), "w") as f:
            f.write(tag)
        if step_files is not None:
            os.makedirs(os.path.join(d, "global_step5"))
            for name in step_files:
                with open(os.path.join(d, "global_step5", name), "w") as f:
                    f.write("lr 0.1\n")
        rc, out, err = run_capture([ckptfs, "info", d], 60)
        text = out.decode("utf-8", "replace")
        fmt = [ln.split()[1] for ln in text.splitlines() if ln.startswith("format")]
        tap.ok(rc == 0 and fmt == ["folder"],
               "an unrelated `latest` (%s) beside safetensors: mounted as a folder" % label,
               ["exit %r" % rc, "format %r" % fmt, "stderr: " + err.decode()[:300]])
        rc, out, err = run_capture([ckptfs, "cat", d, "b.safetensors/w"], 60)
        tap.ok(rc == 0 and out == struct.pack("<2f", -2.0, -2.0),
               "an unrelated `latest` (%s): the folder's tensors read back" % label,
               ["exit %r" % rc, "got %r" % out[:16], "stderr: " + err.decode()[:300]])
    rc, out, _ = run_capture([ckptfs, "info", os.path.join(COMMITTED, "zero2_fp16_ws2")], 60)
    tap.ok(rc == 0 and b"deepspeed" in out,
           "latest naming a step directory of ranks' files: still a DeepSpeed checkpoint",
           [out.decode()[:200]])


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
        d, _ = copy_case(tmp, "latest_fifo")
        os.unlink(os.path.join(d, "latest"))
        os.mkfifo(os.path.join(d, "latest"))
        refused(tap, ckptfs, d, [d], "latest a FIFO: not waited on, refused")
        unrelated_latest(tap, ckptfs, tmp)
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
