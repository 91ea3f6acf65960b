#!/usr/bin/python3
"""ckptfs ls | info | cat | verify: reading checkpoints without a mount.

Environment:
  CKPTFS    path of the ckptfs binary
  FIXTURES  output directory of the fixture generators (tests/gen/*_fixtures.py)

Everything is compared with the manifests the (independent) Python generators wrote:
names, dtypes, shapes, sizes and the sha256 of every tensor's bytes. No /dev/fuse needed.
"""

import fnmatch
import glob
import hashlib
import json
import os
import pty
import random
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from ckptfs_test import Tap, run_capture  # noqa: E402

TIMEOUT = 60          # seconds for one command
REFUSE_TIMEOUT = 10   # seconds for a hostile file to be refused

CKPTFS = os.environ.get("CKPTFS", "")
FIXTURES = os.environ.get("FIXTURES", "")
with open(os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "..", "man",
                       "ckptfs.1")) as _f:
    MAN = _f.read()


def ck(*args, timeout=TIMEOUT):
    return run_capture([CKPTFS] + [str(a) for a in args], timeout)


def lines(data):
    return data.decode("utf-8", "replace").splitlines()


def one_line(err):
    text = err.decode("utf-8", "replace")
    return text.count("\n") == 1 and text.endswith("\n")


def display(name):
    """A name as `ckptfs ls` prints it: control bytes, DEL and '%' as %XX."""
    out = bytearray()
    for b in name.encode("utf-8"):
        out += b"%%%02X" % b if b < 0x20 or b == 0x7F or b == 0x25 else bytes([b])
    return bytes(out)


def unmatched_lines(tensors, got):
    """Manifest tensors without their ls line: NAME, or DIR/NAME for a tensor the checkpoint
    shows under the directory DIR (its tree path starts with DIR/)."""
    left = list(got)
    missing = []
    for t in tensors:
        name = display(t["name"])
        for i, line in enumerate(left):
            prefix = line[:-len(name)] if line.endswith(name) else None
            if prefix == b"" or (prefix and prefix.endswith(b"/")
                                 and t["path"].encode().startswith(prefix)):
                del left[i]
                break
        else:
            missing.append("no line for %r" % t["name"])
    return missing


def sha(data):
    return hashlib.sha256(data).hexdigest()


def fixture(rel):
    return os.path.join(FIXTURES, rel)


def manifests():
    """(relative dir, manifest path, source path, manifest) for every manifest with a
    "tensors" list."""
    out = []
    for m in sorted(glob.glob(os.path.join(FIXTURES, "**", "manifest.json"), recursive=True)):
        try:
            with open(m) as f:
                doc = json.load(f)
        except (OSError, ValueError):
            continue
        if not isinstance(doc, dict) or not isinstance(doc.get("tensors"), list):
            continue
        d = os.path.dirname(m)
        src = doc.get("source")
        if src is None and doc.get("files"):
            src = doc["files"][0]["file"]
        out.append((os.path.relpath(d, FIXTURES), m, os.path.join(d, src or "."), doc))
    return out


def load_manifest(rel):
    for r, m, src, doc in manifests():
        if r == rel:
            return m, src, doc
    return None, None, None


# ---------------------------------------------------------------------------
# help and usage

def check_help(tap):
    rc, out, err = ck("help")
    text = out.decode()
    tap.ok(rc == 0 and all(c in text for c in ("ls", "info", "cat", "verify")),
           "ckptfs help: exit 0, names every command", [rc, err])
    for cmd in ("ls", "info", "cat", "verify"):
        rc, out, err = ck(cmd, "--help")
        n = len(lines(out))
        w = max(len(ln) for ln in lines(out)) if out else 0
        tap.ok(rc == 0 and out.startswith(b"Usage: ckptfs " + cmd.encode()) and n <= 24
               and w <= 80, "ckptfs %s --help: exit 0, fits a screen (%d lines, %d columns)"
               % (cmd, n, w), [rc, err])
        opts = sorted(set(re.findall(r"^ +(?:-\w, )?(--?[a-z][a-z-]*)", out.decode(), re.M)))
        missing = [o for o in opts if o.replace("-", "\\-") not in MAN]
        tap.ok(opts and not missing, "ckptfs %s: every option of --help is in ckptfs(1) (%s)"
               % (cmd, " ".join(opts)), missing)
        rc2, out2, _ = ck("help", cmd)
        tap.ok(rc2 == 0 and out2 == out, "ckptfs help %s = ckptfs %s --help" % (cmd, cmd))
    rc, _, err = ck("help", "nope")
    tap.ok(rc == 1 and one_line(err), "ckptfs help nope: exit 1, one line", [rc, err])


