# Sourced by suites that drive Apache's RocketMQ 5.x Python client (PyPI rocketmq-python-client,
# gRPC): both clients install a package named `rocketmq`, so the 5.x one lives in a venv of its
# own (e2e/grpc/.venv-grpc), reinstalled only when e2e/grpc/requirements-v5.txt changes. Sets
# QUIVER_GRPC_PYTHON to its python. Needs QUIVER_PYTHON (the main venv's python).
grpc_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/../grpc" && pwd)"
grpc_venv="$grpc_dir/.venv-grpc"
grpc_stamp="$grpc_venv/requirements-v5.sha256"
grpc_wanted=$(sha256sum "$grpc_dir/requirements-v5.txt" | cut -d' ' -f1)
if [ ! -x "$grpc_venv/bin/python" ] || [ "$(cat "$grpc_stamp" 2>/dev/null)" != "$grpc_wanted" ]; then
    "$QUIVER_PYTHON" -m venv --clear "$grpc_venv" 2>/dev/null || python3 -m venv --clear "$grpc_venv"
    "$grpc_venv/bin/python" -m pip install -q --disable-pip-version-check -r "$grpc_dir/requirements-v5.txt"
    echo "$grpc_wanted" > "$grpc_stamp"
fi
export QUIVER_GRPC_PYTHON="$grpc_venv/bin/python"
