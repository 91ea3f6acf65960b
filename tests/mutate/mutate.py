#!/usr/bin/python3
"""Mutation testing of the bounds checks of the decoders, the planner, the remote client, serve's
request checks and the stage's journal and spool: does the suite notice when a check moves by
one?

Each mutant changes one comparison of an if/while condition of a C file, where an operand
looks like a length, offset, size or count (type tags, pointers and loop indexes are left out):
  boundary   a > b  <->  a >= b,  a < b  <->  a <= b   (the check moves by one)
  shift      a > b  ->  a > (b + 1), a < b  ->  a < (b - 1), ...; a == b, a != b  ->  b + 1, b - 1
  one-sided  a != b  ->  a > b, a < b                   (an exact check lets one side through)
The mutants are built in a snapshot of the tree (OUT/src, built with -Werror: a mutant that
does not compile or warns is not counted), then the fast tests that concern the file run, its
own first, stopping at the first failure. A mutant that fails a test, or hangs one past 5x its
unmutated time (twice: a busy machine is not a hang), is killed; one that passes them all
survived. Survivors are either gaps in the suite or equivalent mutants (the report lists them
to judge).

  tests/mutate/mutate.py [--files core/model/planner.c,core/formats/gguf.c] [--limit N]
                         [--sample N] [--tests named|fast] [--list]
--files takes paths and group names: decoders (every file of core/formats/), remote
(core/io/remote/ and the block cache), serve (serve's request checks), stage (the journal and
the spool), all (every group); each file is run with the tests FIRST names for it (a file with
none is refused, so a new decoder cannot go unmeasured by accident).
--tests named (the default) runs only the tests FIRST names for the mutated file, and builds
only what they need: a mutant costs its build and a few seconds of tests, so a file of 60
mutants takes about ten minutes on 2 shared cores. --tests fast adds every other fast test
(about half a minute per mutant). --sample N keeps N mutants of each file, evenly spaced in
file order, so a large decoder is measured in proportion along its whole length.
Run by `make mutate` (not part of `make check`; MUTATE_FILES, MUTATE_SAMPLE and MUTATE_TESTS
pass --files, --sample and --tests). Results: OUT/report.txt (OUT = build/mutate by default:
one line per mutant, then a summary per file and overall).
"""

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.realpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
DEFAULT_FILES = ["core/model/planner.c", "core/formats/safetensors.c"]
# Groups --files accepts by name (issue 29: every decoder, the remote client, serve's request
# checks, the stage's journal and spool).
GROUPS = {
    "decoders": None,  # every core/formats/*.c but the table, filled in at run time
    "remote": ["core/io/remote/%s.c" % f for f in ("object", "http", "names", "targets", "s3",
                                                    "hf", "httpdir", "listing")]
    + ["core/io/blockcache.c"],
    "serve": ["fs/serve/serve_http.c", "fs/serve/serve_guard.c", "fs/serve/serve_repo.c"],
    "stage": ["fs/stage/stage_journal.c", "fs/stage/stage_spool.c"],
}
# The unmutated run of a test must end within this (the staging tests take a minute or two).
TEST_TIMEOUT = 300
# Slow or environment-bound tests stay out: stress and valgrind runs, fault injection, the
# staging mount, installation and the man-page lint.
SLOW = {"100-man.t", "210-mount-helper.t", "230-install.t", "500-stress.t", "510-faults.t",
        "520-valgrind.t"}
SLOW_PREFIXES = ("7",)  # 7x: the staging mount
# Tests of several seconds run only for the files that name them in FIRST: a mutant that
# survives costs the whole relevant set, so the set stays at about ten seconds.
ONLY_WHERE_NAMED = {"220-subcommands.t", "320-hfview.t", "unit/segread.t",
                    "unit/zstd_seekable.t"}