def check_usage(tap):
    src = fixture("dtypes/model.safetensors")
    cases = [
        ("ls without SOURCE", ["ls"]),
        ("unknown long option", ["ls", src, "--bogus"]),
        ("unknown short option", ["ls", "-z", src]),
        ("--json with --long", ["ls", "--json", "-l", src]),
        ("info with two sources", ["info", src, src]),
        ("info without SOURCE", ["info"]),
        ("cat without NAME", ["cat", src]),
        ("cat with three operands", ["cat", src, "a", "b"]),
        ("cat --offset not a number", ["cat", src, "model.layers.0.mlp.u8", "--offset", "x1"]),
        ("cat --offset negative", ["cat", src, "model.layers.0.mlp.u8", "--offset=-1"]),
        ("cat --length overflowing", ["cat", src, "model.layers.0.mlp.u8",
                                      "--length", "99999999999999999999"]),
        ("cat --offset without value", ["cat", src, "model.layers.0.mlp.u8", "--offset"]),
        ("cat --offset past the end", ["cat", src, "model.layers.0.mlp.u8", "--offset", "8"]),
        ("verify without SOURCE", ["verify"]),
        ("verify --manifest without value", ["verify", src, "--manifest"]),
        ("unknown -o option", ["ls", src, "-o", "bogus=1"]),
        ("-o tp_splt typo", ["info", src, "-o", "tp_splt=*:0"]),
        ("unknown command word after help", ["help", "ls", "extra"]),
    ]
    for desc, args in cases:
        rc, out, err = ck(*args)
        tap.ok(rc == 1 and one_line(err) and not out,
               "usage error, %s: exit 1, one line, no output" % desc,
               ["exit %r" % rc] + lines(err)[:3])
    for args, words in ((["cat", src, "x", "--offset"], b"option --offset needs a value"),
                        (["ls", "--json=1", src], b"option --json takes no value"),
                        (["ls", "-j", src], b"unknown option -j"),
                        (["ls", src, "--bogus"], b"unknown option --bogus"),
                        (["cat", src, "x", "--length=12x"], b"--length=12x: expected a number")):
        rc, out, err = ck(*args)
        tap.ok(rc == 1 and words in err and one_line(err),
               "usage message for %s: %s" % (" ".join(args[:1] + args[2:]), words.decode()),
               [rc, err])
    rc, out, err = ck("ls", "--", src)
    tap.ok(rc == 0 and out, "`--` ends the options", [rc, err])


# ---------------------------------------------------------------------------
# ls

def check_ls(tap):
    for rel, m, src, doc in manifests():
        tensors = doc["tensors"]
        rc, out, err = ck("ls", src)
        got = out.split(b"\n")[:-1] if out else []
        unmatched = unmatched_lines(tensors, got)
        tap.ok(rc == 0 and len(got) == len(tensors) and not unmatched,
               "ls %s: one line per manifest tensor (%d)" % (rel, len(tensors)),
               ["exit %r, %d lines" % (rc, len(got))] + unmatched[:5] + lines(err)[:2])

        rc, out, err = ck("ls", "--json", src)
        problems = []
        try:
            arr = json.loads(out)
            by = {e["name"]: e for e in arr}
            if len(arr) != len(tensors):
                problems.append("%d entries, want %d" % (len(arr), len(tensors)))
            for t in tensors:
                e = by.get(t["name"])
                if e is None:
                    problems.append("no entry for %r" % t["name"])
                    continue
                for k in ("dtype", "shape", "nbytes", "path"):
                    if k in t and e.get(k) != t[k]:
                        problems.append("%s %s: %r, want %r" % (t["name"], k, e.get(k), t[k]))
                if e.get("incomplete") is not bool(t.get("incomplete", False)):
                    problems.append("%s incomplete: %r" % (t["name"], e.get("incomplete")))
        except (ValueError, KeyError, TypeError) as ex:
            problems.append("not the expected JSON: %s" % ex)
        tap.ok(rc == 0 and not problems, "ls --json %s: name, dtype, shape, nbytes, path, "
               "incomplete as in the manifest" % rel, problems[:8] + lines(err)[:2])

    m, src, doc = load_manifest("sharded")
    if src:
        rc, out, err = ck("ls", "-l", src)
        ok = rc == 0 and len(lines(out)) == len(doc["tensors"])
        for t, line in zip(sorted(doc["tensors"], key=lambda t: t["name"]), lines(out)):
            shape = "[" + ",".join(str(d) for d in t["shape"]) + "]"
            f = line.split()
            ok = ok and f[0] == t["dtype"] and f[1] == shape and f[-1] == t["name"]
        tap.ok(ok, "ls -l sharded: dtype, shape, size, name on each line", lines(out)[:3])
        ok = all(("B" in ln) for ln in lines(out))
        tap.ok(ok, "ls -l sharded: sizes are humanized", lines(out)[:3])

        names = [t["name"] for t in doc["tensors"]]
        for pats in (["model.layers.0.*"], ["*norm*", "model.embed_tokens.weight"], ["*.weight"]):
            want = sorted(n for n in names if any(fnmatch.fnmatchcase(n, p) for p in pats))
            rc, out, err = ck("ls", src, *pats)
            tap.ok(rc == 0 and sorted(lines(out)) == want,
                   "ls sharded %s: the names fnmatch keeps (%d)" % (" ".join(pats), len(want)),
                   [rc, lines(out)[:4], err])
        rc, out, err = ck("ls", src, "model.*", "no.such.*")
        tap.ok(rc == 2 and b"no.such.*" in err and one_line(err),
               "ls with a GLOB that matches nothing: exit 2 naming it", [rc, err])

    m, src, doc = load_manifest("nemo/step_consolidated")
    if src:
        rc, out, err = ck("ls", src, "lm_head*")
        tap.ok(rc == 0 and lines(out) == ["model/lm_head.weight"],
               "ls nemo step: a GLOB also matches the name without its directory", [rc, out])
        problems, listed = [], lines(ck("ls", src)[1])
        for t in doc["tensors"]:
            line = [ln for ln in listed if ln.endswith("/" + t["name"])]
            for form in line:
                rc, out, err = ck("cat", src, form)
                if rc != 0 or sha(out) != t["sha256"]:
                    problems.append("%s: exit %r" % (form, rc))
            if not line:
                problems.append("no DIR/NAME line for %s" % t["name"])
        tap.ok(not problems, "cat nemo step by the DIR/NAME that ls prints", problems[:5])
        rc, out, err = ck("ls", "--json", src)
        arr = json.loads(out) if rc == 0 else []
        tap.ok(arr and all(e.get("prefix") in ("model/", "optim/") and
                           e.get("aside") is (e["prefix"] == "optim/") for e in arr),
               "ls --json nemo step: prefix and aside of each tensor", [e for e in arr[:3]])

    m, src, doc = load_manifest("odd")
    if src:
        rc, out, err = ck("ls", src, "ctl%01z")
        tap.ok(rc == 0 and out == b"ctl%01z\n",
               "ls odd: a GLOB matches the printed (%XX) form of a name", [rc, out, err])


