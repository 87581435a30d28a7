# SuperLink image: Flower only. It runs with `--isolation process`, so no app code runs here
# (the `serverapp` SuperExec container, built from app.Dockerfile, runs every ServerApp).
# Offline build (BuildKit, from the repository root; wheels from docker/make_wheelhouse.sh):
#   DOCKER_BUILDKIT=1 docker build -f docker/superlink.Dockerfile -t ppfl/superlink .
# BASE_IMAGE: python:3.11-slim (Docker Hub) or ppfl/base:bookworm (docker/make_base_image.sh).
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

# Keep in step with pyproject.toml (tests/deploy/test_deploy_docker_files.py checks it).
ARG FLWR_VERSION=1.42.0
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# typer < 0.21: flwr 1.42's CLI needs it (see pyproject.toml). Versions: the host's (constraints.txt).
RUN --mount=type=bind,source=docker/wheelhouse,target=/wheelhouse \
    python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-index --find-links /wheelhouse -c /wheelhouse/constraints.txt \
        "flwr==${FLWR_VERSION}" "typer>=0.20,<0.21"
ENV PATH=/opt/venv/bin:$PATH

# Same uid as Flower's official images: `chown -R 49999:49999 docker/certs` before mounting keys.
RUN useradd --uid 49999 --create-home --home-dir /app app && mkdir /state && chown app:app /state
USER app
WORKDIR /app
# No telemetry or update check from a study's machines; no `uv sync` of app dependencies.
ENV FLWR_TELEMETRY_ENABLED=0 \
    FLWR_DISABLE_UPDATE_CHECK=1 \
    FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
# One HTTPS port serves the Fleet (SuperNodes), Control (flwr CLI) and Runtime (SuperExec) APIs.
EXPOSE 8000
VOLUME ["/state"]
ENTRYPOINT ["flower-superlink"]
CMD ["--help"]
