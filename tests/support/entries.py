"""Cache entries at a fixed instant, as the pure eviction and room tests describe them."""

from __future__ import annotations

from modelsync.core.eviction import Blob, CacheEntry
from modelsync.core.lifecycle import CacheState

NOW = 1_767_225_600.0  # 2026-01-01T00:00:00Z
GRACE_S = 600.0


def entry(
    model: str,
    idle_s: float,
    *blobs: tuple[int, int],
    pinned: bool = False,
    state: CacheState = CacheState.READY,
    lease_s: float | None = None,
) -> CacheEntry:
    """An entry last used `idle_s` before NOW, holding blobs given as (inode, size)."""
    return CacheEntry(
        model=model,
        last_used_at=NOW - idle_s,
        pinned=pinned,
        state=state,
        in_use_until=None if lease_s is None else NOW + lease_s,
        blobs=frozenset(Blob((1, inode), size) for inode, size in blobs),
    )
