#!/usr/bin/env bash
# Quick start, command 1: set everything up, run the default study (dfl-dp, demo grid:
# FL vs sequential DFL, No-DP vs C=1/eps_cal=2, N=100, 20 rounds) and print its tables.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
export PATH="$PWD/.venv/bin:$PATH"
exec .venv/bin/python -m flower_apps.dfl_dp.sweep --grid demo --results-dir "${RESULTS_DIR:-results}" "$@"
