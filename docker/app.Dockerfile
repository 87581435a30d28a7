# syntax=docker/dockerfile:1
# The project's runtime environment (flwr, torch, ... from pyproject.toml), in two images:
#   target `supernode`: flower-supernode; its ClientApps run inside it (subprocess isolation)
#   target `superexec`: flower-superexec; runs the ServerApps of a SuperLink (process isolation)
#   docker build -f docker/app.Dockerfile --target supernode -t ppfl/supernode .   (repository root)
# GPU SuperNodes: --build-arg TORCH_INDEX_URL=https://pypi.org/simple (PyPI's Linux torch is CUDA).
ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim AS deps
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /build
COPY pyproject.toml requirements-nodeps.txt ./
# Dependencies only, not the project: the code arrives with every run as the FAB that
# `flwr run` builds, so an image never runs stale study code.
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
        > requirements.txt \
 && pip install --index-url "${TORCH_INDEX_URL}" $(grep -E '^(torch|torchvision)==' requirements.txt) \
 && pip install -r requirements.txt \
 && pip install --no-deps -r requirements-nodeps.txt \
 && python -c "import flwr, torch, opacus, dp_accounting; print('flwr', flwr.__version__, 'torch', torch.__version__)"
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
