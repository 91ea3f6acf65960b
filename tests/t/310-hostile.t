#!/usr/bin/python3
"""Feed ckptfs hostile inputs and check it refuses or survives them.

Environment:
  CKPTFS    path of the ckptfs binary
  FIXTURES  output directory of tests/gen/safetensors_fixtures.py

FIXTURES/hostile/cases.tsv lists one case per line:
  path <TAB> expect <TAB> needle <TAB> description
expect "refuse": the mount must fail quickly (exit status 2) with exactly one
line on stderr that contains the needle (case-insensitive; "a|b" accepts either
word) and leave nothing mounted.  expect "mount": the mount must succeed and the
whole tree must be safe to walk and read.  FIXTURES/hostile/mount-names.json
lists the tensor names each mount case must expose through sidecars.
The checks are tests/lib/hostile.py's.
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
import hostile  # noqa: E402
from mount_checks import run  # noqa: E402


def main(tap, ckptfs, fixtures):
    hostile.run_cases(tap, ckptfs, os.path.join(fixtures, "hostile"), min_cases=25, named=True)


if __name__ == "__main__":
    sys.exit(run(main))
