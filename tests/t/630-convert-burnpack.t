#!/usr/bin/python3
"""Converting checkpoints to Burnpack (.bpk): the core writer, through TOOLS/convert_tool.

Environment:
  TOOLS     directory of the test tools (convert_tool IN OUT: ckpt_open + ckpt_write)
  FIXTURES  output directory of the fixture generators
  CKPTFS    the ckptfs binary (outputs are also mounted and compared; skipped without FUSE)

Every output is read back with tests/lib/readers/burnpack_reader.py, an independent strict
reader of the format notes (aligned layout, offsets, zero padding, dtypes, the CBOR schema and
its canonical encoding), and every tensor's bytes are compared with the sha256 the fixture
generators recorded for the source. Round trips of Burnpack files that are themselves canonical
(the real burn-mnist.bpk among them) must give back the very same bytes; the others must give
the same tensors, dtypes, param_ids, metadata and scalars. Conversions that Burnpack cannot hold
(a dtype Burn lacks, an incomplete tensor) must fail with exit status 2 and one line naming the
tensor, leaving neither OUT nor a temporary file behind.
"""

import hashlib
import json
import os
import stat
import struct
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.realpath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
sys.path.insert(0, os.path.join(HERE, "..", "lib", "readers"))
from ckptfs_test import (Tap, Watchdog, is_mounted, run_capture, skip_reason,  # noqa: E402
                         unmount)
import burnpack_reader as bpr  # noqa: E402

CONVERT_TIMEOUT = 60
REFUSE_TIMEOUT = 10
MOUNT_TIMEOUT = 30
CASE_TIMEOUT = 120

# ckptfs dtype -> the Burn dtype the writer must use for it
BURN_DTYPE = {"F64": "F64", "F32": "F32", "F16": "F16", "BF16": "BF16", "I64": "I64",
              "I32": "I32", "I16": "I16", "I8": "I8", "U64": "U64", "U32": "U32", "U16": "U16",
              "U8": "U8", "BOOL": {"Bool": "Native"}}
# Burn dtype -> the ckptfs dtype a mount of the output shows
CKPTFS_DTYPE = {"F64": "F64", "F32": "F32", "Flex32": "F32", "F16": "F16", "BF16": "BF16",
                "I64": "I64", "I32": "I32", "I16": "I16", "I8": "I8", "U64": "U64",
                "U32": "U32", "U16": "U16", "U8": "U8", "Bool": "BOOL"}


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def sha(data):
    return hashlib.sha256(data).hexdigest()


def ckptfs_dtype_of(burn):
    if isinstance(burn, str):
        return CKPTFS_DTYPE[burn]
    (k, v), = burn.items()
    if k == "Bool":
        return "U32" if v == "U32" else "BOOL"
    return "U8"  # QFloat: opaque bytes


def leftovers(directory, base):
    return sorted(n for n in os.listdir(directory) if n.startswith("." + base + ".partial-"))


def convert(tools, src, out):
    t0 = time.monotonic()
    rc, out_b, err_b = run_capture([os.path.join(tools, "convert_tool"), src, out],
                                   CONVERT_TIMEOUT)
    return rc, err_b.decode("utf-8", "replace"), time.monotonic() - t0


# ---------------------------------------------------------------------------
# What an output must hold. A case is a dict:
#   label, source, tensors: [{name, burn_dtype, shape (Burn's), sha256, param_id,
#   path (in a mount), dtype and mount_shape (what a mount of the output shows)}],
#   metadata: expected dict, or "ckptfs" for the writer's default keys; scalars: dict or None;
#   identical: a file the output must equal byte for byte, or None.


def expect_plain(name, dtype, shape, sha256, path):
    return {"name": name, "burn_dtype": BURN_DTYPE[dtype], "shape": shape, "sha256": sha256,
            "param_id": None, "path": path, "dtype": dtype, "mount_shape": shape}


def from_manifest_tensors(rows):
    return [expect_plain(t["name"], t["dtype"], t["shape"], t["sha256"], t["path"]) for t in rows]


