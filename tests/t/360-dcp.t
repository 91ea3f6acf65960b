#!/usr/bin/python3
"""Native PyTorch DCP (.metadata + __R_N.distcp): mount real torch 1.13 checkpoints and 2.x-layout
ones and check them against torch's own figures; refuse hostile ones.

Environment:
  CKPTFS    path of the ckptfs binary
  FIXTURES  output root of the generators; FIXTURES/dcp/hostile comes from
            tests/gen/dcp_fixtures.py (standard library only)
The good fixtures are committed in tests/fixtures/dcp (written by tests/gen/dcp_fixtures.py with
real torch 1.13), so this test needs no torch.

Per case: every tensor's size and sha256 (torch's row-major bytes, computed before saving), or for
an incomplete one the covered leading bytes and EIO inside the hole; every sidecar (name, dtype,
shape, format, fqn, requires_grad, the chunks with file/offset/length/box, strides of strided
chunks, the BYTE_IO item of tensors found inside one); the tree holds exactly these tensors
(model at the root, optimizer state under optim/); summary counts and warnings; metadata.json's
"dcp" (layout, version, checkpoint_id, other attributes, replicas, every non-tensor value); the
HF view holds exactly the complete model tensors, same bytes.
Hostile rows (FIXTURES/dcp/hostile/cases.tsv): "refuse" = exit status 2, one stderr line with
the needle, nothing mounted, within 10 s, canary file never created; "mount" = mounts, every file
reads, a summary warning contains the needle, canary never created.
"""

import errno
import hashlib
import os
import sys

PAGE = 4096

HERE = os.path.dirname(os.path.realpath(__file__))
COMMITTED = os.path.normpath(os.path.join(HERE, "..", "fixtures", "dcp"))

sys.path.insert(0, os.path.join(HERE, "..", "lib"))
import hostile  # noqa: E402
from mount_checks import (bytes_problems, case_dirs, check_hf_view, check_tree,  # noqa: E402
                          field_problems, mounted, read_json, run, warning_problems)


# ---------------------------------------------------------------------------
# Good cases

def check_bytes(tap, label, mnt, t):
    raw = os.path.join(mnt, t["path"])
    if not t["incomplete"]:
        problems = bytes_problems(raw, t["nbytes"], t["sha256"])[0]
    else:
        problems = []
        try:
            size = os.stat(raw).st_size
            if size != t["nbytes"]:
                problems.append("st_size %d, want %d" % (size, t["nbytes"]))
            # Reads go through the page cache: only whole covered pages can be read.
            n = t["covered_prefix_bytes"]
            with open(raw, "rb") as f:
                if n >= PAGE:
                    head = os.pread(f.fileno(), PAGE, 0)
                    if hashlib.sha256(head).hexdigest() != t["head_sha256"]:
                        problems.append("the first covered page differs")
                for off in (n, t["nbytes"] - 1):
                    try:
                        os.pread(f.fileno(), 1, off)
                        problems.append("a read inside the hole (offset %d) succeeded" % off)
                    except OSError as e:
                        if e.errno != errno.EIO:
                            problems.append("read inside the hole: %s, want EIO" % e)
        except OSError as e:
            problems.append(str(e))
    what = "covered page equals torch's, EIO in the hole" if t["incomplete"] else \
        "bytes equal torch's (sha256)"
    tap.ok(not problems, "%s: %s %s" % (label, t["path"], what), problems)


def check_sidecar(tap, label, mnt, t):
    try:
        sc = read_json(os.path.join(mnt, t["path"] + ".json"))
    except (OSError, ValueError) as e:
        tap.ok(False, "%s: %s sidecar" % (label, t["path"]), [str(e)])
        return
    problems = field_problems(sc, {k: t[k] for k in ("name", "dtype", "shape", "nbytes", "fqn")})
    if sc.get("format") != "dcp":
        problems.append("format %r, want dcp" % sc.get("format"))
    if t["byte_io_item"]:
        if sc.get("byte_io_item") != t["byte_io_item"]:
            problems.append("byte_io_item %r, want %r" % (sc.get("byte_io_item"),
                                                          t["byte_io_item"]))
    else:
        if sc.get("requires_grad") != t["requires_grad"]:
            problems.append("requires_grad %r, want %r" % (sc.get("requires_grad"),
                                                           t["requires_grad"]))
        want = sorted((c["file"], c["offset"], c["length"], tuple(c["offsets"]),
                       tuple(c["sizes"])) for c in t["chunks"])
        chunks = [c for c in sc.get("chunks", []) if "transforms" not in c]
        got = sorted((c.get("file"), c.get("offset"), c.get("length"),
                      tuple(c.get("offsets", ())), tuple(c.get("sizes", ()))) for c in chunks)
        if got != want:
            problems.append("chunks %r, want %r" % (got, want))
        strided = any("stride" in c for c in chunks)
        if strided != t["strided"]:
            problems.append("a chunk with strides: %r, want %r" % (strided, t["strided"]))
        boxes = sorted((tuple(s.get("box", {}).get("offsets", [0] * len(t["shape"]))),
                        tuple(s.get("box", {}).get("sizes", t["shape"])))
                       for s in sc.get("sources", []))
        if t["chunks"] and boxes != sorted((tuple(c["offsets"]), tuple(c["sizes"]))
                                           for c in t["chunks"]):
            problems.append("sources' boxes %r differ from the chunks" % (boxes,))
    tap.ok(not problems, "%s: %s sidecar (dtype, shape, fqn, chunks with file/offset/length/box)"
           % (label, t["path"]), problems)


