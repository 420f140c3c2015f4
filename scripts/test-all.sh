#!/usr/bin/env bash
# Installs what the tests need and runs every test: the README's test command, and what CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
target_dir=${CARGO_TARGET_DIR:-$root/target}
# A clean CI machine builds once: incremental caches would only take disk (it ran out once).
if [ "${CI:-}" = "true" ]; then export CARGO_INCREMENTAL=0; fi

step() { printf '\n==> %s\n' "$*"; }

step "Debian packages listed in e2e/*/apt.txt"
wanted=$(cat e2e/*/apt.txt 2>/dev/null | sed 's/#.*//' | xargs -r echo)
missing=()
for pkg in $wanted; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
    sudo_cmd=""
    [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
    $sudo_cmd apt-get update -qq
    # Containers have no init system: keep package scripts from starting services.
    DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

step "Python venv with e2e/*/requirements.txt"
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check pytest==8.3.5
for req in e2e/*/requirements.txt; do
    [ -f "$req" ] && .venv/bin/python -m pip install -q --disable-pip-version-check -r "$req"
done

step "cargo fmt --check"
cargo fmt --all --check

step "cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings

step "cargo build (binaries used by the e2e suites)"
cargo build --workspace --bins

step "cargo test"
cargo test --workspace

step "cargo test --release -p quiver-operator (its scenarios give one verdict in every build)"
cargo test --release -p quiver-operator

step "bench smoke (figures are never pass/fail)"
cargo run -q -p quiver-bench -- store --smoke
cargo run -q -p quiver-bench -- peers --smoke --systems quiver

for suite in e2e/*/run.sh; do
    step "e2e: $suite"
    # Suites that build (e2e/rust5) share the workspace's target dir.
    CARGO_TARGET_DIR="$target_dir" QUIVER_PYTHON="$root/.venv/bin/python" \
        QUIVER_BIN_DIR="$target_dir/debug" bash "$suite"
done

step "all tests passed"
