#!/usr/bin/python3
"""folders of single-file checkpoints: several quantizations or .pt files as subtrees, the parts of a split GGUF as one model.

Cases and checks: tests/lib/layout_checks.py; fixtures: tests/gen/layouts_fixtures.py
(FIXTURES/layouts).
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
import layout_checks  # noqa: E402

sys.exit(layout_checks.run("folders", layout_checks.fifo_folders))
