#!/usr/bin/env bash
# TLS certificates and SuperNode keys for docker/compose.yaml (or any deployment).
#   docker/gen_certs.sh                                  # docker/certs, 3 SuperNodes, SAN "superlink"
#   OUT=/srv/flower/certs SUPERNODES=5 docker/gen_certs.sh flower.example.org 203.0.113.7
# Arguments: extra names/IPs the SuperLink is reached at (the server certificate's SANs;
# localhost, 127.0.0.1, ::1 and "superlink", the compose service name, are always included).
# Writes: ca.crt ca.key server.pem server.key superexec.secret authorized_supernodes.pub
#         supernodes/supernode-<i>.key|.pub     (implementation: deploy/certs.py)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-docker/certs}"
SUPERNODES="${SUPERNODES:-3}"
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
for name in "$@"; do sans+=(--san "$name"); done
"$PY" -m deploy.certs all --out "$OUT" "${sans[@]}" --supernodes "$SUPERNODES"
echo "Containers run as uid 49999: sudo chown -R 49999:49999 $OUT (or run them with --user)."
