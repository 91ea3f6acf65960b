"""The start of a test that runs the real clients (tests/t/9N-clients-*.t): it runs itself
again under $CLIENTS_PY (build/clients-venv/bin/python, made by `make deps-clients` from the
pinned tests/clients/requirements.txt) and imports the clients it names there. A client that
is missing fails the test with its name; it is never a SKIP (issue 27: a client that cannot be
installed fails the run).

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
    from client_env import under_clients
    under_clients("torch", "safetensors")          # returns only under $CLIENTS_PY
"""

import importlib
import os
import sys

MARK = "CKPTFS_UNDER_CLIENTS_PY"


def _fail(why):
    print("1..1")
    print("not ok 1 - real clients: %s" % why)
    sys.stdout.flush()
    sys.exit(1)


def under_clients(*modules):
    py = os.environ.get("CLIENTS_PY", "")
    if os.environ.get(MARK) != "1":
        if not py or not os.access(py, os.X_OK):
            _fail("CLIENTS_PY (%r) is not an executable: run `make deps-clients` (or `make "
                  "test`, which sets it)" % py)
        os.environ[MARK] = "1"
        os.execv(py, [py] + sys.argv)
    missing = []
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as e:  # an import that fails is a missing client, whatever the error
            missing.append("%s (%s: %s)" % (name, type(e).__name__, e))
    if missing:
        _fail("cannot import under %s: %s" % (py, "; ".join(missing)))
    # Names are UTF-8 whatever the locale of the harness says.
    sys.stdout.reconfigure(encoding="utf-8", errors="backslashreplace")
