#!/usr/bin/python3
"""HF cache repo folders (refs/main, -o revision=) and snapshots whose files are symlinks into blobs/; index text naming absolute or ../ paths refused.

-o revision= at its edges (issue 29: a mutant of the '..' check survived): "..", ".", "a/..",
"../main", "./main", "a//b", "/main", "", a control byte and 256 bytes are refused as not a
name; "...", "..a", "a..", ".a" and 255 bytes are names (looked up, not found); "main" and
"pr/1" resolve.

Cases and checks: tests/lib/layout_checks.py; fixtures: tests/gen/layouts_fixtures.py
(FIXTURES/layouts).
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
import layout_checks  # noqa: E402
from ckptfs_test import run_capture  # noqa: E402

REFUSED = "not a branch, tag or commit name"


def revision_bounds(tap, ckptfs, root):
    repo = os.path.join(root, "hfcache", "models--org--tiny")
    for rev in ("..", ".", "a/..", "../main", "./main", "a//b", "/main", "", "a\x01b", "x" * 256):
        rc, _, err = run_capture([ckptfs, "ls", "-o", "revision=" + rev, repo], 30)
        tap.ok(rc != 0 and REFUSED in err.decode(errors="replace"),
               "revision=%r: refused as not a name" % rev[:20], [rc, err[:200]])
    for rev in ("...", "..a", "a..", ".a", "y" * 255):
        rc, _, err = run_capture([ckptfs, "ls", "-o", "revision=" + rev, repo], 30)
        text = err.decode(errors="replace")
        tap.ok(rc != 0 and REFUSED not in text and "neither a ref" in text,
               "revision=%r: a name, looked up and not found" % rev[:20], [rc, text[:200]])
    for rev in ("main", "pr/1"):
        rc, out, err = run_capture([ckptfs, "ls", "-o", "revision=" + rev, repo], 30)
        tap.ok(rc == 0 and out, "revision=%s resolves" % rev, [rc, err[:200]])


def extra(tap, ckptfs, root):
    layout_checks.fifo_hfcache(tap, ckptfs, root)
    revision_bounds(tap, ckptfs, root)


sys.exit(layout_checks.run("hfcache", extra))
