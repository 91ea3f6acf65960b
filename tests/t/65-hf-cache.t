#!/usr/bin/python3
"""HF cache repo folders (refs/main, -o revision=) and snapshots whose files are symlinks into blobs/; index text naming absolute or ../ paths refused.

Cases and checks: tests/lib/layout_checks.py; fixtures: tests/gen/layouts_fixtures.py
(FIXTURES/layouts).
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
import layout_checks  # noqa: E402

sys.exit(layout_checks.run("hfcache", layout_checks.fifo_hfcache))
