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

import json
import math
import os
import struct
import subprocess
import sys
import tempfile
import zipfile

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
    with tempfile.TemporaryDirectory() as tmp:
        check_shared_views(tap, ckptfs, tmp)


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


# ---------------------------------------------------------------------------
# Views of shared storages, written here opcode by opcode (no torch needed)

def pickle_str(s):
    b = s.encode()
    return b"X" + struct.pack("<I", len(b)) + b


def rebuild_v2(key, cls, numel, offset, size, stride, requires_grad):
    """torch._utils._rebuild_tensor_v2(persistent id, offset, size, stride, requires_grad,
    OrderedDict()) as protocol 2 spells it, without memo."""
    ints = lambda xs: b"(" + b"".join(b"J" + struct.pack("<i", x) for x in xs) + b"t"
    persid = (b"(" + pickle_str("storage") + b"ctorch\n" + cls.encode() + b"\n" +
              pickle_str(key) + pickle_str("cpu") + b"J" + struct.pack("<i", numel) + b"tQ")
    return (b"ctorch._utils\n_rebuild_tensor_v2\n(" + persid + b"J" + struct.pack("<i", offset) +
            ints(size) + ints(stride) + (b"\x88" if requires_grad else b"\x89") +
            b"ccollections\nOrderedDict\n)Rt" + b"R")


def shared_views_file(path):
    """A state dict in which 8 tensors view float storage "0" (40 elements), one of them an
    empty view at offset 5, and 2 view short storage "1": names, offsets and strides of views
    (a transposed one, a size-1 dim with an odd stride), a name holding '%' and one of 200
    bytes. Returns {name: (storage, offset, size, stride, requires_grad)} in pickle order."""
    tensors = [
        ("v.a", "0", 0, [4], [1], True),
        ("v.b%c", "0", 4, [2, 2], [2, 1], False),
        ("v.empty", "0", 5, [0], [1], False),
        ("v." + "x" * 200, "0", 8, [3], [2], False),
        ("v.d", "0", 12, [2, 3], [1, 2], True),
        ("v.e", "0", 20, [3, 1], [1, 7], False),
        ("v.f", "0", 30, [5], [1], False),
        ("v.g", "0", 39, [], [], False),
        ("h.t", "1", 1, [3, 2], [1, 3], False),
        ("h.all", "1", 0, [12], [1], False),
    ]
    numel = {"0": 40, "1": 12}
    cls = {"0": "FloatStorage", "1": "ShortStorage"}
    body = b"\x80\x02ccollections\nOrderedDict\n)R("
    for name, key, offset, size, stride, rg in tensors:
        body += pickle_str(name) + rebuild_v2(key, cls[key], numel[key], offset, size, stride, rg)
    body += b"u."
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", body)
        z.writestr("archive/data/0", struct.pack("<40f", *range(40)))
        z.writestr("archive/data/1", struct.pack("<12h", *range(12)))
        z.writestr("archive/version", "3\n")
    return tensors


def check_shared_views(tap, ckptfs, tmp):
    """Sidecars say each view's storage, offset, stride, requires_grad and device, and name the
    first 4 other users of a shared storage in file order ("..." when there are more) with
    their count; the names are the dict's keys as they are."""
    src = os.path.join(tmp, "shared_views.pt")
    tensors = shared_views_file(src)
    p = subprocess.run([ckptfs, "ls", "--json", src], capture_output=True, timeout=60)
    listed = json.loads(p.stdout) if p.returncode == 0 else []
    paths = {t["name"]: t["path"] for t in listed}
    tap.ok(sorted(paths) == sorted(t[0] for t in tensors),
           "shared views: ls lists the names as the keys spell them ('%' and 200 bytes kept)",
           [p.stderr.decode(errors="replace")[:300], repr(sorted(paths))[:300]])

    def checks(mnt):
        for name, key, offset, size, stride, rg in tensors:
            users = [t[0] for t in tensors if t[1] == key]
            others = [u for u in users if u != name]
            want = {"name": name, "storage": key, "storage_offset": offset, "stride": stride,
                    "shape": size, "requires_grad": rg, "device": "cpu"}
            if len(users) > 1:
                want["shared_with"] = others[:4] + (["..."] if len(others) > 4 else [])
                want["storage_users"] = len(users)
            problems = []
            try:
                sc = read_json(os.path.join(mnt, paths.get(name, "?") + ".json"))
                problems = field_problems(sc, want)
                if len(users) == 1 and ("shared_with" in sc or "storage_users" in sc):
                    problems.append("a storage of one tensor names users: %r" % sc)
            except (OSError, ValueError) as e:
                problems.append(str(e))
            tap.ok(not problems, "shared views: %.40s sidecar (storage, offset, stride, "
                   "requires_grad, first other users)" % name, problems)
        elems = {"0": (list(range(40)), "<%df"), "1": (list(range(12)), "<%dh")}
        for name, key, offset, size, stride, rg in tensors:
            values, fmt = elems[key]
            want = []
            for i in range(math.prod(size)):
                at, rest = offset, i
                for d in reversed(range(len(size))):
                    at += (rest % size[d]) * stride[d]
                    rest //= size[d]
                want.append(values[at])
            try:
                with open(os.path.join(mnt, paths.get(name, "?")), "rb") as f:
                    got = f.read()
            except OSError as e:
                got = repr(e).encode()
            tap.ok(got == struct.pack(fmt % len(want), *want),
                   "shared views: %.40s reads its own elements in row-major order" % name,
                   ["got %r" % got[:80]])

    mounted(tap, ckptfs, src, "shared views", checks)


if __name__ == "__main__":
    sys.exit(run(main))
