#!/usr/bin/python3
"""The Debian packages: `dpkg-buildpackage -us -uc -b` on a copy of the tree builds ckptfs,
libckpt0 and libckpt-dev with the files each must hold, at the version in VERSION, and lintian
reports no error on them. Under CKPTFS_CI=1 (a throwaway root machine) the build tools are
installed when missing (a missing one fails instead of skipping), and then the packages are
installed, `mount -t fuse.ckptfs` mounts a checkpoint through the packaged helper, and after a
purge no file the packages listed (dpkg -L, taken before the purge) is left."""

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from ckptfs_test import Tap, unmount, is_mounted  # noqa: E402

ROOT = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", ".."))
FIXTURES = os.environ.get("FIXTURES", os.path.join(ROOT, "build", "fixtures"))
CI = os.environ.get("CKPTFS_CI") == "1"
PACKAGES = ("ckptfs", "libckpt0", "libckpt-dev")
tap = Tap()


def run(argv, timeout=600, **kw):
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)


def have(tool):
    return shutil.which(tool) is not None


def build_deps():
    """The Build-Depends of debian/control, without versions."""
    with open(os.path.join(ROOT, "debian", "control")) as f:
        m = re.search(r"^Build-Depends:(.*?)^\S", f.read(), re.M | re.S)
    return [re.sub(r"\s*\(.*\)", "", d).strip() for d in m.group(1).split(",") if d.strip()]


