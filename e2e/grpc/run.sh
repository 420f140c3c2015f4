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

# Both clients install a package named `rocketmq`: the 5.x one lives in a venv of its own,
# reinstalled only when requirements-v5.txt changes.
venv="$here/.venv-grpc"
stamp="$venv/requirements-v5.sha256"
wanted=$(sha256sum "$here/requirements-v5.txt" | cut -d' ' -f1)
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ]; then
    "$QUIVER_PYTHON" -m venv --clear "$venv" 2>/dev/null || python3 -m venv --clear "$venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$here/requirements-v5.txt"
    echo "$wanted" > "$stamp"
fi

cd "$here"
# Helpers shared by the e2e suites (free ports, waiting with a deadline, raw remoting calls).
export PYTHONPATH="$here/../common${PYTHONPATH:+:$PYTHONPATH}"
# Brokers are children of pytest, stopped by its fixtures (and at interpreter exit).
"$venv/bin/python" -m pytest -q -p no:cacheprovider --timeout 180 "$here" "$@"
