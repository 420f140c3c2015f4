#!/usr/bin/env bash
# Chart checks with the real tools: Helm v4 SDK (lint, template, schema), kubernetes-validate,
# jsonschema against our CRDs and prometheus-operator's, promtool on the rendered rules.
set -euo pipefail
cd "$(dirname "$0")"
: "${QUIVER_PYTHON:?QUIVER_PYTHON must point at the venv python}"
exec "$QUIVER_PYTHON" -m pytest -q -p no:cacheprovider .
