#!/usr/bin/python3
"""The source tree keeps its shape: fs/ includes only the public headers of libckpt (listed in
core/PUBLIC_HEADERS), a public header includes only public headers, and no two files of core/
(nor of fs/mount/, fs/stage/) depend on each other, directly or round a longer loop:
- by includes (a module is NAME.c with NAME.h), read as text and resolved the way the
  Makefile's -I flags do;
- by calls: an object file that uses a symbol another defines depends on it (nm on the objects
  the build made; a header that declares another file's functions cannot hide a loop).
- by layers: each folder of core/ has a rank (LAYERS, lowest first); no include and no symbol of
  a file reaches a folder of the same or a higher rank. core/ckpt.h, the API's types, is
  below every folder;
- between front ends: fs/cli, fs/mount, fs/stage, fs/serve never include one another's headers,
  fs/common (what they share) includes and calls none of them, and no call cycle exists in
  all of fs/, between objects or between folders (fs/main.c, the dispatcher, may use all);
Each checker is first run on small made-up trees that break its rule, so a checker that finds
nothing cannot pass."""

import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from ckptfs_test import Tap  # noqa: E402

ROOT = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", ".."))
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def sources(top):
    for d, _, files in os.walk(top):
        for f in sorted(files):
            if f.endswith((".c", ".h")):
                yield os.path.join(d, f)


def includes(path, search):
    """The files path includes, resolved against its own folder, then each folder of search."""
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    for name in INCLUDE.findall(text):
        for base in [os.path.dirname(path)] + search:
            p = os.path.normpath(os.path.join(base, name))
            if os.path.isfile(p):
                yield name, p
                break


def public_headers(root):
    with open(os.path.join(root, "core", "PUBLIC_HEADERS")) as f:
        names = [l.strip() for l in f if l.strip() and not l.startswith("#")]
    return {os.path.normpath(os.path.join(root, "core", n)) for n in names}


def boundary_violations(root):
    """(file, include) pairs where fs/ or a public header reaches an internal core header."""
    core = os.path.join(root, "core") + os.sep
    public = public_headers(root)
    bad = []
    search = [root, os.path.join(root, "fs")]  # -I. -Ifs
    for src in sources(os.path.join(root, "fs")):
        for name, p in includes(src, search):
            if p.startswith(core) and p not in public:
                bad.append((os.path.relpath(src, root), name))
    for h in sorted(public):
        for name, p in includes(h, []):
            if p.startswith(core) and p not in public:
                bad.append((os.path.relpath(h, root), name))
    return bad, public


def module_cycles(top):
    """Strongly connected groups of more than one module in top's include graph."""
    def module(p):
        return os.path.splitext(os.path.relpath(p, top))[0]
    graph = {}
    for src in sources(top):
        m = module(src)
        graph.setdefault(m, set())
        for _, p in includes(src, [top]):
            if p.startswith(top + os.sep) and module(p) != m:
                graph[m].add(module(p))
    return strongly_connected(graph), len(graph)


def strongly_connected(graph):
    """Groups of more than one node that reach each other (Tarjan, iteratively)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]
                    counter[0] += 1
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                elif nxt in on:
                    low[v] = min(low[v], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                group = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    group.append(w)
                    if w == v:
                        break
                if len(group) > 1:
                    out.append(sorted(group))
    return out


def object_symbols(objdir, srcdir=None):
    """{module: (defined symbols, used symbols)} of the objects under objdir whose source
    (srcdir/module.c) still exists: a moved file leaves its old object behind in build/."""
    out = {}
    for d, _, files in os.walk(objdir):
        for f in sorted(files):
            if not f.endswith(".o"):
                continue
            o = os.path.join(d, f)
            m = os.path.splitext(os.path.relpath(o, objdir))[0]
            if srcdir and not os.path.isfile(os.path.join(srcdir, m + ".c")):
                continue
            defs, uses = set(), set()
            text = subprocess.run(["nm", "-P", o], capture_output=True, text=True,
                                  check=True).stdout
            for line in text.splitlines():
                parts = line.split()
                if len(parts) >= 2 and parts[1] in "TDBRVW":
                    defs.add(parts[0])
                elif len(parts) >= 2 and parts[1] == "U":
                    uses.add(parts[0])
            out[m] = (defs, uses)
    return out


def folder_of(module):
    """fs/'s folder of a module ("cli/cli_ls" -> "cli"); a top-level file is its own."""
    return module.split("/")[0] if "/" in module else module


