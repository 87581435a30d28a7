#!/usr/bin/env bash
# Quick start, command 2: set everything up and run the test suite.
# The suite runs on PYTEST_WORKERS pytest-xdist workers (default 2, the machine's cores), one test
# module per worker at a time (module fixtures such as a deployment are started once), longest modules
# first (tests/conftest.py: LONGEST_MODULES). PYTEST_WORKERS=0 runs it serially in one process.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
# Flower spawns its helper processes (flower-superexec, flwr-serverapp, ...) by bare name.
export PATH="$PWD/.venv/bin:$PATH"
WORKERS="${PYTEST_WORKERS:-2}"
if [ "$WORKERS" = "0" ]; then
  exec .venv/bin/python -m pytest "$@"
fi
exec .venv/bin/python -m pytest -n "$WORKERS" --dist loadfile --no-loadscope-reorder "$@"