# ---------------------------------------------------------------------------
# info

def check_info(tap):
    for rel in ("dtypes", "sharded", "dcphf/dim1x4", "dcphf/hole", "gguf/split",
                "lwt/all-variants", "gptrs/chk-odd", "burnpack/good/aligned-all-dtypes"):
        m, src, doc = load_manifest(rel)
        if not src:
            tap.ok(False, "fixture %s exists" % rel)
            continue
        tensors = doc["tensors"]
        rc, out, err = ck("info", "--json", src)
        problems = []
        try:
            s = json.loads(out)
            if s.get("tensor_count") != len(tensors):
                problems.append("tensor_count %r, want %d" % (s.get("tensor_count"), len(tensors)))
            if s.get("total_bytes") != sum(t["nbytes"] for t in tensors):
                problems.append("total_bytes %r" % s.get("total_bytes"))
            counts = {}
            for t in tensors:
                counts[t["dtype"]] = counts.get(t["dtype"], 0) + 1
            got = {k: v.get("tensors") for k, v in s.get("dtypes", {}).items()}
            if got != counts:
                problems.append("dtypes %r, want %r" % (got, counts))
            inc = sum(1 for t in tensors if t.get("incomplete"))
            if s.get("incomplete_tensors") != inc:
                problems.append("incomplete_tensors %r, want %d" % (s.get("incomplete_tensors"),
                                                                     inc))
            files = s.get("files")
            if not files or any(not isinstance(f.get("size"), int) for f in files):
                problems.append("files %r" % files)
        except (ValueError, AttributeError, TypeError) as ex:
            problems.append("not JSON: %s" % ex)
        tap.ok(rc == 0 and not problems, "info --json %s: counts, bytes, dtypes as in the "
               "manifest" % rel, problems + lines(err)[:2])

        rc, out, err = ck("info", src)
        text = out.decode()
        count = re.search(r"^tensors +(\d+)$", text, re.M)
        model = [t for t in tensors if not t.get("aside")]
        tap.ok(rc == 0 and count and int(count.group(1)) == len(model) and "parameters" in text
               and "format" in text
               and "by dtype" in text and "warnings" in text,
               "info %s: a readable summary" % rel, text.splitlines()[:12] + lines(err)[:2])

    src = fixture("dcphf/big_dim1")
    if os.path.isdir(src):
        rc, out, err = ck("info", src)
        text = out.decode()
        tap.ok("1.0M (1,048,576)" in text and "4.0 MiB (4,194,304 bytes)" in text,
               "info big_dim1: parameters 1.0M (1,048,576), 4.0 MiB", text.splitlines())
    src = fixture("dcphf/hole")
    if os.path.isdir(src):
        rc, out, err = ck("info", src)
        text = out.decode()
        tap.ok(rc == 0 and "2 tensors with holes" in text and "hole.big" in text
               and "hole.small" in text, "info hole: names the incomplete tensors",
               text.splitlines())


# ---------------------------------------------------------------------------
# cat

CAT_CASES = ("dtypes", "odd", "sharded", "both", "dcphf/dim1x4", "dcphf/grid", "dcphf/mixed",
             "dcphf/big_dim1", "dcphf/sharded_sub", "dcphf/hole", "gguf/v3", "gguf/split",
             "lwt/natural", "gptrs/chk-layout", "gptrs/ten-v2", "burnpack/good/unaligned",
             "nemo/step_consolidated")


def check_cat_all(tap):
    for rel in CAT_CASES:
        m, src, doc = load_manifest(rel)
        if not src:
            tap.ok(False, "fixture %s exists" % rel)
            continue
        problems, n = [], 0
        for t in doc["tensors"]:
            if t.get("sha256") is None:
                continue
            n += 1
            rc, out, err = ck("cat", src, t["name"])
            if rc != 0 or len(out) != t["nbytes"] or sha(out) != t["sha256"]:
                problems.append("%r: exit %r, %d bytes, %s" % (t["name"], rc, len(out),
                                                               err.decode()[:200]))
        tap.ok(not problems and n > 0,
               "cat %s: sha256 of every tensor's bytes = manifest (%d tensors)" % (rel, n),
               problems[:6])

    m, src, doc = load_manifest("sharded")
    if src:
        problems = []
        for t in doc["tensors"][:6]:
            for form in (t["path"], "/" + t["path"]):
                rc, out, err = ck("cat", src, form)
                if rc != 0 or sha(out) != t["sha256"]:
                    problems.append("%s: exit %r" % (form, rc))
        tap.ok(not problems, "cat by tree path (with or without a leading /)", problems)

    m, src, doc = load_manifest("odd")
    if src:
        problems = []
        names = {t["name"] for t in doc["tensors"]}
        for t in doc["tensors"]:
            forms = {display(t["name"]).decode(), t["path"]}
            if t["path"].endswith(".raw"):
                forms.add(t["path"][:-4])
            for form in forms:
                if form != t["name"] and form in names:
                    continue  # another tensor's exact name: that one wins
                rc, out, err = ck("cat", src, form)
                if rc != 0 or sha(out) != t["sha256"]:
                    problems.append("%r -> exit %r, %s" % (form, rc, err.decode()[:120]))
        tap.ok(not problems, "cat odd names: %XX form, tree path, path without .raw",
               problems[:6])
        rc, out, err = ck("cat", src, "ctl\x01z")
        want = [t for t in doc["tensors"] if t["name"] == "ctl\x01z"]
        tap.ok(rc == 0 and want and sha(out) == want[0]["sha256"],
               "cat odd: the exact name with a control byte", [rc, err])