def frontend_violations(fs_root, objdir=None):
    """(kind, from, to) for every include of one front end's header by another, every include
    or symbol of a front end in fs/common, and every call cycle between folders of fs/."""
    bad = []
    fronts = {d for d in os.listdir(fs_root) if os.path.isdir(os.path.join(fs_root, d))}
    root = os.path.dirname(fs_root)
    for src in sources(fs_root):
        a = folder_of(os.path.relpath(src, fs_root))
        if a not in fronts:
            continue  # fs/main.c dispatches to every front end
        for _, p in includes(src, [root, fs_root]):
            if not p.startswith(fs_root + os.sep):
                continue
            b = folder_of(os.path.relpath(p, fs_root))
            if b in fronts and b != a and b != "common":
                bad.append(("include", os.path.relpath(src, fs_root), os.path.relpath(p, fs_root)))
    if objdir and os.path.isdir(objdir):
        syms = object_symbols(objdir, fs_root)
        owner = {}
        for m, (defs, _) in syms.items():
            for sym in defs:
                owner.setdefault(sym, m)
        graph = {}
        for m, (_, uses) in syms.items():
            a = folder_of(m)
            graph.setdefault(a, set())
            for sym in sorted(uses):
                b = folder_of(owner[sym]) if sym in owner else None
                if b is None or b == a:
                    continue
                graph[a].add(b)
                if a == "common" and b in fronts | {"main"}:
                    bad.append(("symbol " + sym, m, owner[sym]))
        bad += [("folder cycle", " <-> ".join(g), "") for g in strongly_connected(graph)]
    return bad


def call_cycles(objdir, registries=(), srcdir=None):
    """Loops among the object files under objdir, by the symbols one uses and another defines.
    A registry (the format table) lists every decoder, and container formats (tar, a folder of
    checkpoints) probe their members through it: looking a format up in it is not a dependency
    on the file that holds it."""
    syms = object_symbols(objdir, srcdir)
    defined = {}
    for m, (defs, _) in sorted(syms.items()):
        for sym in defs:
            defined.setdefault(sym, m)
    graph = {m: {defined[s] for s in u if defined.get(s, m) not in (m,) + tuple(registries)}
             for m, (_, u) in syms.items()}
    return strongly_connected(graph), len(graph)


# core/'s folders, lowest first: a folder may use only those before it (and core/ckpt.h).
LAYERS = ["util", "io", "model", "parse", "read", "formats", "views", "write"]


def layer_of(path, core):
    """The folder of core/ path lies in, or None for core/ckpt.h and anything outside core/."""
    rel = os.path.relpath(path, core)
    parts = rel.split(os.sep)
    return parts[0] if len(parts) > 1 and not rel.startswith("..") else None


def layer_violations(core, objdir=None, layers=LAYERS):
    """(kind, from, to) for every include and every used symbol that goes from a folder of core/
    to a folder of the same or a higher rank, and ("unranked", folder) for a folder not in
    layers."""
    rank = {name: i for i, name in enumerate(layers)}
    bad = []
    folders = {d for d in os.listdir(core) if os.path.isdir(os.path.join(core, d))}
    bad += [("unranked", d, "") for d in sorted(folders - set(rank))]

    def up(a, b):
        return a in rank and b in rank and a != b and rank[b] > rank[a]
    for src in sources(core):
        a = layer_of(src, core)
        for _, p in includes(src, []):
            b = layer_of(p, core)
            if up(a, b):
                bad.append(("include", os.path.relpath(src, core), os.path.relpath(p, core)))
    if objdir and os.path.isdir(objdir):
        defined, used = {}, {}
        for d, _, files in os.walk(objdir):
            for f in sorted(files):
                if not f.endswith(".o"):
                    continue
                o = os.path.join(d, f)
                m = os.path.splitext(os.path.relpath(o, objdir))[0]
                used[m] = set()
                out = subprocess.run(["nm", "-P", o], capture_output=True, text=True,
                                     check=True).stdout
                for line in out.splitlines():
                    parts = line.split()
                    if len(parts) >= 2 and parts[1] in "TDBRVW":
                        defined.setdefault(parts[0], m)
                    elif len(parts) >= 2 and parts[1] == "U":
                        used[m].add(parts[0])
        for m, syms in sorted(used.items()):
            a = m.split(os.sep)[0] if os.sep in m else None
            for s in sorted(syms):
                dm = defined.get(s)
                b = dm.split(os.sep)[0] if dm and os.sep in dm else None
                if up(a, b):
                    bad.append(("symbol " + s, m, dm))
    return bad


def write(root, rel, text):
    p = os.path.join(root, rel)
    os.makedirs(os.path.dirname(p), exist_ok=True)
    with open(p, "w") as f:
        f.write(text)


