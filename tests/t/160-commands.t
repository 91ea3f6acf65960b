#!/usr/bin/python3
"""The commands of ckptfs, from its one table (fs/main.c), agree everywhere they are named.

- COMMANDS below is the list as ckptfs(1) documents it, written here and not read from the
  binary: `ckptfs help` lists each with a summary, `ckptfs help --commands` prints exactly
  these, the mount's --help names each on its Commands line, and every command's --help (and
  `ckptfs help COMMAND`) starts with the Usage line `ckptfs help` shows for it.
- `ckptfs --help` fits a 24-line, 80-column terminal and lists the remote-source -o options.
- A first word one typo from a command (`ckptfs stat X`) that is no file gets "did you mean
  stats?" and exit 2, not a try to mount it; an existing file of that name is mounted as a
  SOURCE as before, and a word near no command still gets the source error.
- `ckptfs stats -q` prints only the tensors holding NaN or Inf.
"""
import os
import struct
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from ckptfs_test import Tap, run_capture  # noqa: E402

ROOT = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", ".."))
CKPTFS = os.environ.get("CKPTFS") or os.path.join(ROOT, "build", "ckptfs")
COMMANDS = ["ls", "info", "cat", "verify", "convert", "stats", "diff", "serve", "stage",
            "commit", "umount", "help"]
REMOTE_OPTS = ["s3_endpoint", "s3_region", "s3_addressing", "cache_dir", "cache_size",
               "cache_ram", "block_size", "prefetch", "remote_timeout", "retries"]


def ckptfs(*args, cwd=None):
    rc, out, err = run_capture([CKPTFS, *args], 30)
    return rc, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")


def safetensors(path, tensors):
    """tensors: [(name, list of float32 values)], written by hand (header + data)."""
    import json
    header, data = {}, b""
    for name, vals in tensors:
        raw = struct.pack("<%df" % len(vals), *vals)
        header[name] = {"dtype": "F32", "shape": [len(vals)],
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


def main():
    tap = Tap()
    rc, help_out, _ = ckptfs("help")
    listed = {}
    for line in help_out.splitlines():
        if line.startswith("  ") and line[2:3].islower():
            name, _, summary = line[2:].partition(" ")
            listed[name] = summary.strip()
    tap.ok(rc == 0 and sorted(listed) == sorted(COMMANDS) and all(listed.values()),
           "ckptfs help lists every command with a summary, and no other",
           ["missing: %s" % sorted(set(COMMANDS) - set(listed)),
            "extra: %s" % sorted(set(listed) - set(COMMANDS))])
    rc, out, _ = ckptfs("help", "--commands")
    tap.ok(rc == 0 and out.split() == COMMANDS,
           "ckptfs help --commands (the completion's list) prints the table's names", [out])
    rc, mhelp, _ = ckptfs("--help")
    line = [l for l in mhelp.splitlines() if l.startswith("Commands:")]
    tap.ok(rc == 0 and line and line[0].split()[1:] == COMMANDS,
           "the mount's --help names every command on its Commands line", line)
    lines = mhelp.splitlines()
    tap.ok(len(lines) <= 24 and all(len(l) <= 80 for l in lines),
           "ckptfs --help fits a 24x80 terminal (%d lines, widest %d)"
           % (len(lines), max(map(len, lines or [""]))))
    missing = [o for o in REMOTE_OPTS if o + "=" not in mhelp]
    tap.ok(not missing, "ckptfs --help lists the remote -o options", missing)
    usage0 = [l for l in help_out.splitlines() if l.startswith("Usage: ckptfs ")]
    for cmd in COMMANDS[:-1]:
        rc, out, _ = ckptfs(cmd, "--help")
        rc2, out2, _ = ckptfs("help", cmd)
        first = out.splitlines()[0] if out else ""
        tap.ok(rc == 0 and rc2 == 0 and out == out2 and first.startswith("Usage: ckptfs %s " % cmd)
               and len(out.splitlines()) > 2,
               "ckptfs %s --help = ckptfs help %s, starting with its Usage line" % (cmd, cmd),
               [first])
    tap.ok(usage0 and usage0[0].startswith("Usage: ckptfs SOURCE MOUNTPOINT")
           and mhelp.splitlines()[0] == usage0[0],
           "ckptfs help and ckptfs --help show the same mount Usage line", usage0)

    with tempfile.TemporaryDirectory() as t:
        for word, want in (("stat", "stats"), ("lss", "ls"), ("vreify", "verify"),
                           ("umonut", "umount"), ("comit", "commit")):
            rc, out, err = ckptfs(word, os.path.join(t, "x"), cwd=t)
            tap.ok(rc == 2 and "did you mean %s?" % want in err and len(err.splitlines()) == 1,
                   "ckptfs %s X: one line, 'did you mean %s?', exit 2 (got %s)" % (word, want, rc),
                   [err])
        rc, _, err = ckptfs("help", "stat")
        tap.ok(rc == 1 and "did you mean stats?" in err, "ckptfs help stat suggests stats", [err])
        # a file named like a typo is a SOURCE, as before; a word near no command too
        os.makedirs(os.path.join(t, "mnt"))
        cwd = os.getcwd()
        os.chdir(t)
        try:
            with open("stat", "w") as f:
                f.write("not a checkpoint\n")
            rc, _, err = ckptfs("stat", "mnt")
            tap.ok(rc == 2 and "did you mean" not in err and "stat" in err,
                   "an existing file named stat is taken as the SOURCE (exit 2, its error)", [err])
            rc, _, err = ckptfs("zzzqqq", "mnt")
            tap.ok(rc == 2 and "did you mean" not in err and "No such file" in err,
                   "a word near no command is a missing SOURCE", [err])
        finally:
            os.chdir(cwd)

        src = os.path.join(t, "m.safetensors")
        safetensors(src, [("fine", [1.0, 2.0]), ("has_nan", [float("nan"), 1.0]),
                          ("has_inf", [float("inf"), 0.0]), ("also_fine", [3.0])])
        rc, out, err = ckptfs("stats", "-q", src)
        names = [l.split()[-1] for l in out.splitlines()[1:]]
        tap.ok(rc == 0 and sorted(names) == ["has_inf", "has_nan"],
               "stats -q prints only the tensors holding NaN or Inf", [out, err])
        rc, out, _ = ckptfs("stats", "--quiet", src, "fine")
        tap.ok(rc == 0 and out == "", "stats --quiet prints nothing when every value is finite",
               [out])
    tap.done()
    sys.exit(1 if tap.failed else 0)


if __name__ == "__main__":
    main()
