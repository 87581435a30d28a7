#!/usr/bin/env bash
# The Docker federation of docs/deployment.md ("Docker"), end to end, on this host:
#   1. a Docker engine (installed with apt-get if missing and we are root; dockerd started if not running)
#   2. images built offline: ppfl/base:bookworm (debootstrap, docker/make_base_image.sh), the wheels
#      (docker/make_wheelhouse.sh, on the host), then ppfl/superlink, ppfl/superexec, ppfl/supernode
#   3. certificates in REHEARSAL mode (docker/gen_certs.sh --rehearsal): all three sites' private
#      keys on this one host, which only a one-host rehearsal may do
#   4. node-local data for three sites (python -m deploy.export -> docker/data)
#   5. docker/compose.yaml: SuperLink (TLS, SuperNode authentication, Control API on 127.0.0.1:8000
#      only), SuperExec, key registration, three SuperNodes each with its own key and data volume
#   6. dfl-dp and tabular-pdp through `flwr run` (host CLI, private FLWR_HOME), each compared with its
#      simulation (python -m deploy.docker_federation): same seed, same DP noise (server noise-seed-file)
#   7. teardown of what this script started: compose down (its volume too), dockerd if it started it;
#      images are kept (KEEP_IMAGES=0 removes those this script built)
# Prints wall times (base image, wheelhouse, each image, each run deployed vs simulated) and image sizes.
#
#   scripts/docker_federation.sh
#   BASE_IMAGE=python:3.11-slim scripts/docker_federation.sh     # with Docker Hub: no debootstrap
#   KEEP_IMAGES=0 scripts/docker_federation.sh                   # remove the images it built at the end
#   TIMINGS=results_deploy/docker_federation.json scripts/docker_federation.sh   # keep the measurements
# The measurements (times, sizes, load, each run's verdict) are written as JSON to <results>/timings.json,
# and to $TIMINGS when set (docs/deployment.md's Docker table is generated from the kept one).
# Exit status 0 only if both deployed runs finished and equal their simulations.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
BASE_IMAGE="${BASE_IMAGE:-ppfl/base:bookworm}"
KEEP_IMAGES="${KEEP_IMAGES:-1}"
PROJECT="${COMPOSE_PROJECT:-ppfl-federation}"
PORT=8000  # docker/compose.yaml publishes 127.0.0.1:8000 (the SuperLink's one port)
STUDIES="${STUDIES:-dfl-dp tabular-pdp}"
# Three SuperNodes: messages >= nodes. dfl-dp smoke has 10 clients: 2 per message = 5 messages.
# tabular-pdp: its smallest complete run (tests/deploy/test_node_local_federation.py) with 3 clients, one per node.
DFL_KEYS="clients-per-message=2"
TAB_KEYS="num-clients=3 num-rounds=1 tab-settings='pdp' tab-levels='2,1,0,0' local-epochs=1 tab-drift-exclude=false tab-clip-mode='fixed'"
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1

say() { echo "[docker-federation] $*"; }
die() { echo "[docker-federation] ERROR: $*" >&2; exit 1; }
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

# ---------------------------------------------------------------- checks before any work
case "$KEEP_IMAGES" in 0|1) ;; *) die "KEEP_IMAGES must be 0 or 1, got '$KEEP_IMAGES'" ;; esac
for s in $STUDIES; do
  case "$s" in dfl-dp|tabular-pdp) ;; *) die "STUDIES: only dfl-dp and tabular-pdp are compared, got '$s'" ;; esac
done
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY="$(command -v python3 || true)"; fi
fi
[ -n "$PY" ] && "$PY" -c "import flwr, torch" 2>/dev/null \
  || die "needs the project's environment (scripts/setup.sh) or PYTHON=<its python>"
