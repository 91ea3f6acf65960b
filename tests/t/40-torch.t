#!/usr/bin/python3
"""torch.save files: mount real torch 1.13 fixtures and check them against torch's own
figures; refuse hostile files quickly, with one line, without running anything.

Environment:
  CKPTFS    path of the ckptfs binary
  FIXTURES  output directory of the generators; FIXTURES/torch_hostile comes from
            tests/gen/torch_hostile_fixtures.py
The good fixtures are committed in tests/fixtures/torch (written by tests/gen/torch_fixtures.py
with real torch), so this test needs no torch.
"""

import os
import sys

HERE = os.path.dirname(os.path.realpath(__file__))
COMMITTED = os.path.normpath(os.path.join(HERE, "..", "fixtures", "torch"))

sys.path.insert(0, os.path.join(HERE, "..", "lib"))
import hostile  # noqa: E402
from mount_checks import (bytes_problems, check_tree, field_problems, mounted,  # noqa: E402
                          read_json, run)


# ---------------------------------------------------------------------------
# Good fixtures

def check_tensor(tap, label, mnt, t):
    raw = os.path.join(mnt, t["path"])
    problems = bytes_problems(raw, t["nbytes"], t["sha256"])[0]
    tap.ok(not problems, "%s: %s bytes equal torch's row-major bytes (sha256)" % (label, t["name"]),
           problems)

    problems, sc = [], {}
    try:
        sc = read_json(raw + ".json")
    except (OSError, ValueError) as e:
        problems.append("sidecar: %s" % e)
    if sc:
        problems += field_problems(sc, {k: t[k] for k in ("name", "dtype", "shape", "nbytes",
                                                          "requires_grad", "stride",
                                                          "storage_offset")})
    if sc and sc.get("format") != "torch-zip":
        problems.append("format %r" % sc.get("format"))
    if sc and not isinstance(sc.get("storage"), str):
        problems.append("storage key missing: %r" % sc.get("storage"))
    got_shared = sorted(sc.get("shared_with", [])) if sc else []
    if sc and got_shared != t["shared_with"]:
        problems.append("shared_with: got %r, want %r" % (got_shared, t["shared_with"]))
    tap.ok(not problems, "%s: %s sidecar (dtype, shape, stride, offset, requires_grad, sharing)"
           % (label, t["name"]), problems)
    return sc


def run_fixture(tap, ckptfs, fx):
    label = fx["file"]

    def checks(mnt):
        sidecars = {}
        for t in fx["tensors"]:
            sidecars[t["name"]] = check_tensor(tap, label, mnt, t)
        # Tensors sharing a storage show the same key; others show different keys.
        problems = []
        for t in fx["tensors"]:
            for o in fx["tensors"]:
                if o is t or not sidecars[t["name"]] or not sidecars[o["name"]]:
                    continue
                same = sidecars[t["name"]].get("storage") == sidecars[o["name"]].get("storage")
                if same != (o["name"] in t["shared_with"]):
                    problems.append("%s and %s: storage keys %s" % (
                        t["name"], o["name"], "equal" if same else "differ"))
        tap.ok(not problems, "%s: storage keys group exactly the tensors torch shares" % label,
               problems[:10])
        check_tree(tap, label, mnt, fx["tensors"], "tree holds exactly the tensors and sidecars")
        problems = []
        try:
            meta = read_json(os.path.join(mnt, ".ckptfs", "metadata.json"))
            if meta.get("pickle") != fx["pickle"]:
                problems.append("pickle: got %r" % (meta.get("pickle"),))
                problems.append("want %r" % (fx["pickle"],))
            summary = read_json(os.path.join(mnt, ".ckptfs", "summary.json"))
            if summary.get("tensor_count") != len(fx["tensors"]):
                problems.append("tensor_count %r, want %d"
                                % (summary.get("tensor_count"), len(fx["tensors"])))
            if fx["file"] == "renamed.pt" and meta.get("torch", {}).get("archive") != \
                    "other_name":
                problems.append("torch.archive %r, want 'other_name'" % (meta.get("torch"),))
        except (OSError, ValueError) as e:
            problems.append(str(e))
        tap.ok(not problems, "%s: metadata.json \"pickle\" holds every non-tensor value, "
               "summary counts %d tensors" % (label, len(fx["tensors"])), problems)

    mounted(tap, ckptfs, os.path.join(COMMITTED, fx["file"]), label, checks,
            mount_desc="%s: mounts" % label, unmount_desc="%s: unmounts")


def main(tap, ckptfs, fixtures):
    manifest = read_json(os.path.join(COMMITTED, "manifest.json"))
    fixtures_list = manifest["fixtures"]
    tap.ok(len(fixtures_list) >= 8, "manifest lists %d torch %s fixtures"
           % (len(fixtures_list), manifest.get("torch_version")))
    for fx in fixtures_list:
        run_fixture(tap, ckptfs, fx)
    torch_hostile = os.path.join(fixtures, "torch_hostile")
    if tap.ok(os.path.isfile(os.path.join(torch_hostile, "cases.tsv")),
              "%s/cases.tsv exists" % torch_hostile):
        hostile.run_cases(tap, ckptfs, torch_hostile, min_cases=60, min_canaries=5)
        check_bound_bytes(tap, ckptfs, torch_hostile)


def check_bound_bytes(tap, ckptfs, torch_hostile):
    """The boundary cases that mount show exactly the bytes the generator put in each tensor
    (bound-bytes.json: {case: {tensor: {sha256, nbytes}}})."""
    want = read_json(os.path.join(torch_hostile, "bound-bytes.json"))
    tap.ok(len(want) >= 3, "bound-bytes.json lists %d boundary mounts" % len(want))
    for case, tensors in sorted(want.items()):
        def checks(mnt, tensors=tensors, case=case):
            for name, t in sorted(tensors.items()):
                problems = bytes_problems(os.path.join(mnt, name), t["nbytes"], t["sha256"])[0]
                tap.ok(not problems, "%s: %s bytes (sha256 of the generator's)" % (case, name),
                       problems)
        mounted(tap, ckptfs, os.path.join(torch_hostile, case), case, checks)


if __name__ == "__main__":
    sys.exit(run(main))
