"""The production backends of a pull: aiobotocore for the control plane, the range client for the bytes.

Built here, at the edge, and passed into the engine (engine/ports.py): the
engine never constructs a client, so its tests run against in-memory fakes.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from modelsync.config import Settings, check_ca_bundle
from modelsync.engine.ports import Backends, OpenBackends
from modelsync.engine.throttle import TokenBucket


def s3_backends(settings: Settings) -> OpenBackends:
    """Opens, for each pull, an S3 client and a range client configured from `settings`.

    Each pull gets its own range client: closing it is how a cancelled pull
    aborts its transfers. The bandwidth cap is per pull, as the plan assumes.
    """

    @contextlib.asynccontextmanager
    async def open_backends() -> AsyncIterator[Backends]:
        # here, not at the top: a `pull` of a ready model imports neither the S3 SDK nor TLS
        from modelsync.adapters.ranged_http import RangeClient, make_ssl_context
        from modelsync.adapters.s3 import open_s3

        async with open_s3(settings) as s3:
            https = (settings.endpoint_url or "https://").startswith("https")
            if https and settings.ca_bundle and not settings.insecure:
                check_ca_bundle(settings.ca_bundle)  # the file may have changed since the settings were read
            limit = settings.max_bandwidth_bytes_per_s
            client = RangeClient(
                ssl_context=make_ssl_context(ca_bundle=settings.ca_bundle, insecure=settings.insecure)
                if https
                else None,
                connect_timeout_s=settings.connect_timeout_s,
                read_timeout_s=settings.read_timeout_s,
                buffer_bytes=settings.read_chunk_bytes,
                rate_limiter=TokenBucket(limit) if limit else None,
            )
            try:
                yield Backends(store=s3, fetcher=client)
            finally:
                client.close()

    return open_backends