def check_metadata(got, want):
    """Metadata equality; a non-text source value must come back as its JSON text."""
    if want == "ckptfs":
        if not isinstance(got, dict) or sorted(got) != ["format", "producer", "version"]:
            return ["metadata %r, want format/producer/version" % (got,)]
        if got["format"] != "burnpack" or got["producer"] != "ckptfs" or not got["version"]:
            return ["metadata %r, want format burnpack, producer ckptfs, a version" % (got,)]
        return []
    if want is None:
        return [] if got is None else ["metadata %r, want none" % (got,)]
    if not isinstance(got, dict) or sorted(got) != sorted(want):
        return ["metadata keys %r, want %r" % (sorted(got or {}), sorted(want))]
    problems = []
    for k, v in want.items():
        g = got[k]
        if isinstance(v, str):
            ok = g == v
        else:
            try:
                ok = json.loads(g) == v
            except ValueError:
                ok = False
        if not ok:
            problems.append("metadata %r: got %r, want %r" % (k, g, v))
    return problems


def check_output(tap, case, out):
    label = case["label"]
    try:
        bp = bpr.read(out)
    except (bpr.BurnpackError, OSError) as e:
        tap.ok(False, "%s: output passes the strict reader" % label, [str(e)])
        return False
    tap.ok(True, "%s: output passes the strict reader (aligned, canonical CBOR)" % label)

    want = {t["name"]: t for t in case["tensors"]}
    got_names = sorted(bp.by_name)
    tap.ok(got_names == sorted(want), "%s: tensor names" % label,
           ["got %r" % got_names[:20], "want %r" % sorted(want)[:20]])
    problems = []
    for name, w in sorted(want.items()):
        t = bp.by_name.get(name)
        if t is None:
            continue
        if t.dtype != w["burn_dtype"]:
            problems.append("%s: dtype %r, want %r" % (name, t.dtype, w["burn_dtype"]))
        if t.shape != w["shape"]:
            problems.append("%s: shape %r, want %r" % (name, t.shape, w["shape"]))
        if t.param_id != w["param_id"]:
            problems.append("%s: param_id %r, want %r" % (name, t.param_id, w["param_id"]))
        if sha(bp.data(t)) != w["sha256"]:
            problems.append("%s: bytes differ from the source (sha256)" % name)
    tap.ok(not problems, "%s: every tensor's dtype, shape, param_id and bytes" % label, problems)

    problems = check_metadata(bp.metadata, case["metadata"])
    if bp.scalars != case["scalars"]:
        problems.append("scalars %r, want %r" % (bp.scalars, case["scalars"]))
    tap.ok(not problems, "%s: metadata and scalars" % label, problems)

    if case.get("identical"):
        a, b = read_bytes(out), read_bytes(case["identical"])
        diag = []
        if a != b:
            diff = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), None)
            diag.append("sizes %d / %d, first difference at %r" % (len(a), len(b), diff))
        tap.ok(a == b, "%s: output is byte-identical to the source" % label, diag)
    return True


def sidecar_path(raw_path):
    base = raw_path[:-4] if raw_path.endswith(".raw") else raw_path
    return base + ".json"