# Tests that concern a source file most, run first (a killed mutant then costs one test).
FIRST = {
    "planner": ["unit/planner.t", "300-mount-fixtures.t", "360-dcp.t", "330-dcphf.t", "340-mlfw.t"],
    "safetensors": ["300-mount-fixtures.t", "310-hostile.t", "320-hfview.t"],
    "gguf": ["unit/gguf_decode.t", "410-gguf.t", "600-convert-gguf.t"],
    "dcp": ["360-dcp.t", "330-dcphf.t"], "dcp_hf": ["330-dcphf.t"],
    "torch_zip": ["400-torch.t", "360-dcp.t"], "zip": ["400-torch.t", "360-dcp.t"], "pickle": ["unit/pickle_bounds.t", "unit/pickle.t", "400-torch.t"],
    "gptrs": ["420-gptrs.t", "620-convert-gptrs.t"], "lwt": ["430-lwt.t", "610-convert-lwt.t"],
    "burnpack": ["440-burnpack.t", "630-convert-burnpack.t"], "mlfw_tp": ["340-mlfw.t"],
    "nemo_step": ["370-nemo.t"], "hf_dir": ["320-hfview.t", "300-mount-fixtures.t"],
    "zstd_seekable": ["unit/zstd_bounds.t", "unit/zstd_seekable.t", "450-zstd.t",
                      "640-convert-zstd.t"],
    "tar": ["680-tar.t", "370-nemo.t"],
    "deepspeed": ["790-deepspeed.t"], "meta_mp": ["150-meta-mp.t"],
    "hf_cache": ["650-hf-cache.t"], "folder": ["670-folders.t"], "dirlist": ["670-folders.t"],
    "open": ["200-cli.t", "300-mount-fixtures.t"],
    "hfview": ["320-hfview.t"], "cli_diff": ["270-diff.t"],
    "npz": ["960-npz.t"], "onnx": ["970-onnx.t"], "keras": ["980-keras.t"],
    # The remote client: the hostile servers first, then the real ones.
    "object": ["490-remote-faults.t", "462-remote-listing-limits.t", "130-remote-prefetch.t",
               "460-remote-http.t"],
    "http": ["490-remote-faults.t", "462-remote-listing-limits.t", "460-remote-http.t"],
    "names": ["unit/remote_listing.t", "460-remote-http.t", "462-remote-listing-limits.t"],
    "targets": ["460-remote-http.t", "480-remote-hub.t", "140-remote-s3-sigv4.t"],
    "s3": ["462-remote-listing-limits.t", "140-remote-s3-sigv4.t"],  # 47 needs build/node
    "hf": ["462-remote-listing-limits.t", "480-remote-hub.t"],
    "httpdir": ["462-remote-listing-limits.t", "460-remote-http.t"],
    "listing": ["unit/remote_listing.t", "462-remote-listing-limits.t"],
    "blockcache": ["unit/blockcache.t", "461-remote-disk-cache.t", "130-remote-prefetch.t",
                   "490-remote-faults.t"],
    # serve's request checks and its connection guard.
    "serve_http": ["282-serve-request-checks.t", "280-serve.t", "283-serve-slow-clients.t"],
    "serve_guard": ["283-serve-slow-clients.t"], "serve_repo": ["280-serve.t"],
    # The stage's journal and spool: the staging mounts (slow, so only where named).
    "stage_journal": ["740-stage-resume.t", "710-stage-faults.t", "700-stage.t"],
    "stage_spool": ["770-stage-spool.t", "710-stage-faults.t", "700-stage.t"],
}
# Where two files share a stem, the path decides.
FIRST_BY_PATH = {
    "core/parse/tar.c": ["680-tar.t", "370-nemo.t"],
    "core/formats/tar.c": ["680-tar.t", "370-nemo.t"],
}

COND_START = re.compile(r"^\s*(?:\}\s*else\s+)?(?:if|while)\s*\(")
# Comparison operators, not parts of ->, <<, >>, <<=, >>=.
CMP = re.compile(r"(?<![-<>=!])(>=|<=|==|!=|>|<)(?![<>=])")
# A simple right operand: a name with member accesses and indexes, or a number.
OPERAND = re.compile(r"\s*((?:[A-Za-z_]\w*(?:(?:->|\.)\w+|\[[^\[\]]*\])*)|\d+[uUlL]*)")

FLIP = {">": ">=", ">=": ">", "<": "<=", "<=": "<"}
# The left operand: back to the nearest (, &&, ||, !, comma or statement start.
LEFT_STOP = re.compile(r"\(|&&|\|\||!(?!=)|,|;|\?|:")
# Bounds checks compare lengths, offsets, sizes and counts; type tags, pointers and
# loop indexes are something else.
BOUNDS = re.compile(r"(?i)size|len|end|count|off|limit|max|min|bytes|numel|pos|cap|room|"
                    r"left|remain|total|ndim|nb|extent|span|avail|need|have|at\b|^\s*n\b|\bn\s*$")
