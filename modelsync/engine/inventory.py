"""What the plan needs from the world: what the cache holds and the size of the models it lacks.

The plan itself is pure (core/plan.py); these are its two inputs that take
I/O. Sizes are best effort by design: a size S3 cannot tell (unreachable,
denied, missing) is unknown, with the reason for the caller to report, and the
plan shows it as unknown instead of failing.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from modelsync.adapters.cache import Cache
from modelsync.adapters.s3 import S3, open_s3
from modelsync.config import Settings
from modelsync.core.eviction import CacheEntry
from modelsync.core.manifest import MANIFEST_NAME, parse_manifest
from modelsync.core.refs import ModelRef
from modelsync.engine.catalog import open_catalog
from modelsync.errors import ModelsyncError

#: how long `modelsync plan` waits for S3 to tell model sizes before showing them as unknown
SIZES_TIMEOUT_S = 15.0


def cache_entries(cache: Cache) -> list[CacheEntry]:
    """The cache as eviction sees it (models, their physical files, running pulls), for the plan.

    A cache that was never created holds nothing; it is not created here (`modelsync plan`
    may run on a machine that is not a node).
    """
    if not cache.exists():
        return []
    with open_catalog(cache) as catalog:
        return catalog.eviction_entries()


@dataclass(frozen=True, slots=True)
class RemoteSizes:
    #: model id -> total bytes in S3
    known: dict[str, int]
    #: model id -> why S3 could not tell its size; the caller decides how to report it
    unknown: dict[str, str]


def remote_sizes(settings: Settings, refs: list[ModelRef], timeout_s: float = SIZES_TIMEOUT_S) -> RemoteSizes:
    """Bytes of each model in S3 (manifest sizes, else a listing), and why the others are unknown."""
    if not refs:
        return RemoteSizes({}, {})
    return asyncio.run(_sizes(settings, refs, timeout_s))


async def _sizes(settings: Settings, refs: list[ModelRef], timeout_s: float) -> RemoteSizes:
    known: dict[str, int] = {}
    unknown: dict[str, str] = {}
    try:
        async with asyncio.timeout(timeout_s), open_s3(settings) as s3:
            for ref in refs:
                try:
                    known[ref.model_id] = await model_bytes(s3, ref)
                except ModelsyncError as exc:
                    unknown[ref.model_id] = str(exc)
    except TimeoutError:
        for ref in refs:
            if ref.model_id not in known:
                unknown.setdefault(ref.model_id, f"S3 did not answer within {timeout_s:g} s")
    except ModelsyncError as exc:  # no client at all, e.g. AWS_PROFILE names no profile
        for ref in refs:
            unknown.setdefault(ref.model_id, str(exc))
    return RemoteSizes(known, unknown)


async def model_bytes(s3: S3, ref: ModelRef) -> int:
    """The model's total bytes: its manifest's sizes when it has one, else a listing of the prefix."""
    data = await s3.get_manifest(ref, MANIFEST_NAME)
    if data is not None:
        return parse_manifest(data, f"{ref.uri}{MANIFEST_NAME}").total_bytes
    return sum(o.size_bytes for o in await s3.list_model(ref) if not o.key.endswith("/"))
