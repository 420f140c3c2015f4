#!/usr/bin/env bash
# Apache's RocketMQ 5.x Python client (PyPI rocketmq-python-client 5.1.2, gRPC) against the real
# quiver-broker binary; cross-protocol tests run the 4.x client (PyPI rocketmq 0.4.4, the main
# venv's QUIVER_PYTHON) as subprocesses. Each test starts its own broker on free loopback ports.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
: "${QUIVER_PYTHON:?QUIVER_PYTHON must point at a python with requirements.txt (rocketmq 0.4.4)}"
: "${QUIVER_BIN_DIR:?QUIVER_BIN_DIR must hold the quiver and quiver-broker binaries}"
for bin in quiver quiver-broker; do
    [ -x "$QUIVER_BIN_DIR/$bin" ] || { echo "missing $QUIVER_BIN_DIR/$bin (run cargo build --workspace --bins)" >&2; exit 1; }
done
export QUIVER_BIN_DIR QUIVER_PYTHON

# The 5.x client's own venv (both clients install a package named `rocketmq`).
source "$here/../common/grpc-venv.sh"

cd "$here"
# Helpers shared by the e2e suites (free ports, waiting with a deadline, raw remoting calls).
export PYTHONPATH="$here/../common${PYTHONPATH:+:$PYTHONPATH}"
# Brokers are children of pytest, stopped by its fixtures (and at interpreter exit).
"$QUIVER_GRPC_PYTHON" -m pytest -q -p no:cacheprovider --timeout 180 "$here" "$@"