NOT_BOUNDS = re.compile(r"type|kind|NULL|->head|->next|\bc\b")


def condition_lines(text):
    """Line numbers (0-based) that belong to an if/while condition."""
    lines = text.split("\n")
    out = []
    depth, inside = 0, False
    for i, line in enumerate(lines):
        code = line.split("//")[0]
        if not inside and COND_START.match(code):
            inside, depth = True, 0
        if inside:
            out.append(i)
            for ch in code:
                if ch == "(":
                    depth += 1
                elif ch == ")":
                    depth -= 1
                    if depth == 0:
                        inside = False
                        break
    return lines, out


def strip_strings(line):
    """The line with string and char literals blanked, so operators inside them are skipped."""
    return re.sub(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'', lambda m: " " * len(m.group()), line)


def mutants_of(path):
    text = open(os.path.join(ROOT, path)).read()
    lines, cond = condition_lines(text)
    out = []
    for i in cond:
        line = lines[i]
        if line.lstrip().startswith(("/*", "*", "#")):
            continue
        code = strip_strings(line)
        for m in CMP.finditer(code):
            op, a, b = m.group(1), m.start(1), m.end(1)
            rhs = OPERAND.match(line, b)
            left = LEFT_STOP.split(code[:a])[-1]
            right = rhs.group(1) if rhs else code[b:b + 30]
            if not BOUNDS.search(left + " " + right) or NOT_BOUNDS.search(left + " " + right):
                continue
            variants = []
            if op in FLIP:
                variants.append(("boundary", line[:a] + FLIP[op] + line[b:]))
            if op == "!=":
                for one in (">", "<"):
                    variants.append(("one-sided", line[:a] + one + line[b:]))
            # Shifting a 0 or 1 of an (in)equality makes an emptiness test into nonsense, not
            # a bound that moved; the boundary flip covers those.
            trivial = op in ("==", "!=") and rhs and rhs.group(1) in ("0", "1")
            if rhs and not trivial and line[rhs.end():rhs.end() + 1] != "(":
                s, e = rhs.start(1), rhs.end(1)
                # For < and > the boundary flip already moves the bound one way.
                steps = {">": ["+ 1"], ">=": ["- 1"], "<": ["- 1"], "<=": ["+ 1"]}.get(
                    op, ["+ 1", "- 1"])
                for d in steps:
                    variants.append(("shift", line[:s] + "(" + line[s:e] + " " + d + ")" + line[e:]))
            for kind, new in variants:
                out.append({"file": path, "line": i + 1, "kind": kind, "old": line, "new": new})
    return out


def run(cmd, cwd, timeout, env=None, log=None):
    """Runs cmd in its own process group; returns (rc or 'timeout', seconds)."""
    start = time.monotonic()
    p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=log or subprocess.DEVNULL,
                         stderr=subprocess.STDOUT, start_new_session=True)
    try:
        rc = p.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        rc = "timeout"
    return rc, time.monotonic() - start


def unmount_leftovers(tmp):
    """Unmounts FUSE mounts a killed test left under its own TMPDIR (only ours)."""
    try:
        mounts = [l.split()[4] for l in open("/proc/self/mountinfo")]
    except OSError:
        return
    for m in mounts:
        if m.startswith(tmp + "/"):
            subprocess.run(["fusermount3", "-u", "-z", m], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)


