#!/usr/bin/python3
"""The three shell completions (mount-helpers/ckptfs.{bash,zsh,fish}-completion) against the
program: every command the program has (`ckptfs help --commands`, its command table, when it
has one; else the commands `ckptfs help` lists) is offered by each, and each word a completion
offers is a command (`ckptfs WORD --help` answers with its Usage line); each command's flags
are the same in all three and its long flags are the ones `ckptfs COMMAND --help` names; the -o
option names are the same in all three. zsh and fish parse the files (-n), and fish, driven by
its own `complete -C`, offers what the tables say."""

import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from ckptfs_test import Tap  # noqa: E402

ROOT = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", ".."))
CKPTFS = os.environ.get("CKPTFS", os.path.join(ROOT, "build", "ckptfs"))
MH = os.path.join(ROOT, "mount-helpers")
tap = Tap()


def read(name):
    with open(os.path.join(MH, "ckptfs.%s-completion" % name)) as f:
        return f.read()


def run(argv, **kw):
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, **kw)


def case_table(text, func):
    """{label: [words]} from a bash/zsh function made of `label | label) echo "words" ;;`."""
    m = re.search(r"^%s\(\) \{\n(.*?)^\}" % func, text, re.M | re.S)
    out = {}
    for labels, words in re.findall(r"^\s+([a-z*| ]+)\) echo \"([^\"]*)\"", m.group(1) if m else "",
                                    re.M):
        for label in labels.split("|"):
            out[label.strip().replace("*", "mount" if func == "_ckptfs_flags" else "*")] = words.split()
    return out


bash, zsh, fish = read("bash"), read("zsh"), read("fish")
commands = {
    "bash": re.search(r'local commands="([^"]*)"', bash).group(1).split(),
    "zsh": re.search(r"^_ckptfs_commands=\(([^)]*)\)", zsh, re.M).group(1).split(),
    "fish": re.search(r"^set -l ckptfs_commands (.*)$", fish, re.M).group(1).split(),
}
flags = {"bash": case_table(bash, "_ckptfs_flags"), "zsh": case_table(zsh, "_ckptfs_flags"),
         "fish": {m.group(1): m.group(2).split()
                  for m in re.finditer(r"^set -g __ckptfs_flags_(\w+) (.*)$", fish, re.M)}}
o_names = {"bash": case_table(bash, "_ckptfs_o_names"), "zsh": case_table(zsh, "_ckptfs_o_names"),
           "fish": {}}
for label, body in re.findall(r"^\s+case ('?[\w*]+'?)\n\s+echo (.*)$", fish, re.M):
    o_names["fish"][label.strip("'")] = body.split()

# What the program says its commands are.
table = run([CKPTFS, "help", "--commands"])
if table.returncode == 0 and table.stdout.split():
    known = table.stdout.split()
    how = "help --commands"
else:
    known = re.findall(r"^  ([a-z]+) ", run([CKPTFS, "help"]).stdout, re.M)
    how = "help's overview (this ckptfs has no help --commands)"
tap.ok(len(known) >= 8, "the program names its commands (%s): %s" % (how, " ".join(known)))
for sh in ("bash", "zsh", "fish"):
    missing = [c for c in known if c not in commands[sh]]
    tap.ok(not missing, "%s offers every command (missing: %s)" % (sh, missing))
    if how.startswith("help --commands"):
        extra = [c for c in commands[sh] if c not in known]
        tap.ok(not extra, "%s offers no command the table lacks (%s)" % (sh, extra))
not_commands = []
for c in sorted(set(commands["bash"]) | set(commands["zsh"]) | set(commands["fish"])):
    r = run([CKPTFS, c, "--help"])
    if c != "help" and not re.search(r"^Usage: ckptfs %s\b" % c, r.stdout + r.stderr, re.M):
        not_commands.append(c)
tap.ok(not not_commands, "every word offered is a command with a Usage line (%s)" % not_commands)

# Flags: the same three tables, and each long flag as --help names them.
tap.ok(flags["bash"] == flags["zsh"] == flags["fish"], "the three flag tables agree",
       ["%s: %s" % (sh, flags[sh]) for sh in flags])
for cmd in sorted(set(flags["bash"]) - {"help"}):
    helptext = run([CKPTFS, "--help"] if cmd == "mount" else [CKPTFS, cmd, "--help"])
    # Lines that show another command's use (mount's help names `ckptfs stage ... --from`) are
    # that command's.
    others = [c for c in commands["bash"] if c != cmd]
    lines = [l for l in (helptext.stdout + helptext.stderr).splitlines()
             if not any(re.search(r"ckptfs %s\b" % c, l) for c in others)]
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*[a-z]", "\n".join(lines)))
    have = {f for f in flags["bash"][cmd] if f.startswith("--")}
    tap.ok(have - {"--help"} == named - {"--help"},
           "%s: the completions' long flags are the ones --help names" % cmd,
           ["in the completions only: %s" % sorted(have - named - {"--help"}),
            "in --help only: %s" % sorted(named - have - {"--help"})])
tap.ok(o_names["bash"] == o_names["zsh"] == o_names["fish"], "the three -o name tables agree",
       ["%s: %s" % (sh, o_names[sh]) for sh in o_names])

# The shells themselves.
for sh in ("zsh", "fish"):
    if not shutil.which(sh):
        if os.environ.get("CKPTFS_CI") == "1":
            tap.ok(False, "%s is installed (CKPTFS_CI=1)" % sh)
        else:
            tap.skip("%s parses its completion" % sh, "%s is not installed" % sh)
        continue
    r = run([sh, "-n", os.path.join(MH, "ckptfs.%s-completion" % sh)])
    tap.ok(r.returncode == 0, "%s -n: the completion parses" % sh, [r.stderr])
if shutil.which("fish"):
    def fish_complete(line):
        script = "source %s; complete -C %s" % (os.path.join(MH, "ckptfs.fish-completion"),
                                                 "'" + line.replace("'", "\\'") + "'")
        r = run(["fish", "--no-config", "-c", script], cwd="/")
        return sorted({l.split("\t")[0] for l in r.stdout.splitlines()})
    for cmd in ("ls", "verify", "serve", "stage"):
        got = fish_complete("ckptfs %s --" % cmd)
        want = sorted(f for f in flags["fish"][cmd] if f.startswith("--"))
        tap.ok(got == want, "fish: ckptfs %s --<TAB> offers its long flags" % cmd,
               ["got %s" % got, "want %s" % want])
    got = fish_complete("ckptfs ve")
    tap.ok("verify" in got, "fish: ckptfs ve<TAB> offers verify (%s)" % got[:5])
    got = fish_complete("ckptfs help ")
    tap.ok(sorted(commands["fish"]) == [g for g in got if g in commands["fish"]],
           "fish: ckptfs help <TAB> offers the commands")
    got = fish_complete("ckptfs a.safetensors /mnt -o view=hf,np")
    tap.ok(got == ["view=hf,npy"], "fish: -o view=hf,np<TAB> completes after the comma (%s)" % got)
    got = fish_complete("ckptfs stage OUT MNT -o noc")
    tap.ok(got == ["nocommit"], "fish: stage's -o names (%s)" % got)
    got = fish_complete("ckptfs info SRC -o ")
    tap.ok(got == ["revision=", "tp_split="], "fish: the subcommands' -o names (%s)" % got)
tap.done()
sys.exit(1 if tap.failed else 0)
