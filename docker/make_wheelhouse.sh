#!/usr/bin/env bash
# The wheels the app images install, fetched on the host so `docker build` needs no network:
#   docker/make_wheelhouse.sh                 # -> docker/wheelhouse/ (git-ignored)
# Which wheels: the project's dependencies (pyproject.toml, plus the `lite0` extra: the ultrasound
# cpu preset's weights), at the versions installed in the host's environment (its `pip freeze` is
# the constraints file, so an image runs the same numpy/torch/... as the simulation it is compared
# with), and requirements-nodeps.txt (installed --no-deps, as scripts/setup.sh does).
# The host pip's own configuration (index, find-links) applies; PIP_ARGS adds to it, e.g.
#   PIP_ARGS="--extra-index-url https://download.pytorch.org/whl/cpu" docker/make_wheelhouse.sh
# for CPU-only torch where that index is reachable (torch==2.14.1 is then 2.14.1+cpu).
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELHOUSE="${WHEELHOUSE:-docker/wheelhouse}"
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY="$(command -v python3 || true)"; fi
fi
if [ -z "$PY" ] || ! "$PY" -c "import flwr, torch" 2>/dev/null; then
  echo "make_wheelhouse.sh: needs the project's environment (scripts/setup.sh), or PYTHON=<its python>" >&2
  exit 1
fi
mkdir -p "$WHEELHOUSE"
"$PY" - "$WHEELHOUSE" <<'PY'
import sys, tomllib
out = sys.argv[1]
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
reqs = list(project["dependencies"]) + list(project["optional-dependencies"]["lite0"])
open(f"{out}/requirements.txt", "w").write("\n".join(reqs) + "\n")
PY
# The host's versions, less the project itself (editable) and the --no-deps pair.
"$PY" -m pip freeze --exclude-editable | grep -v -E '^(anjana|pycanon)==' >"$WHEELHOUSE/constraints.txt"
cp requirements-nodeps.txt "$WHEELHOUSE/requirements-nodeps.txt"
# shellcheck disable=SC2086
"$PY" -m pip wheel -q ${PIP_ARGS:-} -w "$WHEELHOUSE" \
  -r "$WHEELHOUSE/requirements.txt" -c "$WHEELHOUSE/constraints.txt"
# shellcheck disable=SC2086
"$PY" -m pip wheel -q ${PIP_ARGS:-} --no-deps -w "$WHEELHOUSE" -r "$WHEELHOUSE/requirements-nodeps.txt"
echo "make_wheelhouse.sh: $(ls "$WHEELHOUSE"/*.whl | wc -l) wheels, $(du -sh "$WHEELHOUSE" | cut -f1) in $WHEELHOUSE"
