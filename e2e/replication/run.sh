#!/usr/bin/env bash
# Replicated broker groups, Jepsen style: three real quiver-broker processes sharing one broker
# name (--group-members), the stock Apache client (PyPI rocketmq==0.4.4) producing and
# consuming, and a nemesis that kills (-9), stops (SIGSTOP) and wipes members. Each test starts
# its own group on free loopback ports in a temp directory.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
: "${QUIVER_PYTHON:?QUIVER_PYTHON must point at a python with pytest and requirements.txt}"
: "${QUIVER_BIN_DIR:?QUIVER_BIN_DIR must hold the quiver-broker binary}"
export QUIVER_BROKER_BIN="$QUIVER_BIN_DIR/quiver-broker"
[ -x "$QUIVER_BROKER_BIN" ] || { echo "missing $QUIVER_BROKER_BIN" >&2; exit 1; }
export QUIVER_BIN_DIR
# test_failover_pop drives the 5.x client from its own venv (made here if missing).
source "$here/../common/grpc-venv.sh"
cd "$here"
# e2e/common: free ports, waiting with a deadline, the raw remoting client.
export PYTHONPATH="$here/../common${PYTHONPATH:+:$PYTHONPATH}"
# Members are children of pytest, killed by its fixtures (and at interpreter exit). -s shows
# the figures (failover times, checker counts) as they are printed; -rfEs lists failures,
# errors and skips at the end.
"$QUIVER_PYTHON" -m pytest -q -s -rfEs -p no:cacheprovider --timeout 600 "$here" "$@"