def check_mount(tap, ckptfs, case, out):
    label = case["label"] + " (mounted)"
    mnt = tempfile.mkdtemp(prefix="ckptfs-t63.")
    try:
        rc, _, err = run_capture([ckptfs, out, mnt], MOUNT_TIMEOUT)
        if not tap.ok(rc == 0 and is_mounted(mnt), "%s: mount the output" % label,
                      ["exit %r: %s" % (rc, err.decode("utf-8", "replace").strip())]):
            return
        with Watchdog(mnt, CASE_TIMEOUT) as dog:
            problems = []
            for t in case["tensors"]:
                raw = os.path.join(mnt, t["path"])
                try:
                    st = os.stat(raw)
                    data = read_bytes(raw)
                    if not stat.S_ISREG(st.st_mode) or st.st_size != len(data):
                        problems.append("%s: not a regular file of its size" % t["name"])
                    if sha(data) != t["sha256"]:
                        problems.append("%s: raw bytes differ (sha256)" % t["name"])
                    sc = json.loads(read_bytes(os.path.join(mnt, sidecar_path(t["path"]))))
                except (OSError, ValueError) as e:
                    problems.append("%s: %s" % (t["name"], e))
                    continue
                for key, want in (("name", t["name"]), ("dtype", t["dtype"]),
                                  ("shape", t["mount_shape"]), ("format", "burnpack"),
                                  ("burn_dtype", t["burn_dtype"])):
                    if sc.get(key) != want:
                        problems.append("%s: sidecar %s %r, want %r"
                                        % (t["name"], key, sc.get(key), want))
                if sc.get("param_id") != t["param_id"]:
                    problems.append("%s: sidecar param_id %r, want %r"
                                    % (t["name"], sc.get("param_id"), t["param_id"]))
            tap.ok(not problems, "%s: every tensor's raw bytes and sidecar" % label, problems)
            problems = []
            try:
                doc = json.loads(read_bytes(os.path.join(mnt, ".ckptfs", "metadata.json")))
                bp = doc.get("burnpack", {})
                if bp.get("layout") != "aligned" or bp.get("tensor_count") != len(
                        case["tensors"]):
                    problems.append("burnpack doc %r" % (bp,))
            except (OSError, ValueError) as e:
                problems.append(str(e))
            tap.ok(not problems, "%s: metadata.json says aligned, %d tensors"
                   % (label, len(case["tensors"])), problems)
        if dog.fired:
            tap.ok(False, "%s: checks finished in time" % label, ["watchdog fired"])
    finally:
        tap.ok(unmount(mnt), "%s: unmount" % label)


def run_case(tap, tools, ckptfs, work, case):
    out = os.path.join(work, case["label"].replace("/", "_") + ".bpk")
    rc, err, _ = convert(tools, case["source"], out)
    if not tap.ok(rc == 0 and os.path.isfile(out), "%s: convert to .bpk" % case["label"],
                  ["exit %r: %s" % (rc, err.strip())]):
        return
    tap.ok(not leftovers(work, os.path.basename(out)), "%s: no temporary file left" % case["label"],
           leftovers(work, os.path.basename(out)))
    if check_output(tap, case, out) and ckptfs:
        check_mount(tap, ckptfs, case, out)
    os.unlink(out)


# ---------------------------------------------------------------------------
# Cases


def mnist_case(tap):
    # Committed with the repository (tests/fixtures/burnpack/), so the check runs in any clone.
    src = os.path.join(REPO, "tests", "fixtures", "burnpack", "burn-mnist.bpk")
    if not os.path.isfile(src):
        tap.skip_unless_ci("burn-mnist.bpk round trip", "%s is missing" % src)
        return None
    bp = bpr.read(src)  # the real Burn file is canonical by the notes' recipe
    tensors = [{"name": t.name, "burn_dtype": t.dtype, "shape": t.shape,
                "sha256": sha(bp.data(t)), "param_id": t.param_id,
                "path": t.name.replace(".", "/"), "dtype": ckptfs_dtype_of(t.dtype),
                "mount_shape": t.shape} for t in bp.tensors]
    tap.ok(len(tensors) == 18 and all(t["param_id"] is not None for t in tensors),
           "burn-mnist.bpk: the strict reader reads the real Burn file (18 tensors, param_ids)")
    return {"label": "burn-mnist", "source": src, "tensors": tensors, "metadata": bp.metadata,
            "scalars": bp.scalars, "identical": src}


