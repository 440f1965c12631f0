"""The on-disk cache: ready models, completion records, staging, journals, locks and markers.

One `Cache` per cache root. Its jobs live in the modules of this package:
`layout` (paths), `journal` (resume state), `locks`, `markers` (pins, use,
leases, reservations), `staging`, `records` (completion records on disk), `ready`
(make ready and remove, by rename) and `quarantine` (quarantine and restage).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from modelsync.adapters.cache.journal import Journal, JournalState, boot_id
from modelsync.adapters.cache.layout import LAYOUT_VERSION, STATE_DIR
from modelsync.adapters.cache.locks import ModelLock
from modelsync.adapters.cache.markers import Reservation
from modelsync.adapters.cache.quarantine import QuarantinedModels
from modelsync.adapters.cache.staging import Staging
from modelsync.core.refs import ModelRef

__all__ = [
    "LAYOUT_VERSION",
    "STATE_DIR",
    "Cache",
    "Journal",
    "JournalState",
    "ModelLock",
    "Reservation",
    "Staging",
    "boot_id",
]


class Cache(QuarantinedModels):
    """One cache root: its layout, markers, locks, staging areas and ready models."""

    def staging(self, ref: ModelRef) -> Staging:
        return Staging(self, ref)

    def space_lock(self) -> ModelLock:
        """The cache-wide lock under which pulls claim space and evict for it."""
        return ModelLock(self.locks_dir / "space.lock")

    def lock(self, ref: ModelRef) -> ModelLock:
        return ModelLock(self.locks_dir / f"{ref.slug}.lock")

    @contextlib.contextmanager
    def locked(self, ref: ModelRef, on_wait: Callable[[str], None] | None = None) -> Iterator[None]:
        lock = self.lock(ref)
        lock.acquire(on_wait)
        try:
            yield
        finally:
            lock.release()
