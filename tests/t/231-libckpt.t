#!/usr/bin/python3
"""libckpt as a shared library, as a program outside the tree sees it: `make install-lib
DESTDIR=` puts libckpt.so.N, include/ckpt/ and libckpt.pc in place; the library exports exactly
the functions its installed headers declare (read with gcc -aux-info from the installed
headers, and compared with nm -D of the installed file and core/libckpt.map), none of core's
internal helpers; the C example of docs/libckpt.md, compiled with pkg-config's flags against
the installed library only, and the Python ctypes example there list a sharded checkpoint's
tensors and read their bytes, checked against the safetensors files parsed here (json +
struct, nothing of core/). The version: VERSION, the Makefile, ckpt_version(), `ckptfs
--version`, the library's file name, libckpt.pc and debian/changelog say the same."""

import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from ckptfs_test import Tap  # noqa: E402

ROOT = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", ".."))
CKPTFS = os.environ.get("CKPTFS", os.path.join(ROOT, "build", "ckptfs"))
B = os.path.dirname(CKPTFS)
FIXTURES = os.environ.get("FIXTURES", os.path.join(ROOT, "build", "fixtures"))
tap = Tap()


def run(argv, **kw):
    if argv[0] == "make" and "env" not in kw:
        # Under `make check` this runs inside make: without its MAKEFLAGS and MAKELEVEL the
        # inner make prints no "Entering directory" lines into what the test reads.
        kw["env"] = {k: v for k, v in os.environ.items()
                     if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    return subprocess.run(argv, capture_output=True, text=True, timeout=240, **kw)


def doc_block(lang):
    with open(os.path.join(ROOT, "docs", "libckpt.md")) as f:
        text = f.read()
    m = re.search(r"```%s\n(.*?)```" % lang, text, re.S)
    return m.group(1) if m else None


def safetensors_dir(d):
    """{name: (dtype, shape, bytes)} from the files' own headers."""
    out = {}
    for f in sorted(os.listdir(d)):
        if not f.endswith(".safetensors"):
            continue
        with open(os.path.join(d, f), "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            hdr = json.loads(fh.read(n))
            base = 8 + n
            for k, v in hdr.items():
                if k == "__metadata__":
                    continue
                a, b = v["data_offsets"]
                fh.seek(base + a)
                out[k] = (v["dtype"], v["shape"], fh.read(b - a))
    return out


version = open(os.path.join(ROOT, "VERSION")).read().strip()
tap.ok(re.fullmatch(r"\d+\.\d+\.\d+", version) is not None, "VERSION is x.y.z (%s)" % version)
mk = run(["make", "-s", "-C", ROOT, "print-version"])
tap.ok(mk.stdout.strip() == version, "the Makefile's VERSION (%s)" % mk.stdout.strip())
v = run([CKPTFS, "--version"])
tap.ok(v.stdout.split()[:2] == ["ckptfs", version], "ckptfs --version (%s)" % v.stdout.strip())
with open(os.path.join(ROOT, "debian", "changelog")) as f:
    first = f.readline()
m = re.match(r"ckptfs \(([^)-]+)(-[^)]*)?\)", first)
tap.ok(m and m.group(1) == version, "debian/changelog's upstream version (%s)" % first.strip())

tmp = tempfile.mkdtemp(prefix="libckpt.")
try:
    dest = os.path.join(tmp, "dest")
    r = run(["make", "-s", "-C", ROOT, "install-lib", "B=" + B, "DESTDIR=" + dest,
             "PREFIX=/usr", "LIBDIR=/usr/lib"])
    tap.ok(r.returncode == 0, "make install-lib DESTDIR=... PREFIX=/usr", [r.stderr])
    lib = os.path.join(dest, "usr", "lib")
    inc = os.path.join(dest, "usr", "include", "ckpt")
    real = "libckpt.so." + version
    for name, want in [("libckpt.so.0", real), ("libckpt.so", "libckpt.so.0")]:
        p = os.path.join(lib, name)
        tap.ok(os.path.islink(p) and os.readlink(p) == want, "%s -> %s" % (name, want))
    tap.ok(os.path.isfile(os.path.join(lib, real)), "the library file is named by VERSION")
    od = run(["objdump", "-p", os.path.join(lib, real)]).stdout
    tap.ok(re.search(r"SONAME\s+libckpt\.so\.0\n", od) is not None, "soname libckpt.so.0")
    for h in ("ckpt.h", "read/segread.h"):
        tap.ok(os.path.isfile(os.path.join(inc, h)), "include/ckpt/%s installed" % h)
    pc = os.path.join(lib, "pkgconfig")
    env = dict(os.environ, PKG_CONFIG_PATH=pc, PKG_CONFIG_SYSROOT_DIR=dest,
               PKG_CONFIG_LIBDIR=pc)
    pv = run(["pkg-config", "--modversion", "libckpt"], env=env)
    tap.ok(pv.stdout.strip() == version, "pkg-config --modversion libckpt (%s)" % pv.stdout.strip(),
           [pv.stderr])

    # The exports: the installed headers' declarations, the map, nm -D.
    probe = os.path.join(tmp, "probe.c")
    with open(probe, "w") as f:
        f.write("#include <ckpt/ckpt.h>\n#include <ckpt/read/segread.h>\n")
    aux = os.path.join(tmp, "aux.txt")
    r = run(["gcc", "-std=c17", "-I" + os.path.join(dest, "usr", "include"), "-aux-info", aux,
             "-fsyntax-only", probe])
    tap.ok(r.returncode == 0, "the installed headers compile on their own", [r.stderr])
    declared = set()
    if os.path.exists(aux):
        for line in open(aux):
            if "/include/ckpt/" in line and " static " not in line:
                m = re.search(r"([A-Za-z_][A-Za-z_0-9]*)\s*\(", line.split("*/", 1)[1])
                if m:
                    declared.add(m.group(1))
    nm = run(["nm", "-D", "--defined-only", os.path.join(lib, real)]).stdout.split("\n")
    exported = {l.split()[2].split("@")[0] for l in nm if len(l.split()) == 3
                and l.split()[1] in "TtDdBbRrWiV"} - {"CKPT_0"}
    with open(os.path.join(ROOT, "core", "libckpt.map")) as f:
        mapped = set(re.findall(r"^\s+(ckpt_[a-z_0-9]+);", f.read(), re.M))
    tap.ok(len(declared) > 40, "the headers declare the API (%d functions)" % len(declared))
    tap.ok(exported == declared,
           "exported == declared in the installed headers",
           ["exported, not declared: %s" % sorted(exported - declared),
            "declared, not exported: %s" % sorted(declared - exported)])
    tap.ok(mapped == declared, "core/libckpt.map == the headers' declarations",
           ["%s" % sorted(mapped ^ declared)])
    with open(os.path.join(ROOT, "debian", "libckpt0.symbols")) as f:
        deb_syms = set(re.findall(r"^ (ckpt_[a-z_0-9]+)@CKPT_0 ", f.read(), re.M))
    tap.ok(deb_syms == mapped, "debian/libckpt0.symbols lists the map's functions",
           ["%s" % sorted(deb_syms ^ mapped)])
    leaked = sorted(s for s in exported if not s.startswith("ckpt_"))
    tap.ok(not leaked, "no internal helper exported (%s)" % leaked[:5])
    st = run(["sh", "-c", "nm -D %s | grep -c ' [TD] sb_\\| [TD] json_' || true" % os.path.join(lib, real)])
    tap.ok(st.stdout.strip() == "0", "the strbuf and JSON helpers fs/ borrows stay private")
    dyn = run(["objdump", "-p", CKPTFS]).stdout
    tap.ok("libckpt" not in dyn, "the ckptfs program links libckpt statically")

    # The C example, built against the installed library alone.
    src = doc_block("c")
    tap.ok(src is not None, "docs/libckpt.md has a C example")
    exe = os.path.join(tmp, "list")
    with open(exe + ".c", "w") as f:
        f.write(src or "")
    flags = run(["pkg-config", "--cflags", "--libs", "libckpt"], env=env).stdout.split()
    with open(os.path.join(lib, real), "rb") as f:
        sanitized = b"__asan_init" in f.read()
    if sanitized:
        flags = ["-fsanitize=address,undefined"] + flags
    r = run(["cc", "-std=c17", "-Wall", "-Wextra", "-Werror", exe + ".c", "-o", exe] + flags)
    tap.ok(r.returncode == 0, "the C example compiles with pkg-config's flags (%s)" % " ".join(flags),
           [r.stderr])
    ld = run(["objdump", "-p", exe]).stdout if os.path.exists(exe) else ""
    tap.ok("NEEDED               libckpt.so.0" in ld, "it is linked against libckpt.so.0")
    renv = dict(os.environ, LD_LIBRARY_PATH=lib)
    pyenv = dict(renv)
    if sanitized:
        # The library was built with ASan and UBSan (make check SANITIZE=1): the C example is
        # built with them too, and the interpreter gets their runtimes preloaded; the
        # interpreter's own leaks are not ours.
        rt = [run(["cc", "-print-file-name=lib%s.so" % n]).stdout.strip()
              for n in ("asan", "ubsan")]
        pyenv["LD_PRELOAD"] = " ".join(rt)
        pyenv["ASAN_OPTIONS"] = os.environ.get("ASAN_OPTIONS", "") + ":detect_leaks=0"
    sharded = os.path.join(FIXTURES, "sharded")
    if not os.path.isdir(sharded):
        tap.skip("the examples read a checkpoint", "no fixture %s (make fixtures)" % sharded)
    else:
        want = safetensors_dir(sharded)
        listing = subprocess.run([exe, sharded], capture_output=True, env=renv, timeout=60)
        got = {}
        for line in listing.stderr.decode().splitlines():
            p = line.split("\t")
            if len(p) == 4:
                got[p[0]] = (p[1], [int(x) for x in p[2].strip("[]").split(",") if x], int(p[3]))
        tap.ok(listing.returncode == 0 and got == {k: (d, s, len(b)) for k, (d, s, b) in want.items()},
               "C example: %d tensors, names, dtypes, shapes and sizes as the files say" % len(got),
               [listing.stderr.decode()[-800:]])
        mismatched = []
        for k, (_, _, data) in sorted(want.items())[:8]:
            r = subprocess.run([exe, sharded, k], capture_output=True, env=renv, timeout=60)
            if r.returncode != 0 or r.stdout != data:
                mismatched.append(k)
        tap.ok(not mismatched, "C example: each tensor's bytes as the files hold them %s" % mismatched)
        r = subprocess.run([exe, sharded, "no.such.tensor"], capture_output=True, env=renv, timeout=60)
        tap.ok(r.returncode == 2 and b"no tensor named" in r.stderr, "C example: no such tensor")
        r = subprocess.run([exe, os.path.join(tmp, "missing")], capture_output=True, env=renv,
                           timeout=60)
        tap.ok(r.returncode == 2 and b"missing" in r.stderr,
               "C example: a missing checkpoint is the library's message (%s)"
               % r.stderr.decode().strip()[:120])

        py = doc_block("python")
        tap.ok(py is not None and len(py.strip().splitlines()) <= 24,
               "docs/libckpt.md has a ctypes example of ~20 lines")
        pyf = os.path.join(tmp, "list.py")
        with open(pyf, "w") as f:
            f.write(py or "")
        r = subprocess.run([sys.executable, pyf, sharded], capture_output=True, text=True, env=pyenv,
                           timeout=60)
        lines = {}
        for line in r.stdout.splitlines():
            name, dtype, rest = line.split(" ", 2)
            shape, head = rest.rsplit(" ", 1)
            lines[name] = (dtype, json.loads(shape), head)
        expect = {k: (d, s, b.hex()[:16]) for k, (d, s, b) in want.items()}
        tap.ok(r.returncode == 0 and lines == expect,
               "ctypes example: names, dtypes, shapes and first bytes as the files say",
               [r.stderr[-800:]])
finally:
    shutil.rmtree(tmp, ignore_errors=True)
tap.done()
sys.exit(1 if tap.failed else 0)