def burnpack_cases(tap, fixtures):
    root = os.path.join(fixtures, "burnpack", "good")
    if not tap.ok(os.path.isdir(root), "the generator wrote %s" % root):
        return []
    cases, canonical = [], []
    for c in sorted(os.listdir(root)):
        mpath = os.path.join(root, c, "manifest.json")
        if c == "mnist" or not os.path.isfile(mpath):
            continue  # the real sample is mnist_case's
        with open(mpath, encoding="utf-8") as f:
            m = json.load(f)
        src = os.path.join(root, c, m["source"])
        tensors = []
        for t in m["tensors"]:
            tensors.append({"name": t["name"], "burn_dtype": t["burn_dtype"],
                            "shape": t["burn_shape"] if t["quantized"] else t["shape"],
                            "sha256": t["sha256"], "param_id": t["param_id"],
                            "path": t["path"], "dtype": t["dtype"], "mount_shape": t["shape"]})
        # A source that is itself what Burn writes must come back byte for byte.
        try:
            bpr.read(src)
            identical = src
            canonical.append(c)
        except bpr.BurnpackError:
            identical = None
        cases.append({"label": "burnpack/" + c, "source": src, "tensors": tensors,
                      "metadata": m["doc"].get("metadata"), "scalars": m["doc"].get("scalars"),
                      "identical": identical})
    want = {"aligned-all-dtypes", "bool-map-scalars", "quantized", "notes-example",
            "no-tensors", "metadata-ends-on-256"}
    tap.ok(want <= set(canonical), "Burnpack fixtures: the Burn-shaped ones are canonical "
           "(their round trips must be byte-identical)", ["canonical: %r" % canonical])
    return cases


def write_filtered_safetensors(src, dst, keep):
    """A copy of a safetensors file holding only the tensors keep() accepts."""
    raw = read_bytes(src)
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    base = 8 + n
    out_header, blobs, at = {}, [], 0
    for name, e in header.items():
        if name == "__metadata__" or not keep(e["dtype"]):
            continue
        s, t = e["data_offsets"]
        blobs.append(raw[base + s:base + t])
        out_header[name] = {"dtype": e["dtype"], "shape": e["shape"],
                            "data_offsets": [at, at + t - s]}
        at += t - s
    hj = json.dumps(out_header, separators=(",", ":")).encode()
    hj += b" " * (-len(hj) % 8)
    with open(dst, "wb") as f:
        f.write(struct.pack("<Q", len(hj)) + hj + b"".join(blobs))


def manifest_case(label, case_dir, source, rows):
    return {"label": label, "source": os.path.normpath(os.path.join(case_dir, source)),
            "tensors": from_manifest_tensors(rows), "metadata": "ckptfs", "scalars": None,
            "identical": None}


def other_cases(tap, fixtures, work):
    cases = []

    def load(path):
        with open(path, encoding="utf-8") as f:
            return json.load(f)

    d = os.path.join(fixtures, "dtypes")
    if os.path.isfile(os.path.join(d, "manifest.json")):
        m = load(os.path.join(d, "manifest.json"))
        dst = os.path.join(work, "dtypes-burn.safetensors")
        write_filtered_safetensors(os.path.join(d, m["source"]), dst, lambda dt: dt in BURN_DTYPE)
        rows = [t for t in m["tensors"] if t["dtype"] in BURN_DTYPE]
        tap.ok(len(rows) == len(BURN_DTYPE), "dtypes fixture holds every dtype Burn has (%d)"
               % len(rows))
        cases.append(manifest_case("safetensors/dtypes-burn", work, dst, rows))
    for c in ("odd", "sharded"):
        mp = os.path.join(fixtures, c, "manifest.json")
        if os.path.isfile(mp):
            m = load(mp)
            cases.append(manifest_case("safetensors/" + c, os.path.dirname(mp), m["source"],
                                       m["tensors"]))
    for c in ("grid", "dim1x4", "mixed"):
        mp = os.path.join(fixtures, "dcphf", c, "manifest.json")
        if os.path.isfile(mp):
            m = load(mp)
            cases.append(manifest_case("dcphf/" + c, os.path.dirname(mp), m["source"],
                                       m["tensors"]))
    torch_dir = os.path.join(REPO, "tests", "fixtures", "torch")
    if os.path.isfile(os.path.join(torch_dir, "manifest.json")):
        m = load(os.path.join(torch_dir, "manifest.json"))
        for fx in m["fixtures"]:
            if fx["file"] in ("views.pt", "training.pt", "legacy.pt", "tied.pt"):
                cases.append(manifest_case("torch/" + fx["file"], torch_dir, fx["file"],
                                           fx["tensors"]))
    if len(cases) < 10:
        tap.ok(False, "found the safetensors, dcphf and torch fixtures",
               ["only %r" % [c["label"] for c in cases]])
    return cases


