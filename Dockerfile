# modelsync image: the CLI and the node daemon, for linux/amd64 (A100, B300)
# and linux/arm64 (DGX Spark).
#
# Build both architectures and push them to the site's registry as one
# multi-arch image (README, "Deploy on Kubernetes" > "The image"):
#   docker buildx build --platform linux/amd64,linux/arm64 \
#     --build-arg VERSION=0.1.0 --build-arg REVISION="$(git rev-parse HEAD)" \
#     --build-arg CREATED="$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
#     -t registry.example.internal/platform/modelsync:0.1.0 --push .
#
# Two stages: the build stage installs the locked dependencies (modelsync's
# runtime requirements and its `sign` extra, which verifies model signatures;
# requirements.lock: pinned versions and the wheel hashes of both
# architectures, so both resolve the same and nothing is compiled) and
# modelsync into a virtualenv; the final stage copies that virtualenv onto the
# same base with pip, setuptools and wheel removed.

# The multi-arch index digest of python:3.11-slim-bookworm. Refresh it with
#   docker buildx imagetools inspect python:3.11-slim-bookworm
# (or from the site registry's mirror of it) and keep the tag for readers.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:2e32f7d302adc1c37428355c1e646897c0c53f4fd60b6a551245fb90ee129f91

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY requirements.lock ./
RUN python -m venv /opt/venv \
 && /opt/venv/bin/pip install --require-hashes --only-binary=:all: --no-deps -r requirements.lock
COPY pyproject.toml README.md ./
COPY modelsync ./modelsync
RUN /opt/venv/bin/pip wheel --no-deps --wheel-dir /tmp/wheels . \
 && /opt/venv/bin/pip install --no-deps --no-index /tmp/wheels/modelsync-*.whl \
 && rm -rf /opt/venv/lib/python3.11/site-packages/pip* /opt/venv/bin/pip*

FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="modelsync" \
      org.opencontainers.image.description="Stages LLM weights from S3 into a GPU node's local cache: verified, atomic, resumable." \
      org.opencontainers.image.source="https://git.example.internal/platform/modelsync" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.licenses="Apache-2.0"

# No package installer in the image that runs on the nodes.
RUN rm -rf /usr/local/lib/python3.11/site-packages/pip* \
           /usr/local/lib/python3.11/site-packages/setuptools* \
           /usr/local/lib/python3.11/site-packages/wheel* \
           /usr/local/lib/python3.11/ensurepip \
           /usr/local/bin/pip* \
# The cache group (10001) is shared by everything that touches /model-cache on
# a node: the daemon, tenant init containers and operator Jobs. The manifests
# run as uid 10001 and gid 10001 too; keep the numbers in step.
 && groupadd --system --gid 10001 modelsync \
 && useradd --system --uid 10001 --gid 10001 --no-create-home \
        --home-dir /nonexistent --shell /usr/sbin/nologin modelsync

COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    MODELSYNC_CACHE_DIR=/model-cache

USER 10001:10001
# /metrics, /healthz, /readyz when the daemon runs with --listen 0.0.0.0:9477.
EXPOSE 9477
ENTRYPOINT ["modelsync"]
CMD ["--help"]
