"""The hashing backlog: how far a pull's transfers may run ahead of its hashers.

Every landed byte stays in the page cache until its file's hasher has read it: on disk
a part is written back as it lands, but dropped from the cache only once hashed
(`writeback.write_behind`). When hashing is slower than the link, as SHA-256 is on a signed pull
(~1.2-1.6 GiB/s a core against xxh3's ~10), an unbounded window keeps fetching and the
bytes waiting for a hasher pile up: gigabytes of page cache, each page a fresh one (or
another file's, reclaimed) instead of one the write-behind just freed. The transfer
threads pay for it: a signed pull to XFS spent 3.07 CPU s/GiB against 1.77 with this
bound (BENCHMARKS.md, "The cost of verifying a signature"). So a part enters the window
only while the bytes admitted and not yet hashed stay within a budget: the transfers go
at the hashers' pace, and the page cache a pull holds is bounded whatever the model's size.

It cannot deadlock: a file's parts are admitted in order, so every part that waits has
all the earlier parts of its file admitted, and those land (their hasher then frees
their bytes) or fail the file (which frees them all).
"""

from __future__ import annotations

import asyncio
from collections import deque

from modelsync.core.parts import Part

#: the backlog's budget, in windows' worth of parts (`concurrency × part_size_bytes`): one
#: window in flight and one landed ahead of the hashers, so a hasher that keeps up never
#: leaves the window short of parts
BACKLOG_WINDOWS = 2


class Backlog:
    """Bytes admitted to the window and not hashed yet, at most `limit_bytes`; parts wait in turn.

    A part larger than the whole budget is admitted when nothing else is held, so no
    part waits forever.
    """

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self.held_bytes = 0
        self._waiting: deque[tuple[int, asyncio.Future[None]]] = deque()

    def _fits(self, n_bytes: int) -> bool:
        return self.held_bytes == 0 or self.held_bytes + n_bytes <= self.limit_bytes

    async def admit(self, n_bytes: int) -> None:
        """Hold `n_bytes` of the budget, waiting behind the parts that asked first."""
        if not self._waiting and self._fits(n_bytes):
            self.held_bytes += n_bytes
            return
        entry = (n_bytes, asyncio.get_running_loop().create_future())
        self._waiting.append(entry)
        try:
            await entry[1]
        except asyncio.CancelledError:
            if entry[1].cancelled():
                if entry in self._waiting:
                    self._waiting.remove(entry)
                self._admit_waiting()  # those behind it may fit now
            else:
                self.release(n_bytes)  # granted, then cancelled before it could be used
            raise

    def release(self, n_bytes: int) -> None:
        """Give back bytes that were hashed (or will not be); admit whoever now fits, in turn."""
        self.held_bytes -= n_bytes
        self._admit_waiting()

    def _admit_waiting(self) -> None:
        while self._waiting and (self._waiting[0][1].done() or self._fits(self._waiting[0][0])):
            n_bytes, granted = self._waiting.popleft()
            if not granted.done():  # a cancelled waiter is dropped, not granted
                self.held_bytes += n_bytes
                granted.set_result(None)


class FileBacklog:
    """One file's share of the backlog: its admitted parts, freed as its hasher passes them."""

    def __init__(self, backlog: Backlog) -> None:
        self.backlog = backlog
        self._parts: deque[Part] = deque()

    async def admit(self, part: Part) -> None:
        """Wait until `part` may be fetched (in part order: the hasher frees from the front)."""
        await self.backlog.admit(part.size_bytes)
        self._parts.append(part)

    def hashed(self, position: int) -> None:
        """Free the parts that end at or before `position`, the hasher's."""
        while self._parts and self._parts[0].end <= position:
            self.backlog.release(self._parts.popleft().size_bytes)

    def close(self) -> None:
        """Free whatever is still held: the file is done, failed or cancelled."""
        while self._parts:
            self.backlog.release(self._parts.popleft().size_bytes)
