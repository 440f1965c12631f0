"""What the cache holds, as one consistent view: index rows joined with the markers on disk.

The index is kept in step with the completion records on every open: records
without a row are added, rows without a record are dropped, and a missing or
damaged index is rebuilt from the records. So `ls` after deleting the index
shows the same models, and only LRU order falls back to what the `used/`
markers (or the completion times) say.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass

from modelsync.adapters import fs
from modelsync.adapters.cache import Cache
from modelsync.adapters.cache.damaged import DamagedRecord, damaged_record
from modelsync.adapters.index import Index, IndexedModel
from modelsync.core.eviction import Blob, CacheEntry
from modelsync.core.lifecycle import CacheState
from modelsync.core.record import CompletionRecord
from modelsync.core.refs import ModelRef, parse_model_name
from modelsync.errors import LocalStorageError, ModelsyncError, NotFoundError


@dataclass(frozen=True, slots=True)
class ModelView:
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
    def __init__(self, cache: Cache) -> None:
        self.cache = cache
        #: ready records that cannot be read, found by the last sync with the index
        self.damaged: list[DamagedRecord] = []
        cache.ensure()
        try:
            self.index = Index(cache.index_path)
        except LocalStorageError:
            # A read-only mount or a user outside the cache's group cannot open it (SQLite
            # writes beside it even to read): the private copy below serves read-only commands.
            self.index = Index(None)
        try:
            if not self.index.is_current():
                self.index.reset()
            #: index rows whose model was no longer on disk, dropped while opening
            self.stale_rows_dropped = self._sync()
        except LocalStorageError:
            # The index cannot be brought in step (a full or read-only volume): work from a
            # private copy in memory, built from the records, so ls and evict still run when
            # space is needed most. The file catches up at the next open that can write.
            self.index.close()
            self.index = Index(None)
            self.index.reset()
            self.stale_rows_dropped = self._sync()

    def close(self) -> None:
        self.index.close()

    # -- keeping the index in step with the records ----------------------------------

    def _sync(self) -> int:
        rows = {m.model: m for m in self.index.models()}
        on_disk = dict(self._records_on_disk())
        stale = [model for model in rows if model not in on_disk]
        if stale:
            self.index.remove(stale)
        for model, (ref, record, state) in on_disk.items():
            row = rows.get(model)
            if row is None or not _in_step(row, record, state):
                self._put(ref, record, state)
        return len(stale)

    def _records_on_disk(self) -> Iterator[tuple[str, tuple[ModelRef, CompletionRecord, CacheState]]]:
        """Every model a record (or a damaged record's stand-in) vouches for, and its state.

        A ready model whose record cannot be read is counted as quarantined, from the
        files at its ready path: never served, but it holds space until `verify`
        quarantines it or `evict` removes it. `damaged` lists those records.
        """
        # Quarantine first, so a ready record of the same model (pulled again since) wins.
        for quarantined, state in ((True, CacheState.QUARANTINED), (False, CacheState.READY)):
            records, damaged = self.cache.scan_records(quarantined=quarantined)
            for _slug, record in records:
                ref = parse_model_name(record.source)  # read_records checked it names this slug
                if self.cache.has_data_dir(ref, quarantined=quarantined):
                    yield ref.model_id, (ref, record, state)
            if quarantined:
                continue
            self.damaged = [damaged_record(self.cache.root, path, reason) for path, reason in damaged]
            for found in self.damaged:
                if found.ref is not None and found.stand_in is not None:
                    yield found.ref.model_id, (found.ref, found.stand_in, CacheState.QUARANTINED)

    def register(self, ref: ModelRef, record: CompletionRecord, state: CacheState = CacheState.READY) -> None:
        """Add or replace a model's row, after its record was written (`make_ready`, a quarantine).

        The record on disk already made the change; the row only follows it. When the
        index cannot be written (disk full), the row is left for the next open to bring
        in step from the record, rather than failing a pull whose model is already ready.
        """
        with contextlib.suppress(LocalStorageError):
            self._put(ref, record, state)

    def _put(self, ref: ModelRef, record: CompletionRecord, state: CacheState) -> None:
        """Add or replace a model's row, with the inode of each file for hard-link accounting."""
        root = self.cache.data_dir(ref, quarantined=state is CacheState.QUARANTINED)
        inodes = fs.file_inodes(root, [f.path for f in record.files])
        self.index.put(ref.model_id, record, inodes, state)
        verified_at = self.cache.verified_at(ref)
        if verified_at is not None and verified_at > record.completed_at:
            self.index.set_verified(ref.model_id, verified_at)

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


def _in_step(row: IndexedModel, record: CompletionRecord, state: CacheState) -> bool:
    """Whether an index row says what its record says: an edited or stale row is put again."""
    return (
        row.source,
        row.state,
        row.completed_at,
        row.size_bytes,
        row.files,
        row.verified_by,
        row.signer,
    ) == (
        record.source,
        state,
        record.completed_at,
        record.total_bytes,
        len(record.files),
        record.verified_by,
        record.signer,
    )


def _latest(*instants: float | None) -> float | None:
    return max((at for at in instants if at is not None), default=None)


def _stable_id(*parts: str) -> int:
    """A deterministic blob id for rows without an inode (never collides with a real one)."""
    return int.from_bytes(hashlib.sha256("\0".join(parts).encode()).digest()[:7], "big")
