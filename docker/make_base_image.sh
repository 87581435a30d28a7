#!/usr/bin/env bash
# A Python 3.11 base image made here, without Docker Hub: Debian bookworm (minbase) from the
# Debian mirror by debootstrap, with Debian's python3.11 and venv, imported as one layer.
#   docker/make_base_image.sh                      # -> ppfl/base:bookworm
#   BASE_TAG=ppfl/base:bookworm MIRROR=http://deb.debian.org/debian docker/make_base_image.sh
# The Dockerfiles take it with --build-arg BASE_IMAGE=ppfl/base:bookworm (default python:3.11-slim);
# they create a venv at /opt/venv either way, so Debian's /usr/bin/python3 and the official
# image's /usr/local/bin/python both work. Needs root (debootstrap) and a running Docker engine.
set -euo pipefail
BASE_TAG="${BASE_TAG:-ppfl/base:bookworm}"
MIRROR="${MIRROR:-http://deb.debian.org/debian}"
if [ "$(id -u)" != "0" ]; then
  echo "make_base_image.sh: debootstrap needs root" >&2; exit 1
fi
for tool in debootstrap docker; do
  if ! command -v "$tool" >/dev/null; then
    echo "make_base_image.sh: '$tool' not found (Debian: apt-get install -y debootstrap docker.io)" >&2; exit 1
  fi
done
if [ "${FORCE:-0}" != "1" ] && docker image inspect "$BASE_TAG" >/dev/null 2>&1; then
  echo "make_base_image.sh: $BASE_TAG exists (FORCE=1 rebuilds it)"; exit 0
fi
ROOTFS="$(mktemp -d /tmp/ppfl-rootfs.XXXXXX)"
trap 'rm -rf "$ROOTFS"' EXIT
# python3-venv brings ensurepip's wheels (pip, setuptools); ca-certificates for TLS clients.
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
  bookworm "$ROOTFS" "$MIRROR" >"$ROOTFS.log" 2>&1 || {
  echo "make_base_image.sh: debootstrap failed; see $ROOTFS.log" >&2; exit 1; }
rm -f "$ROOTFS.log"
# No package caches or lists in the image (about 60 MB).
chroot "$ROOTFS" apt-get clean
rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/*.bin "$ROOTFS"/tmp/*
tar -C "$ROOTFS" -c . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["/usr/bin/python3"]' \
  - "$BASE_TAG" >/dev/null
echo "make_base_image.sh: $BASE_TAG ($(docker run --rm "$BASE_TAG" python3 --version))"
