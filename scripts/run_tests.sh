#!/usr/bin/env bash
# Quick start, command 2: set everything up and run the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
exec .venv/bin/python -m pytest "$@"
