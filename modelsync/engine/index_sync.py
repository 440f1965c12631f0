"""The cache's index, opened and kept in step with the completion records on disk.

The records are the truth; the index is a fast copy of what they say, so on
every open records without a row are added, rows without a record are dropped,
and a missing or damaged index is rebuilt from the records. So `ls` after
deleting the index shows the same models, and only LRU order falls back to
what the `used/` markers (or the completion times) say. When the index cannot
be written (a read-only mount, a full disk), a private copy in memory serves.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from modelsync.adapters import fs
from modelsync.adapters.cache import Cache
from modelsync.adapters.cache.damaged import DamagedRecord, damaged_record
from modelsync.adapters.index import Index, IndexedModel
from modelsync.core.lifecycle import CacheState
from modelsync.core.record import CompletionRecord
from modelsync.core.refs import ModelRef, parse_model_name
from modelsync.errors import LocalStorageError


class SyncedIndex:
    """The index of `cache`, in step with its records from the moment it is opened."""

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
