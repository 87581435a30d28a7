#!/usr/bin/env bash
# GPU check (< 5 minutes on one GPU machine): dfl-dp and ultrasound smoke runs through the
# simulation engine with GPU client resources, then the same on CPU. Prints the GPU, whether
# the ClientApps used CUDA, seconds per round and the CPU/GPU ratio. See benchmarks/gpu_check.py.
#   bash benchmarks/gpu_check.sh                    # uses .venv/bin/python if present, else python3
#   PYTHON=/opt/env/bin/python bash benchmarks/gpu_check.sh --num-gpus 0.25
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY="$(command -v python3 || true)"; fi
fi
if [ -z "$PY" ]; then
  echo "gpu_check: no Python found; run scripts/setup.sh or set PYTHON=/path/to/python" >&2
  exit 2
fi
"$PY" -c 'import sys; sys.exit(0 if sys.version_info[:2] in ((3, 11), (3, 12)) else 1)' || {
  echo "gpu_check: $PY is Python $("$PY" -c 'import sys; print(sys.version.split()[0])'); 3.11 or 3.12 needed" >&2
  exit 2
}
# The runs use this environment as it is: no per-run `uv sync`, no telemetry or update check.
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1
export RAY_USAGE_STATS_ENABLED=0
exec "$PY" benchmarks/gpu_check.py "$@"
