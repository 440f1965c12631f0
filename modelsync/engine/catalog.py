"""What the cache holds, as one consistent view: index rows joined with the markers on disk.

The index is opened in step with the completion records (engine/index_sync.py);
the views add what only the markers say (use, pins, leases, `verify`) and the
pulls under way in any process.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from typing import NamedTuple

from modelsync.adapters.cache import Cache
from modelsync.adapters.index import IndexedModel
from modelsync.core.eviction import Blob, CacheEntry
from modelsync.core.lifecycle import CacheState
from modelsync.core.record import CompletionRecord
from modelsync.core.refs import ModelRef, parse_model_name
from modelsync.engine.index_sync import SyncedIndex
from modelsync.errors import ModelsyncError, NotFoundError


class ModelView(NamedTuple):
    """One row of `modelsync ls`."""

    model: str
    source: str
    state: CacheState
    size_bytes: int
    last_used_at: float
    pinned: bool
    verified_at: float | None
    verified_by: str
    lease_until: float | None
    #: who signed the model, when its signature was verified (from the completion record)
    signer: str | None = None


class Catalog:
    """The cache as commands see it: a view per model, the eviction planner's entries, ready models."""

    def __init__(self, cache: Cache) -> None:
        self.cache = cache
        self._synced = SyncedIndex(cache)
        self.index = self._synced.index
        #: ready records that cannot be read, found while opening
        self.damaged = self._synced.damaged
        #: index rows whose model was no longer on disk, dropped while opening
        self.stale_rows_dropped = self._synced.stale_rows_dropped

    def close(self) -> None:
        self.index.close()

    def register(self, ref: ModelRef, record: CompletionRecord, state: CacheState = CacheState.READY) -> None:
        """Add or replace a model's row, after its record was written (`make_ready`, a quarantine)."""
        self._synced.register(ref, record, state)

    # -- views -----------------------------------------------------------------------

    def views(self) -> list[ModelView]:
        views = [self._view(row) for row in self.index.models()]
        known = {v.model for v in views}
        for ref, n_bytes in self._pulls():
            if ref.model_id not in known:
                views.append(
                    ModelView(
                        ref.model_id,
                        ref.uri,
                        CacheState.PULLING,
                        n_bytes,
                        0.0,
                        self.cache.is_pinned(ref),
                        None,
                        "",
                        None,
                    )
                )
        return sorted(views, key=lambda v: v.model)

    def _view(self, row: IndexedModel) -> ModelView:
        ref = parse_model_name(row.model)
        # a quarantined model failed its last check; otherwise the latest of the pull, `verify`
        # and `pull --verify` (whose marker may be newer than the row)
        verified_at = None
        if row.state is not CacheState.QUARANTINED:
            verified_at = _latest(row.verified_at, self.cache.verified_at(ref))
        return ModelView(
            model=row.model,
            source=row.source,
            state=row.state,
            size_bytes=row.size_bytes,
            last_used_at=self.cache.last_used(ref) or row.completed_at,
            pinned=self.cache.is_pinned(ref),
            verified_at=verified_at,
            verified_by=row.verified_by,
            lease_until=self.cache.lease_until(ref),
            signer=row.signer,
        )

    def _pulls(self) -> list[tuple[ModelRef, int]]:
        """Pulls in progress in any process, with the space each reserved."""
        pulls = []
        for claim in self.cache.reservations().values():
            with contextlib.suppress(ModelsyncError):
                pulls.append((parse_model_name(claim.source), claim.size_bytes))
        return pulls

    def eviction_entries(self, views: list[ModelView] | None = None) -> list[CacheEntry]:
        """The cache as the eviction planner sees it: models, their physical files, running pulls.

        `views` the caller already has (`ls`) spare reading every marker a second time.
        """
        blobs: dict[str, set[Blob]] = {}
        for f in self.index.files():
            key = (f.dev, f.ino) if f.ino else (-1, _stable_id(f.model, f.path))
            blobs.setdefault(f.model, set()).add(Blob(key, f.size_bytes))
        entries = []
        for view in self.views() if views is None else views:
            if view.state is CacheState.PULLING:
                reserved = {Blob((-2, _stable_id(view.model, "")), view.size_bytes)}
                entries.append(
                    CacheEntry(view.model, 0.0, view.pinned, CacheState.PULLING, None, frozenset(reserved))
                )
                continue
            entries.append(
                CacheEntry(
                    model=view.model,
                    last_used_at=view.last_used_at,
                    pinned=view.pinned,
                    state=view.state,
                    in_use_until=view.lease_until,
                    blobs=frozenset(blobs.get(view.model, ())),
                )
            )
        return entries

    def ready_refs(self) -> list[ModelRef]:
        """Every ready model (not quarantined, not being pulled)."""
        return [parse_model_name(row.model) for row in self.index.models() if row.state is CacheState.READY]

    def view(self, model: str) -> ModelView | None:
        return next((v for v in self.views() if v.model == model), None)

    def require(self, model: str) -> ModelView:
        view = self.view(model)
        if view is None:
            raise NotFoundError(f"no cached model {model!r}; run `modelsync ls`")
        return view


@contextlib.contextmanager
def open_catalog(cache: Cache) -> Iterator[Catalog]:
    catalog = Catalog(cache)
    try:
        yield catalog
    finally:
        catalog.close()


def _latest(*instants: float | None) -> float | None:
    return max((at for at in instants if at is not None), default=None)


def _stable_id(*parts: str) -> int:
    """A deterministic blob id for rows without an inode (never collides with a real one)."""
    return int.from_bytes(hashlib.sha256("\0".join(parts).encode()).digest()[:7], "big")
