#!/usr/bin/python3
"""A path holding a newline or an escape sequence never reaches the terminal raw: every front
end's message shows bytes 0x00-0x1F, 0x7F and the C1 controls as %XX (as core's names are
shown), on one line, with the rest of the path readable.

Each case is a command whose one-line error names a path the user gave: the read-only mount's
mount point, a stage's mount point, serve's --token-file, the cli's source, mountpoint checks.
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from ckptfs_test import Tap, run_capture  # noqa: E402

ROOT = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", ".."))
CKPTFS = os.environ.get("CKPTFS") or os.path.join(ROOT, "build", "ckptfs")
FIXTURES = os.environ.get("FIXTURES") or os.path.join(ROOT, "build", "fixtures")

EVIL = b"ev\nil\x1b[2J\x7f\xc2\x9bx"  # a newline, ESC [2J (clear screen), DEL, C1 CSI (U+009B)
SHOWN = "ev%0Ail%1B[2J%7F%C2%9Bx"


def check(tap, desc, argv, expect_rc, shown=SHOWN):
    """shown: how the path must appear; core's own messages (ckpt_err) turn control bytes
    into spaces before fs/ sees them, so for those only "nothing raw" is asked."""
    rc, out, err = run_capture(argv, 30)
    raw = any(b in err.rstrip(b"\n") for b in (b"\n", b"\x1b", b"\x7f", b"\xc2\x9b"))
    text = err.decode("utf-8", "replace")
    tap.ok(rc == expect_rc and err.endswith(b"\n") and not raw and (not shown or shown in text),
           "%s: one line%s, nothing raw (exit %s)"
           % (desc, ", the path shown as " + shown if shown else "", rc), [repr(err)])


def main():
    tap = Tap()
    with tempfile.TemporaryDirectory() as t:
        t = os.fsencode(t)
        src = next((os.path.join(d, f) for d, _, fs in sorted(os.walk(FIXTURES)) for f in fs
                    if f.endswith(".safetensors")), "x")
        evil = os.path.join(t, EVIL)
        check(tap, "mount: a missing mount point", [CKPTFS, src, evil], 1)
        check(tap, "stage: a missing mount point",
              [CKPTFS, "stage", os.path.join(t, b"out.safetensors"), evil], 1)
        check(tap, "serve: a missing --token-file",
              [CKPTFS, "serve", "--token-file", evil, src], 1)
        check(tap, "ls: a missing source (core's message)", [CKPTFS, "ls", evil], 2, None)
        os.mkdir(evil)
        check(tap, "mount: a source inside the mount point",
              [CKPTFS, evil, evil], 1)
        check(tap, "commit: not a staging mount", [CKPTFS, "commit", evil], 1)
    tap.done()
    sys.exit(1 if tap.failed else 0)


if __name__ == "__main__":
    main()
