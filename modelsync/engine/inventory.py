"""What the plan needs from the world: what the cache holds and the size of the models it lacks.

The plan itself is pure (core/plan.py); these are its two inputs that take
I/O. Sizes are best effort by design: a size S3 cannot tell (unreachable,
denied, missing) is unknown, with the reason for the caller to report, and the
plan shows it as unknown instead of failing.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

from modelsync.adapters.cache import Cache
from modelsync.core.eviction import CacheEntry
from modelsync.core.manifest import MANIFEST_NAME, parse_manifest
from modelsync.core.refs import ModelRef
from modelsync.engine.background import in_daemon_thread
from modelsync.engine.catalog import open_catalog
from modelsync.engine.ports import ObjectStore, OpenBackends
from modelsync.errors import ModelsyncError

log = logging.getLogger("modelsync.daemon")

#: how long `modelsync plan` waits for S3 to tell model sizes before showing them as unknown
SIZES_TIMEOUT_S = 15.0
#: how long before the daemon asks S3 again for a size it could not tell
SIZE_RETRY_S = 300.0


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


def remote_sizes(
    backends: OpenBackends, refs: list[ModelRef], timeout_s: float = SIZES_TIMEOUT_S
) -> RemoteSizes:
    """Bytes of each model in S3 (manifest sizes, else a listing), and why the others are unknown."""
    if not refs:
        return RemoteSizes({}, {})
    return asyncio.run(_sizes(backends, refs, timeout_s))


async def _sizes(backends: OpenBackends, refs: list[ModelRef], timeout_s: float) -> RemoteSizes:
    known: dict[str, int] = {}
    unknown: dict[str, str] = {}
    try:
        async with asyncio.timeout(timeout_s), backends() as opened:
            for ref in refs:
                try:
                    known[ref.model_id] = await model_bytes(opened.store, ref)
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


async def model_bytes(store: ObjectStore, ref: ModelRef) -> int:
    """The model's total bytes: its manifest's sizes when it has one, else a listing of the prefix."""
    data = await store.get_manifest(ref, MANIFEST_NAME)
    if data is not None:
        return parse_manifest(data, f"{ref.uri}{MANIFEST_NAME}").total_bytes
    return sum(o.size_bytes for o in await store.list_model(ref) if not o.key.endswith("/"))


class SizeLookup:
    """The daemon's sizes of models it lacks, asked of S3 in a background thread.

    A fetch whose size nobody knows counts as 0 bytes in the plan, which would
    call an over-budget schedule fitting; so the loop asks for such sizes (again
    after SIZE_RETRY_S when S3 cannot tell), and the misfit is logged and
    exported before a pull fails for want of room.
    """

    def __init__(
        self, sizer: Callable[[list[ModelRef]], RemoteSizes], on_learned: Callable[[], None]
    ) -> None:
        self._sizer = sizer
        self._on_learned = on_learned
        #: model id -> total bytes
        self.known: dict[str, int] = {}
        self._due: dict[str, float] = {}
        self._asking = False

    def learn(self, refs: list[ModelRef], now: float) -> None:
        """Ask for the sizes of `refs` not asked for recently, unless a lookup is under way."""
        refs = [ref for ref in refs if self._due.get(ref.model_id, -math.inf) <= now]
        if self._asking or not refs:
            return
        for ref in refs:
            self._due[ref.model_id] = now + SIZE_RETRY_S
        self._asking = True
        in_daemon_thread(lambda: self._sizer(refs), "modelsync-sizes").add_done_callback(self._answered)

    def _answered(self, future: asyncio.Future[RemoteSizes]) -> None:
        self._asking = False
        exc = future.exception()
        if exc is not None:
            log.error("looking up model sizes failed (a bug)", exc_info=exc)
            return
        sizes = future.result()
        for model_id, reason in sizes.unknown.items():
            log.warning("size of %s unknown: %s", model_id, reason, extra={"model": model_id})
        if sizes.known:
            self.known.update(sizes.known)
            self._on_learned()
