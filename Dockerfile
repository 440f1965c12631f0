# modelsync image: the CLI and the node daemon.
#
# Not built by this repository's tests or CI: there is no Docker daemon on the
# development machines. Build it where there is one, for both architectures
# the clusters run (DGX Spark is linux/arm64, the A100 and B300 servers are
# linux/amd64), and push it to the air-gapped clusters' registry:
#   docker buildx build --platform linux/amd64,linux/arm64 \
#     -t registry.example.internal/platform/modelsync:0.1.0 --push .
# Nothing below is architecture-specific: the base image is multi-arch and the
# dependencies ship wheels for both, so no compiler is needed.
FROM python:3.11-slim

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    MODELSYNC_CACHE_DIR=/model-cache

# The cache group (10001) is shared by everything that touches /model-cache on
# a node: the daemon, init containers and operator Jobs. The manifests run as
# uid 10001 and gid 10001 too; keep the numbers in step.
RUN groupadd --system --gid 10001 modelsync \
 && useradd --system --uid 10001 --gid 10001 --no-create-home \
        --home-dir /nonexistent --shell /usr/sbin/nologin modelsync

WORKDIR /src
COPY pyproject.toml README.md ./
COPY modelsync ./modelsync
RUN pip install . \
 && rm -rf /src

WORKDIR /
USER 10001:10001
# /metrics, /healthz, /readyz when the daemon runs with --listen 0.0.0.0:9477.
EXPOSE 9477
ENTRYPOINT ["modelsync"]
CMD ["--help"]
