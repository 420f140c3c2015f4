#!/usr/bin/env bash
# Apache's Rust 5.x client (crates.io rocketmq 5.0.0: Producer, SimpleConsumer) against the real
# quiver-broker's gRPC port. The crate is outside the workspace (root Cargo.toml `exclude`, its
# own Cargo.lock): the client's older tonic / prost stay out of the broker's dependency graph.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
: "${QUIVER_PYTHON:?QUIVER_PYTHON must point at the e2e venv python}"
: "${QUIVER_BIN_DIR:?QUIVER_BIN_DIR must hold the quiver and quiver-broker binaries}"
for bin in quiver quiver-broker; do
    [ -x "$QUIVER_BIN_DIR/$bin" ] || { echo "missing $QUIVER_BIN_DIR/$bin (run cargo build --workspace --bins)" >&2; exit 1; }
done
target_dir=${CARGO_TARGET_DIR:-$here/target}
CARGO_TARGET_DIR="$target_dir" cargo build --locked --quiet --manifest-path "$here/Cargo.toml"
export PYTHONPATH="$here/../common${PYTHONPATH:+:$PYTHONPATH}"

port() { "$QUIVER_PYTHON" -c 'from quiver_e2e import free_port; print(free_port())'; }
remoting="127.0.0.1:$(port)"
grpc="127.0.0.1:$(port)"
http="127.0.0.1:$(port)"
data=$(mktemp -d -t quiver-rust5-XXXXXX)
"$QUIVER_BIN_DIR/quiver-broker" --data-dir "$data" --listen "$remoting" --advertise "$remoting" \
    --http-listen "$http" --grpc-listen "$grpc" --grpc-advertise "$grpc" >"$data/broker.log" 2>&1 &
broker=$!
stop() {
    kill "$broker" 2>/dev/null || true
    wait "$broker" 2>/dev/null || true
    rm -rf "$data"
}
trap stop EXIT
fail() { echo "$1; broker log:" >&2; tail -n 80 "$data/broker.log" >&2; exit 1; }

"$QUIVER_PYTHON" - "$http" "$grpc" <<'PY' || fail "the broker did not come up"
import socket, sys, urllib.request
from quiver_e2e import wait_until
http, grpc = sys.argv[1], sys.argv[2]
def up():
    try:
        with urllib.request.urlopen(f"http://{http}/readyz", timeout=2) as r:
            ready = r.status == 200
        socket.create_connection(tuple(grpc.rsplit(":", 1)), timeout=1).close()
        return ready
    except OSError:
        return False
wait_until(up, 30, "the broker's /readyz and gRPC port")
PY

quiver() { "$QUIVER_BIN_DIR/quiver" --server "$remoting" "$@" >/dev/null; }
# Each group reads its topic from the start (the same topics and groups as src/main.rs).
for pair in Rust5Topic:rust5-readers Rust5Redeliver:rust5-redeliver; do
    topic=${pair%%:*}
    group=${pair#*:}
    quiver topics create "$topic" --queues 4
    "$QUIVER_PYTHON" -c 'import json, sys, remoting
code, remark, _, _ = remoting.call(sys.argv[1], 200, body=json.dumps({"groupName": sys.argv[2]}).encode())
assert code == 0, remark' "$remoting" "$group"
    quiver offsets reset --group "$group" --topic "$topic" --to earliest
done

"$target_dir/debug/quiver-e2e-rust5" "$grpc" || fail "the Rust 5.x client checks failed"
