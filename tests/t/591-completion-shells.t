#!/usr/bin/python3
"""The three shell completions (mount-helpers/ckptfs.{bash,zsh,fish}-completion) against the
program: each takes the commands from the program's own table (`ckptfs help --commands`), none
keeps a list of its own, and fish, driven by its own `complete -C` with this ckptfs on PATH,
offers exactly the table's commands; each command's flags and -o option names, as each shell
itself evaluates its tables, are the same in all three, and a command's long flags are the ones
its --help names. zsh and fish parse the files (-n); fish completes flags, -o names after a
comma and -o values."""

import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from ckptfs_test import Tap  # noqa: E402

ROOT = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", ".."))
CKPTFS = os.path.realpath(os.environ.get("CKPTFS", os.path.join(ROOT, "build", "ckptfs")))
MH = os.path.join(ROOT, "mount-helpers")
CI = os.environ.get("CKPTFS_CI") == "1"
SHELLS = ("bash", "zsh", "fish")
tap = Tap()


def path(sh):
    return os.path.join(MH, "ckptfs.%s-completion" % sh)


def run(argv, **kw):
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, **kw)


def table_of(sh, kind, cmd):
    """What shell sh's completion file says for cmd: its flags or its -o names, as words."""
    f = path(sh)
    if sh == "bash":
        fn = "_ckptfs_flags" if kind == "flags" else "_ckptfs_o_names"
        r = run(["bash", "--norc", "--noprofile", "-c", 'source "$1"; %s "$2"' % fn, "_", f, cmd])
    elif sh == "zsh":
        fn = "_ckptfs_flags" if kind == "flags" else "_ckptfs_o_names"
        # Sourcing runs its last line, `_ckptfs "$@"`, outside a completion: quiet it.
        r = run(["zsh", "-f", "-c", 'source "$1" >/dev/null 2>&1; %s "$2"' % fn, "_", f, cmd])
    else:
        what = ("printf '%%s\\n' $__ckptfs_flags_%s" % cmd if kind == "flags"
                else "__ckptfs_o_names %s" % cmd)
        r = run(["fish", "--no-config", "-c", "source %s; %s" % (f, what)])
    return r.stdout.split()


table = run([CKPTFS, "help", "--commands"])
commands = table.stdout.split()
tap.ok(table.returncode == 0 and len(commands) >= 8,
       "the program's command table: %s" % " ".join(commands), [table.stderr])
for sh in SHELLS:
    with open(path(sh)) as f:
        text = f.read()
    tap.ok("help --commands" in text and not re.search(r"\bls info cat\b", text),
           "%s takes the commands from the table, keeps no list of its own" % sh)

present = [sh for sh in SHELLS if shutil.which(sh)]
for sh in SHELLS:
    if sh not in present:
        if CI:
            tap.ok(False, "%s is installed (CKPTFS_CI=1)" % sh)
        else:
            tap.skip("%s's tables and syntax" % sh, "%s is not installed" % sh)
for sh in ("zsh", "fish"):
    if sh in present:
        r = run([sh, "-n", path(sh)])
        tap.ok(r.returncode == 0, "%s -n: the completion parses" % sh, [r.stderr])

labels = ["mount"] + [c for c in commands if c != "help"]
for cmd in labels:
    flags = {sh: table_of(sh, "flags", cmd) for sh in present}
    names = {sh: table_of(sh, "o", cmd) for sh in present}
    tap.ok(len({tuple(v) for v in flags.values()}) == 1 and flags["bash"],
           "%s: the same flags in %s" % (cmd, ", ".join(present)), ["%s: %s" % kv for kv in flags.items()])
    tap.ok(len({tuple(v) for v in names.values()}) == 1,
           "%s: the same -o names in %s" % (cmd, ", ".join(present)),
           ["%s: %s" % kv for kv in names.items()])
    helptext = run([CKPTFS, "--help"] if cmd == "mount" else [CKPTFS, cmd, "--help"])
    # Lines that show another command's use (mount's help names `ckptfs stage ... --from`) are
    # that command's.
    others = [c for c in commands if c != cmd]
    lines = [l for l in (helptext.stdout + helptext.stderr).splitlines()
             if not any(re.search(r"ckptfs %s\b" % c, l) for c in others)]
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*[a-z]", "\n".join(lines)))
    # --help and --version: every command's, whether or not its help spells them out.
    named -= {"--help", "--version"}
    have = {f for f in flags["bash"] if f.startswith("--")} - {"--help", "--version"}
    tap.ok(have == named, "%s: the completions' long flags are the ones --help names" % cmd,
           ["in the completions only: %s" % sorted(have - named),
            "in --help only: %s" % sorted(named - have)])

if "fish" in present:
    empty = tempfile.mkdtemp(prefix="ckptfs-fish.")  # no file names among the candidates
    env = dict(os.environ, PATH=os.path.dirname(CKPTFS) + ":" + os.environ.get("PATH", ""))

    def fish_complete(line):
        script = "source %s; complete -C %s" % (path("fish"), "'" + line.replace("'", "\\'") + "'")
        r = run(["fish", "--no-config", "-c", script], cwd=empty, env=env)
        return sorted({l.split("\t")[0] for l in r.stdout.splitlines()})
    try:
        got = fish_complete("ckptfs ")
        tap.ok(got == sorted(commands), "fish: ckptfs <TAB> offers the table's commands (%s)" % got)
        got = fish_complete("ckptfs help ")
        tap.ok(got == sorted(commands), "fish: ckptfs help <TAB> offers them too")
        for cmd in ("ls", "verify", "serve", "stage", "stats"):
            got = fish_complete("ckptfs %s --" % cmd)
            want = sorted(f for f in table_of("fish", "flags", cmd) if f.startswith("--"))
            tap.ok(got == want, "fish: ckptfs %s --<TAB> offers its long flags" % cmd,
                   ["got %s" % got, "want %s" % want])
        got = fish_complete("ckptfs a.safetensors /mnt -o view=hf,np")
        tap.ok(got == ["view=hf,npy"], "fish: -o view=hf,np<TAB> completes after the comma (%s)" % got)
        got = fish_complete("ckptfs a.safetensors /mnt -o npy,view=")
        tap.ok(got == ["npy,view=hf", "npy,view=tree"], "fish: -o view=<TAB> offers the views (%s)" % got)
        got = fish_complete("ckptfs stage OUT MNT -o noc")
        tap.ok(got == ["nocommit"], "fish: stage's -o names (%s)" % got)
        got = fish_complete("ckptfs info SRC -o s3_addressing=")
        tap.ok(got == ["s3_addressing=path", "s3_addressing=virtual"],
               "fish: a subcommand's remote -o values (%s)" % got)
    finally:
        shutil.rmtree(empty, ignore_errors=True)
tap.done()
sys.exit(1 if tap.failed else 0)
