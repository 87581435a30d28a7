# The project's runtime environment (flwr, torch, ... from pyproject.toml), in two images:
#   target `supernode`: flower-supernode; its ClientApps run inside it (subprocess isolation)
#   target `superexec`: flower-superexec; runs the ServerApps of a SuperLink (process isolation)
# Offline build (BuildKit, from the repository root; no network: every wheel comes from the host):
#   docker/make_wheelhouse.sh                          # once, on the host: docker/wheelhouse/
#   DOCKER_BUILDKIT=1 docker build -f docker/app.Dockerfile --target supernode -t ppfl/supernode .
# BASE_IMAGE: any Debian-like image with python3 (3.11) and its venv module: python:3.11-slim
# (Docker Hub) or ppfl/base:bookworm (docker/make_base_image.sh, made locally from Debian's mirror).
# No `# syntax=` line: it would pull a Dockerfile frontend from Docker Hub; the engine's built-in
# BuildKit frontend has RUN --mount.
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS deps
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# Dependencies only, not the project: the code arrives with every run as the FAB that
# `flwr run` builds, so an image never runs stale study code. The wheelhouse is bind-mounted for
# this step only (no layer of wheels in the image); requirements.txt is pyproject.toml's list (+ the
# lite0 extra), constraints.txt the host environment's versions (so a deployed run and its
# simulation run the same numpy/torch), requirements-nodeps.txt goes in --no-deps as in setup.sh.
# A venv at /opt/venv: the same path whether the base's python is /usr/bin/python3 (Debian) or
# /usr/local/bin/python (python:3.11-slim).
RUN --mount=type=bind,source=docker/wheelhouse,target=/wheelhouse \
    python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-index --find-links /wheelhouse \
        -r /wheelhouse/requirements.txt -c /wheelhouse/constraints.txt \
 && /opt/venv/bin/pip install --no-index --find-links /wheelhouse --no-deps \
        -r /wheelhouse/requirements-nodeps.txt \
 && /opt/venv/bin/python -c "import flwr, torch, opacus, dp_accounting, anjana; print('flwr', flwr.__version__, 'torch', torch.__version__)"
ENV PATH=/opt/venv/bin:$PATH
# deploy/ holds the key-registration helper the compose `register` service runs.
COPY deploy/ /opt/ppfl/deploy/
RUN useradd --uid 49999 --create-home --home-dir /app app \
 && mkdir -p /data /app/results && chown app:app /data /app/results
USER app
WORKDIR /app
# Processes use this environment as is: no `uv sync` per run (it would fetch a CUDA torch),
# no telemetry, no update check. PPFL_DATA: where datasets are looked for (mount them there).
ENV PYTHONPATH=/opt/ppfl \
    PPFL_DATA=/data \
    FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 \
    FLWR_TELEMETRY_ENABLED=0 \
    FLWR_DISABLE_UPDATE_CHECK=1

FROM deps AS supernode
ENTRYPOINT ["flower-supernode"]
CMD ["--help"]

FROM deps AS superexec
ENTRYPOINT ["flower-superexec"]
CMD ["--help"]
