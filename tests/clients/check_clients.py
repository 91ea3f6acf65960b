#!/usr/bin/env python3
"""Every client pinned in requirements.in is installed at its version and imports: run by
`make deps-clients` with the venv's python after pip. One line per client that is not, naming
it, and exit status 1: a client that cannot be had fails the build, it is never skipped.

usage: check_clients.py REQUIREMENTS_IN
"""

import importlib
import importlib.metadata
import os
import re
import sys

# keras imports its backend at import time: the tests run it on torch, which the venv has
# (its default, tensorflow, is not pinned).
os.environ.setdefault("KERAS_BACKEND", "torch")

# The module each distribution is imported as, where the names differ.
MODULE = {"huggingface_hub": "huggingface_hub", "huggingface-hub": "huggingface_hub"}


def pins(path):
    out = []
    for line in open(path, encoding="utf-8"):
        line = line.split("#", 1)[0].strip()
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)==([^\s;]+)", line)
        if m:
            out.append((m.group(1), m.group(2)))
        elif line:
            raise SystemExit("check_clients: %s: not an exact pin: %r" % (path, line))
    return out


def main(argv):
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    bad = 0
    for dist, want in pins(argv[1]):
        try:
            got = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            print("deps-clients: %s==%s is not installed" % (dist, want))
            bad += 1
            continue
        if got != want:
            print("deps-clients: %s is %s, requirements.in pins %s" % (dist, got, want))
            bad += 1
            continue
        module = MODULE.get(dist, dist.replace("-", "_"))
        try:
            importlib.import_module(module)
        except Exception as e:  # a wheel that installs but does not load on this machine
            print("deps-clients: %s==%s does not import (%s: %s)"
                  % (dist, want, type(e).__name__, e))
            bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
