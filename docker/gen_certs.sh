#!/usr/bin/env bash
# TLS certificates for a Flower deployment: what the coordinator holds, and (rehearsals only) SuperNode keys.
#   OUT=/srv/flower/certs docker/gen_certs.sh flower.example.org 203.0.113.7   # coordinator: CA, server, secret
#   REHEARSAL=1 docker/gen_certs.sh                  # one-host rehearsal (docker/compose.yaml): + 3 SuperNode keys
#   REHEARSAL=1 SUPERNODES=5 docker/gen_certs.sh     # ... + 5
# Arguments: extra names/IPs the SuperLink is reached at (the server certificate's SANs;
# localhost, 127.0.0.1, ::1 and "superlink", the compose service name, are always included).
# Writes: ca.crt ca.key server.pem server.key superexec.secret
#   and with REHEARSAL=1 also supernodes/supernode-<i>.key|.pub and authorized_supernodes.pub.
# A real institution makes its own key pair and sends only the public key (docs/deployment.md, step 2):
#   python -m deploy.certs node-key --out ~/flower/keys hospital-a
# so by default this script never writes a SuperNode's private key: the coordinator must not hold one.
# (implementation: deploy/certs.py)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-docker/certs}"
SUPERNODES="${SUPERNODES:-3}"
REHEARSAL="${REHEARSAL:-0}"
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY="$(command -v python3 || true)"; fi
fi
if [ -z "$PY" ] || ! "$PY" -c "import cryptography, tomli_w" 2>/dev/null; then
  echo "gen_certs.sh: needs Python 3.11+ with 'cryptography' and 'tomli_w' (both come with flwr):" >&2
  echo "  run scripts/setup.sh, or: pip install 'cryptography>=50' tomli-w; or set PYTHON=..." >&2
  exit 1
fi
case "$REHEARSAL" in
  0|1) ;;
  *) echo "gen_certs.sh: REHEARSAL must be 0 or 1, got '$REHEARSAL'" >&2; exit 2 ;;
esac
if [ -e "$OUT/ca.key" ] && [ "${FORCE:-0}" != "1" ]; then
  echo "gen_certs.sh: $OUT already holds a CA; set FORCE=1 to replace everything (all nodes must then re-register)" >&2
  exit 1
fi
sans=(--san superlink)
for name in "$@"; do sans+=(--san "$name"); done
if [ "$REHEARSAL" = "1" ]; then
  echo "gen_certs.sh: REHEARSAL=1: also writing $SUPERNODES SuperNodes' PRIVATE keys here, for a one-host rehearsal;" \
       "never do this for real institutions (each makes its own key: python -m deploy.certs node-key)" >&2
  "$PY" -m deploy.certs all --out "$OUT" "${sans[@]}" --supernodes "$SUPERNODES"
else
  "$PY" -m deploy.certs tls --out "$OUT" "${sans[@]}"
  echo "No SuperNode keys written: each institution runs 'python -m deploy.certs node-key --out <dir> <name>' and" \
       "sends <name>.pub; register them with 'flwr supernode register <name>.pub <connection>'" \
       "(REHEARSAL=1 writes keys for a one-host rehearsal such as docker/compose.yaml)."
fi
echo "Containers run as uid 49999: sudo chown -R 49999:49999 $OUT (or run them with --user)."
