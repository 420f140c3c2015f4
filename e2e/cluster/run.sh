#!/usr/bin/env bash
# Cluster end-to-end tests of the operator. They run only when KUBECONFIG points at a cluster
# (plus QUIVER_OPERATOR_IMAGE and QUIVER_BROKER_IMAGE the cluster can pull); otherwise pytest
# reports them as skipped. Each run uses its own namespace and removes it at the end.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
: "${QUIVER_PYTHON:?QUIVER_PYTHON must point at a python with pytest and requirements.txt}"
: "${QUIVER_BIN_DIR:?QUIVER_BIN_DIR must hold the quiver CLI binary}"
export QUIVER_BIN_DIR
cd "$here"
"$QUIVER_PYTHON" -m pytest -q -p no:cacheprovider "$here"
