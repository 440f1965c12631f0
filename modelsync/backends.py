"""The production backends of a pull: the object store and the range client for the bytes.

Built here, at the edge, and passed into the engine (engine/ports.py): the
engine never constructs a client, so its tests run against in-memory fakes.

Every pull opens the same backends: the init container's plain `pull`, the full
command line, `prefetch`, `verify --repair` and the daemon. One code path, so a
route that works (or fails) for one works (or fails) the same way for all. The
object store is `adapters/store/data_plane.py` wherever the environment's static
keys and a path-style endpoint let it sign requests itself: a model with a
manifest is then pulled without importing or opening the S3 SDK, which is most
of a cold pull's start-up (the daemon, which has the SDK loaded already, still
saves creating a client per pull). Elsewhere (credentials from a profile, web
identity or an instance role; AWS's own endpoints) it is aiobotocore's, as before.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from modelsync.adapters.http.rate_limit import TokenBucket, capped_read_bytes
from modelsync.config import Settings, receive_buffer_bytes
from modelsync.core.retry import RetryPolicy
from modelsync.engine.ports import Backends, OpenBackends, OpenWriter
from modelsync.engine.throttle import store_gate

if TYPE_CHECKING:
    from modelsync.adapters.store.sdk import S3


def s3_backends(settings: Settings) -> OpenBackends:
    """Opens, for each pull, an object store and a range client configured from `settings`.

    Each pull gets its own range client: closing it is how a cancelled pull
    aborts its transfers (the manifest's GET included). The bandwidth cap is
    per pull, as the plan assumes; the store's gate is the process's, so every
    pull of one store slows down together while it throttles.
    """
    gate = store_gate(settings.endpoint_url or f"aws:{settings.region}", RetryPolicy.of(settings).time_scale)

    @contextlib.asynccontextmanager
    async def open_backends() -> AsyncIterator[Backends]:
        # here, not at the top: a `pull` of a ready model imports neither the store nor TLS
        from modelsync.adapters.http.client import RangeClient
        from modelsync.adapters.http.tls import data_plane_context
        from modelsync.adapters.store.data_plane import open_store

        limit = settings.max_bandwidth_bytes_per_s
        capped_read = capped_read_bytes(limit, settings.concurrency) if limit else None
        buffer_bytes = receive_buffer_bytes(settings)
        client = RangeClient(
            ssl_context=data_plane_context(settings),
            connect_timeout_s=settings.connect_timeout_s,
            read_timeout_s=settings.read_timeout_s,
            buffer_bytes=min(buffer_bytes, capped_read or buffer_bytes),
            rate_limiter=TokenBucket(limit) if limit else None,
            receive_buffer_bytes=capped_read,
        )
        try:
            async with open_store(settings, client) as store:
                yield Backends(store=store, fetcher=client, gate=gate)
        finally:
            client.close()

    return open_backends


def s3_writer(settings: Settings) -> OpenWriter:
    """Opens, for a publish, the aiobotocore store configured from `settings` (engine/upload.py)."""

    def open_writer() -> contextlib.AbstractAsyncContextManager[S3]:
        from modelsync.adapters.store.sdk import open_s3  # here: only a publish needs the SDK

        return open_s3(settings)

    return open_writer
