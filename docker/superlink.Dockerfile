# syntax=docker/dockerfile:1
# SuperLink image: Flower only. It runs with `--isolation process`, so no app code runs here
# (the `serverapp` SuperExec container, built from app.Dockerfile, runs every ServerApp).
#   docker build -f docker/superlink.Dockerfile -t ppfl/superlink .      (from the repository root)
ARG PYTHON_VERSION=3.11
FROM python:${PYTHON_VERSION}-slim

# Keep in step with pyproject.toml (tests/deploy/test_deploy_docker_files.py checks it).
ARG FLWR_VERSION=1.42.0
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# typer < 0.21: flwr 1.42's CLI needs it (see pyproject.toml).
RUN pip install "flwr==${FLWR_VERSION}" "typer>=0.20,<0.21"

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