def check_cat_errors(tap):
    src = fixture("dtypes/model.safetensors")
    rc, out, err = ck("cat", src, "no.such.tensor")
    tap.ok(rc == 2 and not out and one_line(err)
           and b"no tensor named no.such.tensor (see: ckptfs ls " in err,
           "cat unknown tensor: exit 2, says so and points at ls", [rc, err])

    hole = fixture("dcphf/hole")
    m, _, doc = load_manifest("dcphf/hole")
    if not doc:
        tap.ok(False, "fixture dcphf/hole exists")
        return
    rc, out, err = ck("cat", hole, "hole.big")
    tap.ok(rc == 2 and not out and one_line(err) and b"Input/output error" in err
           and b"hole.big" in err,
           "cat of a tensor with a hole: exit 2, EIO message, nothing written",
           [rc, len(out), err])
    big = [t for t in doc["tensors"] if t["name"] == "hole.big"][0]
    chunks = sorted(big["chunks"], key=lambda c: c["offsets"][0])
    row = big["shape"][1] * 4

    def chunk_bytes(c, start, length):
        with open(os.path.join(hole, c["file"]), "rb") as f:
            f.seek(c["data_offset"] + start)
            return f.read(length)

    first = chunks[0]
    n = first["sizes"][0] * row
    rc, out, err = ck("cat", hole, "hole.big", "--offset", 0, "--length", n)
    tap.ok(rc == 0 and out == chunk_bytes(first, 0, n),
           "cat --length of the part before the hole: the first chunk's bytes", [rc, err])
    last = chunks[-1]
    start = last["offsets"][0] * row
    rc, out, err = ck("cat", hole, "hole.big", "--offset", start + 100, "--length", 1000)
    tap.ok(rc == 0 and out == chunk_bytes(last, 100, 1000),
           "cat --offset into the part after the hole", [rc, err])
    gap = next(c["offsets"][0] + c["sizes"][0] for c, d in zip(chunks, chunks[1:])
               if c["offsets"][0] + c["sizes"][0] < d["offsets"][0]) * row
    rc, out, err = ck("cat", hole, "hole.big", "--offset", gap - 10, "--length", 20)
    tap.ok(rc == 2 and not out and one_line(err) and b"bytes %d.." % gap in err,
           "cat of a slice that runs into the hole: exit 2 naming the first missing byte",
           [rc, err])


