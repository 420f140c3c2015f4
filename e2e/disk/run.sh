#!/usr/bin/env bash
# A full disk never crashes the broker: the real quiver-broker on real small tmpfs file systems
# (mounted, resized, remounted read-only by each test: needs root, as CI runs), filled by the
# stock Apache client (PyPI rocketmq==0.4.4). Each test starts its own broker on free loopback
# ports with its data directory on the tmpfs and its log outside it.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
: "${QUIVER_PYTHON:?QUIVER_PYTHON must point at a python with pytest and requirements.txt}"
: "${QUIVER_BIN_DIR:?QUIVER_BIN_DIR must hold the quiver-broker binary}"
export QUIVER_BROKER_BIN="$QUIVER_BIN_DIR/quiver-broker"
[ -x "$QUIVER_BROKER_BIN" ] || { echo "missing $QUIVER_BROKER_BIN" >&2; exit 1; }
cd "$here"
# e2e/common: free ports, waiting with a deadline; e2e/broker: its Broker class, client helpers
# and remoting client, imported rather than copied.
export PYTHONPATH="$here/../common:$here/../broker${PYTHONPATH:+:$PYTHONPATH}"
# Brokers are children of pytest, stopped by its fixtures (and at interpreter exit); each test
# unmounts its tmpfs. -rfEs lists failures, errors and (never expected) skips at the end.
"$QUIVER_PYTHON" -m pytest -q -rfEs -p no:cacheprovider --timeout 600 "$here" "$@"