tools = {"dpkg-buildpackage": "dpkg-dev", "dh": "debhelper", "lintian": "lintian"}
missing = [pkg for tool, pkg in tools.items() if not have(tool)]
if missing and CI and os.geteuid() == 0:
    r = run(["apt-get", "install", "-y", "-qq", "--no-install-recommends"] + missing + build_deps(),
            env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
    tap.ok(r.returncode == 0, "apt-get install %s (CKPTFS_CI=1)" % " ".join(missing), [r.stderr[-600:]])
    missing = [pkg for tool, pkg in tools.items() if not have(tool)]
if missing:
    if CI:
        tap.ok(False, "the package tools are present (missing: %s)" % " ".join(missing))
        tap.done()
        sys.exit(1)
    print("1..0 # SKIP %s not installed (apt-get install %s, or CKPTFS_CI=1)"
          % (", ".join(missing), " ".join(missing)))
    sys.exit(0)

version = open(os.path.join(ROOT, "VERSION")).read().strip()
arch = run(["dpkg", "--print-architecture"]).stdout.strip()
multiarch = run(["dpkg-architecture", "-qDEB_HOST_MULTIARCH"]).stdout.strip()
tmp = tempfile.mkdtemp(prefix="ckptfs-deb.")
mnt = os.path.join(tmp, "mnt")
installed = False
try:
    # A copy of the tree without build outputs: the package's clean step (make clean) must not
    # touch the checkout's build/.
    src = os.path.join(tmp, "ckptfs-" + version)
    os.makedirs(src)
    r = subprocess.run("tar -C %s --exclude=./build --exclude=./build-san --exclude=./.git -cf - . "
                       "| tar -C %s -xf -" % (ROOT, src), shell=True)
    tap.ok(r.returncode == 0, "a copy of the tree")
    cl = run(["dpkg-parsechangelog", "-l", os.path.join(src, "debian", "changelog"), "-SVersion"])
    tap.ok(cl.stdout.strip() == version, "debian/changelog's version is VERSION (%s)" % cl.stdout.strip())
    r = run(["dpkg-buildpackage", "-us", "-uc", "-b", "-j2"], cwd=src, timeout=1500)
    tap.ok(r.returncode == 0, "dpkg-buildpackage -us -uc -b", [r.stdout[-1500:], r.stderr[-1500:]])
    debs = {p: os.path.join(tmp, "%s_%s_%s.deb" % (p, version, arch)) for p in PACKAGES}
    contents = {}
    for p, deb in debs.items():
        ok = os.path.exists(deb)
        tap.ok(ok, "built %s" % os.path.basename(deb), [" ".join(sorted(os.listdir(tmp)))])
        contents[p] = set()
        if ok:
            for line in run(["dpkg-deb", "-c", deb]).stdout.splitlines():
                path = line.split()[5].lstrip(".")
                contents[p].add(path.rstrip("/"))
            tap.ok(run(["dpkg-deb", "-f", deb, "Version"]).stdout.strip() == version,
                   "%s is version %s" % (p, version))
    lib = "/usr/lib/" + multiarch
    want = {
        "ckptfs": ["/usr/bin/ckptfs", "/sbin/mount.fuse.ckptfs", "/usr/share/man/man1/ckptfs.1.gz",
                   "/usr/share/man/man5/ckptfs.5.gz", "/usr/share/man/man8/mount.fuse.ckptfs.8.gz",
                   "/usr/share/bash-completion/completions/ckptfs",
                   "/usr/share/zsh/vendor-completions/_ckptfs",
                   "/usr/share/fish/vendor_completions.d/ckptfs.fish"],
        "libckpt0": [lib + "/libckpt.so.0", lib + "/libckpt.so." + version],
        "libckpt-dev": [lib + "/libckpt.so", lib + "/pkgconfig/libckpt.pc",
                        "/usr/include/ckpt/ckpt.h", "/usr/include/ckpt/read/segread.h"],
    }
    for p, files in want.items():
        absent = [f for f in files if f not in contents[p]]
        tap.ok(not absent, "%s holds its files (missing: %s)" % (p, absent))
    stray = [f for f in contents["ckptfs"] if "libckpt" in f or f.startswith("/usr/include")]
    tap.ok(not stray, "the program's package holds none of the library's files (%s)" % stray)
    changes = glob.glob(os.path.join(tmp, "*.changes"))
    r = run(["lintian", "--allow-root", "--tag-display-limit", "0"] + changes, timeout=900)
    errors = [l for l in r.stdout.splitlines() if l.startswith("E:")]
    tap.ok(changes and not errors and "internal error" not in r.stderr,
           "lintian: no errors (%d other tags)" % len(r.stdout.splitlines()), errors + [r.stderr[-500:]])
    for l in r.stdout.splitlines():
        tap.diag("lintian: " + l)

    if not CI:
        tap.skip("install, mount -t fuse.ckptfs, purge", "only under CKPTFS_CI=1 (a throwaway root machine)")
    elif os.geteuid() != 0:
        tap.ok(False, "CKPTFS_CI=1 runs as root")
    else:
        r = run(["apt-get", "install", "-y", "-qq"] + [debs[p] for p in PACKAGES],
                env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
        installed = r.returncode == 0
        tap.ok(installed, "apt-get install the three packages", [r.stderr[-800:]])
        listed = set()
        for p in PACKAGES:
            listed |= set(run(["dpkg", "-L", p]).stdout.split("\n")) - {"", "/."}
        tap.ok(any(f.endswith("mount.fuse.ckptfs") for f in listed), "dpkg -L lists the mount helper")
        src_ckpt = os.path.join(FIXTURES, "sharded")
        if not os.path.isdir(src_ckpt):
            tap.ok(False, "fixture %s (make fixtures)" % src_ckpt)
        else:
            os.makedirs(mnt)
            # mount(8) from a clean environment: it finds /sbin/mount.fuse.ckptfs, which runs
            # /usr/bin/ckptfs beside it, nothing of the checkout.
            env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
            r = run(["mount", "-t", "fuse.ckptfs", src_ckpt, mnt], env=env, timeout=60)
            tap.ok(r.returncode == 0 and is_mounted(mnt), "mount -t fuse.ckptfs through the package",
                   [r.stderr])
            try:
                with open(os.path.join(mnt, ".ckptfs", "summary.json")) as f:
                    summary = json.load(f)
            except (OSError, ValueError) as e:
                summary = {"error": str(e)}
            tap.ok(summary.get("format") == "safetensors-sharded",
                   "the mount shows the checkpoint (%s)" % summary.get("format", summary))
            if is_mounted(mnt):
                unmount(mnt)
            tap.ok(not is_mounted(mnt), "unmounted")
        r = run(["apt-get", "purge", "-y", "-qq"] + list(PACKAGES),
                env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
        installed = r.returncode != 0
        tap.ok(r.returncode == 0, "apt-get purge the three packages", [r.stderr[-500:]])
        left = []
        for f in sorted(listed):
            if not os.path.lexists(f):
                continue
            if os.path.isdir(f):
                # A directory (or merged /usr's /sbin -> usr/sbin) stays when another package
                # owns it too or it holds other files; one the packages made and left empty
                # is left behind.
                if run(["dpkg", "-S", f]).returncode != 0 and not os.listdir(f):
                    left.append(f)
            else:
                left.append(f)
        tap.ok(not left, "nothing of the packages is left after the purge (%d files listed)" % len(listed),
               left[:20])
        st = run(["dpkg-query", "-W", "-f=${Status}\n"] + list(PACKAGES)).stdout
        tap.ok("installed" not in st.replace("not-installed", ""), "dpkg knows none of them")
finally:
    if is_mounted(mnt):
        unmount(mnt)
    if installed:
        run(["dpkg", "--purge"] + list(PACKAGES))
    shutil.rmtree(tmp, ignore_errors=True)
tap.done()
sys.exit(1 if tap.failed else 0)
