# syntax=docker/dockerfile:1
# modelkv-exporter images. Build from the repository root:
#
#   docker build -t modelkv-exporter:0.1.0 .                                          # the sidecar (default)
#   docker build --target engine \
#     --build-arg ENGINE_IMAGE=vllm/vllm-openai:v0.30.0 -t my-vllm-modelkv:0.1.0 .    # an engine image with the hook
#
# The sidecar image holds only the sidecar's dependencies (the package's `sidecar` extra:
# prometheus-client, FastAPI, uvicorn), pinned by requirements/sidecar.txt: no torch, no vLLM.
# tests/deploy/test_docker.py runs the "sidecar-install" steps below in a clean venv and serves /metrics from it.
# tests/deploy/test_image.py builds both targets with podman and runs the sidecar as the Kubernetes manifest does.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG ENGINE_IMAGE=vllm/vllm-openai:v0.30.0

# --- build a wheel of this project --------------------------------------------------------
FROM ${PYTHON_IMAGE} AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY modelkv_exporter ./modelkv_exporter
RUN python -m pip wheel --no-cache-dir --no-deps --wheel-dir /dist .

# --- install the sidecar into a self-contained venv ---------------------------------------
# The pinned dependencies go in first, in a layer of their own: a change to the package's
# source rebuilds only the wheel and the last step, not the downloads. The package then goes
# in with its `sidecar` extra and no index: the pins must already satisfy the extra.
FROM ${PYTHON_IMAGE} AS sidecar-install
COPY requirements/sidecar.txt /tmp/sidecar-requirements.txt
RUN python -m venv /opt/modelkv \
    && /opt/modelkv/bin/pip install --no-cache-dir -r /tmp/sidecar-requirements.txt
COPY --from=wheel /dist /dist
RUN /opt/modelkv/bin/pip install --no-cache-dir --no-index --find-links /dist 'modelkv-exporter[sidecar]' \
    && /opt/modelkv/bin/pip uninstall -y setuptools pip

# --- the sidecar image ----------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS sidecar
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="modelkv-exporter" \
      org.opencontainers.image.description="Prometheus exporter for model-local KV caches that vLLM-Omni models declare" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.documentation="docs/deploy.md"
# Nothing in the running sidecar installs packages: the base image's own pip goes too.
RUN python -c "import glob, os, pip, shutil; d = os.path.dirname(pip.__file__); [shutil.rmtree(p) for p in [d, *glob.glob(d + '-*.dist-info')]]" \
    && rm -f "$(dirname "$(command -v python)")"/pip "$(dirname "$(command -v python)")"/pip3*
COPY --from=sidecar-install /opt/modelkv /opt/modelkv
ENV PATH=/opt/modelkv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    MODELKV_SPOOL_DIR=/var/run/modelkv
USER 65532:65532
EXPOSE 9400 9401
ENTRYPOINT ["modelkv-exporter", "serve"]

# --- an engine image with the in-engine hook (optional target) ------------------------------
# The base install (no extra) depends on nothing: vLLM's own torch, transformers and HTTP stack stay
# as the image pins them. Set MODELKV_SPOOL_DIR in the engine's environment to turn the hook on;
# the plugin is found through its vllm.general_plugins entry point.
FROM ${ENGINE_IMAGE} AS engine
COPY --from=wheel /dist /tmp/modelkv-dist
RUN python3 -m pip install --no-cache-dir /tmp/modelkv-dist/*.whl && rm -rf /tmp/modelkv-dist

# The default target is the sidecar.
FROM sidecar
