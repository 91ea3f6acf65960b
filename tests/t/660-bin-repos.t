#!/usr/bin/python3
"""HF repos with pytorch_model.bin or sharded .bin + index (weight_map checked, mismatches warned), safetensors winning over .bin.

Cases and checks: tests/lib/layout_checks.py; fixtures: tests/gen/layouts_fixtures.py
(FIXTURES/layouts).
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
import layout_checks  # noqa: E402

sys.exit(layout_checks.run("binrepo"))