def check_cat_slices(tap):
    rnd = random.Random(22)
    for rel in ("dcphf/dim1x4", "dcphf/grid", "dcphf/big_dim1", "dtypes"):
        m, src, doc = load_manifest(rel)
        if not src:
            tap.ok(False, "fixture %s exists" % rel)
            continue
        problems = []
        for t in doc["tensors"][:4]:
            rc, full, err = ck("cat", src, t["name"])
            nb = t["nbytes"]
            if rc != 0 or len(full) != nb:
                problems.append("%s: full read failed" % t["name"])
                continue
            pairs = [(0, nb), (0, 1), (nb - 1, 1), (nb, 5), (nb // 2, nb), (1, 0)]
            pairs += [(rnd.randrange(nb), rnd.randrange(nb + 1)) for _ in range(3)]
            for off, length in pairs:
                rc, out, err = ck("cat", src, t["name"], "--offset", off, "--length", length)
                if rc != 0 or out != full[off:off + length]:
                    problems.append("%s [%d,+%d): exit %r, %d bytes" % (t["name"], off, length,
                                                                         rc, len(out)))
            rc, out, err = ck("cat", src, t["name"], "--offset", nb // 3)
            if rc != 0 or out != full[nb // 3:]:
                problems.append("%s --offset only" % t["name"])
        tap.ok(not problems, "cat --offset/--length slices of %s = slices of the whole" % rel,
               problems[:6])


def run_on_pty(argv, which, timeout=TIMEOUT):
    """Runs argv with stdout (which=1) or stderr (which=2) on a pseudo-terminal and the other
    stream in a file; returns (rc, what the terminal got, the file's bytes, seconds)."""
    master, slave = pty.openpty()
    got = bytearray()

    def drain():
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                return
            if not chunk:
                return
            got.extend(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    with tempfile.TemporaryFile() as other:
        kw = {"stdout": slave, "stderr": other} if which == 1 else \
             {"stdout": other, "stderr": slave}
        started = time.monotonic()
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, **kw)
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            rc = p.wait()
            rc = None
        took = time.monotonic() - started
        os.close(slave)
        reader.join(5)
        os.close(master)
        other.seek(0)
        return rc, bytes(got), other.read(), took


def check_cat_output(tap):
    src = fixture("dtypes/model.safetensors")
    rc, on_tty, err, _ = run_on_pty([CKPTFS, "cat", src, "model.layers.0.mlp.u8"], 1)
    tap.ok(rc == 1 and b"terminal" in err and one_line(err) and not on_tty,
           "cat to a terminal: refused with exit 1, nothing written", [rc, err, on_tty])
    rc, on_tty, err, _ = run_on_pty([CKPTFS, "cat", "--force", src, "model.layers.0.mlp.u8"], 1)
    tap.ok(rc == 0 and len(on_tty) >= 7, "cat --force to a terminal writes", [rc, err])

    big = fixture("dcphf/big_dim1")
    with tempfile.TemporaryFile() as err:
        p = subprocess.run(["bash", "-c", '"$0" cat "$1" big.weight | head -c 1 | wc -c; '
                            'echo "${PIPESTATUS[0]}"', CKPTFS, big],
                           stdout=subprocess.PIPE, stderr=err, timeout=TIMEOUT)
        err.seek(0)
        msg = err.read()
    out = p.stdout.decode().split()
    tap.ok(out == ["1", "4"] and not msg,
           "cat of 4 MiB | head -c 1: quiet, exit status 4 (closed pipe)", [out, msg])
    with tempfile.TemporaryFile() as err:
        p = subprocess.run(["bash", "-c", '"$0" ls "$1" | head -n 1 >/dev/null; '
                            'echo "${PIPESTATUS[0]}"', CKPTFS, fixture("sharded")],
                           stdout=subprocess.PIPE, stderr=err, timeout=TIMEOUT)
        err.seek(0)
        msg = err.read()
    tap.ok(p.stdout.strip() in (b"0", b"4") and not msg, "ls | head -n 1: quiet",
           [p.stdout, msg])
    if os.path.exists("/dev/full"):
        with open("/dev/full", "wb") as full:
            p = subprocess.run([CKPTFS, "cat", src, "model.layers.0.mlp.u8"], stdout=full,
                               stderr=subprocess.PIPE, timeout=TIMEOUT)
        tap.ok(p.returncode == 4 and b"No space left" in p.stderr and p.stderr.count(b"\n") == 1,
               "cat to /dev/full: exit 4 with one line", [p.returncode, p.stderr])


# ---------------------------------------------------------------------------
# verify

def check_verify_fixtures(tap):
    for rel, m, src, doc in manifests():
        rc, out, err = ck("verify", "-q", src, "--manifest", m)
        text = out.decode()
        tap.ok(rc == 0 and "format checks: passed at open" in text,
               "verify %s --manifest manifest.json: exit 0" % rel,
               ["exit %r" % rc] + text.splitlines()[-4:] + lines(err)[:2])


def write_json(path, doc):
    with open(path, "w") as f:
        json.dump(doc, f)


def check_verify_tampered(tap, tmp):
    m, src, doc = load_manifest("dtypes")
    if not src:
        tap.ok(False, "fixture dtypes exists")
        return
    rc, out, err = ck("verify", src, "--manifest", m)
    text = out.decode()
    tap.ok(rc == 0 and text.count("\nOK ") + text.startswith("OK ") == len(doc["tensors"]),
           "verify dtypes: one OK line per tensor", text.splitlines()[:3])

    victim = doc["tensors"][3]["name"]
    cases = []
    d = json.loads(json.dumps(doc))
    d["tensors"][3]["sha256"] = "0" * 64
    cases.append(("a changed sha256", d, "MISMATCH", victim, "sha256"))
    d = json.loads(json.dumps(doc))
    d["tensors"][3]["nbytes"] += 1
    cases.append(("a changed nbytes", d, "MISMATCH", victim, "nbytes"))
    d = json.loads(json.dumps(doc))
    del d["tensors"][3]
    cases.append(("a tensor left out", d, "NEW", victim, "not in the manifest"))
    d = json.loads(json.dumps(doc))
    d["tensors"].append(dict(doc["tensors"][0], name="model.ghost"))
    cases.append(("an extra entry", d, "MISSING", "model.ghost", "not in the source"))
    d = json.loads(json.dumps(doc))
    d["tensors"][3]["sha256"] = None
    cases.append(("sha256 null for a complete tensor", d, "MISMATCH", victim, "no sha256"))
    for desc, d, word, name, detail in cases:
        path = os.path.join(tmp, "tampered.json")
        write_json(path, d)
        rc, out, err = ck("verify", src, "--manifest", path)
        bad = [ln for ln in lines(out) if not ln.startswith("OK ")]
        want = "%-11s %s: " % (word, name)
        tap.ok(rc == 3 and any(ln.startswith(want) and detail in ln for ln in bad),
               "verify with %s: exit 3, a %s line naming %s" % (desc, word, name),
               ["exit %r" % rc] + bad[:4] + lines(err)[:2])
        rc, out, err = ck("verify", "-q", "--json", src, "--manifest", path)
        try:
            r = json.loads(out)
            good = (r["result"] == "mismatch" and
                    (r["counts"]["mismatch"] + r["counts"]["new"] + r["counts"]["missing"]) == 1)
        except (ValueError, KeyError):
            good = False
        tap.ok(rc == 3 and good, "verify --json with %s: result mismatch, one problem" % desc,
               [rc, out[:300]])
    rc, out, err = ck("verify", "-q", src, "--manifest", os.path.join(tmp, "tampered.json"))
    tap.ok(rc == 3 and len(lines(out)) == 3, "verify -q: only the problem and the totals",
           lines(out))


def check_verify_manifests(tap, tmp):
    m, src, doc = load_manifest("dcphf/hole")
    if src:
        d = json.loads(json.dumps(doc))
        for t in d["tensors"]:
            if t["name"] == "hole.small":
                t["sha256"] = "ab" * 32
        path = os.path.join(tmp, "hole-claims-digest.json")
        write_json(path, d)
        rc, out, err = ck("verify", "-q", src, "--manifest", path)
        tap.ok(rc == 3 and any(ln.startswith("MISMATCH    hole.small: has holes") for ln in
                               lines(out)),
               "verify: a tensor with holes whose manifest entry has a digest is a MISMATCH",
               lines(out))
    for rel in ("sharded", "dcphf/hole", "dcphf/grid", "gguf/split"):
        m, src, doc = load_manifest(rel)
        if not src:
            tap.ok(False, "fixture %s exists" % rel)
            continue
        out_m = os.path.join(tmp, rel.replace("/", "_") + ".json")
        rc, out, err = ck("verify", "-q", src, "--write-manifest", out_m)
        problems = []
        try:
            with open(out_m) as f:
                w = json.load(f)
            by = {t["name"]: t for t in w["tensors"]}
            for t in doc["tensors"]:
                e = by.get(t["name"])
                if not e or e["sha256"] != t["sha256"] or e["nbytes"] != t["nbytes"] \
                        or e["dtype"] != t["dtype"] or e["shape"] != t["shape"]:
                    problems.append("%s: %r" % (t["name"], e))
            if len(by) != len(doc["tensors"]):
                problems.append("%d entries" % len(by))
        except (OSError, ValueError, KeyError) as ex:
            problems.append(str(ex))
        tap.ok(rc == 0 and not problems,
               "verify --write-manifest %s: digests equal the generator's (null for holes)"
               % rel, ["exit %r" % rc] + problems[:5] + lines(err)[:2])
        rc, out, err = ck("verify", "-q", src, "--manifest", out_m)
        tap.ok(rc == 0, "verify %s against the manifest it wrote: exit 0" % rel,
               [rc] + lines(out)[-3:])
        leftovers = [f for f in os.listdir(tmp) if ".tmp." in f]
        tap.ok(not leftovers, "no temporary file left behind", leftovers)

        rc, out, err = ck("verify", "--json", src)
        jpath = os.path.join(tmp, "result.json")
        with open(jpath, "wb") as f:
            f.write(out)
        rc2, out2, err2 = ck("verify", "-q", src, "--manifest", jpath)
        try:
            r = json.loads(out)
            good = r["result"] == "hashed" and r["format_checks"] == "passed at open"
        except (ValueError, KeyError):
            good = False
        tap.ok(rc == 0 and good and rc2 == 0,
               "verify --json %s: parses, and serves as a manifest" % rel, [rc, rc2, out2[-200:]])

    m, src, doc = load_manifest("sharded")
    if src:
        rc, out, err = ck("verify", src)
        want = sorted("%s  %s" % (t["sha256"], t["name"]) for t in doc["tensors"])
        got = sorted(ln for ln in lines(out) if len(ln) > 66 and ln[64:66] == "  ")
        tap.ok(rc == 0 and got == want, "verify without a manifest: sha256sum-style lines",
               got[:2] + want[:2])

    for rel, word in (("lwt/natural", "CRC-32"), ("gptrs/chk-odd", "BLAKE3")):
        m, src, doc = load_manifest(rel)
        if src:
            rc, out, err = ck("verify", "-q", src)
            tap.ok(rc == 0 and b"format checks: passed at open" in out and word.encode() in out,
                   "verify %s: says the format's own %s was checked at open" % (rel, word),
                   lines(out)[-2:])


def check_verify_bad_manifests(tap, tmp):
    src = fixture("dtypes/model.safetensors")
    m, _, doc = load_manifest("dtypes")
    if not doc:
        return
    cases = [
        ("not JSON", b"{\"tensors\": [", "offset"),
        ("no tensors list", b"{\"files\": []}", "tensors"),
        ("sha256 not hex", json.dumps({"tensors": [dict(doc["tensors"][0], sha256="xyz")]})
         .encode(), "sha256"),
        ("no sha256", json.dumps({"tensors": [{"name": "a", "nbytes": 1}]}).encode(), "sha256"),
        ("nbytes negative", json.dumps({"tensors": [dict(doc["tensors"][0], nbytes=-1)]})
         .encode(), "nbytes"),
        ("a name twice", json.dumps({"tensors": [doc["tensors"][0], doc["tensors"][0]]})
         .encode(), "same tensor"),
        ("entry not an object", b"{\"tensors\": [1]}", "object"),
    ]
    path = os.path.join(tmp, "bad-manifest.json")
    for desc, text, word in cases:
        with open(path, "wb") as f:
            f.write(text)
        rc, out, err = ck("verify", src, "--manifest", path)
        tap.ok(rc == 2 and one_line(err) and b"bad-manifest.json" in err and word.encode() in err,
               "verify with a manifest with %s: exit 2, one line naming file and %s"
               % (desc, word), [rc, err])
    rc, out, err = ck("verify", src, "--manifest", os.path.join(tmp, "nope.json"))
    tap.ok(rc == 2 and one_line(err) and b"No such file" in err,
           "verify with a missing manifest: exit 2", [rc, err])
    rc, out, err = ck("verify", src, "--write-manifest", os.path.join(tmp, "no/dir/m.json"))
    tap.ok(rc == 4 and one_line(err), "verify --write-manifest into a missing directory: exit 4",
           [rc, err])


def check_progress(tap, tmp):
    """A 1 GiB sparse tensor takes over a second to hash: progress shows on a terminal only."""
    path = os.path.join(tmp, "sparse.safetensors")
    n = 1 << 30
    header = json.dumps({"big": {"dtype": "U8", "shape": [n], "data_offsets": [0, n]}}).encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        f.truncate(8 + len(header) + n)
    # hashlib.sha256(bytes(1 << 30)).hexdigest(), computed once
    want = b"49bc20df15e412a64472421e13fe86ff1c5165e18b2afccf160d4dc19fe68a14"
    rc, err_tty, out, took = run_on_pty([CKPTFS, "verify", path], 2)
    tap.ok(rc == 0 and out.startswith(want),
           "verify of a 1 GiB tensor: the right digest (%.1f s)" % took, [rc, out[:100]])
    # Progress starts after a second: on a machine that hashes 1 GiB faster than that, a
    # sparse tensor sized for ~3 s (at the rate just measured) makes the run long enough.
    if took < 1.5:
        gib = min(64, max(2, int(3.0 / max(took, 0.05)) + 1))
        with open(path, "r+b") as f:
            header = json.dumps({"big": {"dtype": "U8", "shape": [gib * n],
                                         "data_offsets": [0, gib * n]}}).encode()
            header += b" " * (-len(header) % 8)
            f.write(struct.pack("<Q", len(header)) + header)
            f.truncate(8 + len(header) + gib * n)
        rc, err_tty, out, took = run_on_pty([CKPTFS, "verify", path], 2)
        tap.ok(rc == 0 and took > 1.5, "verify of a %d GiB sparse tensor takes over 1.5 s (%.1f s)"
               % (gib, took), [rc, out[:100]])
    text = err_tty.decode("utf-8", "replace")
    tap.ok("verify: " in text and "/s" in text and "GiB" in text and "\x1b[K" in text,
           "progress on a terminal: bytes done / total, rate", [text[:300]])
    updates = text.count("\r") - 1
    tap.ok(updates <= 10 * took + 2, "progress updates at most ~10 a second (%d in %.1f s)"
           % (updates, took))
    rc, out, err = ck("verify", path)
    tap.ok(rc == 0 and not err, "no progress when stderr is not a terminal", [rc, err[:200]])
    os.unlink(path)


def check_torch(tap, tmp):
    """The committed torch fixtures: strided views and shared storages read through the
    planner must hash as the generator (real torch) recorded."""
    root = os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "fixtures", "torch")
    try:
        with open(os.path.join(root, "manifest.json")) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        tap.ok(False, "the committed torch fixtures (tests/fixtures/torch) load", [e])
        return
    for fx in doc.get("fixtures", []):
        if fx.get("expect") != "mount" or not fx.get("tensors"):
            continue
        m = os.path.join(tmp, "torch-manifest.json")
        write_json(m, {"tensors": fx["tensors"]})
        src = os.path.join(root, fx["file"])
        rc, out, err = ck("verify", "-q", src, "--manifest", m)
        tap.ok(rc == 0, "verify torch %s (%d tensors): exit 0" % (fx["file"], len(fx["tensors"])),
               [rc] + lines(out)[-4:] + lines(err)[:2])
        if fx["file"] != "views.pt":
            continue
        problems = []
        for t in fx["tensors"]:
            rc, out, err = ck("cat", src, t["name"])
            if rc != 0 or sha(out) != t["sha256"]:
                problems.append("%s: exit %r %s" % (t["name"], rc, err[:100]))
        tap.ok(not problems, "cat of every strided view in views.pt: sha256 = torch's", problems)


# ---------------------------------------------------------------------------
# per-rank copies and -o

def check_ranks(tap, tmp):
    d = fixture("mlfw/dir2")
    mpath = os.path.join(d, "manifest.json")
    if not os.path.exists(mpath):
        tap.ok(False, "fixture mlfw/dir2 exists")
        return
    with open(mpath) as f:
        doc = json.load(f)
    src = os.path.join(d, doc["source"])
    rc, out, err = ck("ls", "-a", src)
    got = set(lines(out))
    want = {".ckptfs/ranks/%d/%s" % (r["rank"], r["name"]) for r in doc["ranks"]}
    tap.ok(rc == 0 and want <= got, "ls -a: per-rank copies as .ckptfs/ranks/N/NAME",
           sorted(want - got)[:4])
    rc, plain, err = ck("ls", src)
    tap.ok(rc == 0 and not any(ln.startswith(".ckptfs/") for ln in lines(plain)),
           "ls without -a: model tensors only")
    rc, out, err = ck("info", src)
    tap.ok(rc == 0 and re.search(rb"^outside model +%d tensors" % len(doc["ranks"]), out, re.M),
           "info: counts the per-rank copies outside the model", lines(out)[-3:])
    problems = []
    for r in doc["ranks"][:8]:
        for form in (r["path"], ".ckptfs/ranks/%d/%s" % (r["rank"], r["name"])):
            rc, out, err = ck("cat", src, form)
            if rc != 0 or sha(out) != r["sha256"]:
                problems.append("%s: exit %r %s" % (form, rc, err[:100]))
    tap.ok(not problems, "cat of per-rank copies by path and by DIR/NAME: sha256 = manifest",
           problems)
    m = os.path.join(tmp, "ranks.json")
    rc, out, err = ck("verify", "-q", "-a", src, "--write-manifest", m)
    rc2, out2, err2 = ck("verify", "-q", src, "--manifest", m)
    with open(m) as f:
        w = json.load(f)
    paths = {t["path"]: t["sha256"] for t in w["tensors"]}
    good = all(paths.get(r["path"]) == r["sha256"] for r in doc["ranks"])
    tap.ok(rc == 0 and rc2 == 0 and good,
           "verify -a --write-manifest: per-rank digests; the manifest checks them again",
           [rc, rc2, lines(out2)[-3:]])
    for mpath in sorted(glob.glob(fixture("mlfw/*/manifest.json"))):
        with open(mpath) as f:
            mdoc = json.load(f)
        rel = os.path.relpath(os.path.dirname(mpath), FIXTURES)
        msrc = os.path.join(os.path.dirname(mpath), mdoc["source"])
        for mount in mdoc.get("mounts", []):
            if not mount["options"]:
                continue
            want = os.path.join(tmp, "mount-manifest.json")
            write_json(want, {"tensors": mount["tensors"]})
            rc, out, err = ck("verify", "-q", msrc, "--manifest", want, *mount["options"])
            rc2, out2, err2 = ck("verify", "-q", msrc, "--manifest", want)
            tap.ok(rc == 0 and rc2 == 3,
                   "%s, %s: verify with %s matches what the mount shows with it (and "
                   "differs without)" % (rel, mount["label"], " ".join(mount["options"])),
                   [rc, rc2] + lines(out)[-3:] + lines(err)[:2])
    rc, out, err = ck("ls", src, "-o", "tp_split=*:0")
    tap.ok(rc == 0 and out, "-o tp_split=... is accepted", [rc, err])
    rc, out, err = ck("info", "-o", "view=hf,readahead_kb=4096", src)
    tap.ok(rc == 0, "mount-only -o options are accepted and ignored", [rc, err])


# ---------------------------------------------------------------------------
# hostile inputs

def needle_matches(needle, text):
    text = text.lower()
    return all(any(w.lower() in text for w in group.split("|") if w)
               for group in needle.split("&"))


def read_cases(path):
    with open(path) as f:
        rows = [ln.rstrip("\n").split("\t") for ln in f if ln.strip()]
    head, rows = rows[0], rows[1:]
    return [dict(zip(head, r)) for r in rows]


def check_hostile(tap):
    hostile = fixture("hostile")
    cases = os.path.join(hostile, "cases.tsv")
    if not os.path.exists(cases):
        tap.ok(False, "hostile/cases.tsv exists")
        return
    for row in read_cases(cases):
        src = os.path.join(hostile, row["path"])
        started = time.monotonic()
        rc, out, err = run_capture([CKPTFS, "ls", src], REFUSE_TIMEOUT)
        took = time.monotonic() - started
        text = err.decode("utf-8", "replace")
        if row["expect"] == "refuse":
            tap.ok(rc == 2 and one_line(err) and not out and needle_matches(row["needle"], text)
                   and took < REFUSE_TIMEOUT,
                   "ls hostile %s: exit 2, one line with %r" % (row["path"], row["needle"]),
                   ["exit %r" % rc] + text.splitlines()[:3])
        else:
            rc2, out2, err2 = run_capture([CKPTFS, "verify", src], REFUSE_TIMEOUT * 3)
            tap.ok(rc == 0 and rc2 == 0, "hostile %s opens: ls and verify read it safely"
                   % row["path"], [rc, rc2, err[:200], err2[:200]])

    for rel in ("gguf/hostile", "lwt/hostile", "gptrs/hostile", "burnpack/hostile",
                "torch_hostile", "dcphf/hostile"):
        path = fixture(os.path.join(rel, "cases.tsv"))
        if not os.path.exists(path):
            continue
        rows = [r for r in read_cases(path) if r.get("expect", "refuse") == "refuse"][:10]
        problems = []
        for row in rows:
            src = os.path.join(os.path.dirname(path), row["path"])
            for cmd in (["verify", src], ["cat", src, "x"]):
                rc, out, err = run_capture([CKPTFS] + cmd, REFUSE_TIMEOUT)
                if rc != 2 or not one_line(err) or out:
                    problems.append("%s %s: exit %r, %r" % (cmd[0], row["path"], rc, err[:150]))
        tap.ok(rows and not problems,
               "%s: %d refused files give exit 2 and one line from verify and cat"
               % (rel, len(rows)), problems[:6])


def main():
    tap = Tap()
    if not CKPTFS or not os.access(CKPTFS, os.X_OK) or not os.path.isdir(FIXTURES or "/nonexistent"):
        print("1..0 # SKIP CKPTFS or FIXTURES not set")
        return 0
    tmp = tempfile.mkdtemp(prefix="ckptfs-t22.")
    try:
        check_help(tap)
        check_usage(tap)
        check_ls(tap)
        check_info(tap)
        check_cat_all(tap)
        check_cat_errors(tap)
        check_cat_slices(tap)
        check_cat_output(tap)
        check_verify_fixtures(tap)
        check_verify_tampered(tap, tmp)
        check_verify_manifests(tap, tmp)
        check_verify_bad_manifests(tap, tmp)
        check_torch(tap, tmp)
        check_ranks(tap, tmp)
        check_hostile(tap)
        check_progress(tap, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    tap.done()
    return 1 if tap.failed else 0


if __name__ == "__main__":
    sys.exit(main())