def kill_leftover_daemons(binary):
    """Kills processes still running the snapshot's ckptfs after a test (by pid, only those:
    a mutant's daemon that loops survives its test's process group, having left its session)."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            if os.readlink("/proc/%s/exe" % pid) == binary:
                os.kill(int(pid), signal.SIGKILL)
        except OSError:
            pass


def fast_tests(src):
    units = sorted("unit/" + f for f in os.listdir(os.path.join(src, "build", "unit"))
                   if f.endswith(".t"))
    tests = sorted(f for f in os.listdir(os.path.join(src, "tests", "t"))
                   if f.endswith(".t") and f not in SLOW and not f.startswith(SLOW_PREFIXES))
    return units + tests


def first_tests(path):
    return FIRST_BY_PATH.get(path) or FIRST.get(os.path.basename(path)[:-2], [])


def expand_files(spec):
    """--files: paths and group names, in order, each once."""
    out = []
    for f in (x.strip() for x in spec.split(",")):
        if not f:
            continue
        if f == "all":
            names = list(GROUPS)
        elif f in GROUPS:
            names = [f]
        else:
            names = None
        if names is None:
            out.append(f)
            continue
        for g in names:
            if GROUPS[g] is None:  # every decoder of the table
                out += sorted("core/formats/" + n for n in os.listdir(os.path.join(ROOT, "core",
                                                                                  "formats"))
                              if n.endswith(".c") and n != "formats.c")
            else:
                out += GROUPS[g]
    seen = set()
    return [f for f in out if not (f in seen or seen.add(f))]


def relevant(tests, path, scope="fast"):
    """The tests for a mutant of path: its own first, then (scope "fast") the fast rest."""
    first = [t for t in first_tests(path) if t in tests]
    if scope == "named":
        return first
    return first + [t for t in tests if t not in first and t not in ONLY_WHERE_NAMED]


def sample(ms, n):
    """n of ms, evenly spaced (first and last included), in order."""
    if n <= 0 or len(ms) <= n:
        return ms
    if n == 1:
        return ms[:1]
    return [ms[round(i * (len(ms) - 1) / (n - 1))] for i in range(n)]


def test_cmd(src, test):
    if test.startswith("unit/"):
        return [os.path.join(src, "build", test)]
    path = os.path.join(src, "tests", "t", test)
    first = open(path).readline()
    return [first[2:].split()[0] if first.startswith("#!") else "/bin/sh", path]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--files", default=",".join(DEFAULT_FILES),
                    help="comma-separated core/ sources to mutate (default: %(default)s)")
    ap.add_argument("--limit", type=int, default=0, help="at most N mutants per file")
    ap.add_argument("--sample", type=int, default=0,
                    help="N mutants per file, evenly spaced along it")
    ap.add_argument("--tests", choices=("named", "fast"), default="named",
                    help="only the tests named for the file, or every fast test")
    ap.add_argument("--list", action="store_true", help="list the mutants, run nothing")
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "mutate"))
    args = ap.parse_args()
    args.out = os.path.abspath(args.out)

    mutants = []
    files = expand_files(args.files)
    unnamed = [f for f in files if not first_tests(f)]
    if unnamed and args.tests == "named":
        print("mutate: no tests named in FIRST for %s (add them, or use --tests fast)"
              % ", ".join(unnamed))
        return 1
    for f in files:
        ms = mutants_of(f)
        ms = ms[:args.limit] if args.limit else ms
        mutants += sample(ms, args.sample)
    if args.list:
        for m in mutants:
            print("%s:%d %s: %s" % (m["file"], m["line"], m["kind"], m["new"].strip()))
        print("%d mutants" % len(mutants))
        return 0

    src = os.path.join(args.out, "src")
    shutil.rmtree(src, ignore_errors=True)
    os.makedirs(src)
    # A snapshot of the tree: edits to the worktree during a run do not change its results.
    for d in ("core", "fs", "tests/unit", "tests/t", "tests/lib", "tests/gen", "tests/fixtures",
              "man", "mount-helpers"):
        shutil.copytree(os.path.join(ROOT, d), os.path.join(src, d))
    for f in ("Makefile", "README.md"):
        shutil.copy(os.path.join(ROOT, f), src)
    # Every test tool (peak_rss_tool, convert_tool, ...): the tests FIRST names use them.
    tools = ["build/tools/%s" % f[:-2] for f in os.listdir(os.path.join(src, "tests", "unit"))
             if f.endswith("_tool.c")]
    make = ["make", "-s", "-j2", "B=build", "build/ckptfs", "build/fixtures/.done"] + tools
    units = ["build/unit/%s.t" % f[:-2] for f in os.listdir(os.path.join(src, "tests", "unit"))
             if f.endswith(".c") and not f.endswith("_tool.c")]
    blog = open(os.path.join(args.out, "build.log"), "w")
    rc, _ = run(make + units, src, 900, log=blog)
    if rc != 0:
        print("mutate: the unmutated copy does not build (see %s/build.log)" % args.out)
        return 1
    files = sorted({m["file"] for m in mutants})
    # The fast tests, and the slow ones a mutated file names (the staging tests for fs/stage).
    everything = fast_tests(src)
    everything += sorted({t for f in files for t in first_tests(f) if t not in everything and
                          os.path.exists(test_cmd(src, t)[-1])})
    tests = [t for t in everything if any(t in relevant(everything, f, args.tests)
                                          for f in files)]
    if args.tests == "named":  # a mutant rebuilds only what its tests run
        units = ["build/%s" % t for t in tests if t.startswith("unit/")]
    tmp = tempfile.mkdtemp(prefix="ckptfs-mutate.")
    env = dict(os.environ, CKPTFS=os.path.join(src, "build", "ckptfs"), FIXTURES=os.path.join(src, "build", "fixtures"),
               UNIT_DIR=os.path.join(src, "build", "unit"),
               TOOLS=os.path.join(src, "build", "tools"), TMPDIR=tmp)

    # The unmutated tree must pass, or every mutant would look killed. Its times set each
    # test's timeout: a mutant that takes far longer is hanging (a loop that never ends).
    timeout = {}
    for t in tests:
        rc, took = run(test_cmd(src, t), src, TEST_TIMEOUT, env)
        unmount_leftovers(tmp)
        kill_leftover_daemons(env["CKPTFS"])
        if rc != 0:
            print("mutate: %s fails without any mutation; fix that first" % t)
            return 1
        timeout[t] = max(10.0, 5 * took)

    report = open(os.path.join(args.out, "report.txt"), "w")
    counts = {"killed": 0, "survived": 0, "no-build": 0}
    per_file = {f: {"killed": 0, "survived": 0, "no-build": 0} for f in files}
    survivors = []
    for n, m in enumerate(mutants, 1):
        path = os.path.join(src, m["file"])
        original = open(path).read()
        lines = original.split("\n")
        assert lines[m["line"] - 1] == m["old"]
        lines[m["line"] - 1] = m["new"]
        open(path, "w").write("\n".join(lines))
        try:
            rc, _ = run(make + units, src, 900, log=blog)
            if rc != 0:
                verdict, by = "no-build", ""
            else:
                verdict, by = "survived", ""
                for t in relevant(tests, m["file"], args.tests):
                    rc, _ = run(test_cmd(src, t), src, timeout[t], env)
                    unmount_leftovers(tmp)
                    kill_leftover_daemons(env["CKPTFS"])
                    if rc == "timeout":  # a busy machine, or a hang? Once more, 3x longer.
                        rc, _ = run(test_cmd(src, t), src, 3 * timeout[t], env)
                        unmount_leftovers(tmp)
                        kill_leftover_daemons(env["CKPTFS"])
                    if rc != 0:
                        verdict, by = "killed", "%s%s" % (t, " (timeout)" if rc == "timeout" else "")
                        break
        finally:
            open(path, "w").write(original)
        counts[verdict] += 1
        per_file[m["file"]][verdict] += 1
        line = "%-8s %s:%d %s: %s%s" % (verdict, m["file"], m["line"], m["kind"],
                                       m["new"].strip(), "  [by %s]" % by if by else "")
        report.write(line + "\n")
        report.flush()
        print("[%d/%d] %s" % (n, len(mutants), line), flush=True)
        if verdict == "survived":
            survivors.append(line)
    # Leave the copy's objects matching the unmutated sources.
    run(make + units, src, 900, log=blog)
    shutil.rmtree(tmp, ignore_errors=True)
    counted = counts["killed"] + counts["survived"]
    print("\nmutants: %d built, %d killed, %d survived (%d did not build)"
          % (counted, counts["killed"], counts["survived"], counts["no-build"]))
    for s in survivors:
        print("  " + s)
    for f in files:
        c = per_file[f]
        summary = "file %s: %d built, %d killed, %d survived, %d no-build" % (
            f, c["killed"] + c["survived"], c["killed"], c["survived"], c["no-build"])
        print(summary)
        report.write(summary + "\n")
    report.write("summary: %d built, %d killed, %d survived, %d no-build\n"
                 % (counted, counts["killed"], counts["survived"], counts["no-build"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
