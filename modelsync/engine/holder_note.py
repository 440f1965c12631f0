"""A pull's events passed on, with the lock's holder note kept current for waiting pullers.

A puller that finds a model's lock held says who holds it and how far that pull
is; the holder rewrites that note every HOLDER_NOTE_S from the bytes it fetched.
"""

from __future__ import annotations

import time

from modelsync.adapters.cache import ModelLock
from modelsync.engine.events import ByteCounter, PullEvents

#: how often the lock holder's progress note is rewritten for waiting pullers
HOLDER_NOTE_S = 2.0


class ProgressNote:
    """Passes events on, and keeps the lock's holder note current so waiters can say how far it is."""

    def __init__(self, events: PullEvents, lock: ModelLock, interval_s: float = HOLDER_NOTE_S) -> None:
        self._events = events
        self._lock = lock
        self._interval_s = interval_s
        self._total = 0
        self._next_note = 0.0
        #: bytes written by this pull, the figure PullResult reports
        self.counter = ByteCounter()

    def waiting(self, holder: str) -> None:
        self._events.waiting(holder)

    def planned(self, files: int, total_bytes: int, missing_bytes: int) -> None:
        self._total = missing_bytes
        self._lock.update_holder(0, missing_bytes)
        self._events.planned(files, total_bytes, missing_bytes)

    def fetched(self, n_bytes: int) -> None:
        self.counter.fetched(n_bytes)
        now = time.monotonic()
        if now >= self._next_note:  # from transfer threads: a race only makes the note a little stale
            self._next_note = now + self._interval_s
            self._lock.update_holder(self.counter.fetched_bytes, self._total)
        self._events.fetched(n_bytes)

    def verifying(self, path: str) -> None:
        self._events.verifying(path)

    def note(self, message: str) -> None:
        self._events.note(message)

    def damaged(self, path: str, reason: str) -> None:
        self._events.damaged(path, reason)

    def refetching(self, n_bytes: int) -> None:
        self._events.refetching(n_bytes)
