#!/bin/sh
# Keras 3 weights written by keras and h5py (in the client venv, $CLIENTS_PY), checked
# against what h5py reads: see tests/t/980-keras.py.
if [ -z "$CLIENTS_PY" ] || [ ! -x "$CLIENTS_PY" ]; then
    echo "1..1"
    echo "not ok 1 - the client venv's python (CLIENTS_PY=$CLIENTS_PY) runs: make deps-clients"
    exit 1
fi
exec "$CLIENTS_PY" "$(dirname "$0")/980-keras.py"
