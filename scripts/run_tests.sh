#!/usr/bin/env bash
# Quick start, command 2: set everything up and run the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
# Flower spawns its helper processes (flower-superexec, flwr-serverapp, ...) by bare name.
export PATH="$PWD/.venv/bin:$PATH"
exec .venv/bin/python -m pytest "$@"
