#!/usr/bin/env bash
# TLS certificates and SuperNode keys for docker/compose.yaml (or any deployment).
# By default only what the coordinator holds: the CA, the SuperLink's certificate and key and the
# SuperExec secret. A SuperNode's private key is made at its site and never leaves it:
#   docker/gen_certs.sh flower.example.org 203.0.113.7      # coordinator: ca.crt ca.key server.* superexec.secret
#   python -m deploy.certs node-key --out my-keys hospital-a # each site: hospital-a.key (kept) + .pub (sent)
#   python -m deploy.certs authorize --out docker/certs hospital-a.pub hospital-b.pub ...
#                                                            # coordinator: authorized_supernodes.pub
# Rehearsal on ONE host (the compose file's three SuperNodes, scripts/docker_federation.sh): every
# site's private key is written here too, under supernodes/:
#   docker/gen_certs.sh --rehearsal                          # or REHEARSAL=1; SUPERNODES=3 by default
#   OUT=/srv/flower/certs docker/gen_certs.sh ...            # another output folder (default docker/certs)
# Arguments: extra names/IPs the SuperLink is reached at (the server certificate's SANs;
# localhost, 127.0.0.1, ::1 and "superlink", the compose service name, are always included).
# Writes: ca.crt ca.key server.pem server.key superexec.secret (.gitignore: never committed)
#   rehearsal also: supernodes/supernode-<i>.key|.pub authorized_supernodes.pub (implementation: deploy/certs.py)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-docker/certs}"
SUPERNODES="${SUPERNODES:-3}"
REHEARSAL="${REHEARSAL:-0}"
names=()
for arg in "$@"; do
  case "$arg" in
    --rehearsal) REHEARSAL=1 ;;
    -*) echo "gen_certs.sh: unknown option $arg (only --rehearsal; names/IPs are plain arguments)" >&2; exit 2 ;;
    *) names+=("$arg") ;;
  esac
done
if [ "$REHEARSAL" != "0" ] && [ "$REHEARSAL" != "1" ]; then
  echo "gen_certs.sh: REHEARSAL must be 0 or 1, got '$REHEARSAL'" >&2; exit 2
fi
if ! [[ "$SUPERNODES" =~ ^[0-9]+$ ]]; then
  echo "gen_certs.sh: SUPERNODES must be a number >= 0, got '$SUPERNODES'" >&2; exit 2
fi
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY="$(command -v python3 || true)"; fi
fi
if [ -z "$PY" ] || ! "$PY" -c "import cryptography, tomli_w" 2>/dev/null; then
  echo "gen_certs.sh: needs Python 3.11+ with 'cryptography' and 'tomli_w' (both come with flwr):" >&2
  echo "  run scripts/setup.sh, or: pip install 'cryptography>=50' tomli-w; or set PYTHON=..." >&2
  exit 1
fi
if [ -e "$OUT/ca.key" ] && [ "${FORCE:-0}" != "1" ]; then
  echo "gen_certs.sh: $OUT already holds a CA; set FORCE=1 to replace everything (all nodes must then re-register)" >&2
  exit 1
fi
sans=(--san superlink)
for name in "${names[@]+"${names[@]}"}"; do sans+=(--san "$name"); done
if [ "$REHEARSAL" = "1" ]; then
  echo "gen_certs.sh: REHEARSAL: writing the private keys of all $SUPERNODES SuperNodes on this host ($OUT/supernodes)."
  echo "  Only for a federation rehearsed on one machine; a real site makes its own key (python -m deploy.certs node-key)."
  "$PY" -m deploy.certs all --out "$OUT" "${sans[@]}" --supernodes "$SUPERNODES"
else
  "$PY" -m deploy.certs tls --out "$OUT" "${sans[@]}"
  echo "No SuperNode keys were made here (they are the sites' own). Each site runs"
  echo "  python -m deploy.certs node-key --out my-keys <site-name>   # keeps <site-name>.key, sends <site-name>.pub"
  echo "then, with the .pub files received: $PY -m deploy.certs authorize --out $OUT site-a.pub site-b.pub ..."
fi
echo "Containers run as uid 49999: sudo chown -R 49999:49999 $OUT (or run them with --user)."