def main():
    tap = Tap()
    with tempfile.TemporaryDirectory() as t:
        # a made-up tree that breaks every rule once
        write(t, "core/PUBLIC_HEADERS", "# api\nckpt.h\n")
        write(t, "core/ckpt.h", '#include "catalog.h"\n')
        write(t, "core/catalog.h", "")
        write(t, "core/a.c", '#include "b.h"\n')
        write(t, "core/b.h", "")
        write(t, "core/b.c", '#include "sub/c.h"\n')
        write(t, "core/sub/c.h", '#include "../a.h"\n')
        write(t, "core/a.h", "")
        write(t, "core/d.c", '#include "d.h"\n#include "a.h"\n')
        write(t, "core/d.h", "")
        write(t, "fs/x/y.c", '#include "core/ckpt.h"\n#include "core/catalog.h"\n'
                             '#include "../../core/sub/c.h"\n#include "y.h"\n')
        write(t, "fs/x/y.h", "")
        bad, _ = boundary_violations(t)
        tap.ok(sorted(bad) == [("core/ckpt.h", "catalog.h"), ("fs/x/y.c", "../../core/sub/c.h"),
                               ("fs/x/y.c", "core/catalog.h")],
               "the boundary check finds internal headers reached from fs/ and from a public "
               "header, and nothing else", bad)
        cycles, _ = module_cycles(os.path.join(t, "core"))
        tap.ok(cycles == [["a", "b", "sub/c"]],
               "the include-cycle check finds a three-module loop through a subfolder and no "
               "other", cycles)
        # the old writer.c <-> writers/ loop: declarations in a third header, calls both ways
        write(t, "calls/w.h", "int write_x(void);\nint out_bytes(void);\n")
        write(t, "calls/writer.c", '#include "w.h"\nint out_bytes(void) { return 1; }\n'
                                   "int write_any(void) { return write_x(); }\n")
        write(t, "calls/writers/x.c", '#include "../w.h"\n'
                                      "int write_x(void) { return out_bytes(); }\n")
        write(t, "calls/other.c", '#include "w.h"\nint other(void) { return write_x(); }\n')
        for c in ("writer", "writers/x", "other"):
            subprocess.run(["cc", "-c", os.path.join(t, "calls", c + ".c"), "-o",
                            os.path.join(t, "calls", c + ".o")], check=True)
        # layers: an include up a rank, a symbol up a rank, a folder without a rank; the same
        # rank (a folder's own files) and core/ckpt.h are allowed
        write(t, "layers/ckpt.h", "")
        write(t, "layers/util/u.c", '#include "../ckpt.h"\n#include "../model/m.h"\n')
        write(t, "layers/util/u.h", "")
        write(t, "layers/model/m.h", '#include "../util/u.h"\n#include "n.h"\n')
        write(t, "layers/model/n.h", "")
        write(t, "layers/extra/e.h", "")
        write(t, "layers/obj/util/u.c", "int model_fn(void);\nint util_fn(void) { return model_fn(); }\n")
        write(t, "layers/obj/model/m.c", "int util_fn(void);\nint model_fn(void) { return 1; }\n"
                                          "int other(void) { return util_fn(); }\n")
        for c in ("util/u", "model/m"):
            subprocess.run(["cc", "-c", os.path.join(t, "layers/obj", c + ".c"), "-o",
                            os.path.join(t, "layers/obj", c + ".o")], check=True)
        bad = layer_violations(os.path.join(t, "layers"), os.path.join(t, "layers/obj"),
                               ["util", "model", "obj"])
        tap.ok(sorted(bad) == [("include", "util/u.c", "model/m.h"), ("symbol model_fn", "util/u",
                                "model/m"), ("unranked", "extra", "")],
               "the layer check finds an include and a call up a rank and a folder without one, "
               "and nothing else", bad)
        cycles, _ = call_cycles(os.path.join(t, "calls"))
        tap.ok(cycles == [["writer", "writers/x"]],
               "the call-cycle check finds two objects calling each other and no other", cycles)
        # front ends: a cli file including serve's header, serve reaching into cli by a
        # relative path, common including the mount's header and calling the stage; the cli
        # and serve folders calling each other (the old help -> serve_main, serve -> cli_plot)
        # though no two objects do; main.c, own headers and common/ headers are allowed
        f = os.path.join(t, "front", "fs")
        write(f, "main.c", '#include "cli/c.h"\n#include "serve/s.h"\n'
                           "int cli_help(void);\nint main(void) { return cli_help(); }\n")
        write(f, "cli/c.h", "")
        write(f, "cli/c.c", '#include "c.h"\n#include "common/k.h"\n#include "serve/s.h"\n'
                            "int serve_run(void);\nint cli_help(void) { return serve_run(); }\n")
        write(f, "cli/plot.c", "int cli_plot(void) { return 2; }\n")
        write(f, "serve/s.h", "")
        write(f, "serve/s.c", '#include "../cli/c.h"\n#include "s.h"\n'
                              "int cli_plot(void);\nint serve_run(void) { return 1; }\n"
                              "int serve_draw(void) { return cli_plot(); }\n")
        write(f, "common/k.h", "")
        write(f, "common/k.c", '#include "k.h"\n#include "mount/m.h"\n'
                               "int stage_go(void);\nint k(void) { return stage_go(); }\n")
        write(f, "mount/m.h", "")
        write(f, "stage/g.c", "int stage_go(void) { return 3; }\n")
        for c in ("main", "cli/c", "cli/plot", "serve/s", "common/k", "stage/g"):
            subprocess.run(["cc", "-c", os.path.join(f, c + ".c"), "-I", f, "-o",
                            os.path.join(f, c + ".o")], check=True)
        write(f, "cli/stale.o", "")  # an object whose source was moved away: not read
        bad = frontend_violations(f, f)
        tap.ok(sorted(bad) == [("folder cycle", "cli <-> serve", ""),
                               ("include", "cli/c.c", "serve/s.h"),
                               ("include", "common/k.c", "mount/m.h"),
                               ("include", "serve/s.c", "cli/c.h"),
                               ("symbol stage_go", "common/k", "stage/g")],
               "the front-end check finds includes across front ends, fs/common using one, and "
               "a cycle of folders with no cycle of objects, and nothing else", bad)
        cycles, _ = call_cycles(f, srcdir=f)
        tap.ok(cycles == [], "... where the object-level check alone sees no loop", cycles)

    bad, public = boundary_violations(ROOT)
    tap.ok(len(public) >= 2 and all(os.path.isfile(p) for p in public),
           "core/PUBLIC_HEADERS lists %d headers, all present" % len(public),
           sorted(p for p in public if not os.path.isfile(p)))
    tap.ok(not bad, "fs/ and the public headers include only public core headers",
           ["%s includes \"%s\" (internal to core/)" % b for b in bad])
    cycles, n = module_cycles(os.path.join(ROOT, "core"))
    tap.ok(n > 30 and not cycles, "no include cycle among the %d modules of core/" % n,
           [" -> ".join(c) for c in cycles])
    build = os.path.dirname(os.environ.get("CKPTFS") or os.path.join(ROOT, "build", "ckptfs"))
    objdir = os.path.join(build, "core")
    bad = layer_violations(os.path.join(ROOT, "core"), objdir)
    tap.ok(os.path.isdir(objdir) and not bad, "core/'s folders use only lower layers (%s), by "
           "include and by symbol" % " < ".join(LAYERS),
           ["%s: %s -> %s" % b for b in bad] or ["no objects in %s (build first)" % objdir])
    fs_root = os.path.join(ROOT, "fs")
    objdir = os.path.join(build, "fs")
    bad = frontend_violations(fs_root, objdir)
    tap.ok(os.path.isdir(objdir) and not bad, "fs/'s front ends include none of one another's "
           "headers, fs/common uses none of them, and no two folders of fs/ call each other",
           ["%s: %s -> %s" % b for b in bad] or ["no objects in %s (build first)" % objdir])
    for sub, registries in (("core", ["formats/formats"]), ("fs", [])):
        objdir = os.path.join(build, sub)
        if not os.path.isdir(objdir):
            tap.skip("call cycles in %s/" % sub, "no objects in %s (build first)" % objdir)
            continue
        cycles, n = call_cycles(objdir, registries, os.path.join(ROOT, sub))
        tap.ok(n >= 2 and not cycles, "no two of the %d objects of %s/ call each other, directly "
               "or round a loop" % (n, sub), [" <-> ".join(c) for c in cycles])
    # tests/t: a number names one file (prove's output, notes and "see 46" mean one test)
    numbers = {}
    for name in sorted(os.listdir(os.path.join(ROOT, "tests", "t"))):
        m = re.match(r"(\d+)-.*\.t$", name)
        if m:
            numbers.setdefault(m.group(1), []).append(name)
    doubled = {k: v for k, v in numbers.items() if len(v) > 1}
    tap.ok(len(numbers) > 50 and not doubled, "the %d tests of tests/t have %d numbers, one each"
           % (sum(map(len, numbers.values())), len(numbers)), sorted(doubled.values()))
    # the repository's own docs describe the repository, not one machine
    machine = []
    for doc in ("README.md", "tests/README.md", "docs/ARCHITECTURE.md"):
        if not os.path.isfile(os.path.join(ROOT, doc)):
            machine.append("%s: missing" % doc)
            continue
        with open(os.path.join(ROOT, doc), encoding="utf-8") as f:
            machine += ["%s:%d: %s" % (doc, i + 1, line.strip())
                        for i, line in enumerate(f) if re.search(r"(^|[\s(`])/(work|home|root)/", line)]
    tap.ok(not machine, "README.md, tests/README.md and docs/ARCHITECTURE.md are there and name "
           "no machine path", machine)
    print("1..%d" % tap.n)
    return 1 if tap.failed else 0


if __name__ == "__main__":
    sys.exit(main())
