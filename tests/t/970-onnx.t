#!/bin/sh
# ONNX models written by the onnx package itself (in the client venv, $CLIENTS_PY), checked
# against what onnx.load + numpy_helper.to_array return: see tests/t/970-onnx.py.
if [ -z "$CLIENTS_PY" ] || [ ! -x "$CLIENTS_PY" ]; then
    echo "1..1"
    echo "not ok 1 - the client venv's python (CLIENTS_PY=$CLIENTS_PY) runs: make deps-clients"
    exit 1
fi
exec "$CLIENTS_PY" "$(dirname "$0")/970-onnx.py"