def same_value(a, b):
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and float(a) == float(b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    return a == b and type(a) is type(b)


def check_documents(tap, label, mnt, man):
    problems = []
    try:
        summary = read_json(os.path.join(mnt, ".ckptfs", "summary.json"))
        model = [t for t in man["tensors"] if not t["aside"]]
        aside = [t for t in man["tensors"] if t["aside"]]
        if summary.get("format") != "dcp":
            problems.append("format %r" % summary.get("format"))
        if summary.get("tensor_count") != len(model):
            problems.append("tensor_count %r, want %d" % (summary.get("tensor_count"), len(model)))
        if summary.get("tensors_outside_the_model", 0) != len(aside):
            problems.append("tensors_outside_the_model %r, want %d"
                            % (summary.get("tensors_outside_the_model"), len(aside)))
        if summary.get("incomplete_tensors") != man["incomplete_tensors"]:
            problems.append("incomplete_tensors %r, want %d"
                            % (summary.get("incomplete_tensors"), man["incomplete_tensors"]))
        problems += warning_problems(summary, man["warnings"])
        dcp = read_json(os.path.join(mnt, ".ckptfs", "metadata.json")).get("dcp", {})
        for key, want in (("layout", man["layout"]), ("version", man["version"]),
                          ("replicated_chunks", man["replicated_chunks"])):
            if dcp.get(key) != want:
                problems.append("dcp.%s %r, want %r" % (key, dcp.get(key), want))
        cid = (dcp.get("storage_meta") or {}).get("checkpoint_id")
        if cid != man["checkpoint_id"]:
            problems.append("storage_meta.checkpoint_id %r, want %r" % (cid, man["checkpoint_id"]))
        if sorted(dcp.get("other_attributes", [])) != man["other_attributes"]:
            problems.append("other_attributes %r, want %r" % (dcp.get("other_attributes"),
                                                             man["other_attributes"]))
        values = dcp.get("values", {})
        if not same_value(values, man["values"]):
            problems.append("values %r" % (values,))
            problems.append("want   %r" % (man["values"],))
    except (OSError, ValueError) as e:
        problems.append(str(e))
    tap.ok(not problems, "%s: summary counts/warnings, metadata.json dcp (layout, version, "
           "storage_meta, %d values)" % (label, len(man["values"])), problems)


def run_case(tap, ckptfs, case):
    src = os.path.join(COMMITTED, case)
    man = read_json(os.path.join(src, "manifest.json"))

    def checks(mnt):
        for t in man["tensors"]:
            check_bytes(tap, case, mnt, t)
            check_sidecar(tap, case, mnt, t)
        check_tree(tap, case, mnt, man["tensors"],
                   "tree holds exactly the tensors (optimizer state under optim/)", every_file=True)
        check_documents(tap, case, mnt, man)
        complete = {t["name"]: t for t in man["tensors"] if not t["aside"] and not t["incomplete"]}
        check_hf_view(tap, case, mnt, complete, ".ckptfs/hf/model.safetensors holds exactly the "
                      "complete model tensors, same bytes")

    mounted(tap, ckptfs, src, case, checks, mount_desc="%s: mounts" % case,
            unmount_desc="%s: unmounts")


def main(tap, ckptfs, fixtures):
    cases = case_dirs(COMMITTED)
    tap.ok(len(cases) >= 8, "found %d committed DCP cases in %s" % (len(cases), COMMITTED))
    for case in cases:
        run_case(tap, ckptfs, case)
    dcp_hostile = os.path.join(fixtures, "dcp", "hostile")
    if tap.ok(os.path.isfile(os.path.join(dcp_hostile, "cases.tsv")),
              "%s/cases.tsv exists" % dcp_hostile):
        # Refusals are matched with the case's path blanked out; a mount case's needle must
        # be in a summary.json warning.
        hostile.run_cases(tap, ckptfs, dcp_hostile, min_cases=40, min_canaries=4, blank=True,
                          warning=True)


if __name__ == "__main__":
    sys.exit(run(main))
