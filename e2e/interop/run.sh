#!/usr/bin/env bash
# Interoperability of the Rust client (`quiver` CLI) with the Apache C++ client (PyPI
# rocketmq==0.4.4) through a real quiver-broker. Each test module starts its own broker.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
: "${QUIVER_PYTHON:?QUIVER_PYTHON must point at a python with pytest and requirements.txt}"
: "${QUIVER_BIN_DIR:?QUIVER_BIN_DIR must hold the quiver and quiver-broker binaries}"
for bin in quiver quiver-broker; do
    [ -x "$QUIVER_BIN_DIR/$bin" ] || { echo "missing $QUIVER_BIN_DIR/$bin (run cargo build --workspace --bins)" >&2; exit 1; }
done
export QUIVER_BIN_DIR
cd "$here"
# Helpers shared by the e2e suites (free ports, waiting with a deadline).
export PYTHONPATH="$here/../common${PYTHONPATH:+:$PYTHONPATH}"
# Brokers are children of pytest, stopped by its fixtures (and at interpreter exit).
"$QUIVER_PYTHON" -m pytest -q -p no:cacheprovider --timeout 120 "$here"