# ---------------------------------------------------------------------------
# The strict reader is not vacuous: the notes' hand-built example (2.8) passes, each single
# departure from the recipe fails.


def notes_example(cbor=None, pad=b"", tail=b"", data=struct.pack("<2f", 1.0, 2.0)):
    if cbor is None:
        cbor = (b"\xa1\x67tensors\xa1\x61w\xa3\x65dtype\x63F32\x65shape\x81\x02"
                b"\x6cdata_offsets\x82\x00\x08")
    head = b"NRUB\x01\x00" + struct.pack("<I", len(cbor)) + cbor
    padding = bytearray(256 - len(head))
    padding[:len(pad)] = pad
    return head + bytes(padding) + data + tail


def reader_self_test(tap):
    good = notes_example()
    problems = []
    try:
        bpr.parse(good)
    except bpr.BurnpackError as e:
        problems.append(str(e))
    tap.ok(len(good) == 264 and not problems, "strict reader accepts the notes' example", problems)
    desc = b"\x65dtype\x63F32\x65shape\x81\x02\x6cdata_offsets\x82\x00\x08"
    bad = {
        "a non-shortest integer head": notes_example(
            b"\xa1\x67tensors\xa1\x61w\xa3\x65dtype\x63F32\x65shape\x81\x18\x02"
            b"\x6cdata_offsets\x82\x00\x08"),
        "an indefinite-length map": notes_example(b"\xa1\x67tensors\xbf\x61w\xa3" + desc + b"\xff"),
        "descriptor keys out of order": notes_example(
            b"\xa1\x67tensors\xa1\x61w\xa3\x65shape\x81\x02\x65dtype\x63F32"
            b"\x6cdata_offsets\x82\x00\x08"),
        "a tag": notes_example(b"\xa1\x67tensors\xa1\x61w\xd8\x18\xa3" + desc),
        "a non-zero padding byte": notes_example(pad=b"\x01"),
        "a byte after the last tensor": notes_example(tail=b"\x00"),
        "a byte length that is not numel x 4": notes_example(
            b"\xa1\x67tensors\xa1\x61w\xa3\x65dtype\x63F32\x65shape\x81\x02"
            b"\x6cdata_offsets\x82\x00\x07", data=b"\0" * 7),
        "a tensor not at align(previous end)": notes_example(
            b"\xa1\x67tensors\xa1\x61w\xa3\x65dtype\x63F32\x65shape\x81\x02"
            b"\x6cdata_offsets\x82\x01\x09", data=b"\0" * 9),
        "an empty metadata map": notes_example(
            b"\xa2\x67tensors\xa1\x61w\xa3" + desc + b"\x68metadata\xa0"),
        "a dtype Burn lacks": notes_example(
            b"\xa1\x67tensors\xa1\x61w\xa3\x65dtype\x63C64\x65shape\x81\x01"
            b"\x6cdata_offsets\x82\x00\x08"),
    }
    for what, blob in bad.items():
        try:
            bpr.parse(blob)
            tap.ok(False, "strict reader refuses %s" % what, ["accepted"])
        except bpr.BurnpackError as e:
            tap.ok(True, "strict reader refuses %s (%s)" % (what, e))


# ---------------------------------------------------------------------------
# Refusals


def refusal_cases(fixtures):
    cases = []

    def load(path):
        with open(path, encoding="utf-8") as f:
            return json.load(f)

    mp = os.path.join(fixtures, "dtypes", "manifest.json")
    if os.path.isfile(mp):
        m = load(mp)
        cases.append(("unsupported dtypes (safetensors C64, F8, F6, F4)",
                      os.path.join(fixtures, "dtypes", m["source"]),
                      [t["name"] for t in m["tensors"] if t["dtype"] not in BURN_DTYPE]))
    mp = os.path.join(REPO, "tests", "fixtures", "torch", "manifest.json")
    if os.path.isfile(mp):
        for fx in load(mp)["fixtures"]:
            if fx["file"] == "state_dict.pt":
                cases.append(("unsupported dtypes (torch complex64/complex128)",
                              os.path.join(os.path.dirname(mp), fx["file"]),
                              [t["name"] for t in fx["tensors"] if t["dtype"] not in BURN_DTYPE]))
    mp = os.path.join(fixtures, "gguf", "v3", "manifest.json")
    if os.path.isfile(mp):
        m = load(mp)
        cases.append(("unsupported dtypes (ggml block types)",
                      os.path.join(os.path.dirname(mp), m["sources"][0]),
                      [t["name"] for t in m["tensors"] if t["dtype"] not in BURN_DTYPE]))
    mp = os.path.join(fixtures, "dcphf", "hole", "manifest.json")
    if os.path.isfile(mp):
        m = load(mp)
        cases.append(("incomplete tensor (dcphf hole)", os.path.dirname(mp),
                      [t["name"] for t in m["tensors"] if t["incomplete"]]))
    return cases


