#!/usr/bin/env bash
# promtool checks and unit tests of the shipped alert rules, then a real Prometheus scraping a
# real quiver-broker while the real RocketMQ client produces and consumes. The tests start and
# stop every process themselves (loopback, free ports, temp dirs).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
: "${QUIVER_PYTHON:?QUIVER_PYTHON must point at the venv python}"
: "${QUIVER_BIN_DIR:?QUIVER_BIN_DIR must hold the quiver-broker binary}"
export QUIVER_BROKER_BIN="$QUIVER_BIN_DIR/quiver-broker"
[ -x "$QUIVER_BROKER_BIN" ] || { echo "missing $QUIVER_BROKER_BIN" >&2; exit 1; }
command -v prometheus >/dev/null || { echo "prometheus missing (apt: see apt.txt)" >&2; exit 1; }
command -v promtool >/dev/null || { echo "promtool missing (apt: see apt.txt)" >&2; exit 1; }
cd "$here"
# Helpers shared by the e2e suites (free ports, waiting with a deadline).
export PYTHONPATH="$here/../common${PYTHONPATH:+:$PYTHONPATH}"
exec "$QUIVER_PYTHON" -m pytest -q -p no:cacheprovider "$here"
