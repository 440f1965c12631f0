# modelsync image: the CLI and the node daemon, for linux/amd64 (A100, B300)
# and linux/arm64 (DGX Spark).
#
# Build both architectures (README, "Deploy on Kubernetes" > "The image"):
#   scripts/wheelhouse                          # once per lock change: ./wheelhouse, both arches
#   scripts/image --packages wheelhouse         # podman, offline: --network none, no index
# or with Docker, into the site's registry as one multi-arch image:
#   docker buildx build --platform linux/amd64,linux/arm64 \
#     --build-arg VERSION=0.1.0 --build-arg REVISION="$(git rev-parse HEAD)" \
#     --build-arg CREATED="$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
#     -t registry.example.internal/platform/modelsync:0.1.0 --push .
#
# Two stages. The build stage installs modelsync's locked dependencies
# (requirements.lock: its runtime requirements and the `sign` extra, pinned
# with the wheel hashes of both architectures, so both resolve the same and
# nothing is compiled) into /opt/venv, and builds modelsync's own wheel with
# the build backend of requirements-build.lock (setuptools, pinned with its
# hash) without build isolation: nothing unpinned is fetched. The final stage
# copies /opt/venv, which never had pip, onto the same base, whose own pip,
# setuptools and wheel are removed.

# The multi-arch index digest of python:3.11-slim-bookworm. Refresh it with
#   docker buildx imagetools inspect python:3.11-slim-bookworm
# (or from the site registry's mirror of it) and keep the tag for readers.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:2e32f7d302adc1c37428355c1e646897c0c53f4fd60b6a551245fb90ee129f91

FROM ${PYTHON_IMAGE} AS build
# Where pip finds the locked wheels; their hashes are checked either way.
#   an index URL: the site's PyPI mirror (default: PyPI), or
#   "wheelhouse": only the wheels in ./wheelhouse of the build context
#   (scripts/wheelhouse fills it), no index at all: build with --network none.
ARG PACKAGES=https://pypi.org/simple
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY requirements.lock requirements-build.lock ./
# /opt/build: pip (the base's) and the pinned build backend. /opt/venv: the
# runtime, without pip; the build venv's pip installs into it (--python).
RUN --mount=type=bind,source=wheelhouse,target=/wheelhouse \
    if [ "$PACKAGES" = wheelhouse ]; then set -- --no-index --find-links /wheelhouse; \
    else set -- --index-url "$PACKAGES"; fi \
 && python -m venv /opt/build \
 && python -m venv --without-pip /opt/venv \
 && /opt/build/bin/pip install "$@" --require-hashes --only-binary=:all: --no-deps -r requirements-build.lock \
 && /opt/build/bin/pip --python /opt/venv/bin/python install "$@" \
        --require-hashes --only-binary=:all: --no-deps -r requirements.lock
COPY pyproject.toml README.md ./
COPY modelsync ./modelsync
RUN /opt/build/bin/pip wheel --no-index --no-build-isolation --no-deps --wheel-dir /tmp/wheels . \
 && /opt/build/bin/pip --python /opt/venv/bin/python install --no-index --no-deps /tmp/wheels/modelsync-*.whl

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