def run_refusal(tap, tools, work, label, src, names, existing):
    out = os.path.join(work, "refused.bpk")
    if existing:
        with open(out, "wb") as f:
            f.write(b"keep me")
    rc, err, took = convert(tools, src, out)
    lines = err.strip().splitlines()
    what = "%s%s" % (label, ", over an existing OUT" if existing else "")
    problems = []
    if rc != 2:
        problems.append("exit status %r, want 2" % rc)
    if len(lines) != 1:
        problems.append("stderr has %d lines, want 1: %r" % (len(lines), err))
    elif not any('"%s"' % n in lines[0] for n in names):
        problems.append("message names none of %r: %s" % (names, lines[0]))
    if took >= REFUSE_TIMEOUT:
        problems.append("took %.1f s" % took)
    tap.ok(not problems, "%s: refused with exit 2 and one line naming the tensor" % what,
           problems + lines[:1])
    problems = leftovers(work, "refused.bpk")
    if existing:
        if not os.path.isfile(out) or read_bytes(out) != b"keep me":
            problems.append("the existing OUT was changed")
    elif os.path.exists(out):
        problems.append("OUT was created")
    tap.ok(not problems, "%s: %s and no temporary file"
           % (what, "OUT untouched" if existing else "no OUT"), problems)
    if os.path.exists(out):
        os.unlink(out)


# ---------------------------------------------------------------------------


def main():
    tools = os.environ.get("TOOLS", "")
    fixtures = os.environ.get("FIXTURES", "")
    tool = os.path.join(tools, "convert_tool")
    if not os.access(tool, os.X_OK):
        print("1..0 # SKIP TOOLS/convert_tool (%r) is not an executable" % tool)
        return 0
    if not fixtures or not os.path.isdir(fixtures):
        print("1..0 # SKIP FIXTURES (%r) is not a directory" % fixtures)
        return 0
    sys.stdout.reconfigure(encoding="utf-8", errors="backslashreplace")
    tools, fixtures = os.path.abspath(tools), os.path.abspath(fixtures)
    ckptfs = os.environ.get("CKPTFS", "")
    reason = skip_reason(ckptfs, fixtures)
    ckptfs = None if reason else os.path.abspath(ckptfs)

    tap = Tap()
    if reason:
        tap.diag("outputs are not mounted: " + reason)
    work = tempfile.mkdtemp(prefix="ckptfs-t63-work.")
    try:
        reader_self_test(tap)
        cases = []
        mnist = mnist_case(tap)
        if mnist:
            cases.append(mnist)
        cases += burnpack_cases(tap, fixtures)
        cases += other_cases(tap, fixtures, work)
        for case in cases:
            run_case(tap, tools, ckptfs, work, case)
        refusals = refusal_cases(fixtures)
        tap.ok(len(refusals) == 4, "found the refusal sources (%d)" % len(refusals))
        for i, (label, src, names) in enumerate(refusals):
            run_refusal(tap, tools, work, label, src, names, existing=False)
            if i == 0:
                run_refusal(tap, tools, work, label, src, names, existing=True)
    finally:
        for n in os.listdir(work):
            os.unlink(os.path.join(work, n))
        os.rmdir(work)
    tap.done()
    return 1 if tap.failed else 0


if __name__ == "__main__":
    sys.exit(main())