FLWR_BIN="$(dirname "$("$PY" -c 'import sys; print(sys.executable)')")"
[ -x "$FLWR_BIN/flwr" ] || die "no flwr CLI next to $PY"
"$PY" - <<PY || die "127.0.0.1:$PORT is in use: the compose file publishes the SuperLink there; free it first"
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1", $PORT)); s.close()
PY

LOAD_START="$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || true)"
T_START=$(date +%s.%N)
WORK="$(mktemp -d /tmp/ppfl-docker-federation.XXXXXX)"  # private FLWR_HOME, logs
STAMP="$(date +%Y%m%d-%H%M%S)"
RESULTS="results/docker-federation/$STAMP"  # deployed runs (the serverapp service mounts ../results)
SIM_RESULTS="$WORK/simulated"
STARTED_DOCKERD=""
COMPOSE_UP=0
BUILT_IMAGES=()

cleanup() {
  local rc=$?
  set +e
  if [ "$COMPOSE_UP" = "1" ]; then
    say "compose logs -> $WORK/compose.log; compose down"
    "${COMPOSE[@]}" logs --no-color >"$WORK/compose.log" 2>&1
    "${COMPOSE[@]}" down -v --remove-orphans >/dev/null 2>&1
  fi
  if [ "$KEEP_IMAGES" = "0" ] && [ "${#BUILT_IMAGES[@]}" -gt 0 ]; then
    say "removing the images this script built: ${BUILT_IMAGES[*]}"
    docker rmi "${BUILT_IMAGES[@]}" >/dev/null 2>&1
  fi
  if [ -n "$STARTED_DOCKERD" ]; then
    say "stopping the dockerd this script started (pid $STARTED_DOCKERD)"
    kill "$STARTED_DOCKERD" 2>/dev/null
    for _ in $(seq 1 30); do kill -0 "$STARTED_DOCKERD" 2>/dev/null || break; sleep 1; done
  fi
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------- 1. Docker engine
if ! command -v dockerd >/dev/null && ! docker info >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
    say "no Docker engine: installing Debian's docker.io, docker-compose and debootstrap (apt-get)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io docker-compose debootstrap \
      >"$WORK/apt.log" 2>&1 || die "apt-get install docker.io failed; see $WORK/apt.log"
  else
    die "no Docker engine; install one (Debian: sudo apt-get install docker.io docker-compose debootstrap)"
  fi
fi
if ! docker info >/dev/null 2>&1; then
  [ "$(id -u)" = "0" ] || die "the Docker daemon is not running and starting it needs root"
  [ -S /var/run/docker.sock ] && die "/var/run/docker.sock exists but the daemon does not answer: not starting a second one"
  say "starting dockerd (log $WORK/dockerd.log)"
  dockerd >"$WORK/dockerd.log" 2>&1 &
  STARTED_DOCKERD=$!
  for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || die "dockerd did not come up; see $WORK/dockerd.log"
fi
say "engine $(docker version --format '{{.Server.Version}}'), storage driver $(docker info --format '{{.Driver}}')"
# BuildKit (RUN --mount of the wheelhouse): buildx where installed; else a CLI older than 23 has it built in
# (DOCKER_BUILDKIT=1); a newer CLI without buildx has none, so look for Debian's own 20.10 CLI.
BUILD=()
if docker buildx version >/dev/null 2>&1; then
  BUILD=(docker buildx build --load)
else
  for cli in docker /usr/bin/docker; do
    command -v "$cli" >/dev/null || continue
    major="$("$cli" version --format '{{.Client.Version}}' 2>/dev/null | cut -d. -f1)"
    if [ -n "$major" ] && [ "$major" -lt 23 ] 2>/dev/null; then BUILD=(env DOCKER_BUILDKIT=1 "$cli" build); break; fi
  done
fi
[ "${#BUILD[@]}" -gt 0 ] || die "no BuildKit: install the buildx plugin (docker-buildx-plugin / docker-buildx)"
if docker compose version >/dev/null 2>&1; then
  COMPOSE=(docker compose -p "$PROJECT" -f docker/compose.yaml)
elif command -v docker-compose >/dev/null; then
  COMPOSE=(docker-compose -p "$PROJECT" -f docker/compose.yaml)
else
  die "no Docker Compose (Debian: apt-get install docker-compose)"
fi
say "build: ${BUILD[*]}; compose: $("${COMPOSE[@]}" version 2>/dev/null | head -1)"
[ -z "$("${COMPOSE[@]}" ps -q 2>/dev/null)" ] || die "compose project $PROJECT is already running: '${COMPOSE[*]} down' it first"

# ---------------------------------------------------------------- 2. images, offline
PRESENT_BEFORE="$(docker images --format '{{.Repository}}:{{.Tag}}' | grep -E '^ppfl/' | tr '\n' ' ' || true)"
CACHE_BEFORE="$(docker system df --format '{{.Type}}={{.Size}}' 2>/dev/null | grep '^Build Cache=' | cut -d= -f2 || true)"
T_BASE=skipped
if [ "$BASE_IMAGE" = "ppfl/base:bookworm" ]; then
  t0=$(now)
  docker image inspect "$BASE_IMAGE" >/dev/null 2>&1 || BUILT_IMAGES+=("$BASE_IMAGE")
  docker/make_base_image.sh
  T_BASE="$(secs "$t0" "$(now)") s"
fi
T_EXPORT=
t0=$(now)
if [ -f docker/wheelhouse/constraints.txt ] && [ "${REFRESH_WHEELHOUSE:-0}" != "1" ]; then
  say "wheelhouse docker/wheelhouse present ($(du -sh docker/wheelhouse | cut -f1)); REFRESH_WHEELHOUSE=1 refetches it"
  T_WHEELS="reused"
else
  PYTHON="$PY" docker/make_wheelhouse.sh
  T_WHEELS="$(secs "$t0" "$(now)") s"
fi
declare -A T_IMG
build() {  # tag dockerfile [target]
  local tag=$1 df=$2 target=${3:-} t0
  docker image inspect "$tag" >/dev/null 2>&1 || BUILT_IMAGES+=("$tag")
  t0=$(now)
  "${BUILD[@]}" --build-arg BASE_IMAGE="$BASE_IMAGE" -f "$df" ${target:+--target "$target"} -t "$tag" . \
    >"$WORK/build-${tag//\//_}.log" 2>&1 || { tail -30 "$WORK/build-${tag//\//_}.log"; die "building $tag failed"; }
  T_IMG[$tag]="$(secs "$t0" "$(now)") s"
  say "built $tag in ${T_IMG[$tag]}"
}
build ppfl/superlink:latest docker/superlink.Dockerfile
build ppfl/supernode:latest docker/app.Dockerfile supernode
build ppfl/superexec:latest docker/app.Dockerfile superexec

# ---------------------------------------------------------------- 3. certificates (rehearsal)
need=(ca.crt server.pem server.key superexec.secret authorized_supernodes.pub
      supernodes/supernode-1.key supernodes/supernode-2.key supernodes/supernode-3.key)
have=0; for f in "${need[@]}"; do [ -f "docker/certs/$f" ] && have=$((have + 1)); done
if [ "$have" = "${#need[@]}" ]; then
  say "reusing docker/certs (all rehearsal files present)"
elif [ "$have" = "0" ] && [ ! -e docker/certs/ca.key ]; then
  say "REHEARSAL certificates: the private keys of all three SuperNodes are written on THIS host (docker/certs/supernodes)."
  say "  A real deployment never does this: each site makes its own key (python -m deploy.certs node-key)."
  PYTHON="$PY" REHEARSAL=1 SUPERNODES=3 docker/gen_certs.sh >/dev/null
else
  die "docker/certs holds only some of the rehearsal files (${need[*]}); move it away or complete it"
fi
[ "$(id -u)" = "0" ] && chown -R 49999:49999 docker/certs  # the containers' user reads its keys

# ---------------------------------------------------------------- 4. node-local data
t0=$(now)
mkdir -p docker/data/coordinator
"$PY" -m deploy.export --study dfl-dp --nodes 3 --seed 0 --preset smoke --run-config "$DFL_KEYS" \
  --out docker/data >"$WORK/export.log" 2>&1 || { cat "$WORK/export.log"; die "export of dfl-dp failed"; }
"$PY" -m deploy.export --study tabular-pdp --nodes 3 --seed 0 --preset smoke --run-config "$TAB_KEYS" \
  --out docker/data >>"$WORK/export.log" 2>&1 || { cat "$WORK/export.log"; die "export of tabular-pdp failed"; }
# The server's DP noise seed (research only: whoever holds it can reproduce the noise): both runs use it.
[ -f docker/data/coordinator/noise.seed ] || echo "docker federation rehearsal" >docker/data/coordinator/noise.seed
# deploy.export writes owner-only files; the containers' user (uid 49999) reads them (mounted read-only)
[ "$(id -u)" = "0" ] && chown -R 49999:49999 docker/data
T_EXPORT="$(secs "$t0" "$(now)") s"
say "exported docker/data (node-0..2 + coordinator) in $T_EXPORT"
mkdir -p "$RESULTS" && [ "$(id -u)" = "0" ] && chown -R 49999:49999 "$RESULTS"

# ---------------------------------------------------------------- 5. the federation
t0=$(now)
COMPOSE_UP=1
"${COMPOSE[@]}" up -d --no-build >"$WORK/compose-up.log" 2>&1 || { cat "$WORK/compose-up.log"; die "compose up failed"; }
"$PY" -m deploy.flwr_cli connection --flwr-home "$WORK/flwr" --name compose --address "127.0.0.1:$PORT" \
  --root-certificates docker/certs/ca.crt >/dev/null
"$PY" - "$WORK/flwr" <<'PY' || die "the SuperNodes did not come online; see '${COMPOSE[*]} logs'"
import sys, time
from deploy import flwr_cli
deadline = time.monotonic() + 300
while True:
    try:
        online = [n for n in flwr_cli.list_supernodes("compose", sys.argv[1]) if n["status"] == "online"]
    except Exception as exc:  # SuperLink still starting
        online, err = [], exc
    if len(online) >= 3:
        break
    if time.monotonic() > deadline:
        sys.exit(f"{len(online)} of 3 SuperNodes online after 300 s")
    time.sleep(3)
PY
T_UP="$(secs "$t0" "$(now)") s"
say "federation up (SuperLink, SuperExec, 3 SuperNodes online) in $T_UP"

# ---------------------------------------------------------------- 6. runs, compared with simulations
declare -A RUNLINE
status=0
for study in $STUDIES; do
  keys="$DFL_KEYS"; [ "$study" = "tabular-pdp" ] && keys="$TAB_KEYS"
  set +e  # a failed study is reported, and the next one still runs
  PATH="$FLWR_BIN:$PATH" "$PY" -m deploy.docker_federation --study "$study" --data docker/data \
    --flwr-home "$WORK/flwr" --connection compose --results "$RESULTS/$study" \
    --sim-results "$SIM_RESULTS/$study" --seed-file docker/data/coordinator/noise.seed --extra "$keys" \
    2>&1 | tee "$WORK/run-$study.log" | grep --line-buffered -E '^\[|^\{|^  '
  pipe=("${PIPESTATUS[@]}")
  set -e
  rc=${pipe[0]}
  RUNLINE[$study]="$(grep '^{' "$WORK/run-$study.log" | tail -1 || true)"
  [ "$rc" = "0" ] || { status=1; say "$study: exit $rc (log $WORK/run-$study.log)"; }
done

# ---------------------------------------------------------------- report
echo
say "=== measured on $(hostname), $(nproc) cores, engine $(docker version --format '{{.Server.Version}}') ==="
say "base image (debootstrap + import): $T_BASE; wheelhouse: $T_WHEELS"
for tag in ppfl/superlink:latest ppfl/supernode:latest ppfl/superexec:latest; do say "image $tag: ${T_IMG[$tag]}"; done
say "compose up until 3 SuperNodes online: $T_UP"
for study in $STUDIES; do say "$study: ${RUNLINE[$study]:-no result}"; done
docker images --format '{{.Repository}}:{{.Tag}}  {{.Size}}' | grep -E '^ppfl/' | sed 's/^/[docker-federation] size /'
say "deployed results in $RESULTS; work folder (FLWR_HOME, logs) $WORK"

# ---------------------------------------------------------------- the measurements, as data
RUNLINES="$(for study in $STUDIES; do echo "${RUNLINE[$study]:-}"; done)"
SIZES="$(docker image inspect --format '{{index .RepoTags 0}} {{.Size}}' ppfl/base:bookworm ppfl/superlink:latest \
  ppfl/supernode:latest ppfl/superexec:latest 2>/dev/null || true)"
IMGTIMES="$(for tag in ppfl/superlink:latest ppfl/supernode:latest ppfl/superexec:latest; do echo "$tag ${T_IMG[$tag]}"; done)"
mkdir -p "$RESULTS"
T_BASE="$T_BASE" T_WHEELS="$T_WHEELS" T_UP="$T_UP" T_EXPORT="$T_EXPORT" IMGTIMES="$IMGTIMES" SIZES="$SIZES" \
RUNLINES="$RUNLINES" LOAD_START="$LOAD_START" T_START="$T_START" PRESENT_BEFORE="$PRESENT_BEFORE" \
CACHE_BEFORE="$CACHE_BEFORE" BASE_IMAGE="$BASE_IMAGE" ENGINE="$(docker version --format '{{.Server.Version}}')" \
DRIVER="$(docker info --format '{{.Driver}}')" COMPOSE_VERSION="$("${COMPOSE[@]}" version 2>/dev/null | head -1)" \
"$PY" - "$RESULTS/timings.json" "${TIMINGS:-}" <<'PY' || say "could not write the timings record"
import json, os, sys, time
from flower_apps.common.results import atomic_write_json

def seconds(text):
    text = (text or "").strip()
    return float(text[:-2]) if text.endswith(" s") else None

e = os.environ
runs = [json.loads(line) for line in e["RUNLINES"].splitlines() if line.strip().startswith("{")]
record = {
    "script": "scripts/docker_federation.sh", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    "cores": os.cpu_count(), "load_average_start": e["LOAD_START"],
    "load_average_end": open("/proc/loadavg").read().split()[:3] if os.path.exists("/proc/loadavg") else None,
    "engine": e["ENGINE"], "storage_driver": e["DRIVER"], "compose": e["COMPOSE_VERSION"], "base_image": e["BASE_IMAGE"],
    "images_present_before": e["PRESENT_BEFORE"].split(), "build_cache_before": e["CACHE_BEFORE"] or None,
    "seconds": {"base_image": seconds(e["T_BASE"]), "wheelhouse": seconds(e["T_WHEELS"]),
                "wheelhouse_reused": e["T_WHEELS"] == "reused", "export": seconds(e["T_EXPORT"]),
                "compose_up": seconds(e["T_UP"]),
                "images": {l.split()[0]: seconds(" ".join(l.split()[1:])) for l in e["IMGTIMES"].splitlines() if l.strip()},
                "whole_script": round(time.time() - float(e["T_START"]), 1)},
    "image_bytes": {l.split()[0]: int(l.split()[1]) for l in e["SIZES"].splitlines() if len(l.split()) == 2},
    "runs": runs,
}
for path in sys.argv[1:]:
    if path:
        atomic_write_json(path, record)
        print(f"[docker-federation] measurements -> {path}")
PY
exit $status
