#!/usr/bin/python3
"""Mount every gpt-rs fixture (GPTRSCHK / GPTRSTEN) and feed the hostile ones.

Environment: CKPTFS (the ckptfs binary), FIXTURES (fixture root, where
tests/gen/gptrs_fixtures.py wrote gptrs/).

The checks are tests/lib/format_suite.py's: every good case's tensors (bytes,
sidecars with the format's extra members such as base_id), the tree, the
"gpt-rs" document in .ckptfs/metadata.json and the expected warnings; every
hostile case refused or mounted safely.
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from format_suite import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main("gptrs", "gpt-rs"))
