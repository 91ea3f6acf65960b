#!/usr/bin/python3
"""uncompressed tar archives (pax, GNU and ustar long names) and NeMo 1.x .nemo files as containers read in place; hostile and compressed archives refused.

Cases and checks: tests/lib/layout_checks.py; fixtures: tests/gen/layouts_fixtures.py
(FIXTURES/layouts).
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
import layout_checks  # noqa: E402

sys.exit(layout_checks.run("tar"))
