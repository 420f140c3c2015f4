#!/usr/bin/env bash
# Real-client end-to-end tests of quiver-broker: the Apache C++ client (PyPI rocketmq==0.4.4)
# against the broker binary. Each test starts its own brokers on free loopback ports.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
: "${QUIVER_PYTHON:?QUIVER_PYTHON must point at a python with pytest and requirements.txt}"
: "${QUIVER_BIN_DIR:?QUIVER_BIN_DIR must hold the quiver-broker binary}"
export QUIVER_BROKER_BIN="$QUIVER_BIN_DIR/quiver-broker"
[ -x "$QUIVER_BROKER_BIN" ] || { echo "missing $QUIVER_BROKER_BIN" >&2; exit 1; }
# test_tls.py runs the `quiver` CLI too.
[ -x "$QUIVER_BIN_DIR/quiver" ] || { echo "missing $QUIVER_BIN_DIR/quiver (run cargo build --workspace --bins)" >&2; exit 1; }
export QUIVER_BIN_DIR
# Brokers are children of pytest, stopped by its fixtures (and at interpreter exit).
cd "$here"
# Helpers shared by the e2e suites (free ports, waiting with a deadline).
export PYTHONPATH="$here/../common${PYTHONPATH:+:$PYTHONPATH}"
"$QUIVER_PYTHON" -m pytest -q -p no:cacheprovider "$here"
