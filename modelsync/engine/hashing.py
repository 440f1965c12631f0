"""The hand-off from transfers to hashing: a hasher follows each file's contiguous prefix of landed parts.

So when a file's last part lands, the file is almost hashed. Hashing runs in
the default executor's threads, a few files at a time (`HASH_SLOTS`, or one per
usable core when SHA-256 is computed too), a turn of `HASH_TURN_BYTES` each;
every turn frees its share of the backlog (engine/backlog.py) and, on disk,
writes the hashed range behind.
"""

from __future__ import annotations

import asyncio

from modelsync.adapters import fs, writeback
from modelsync.adapters.cache import Staging
from modelsync.adapters.digest import PrefixHasher, sha256_slots
from modelsync.core.parts import FileWork, Part
from modelsync.engine.backlog import FileBacklog
from modelsync.engine.transfer_threads import in_thread

#: files hashed at once when only xxh3 is computed (~10 GiB/s a core: two keep up with any link)
HASH_SLOTS = 2
#: bytes a hasher takes per turn of its slot: each turn then frees its share of the backlog and
#: writes it behind, rather than a lagging hasher holding both until a long stretch is hashed
HASH_TURN_BYTES = 32 * 1024 * 1024


class LandedPrefix:
    """How far from the front a file's parts have all landed, for its hasher to follow."""

    def __init__(self, work: FileWork, hasher: PrefixHasher, fd: int, backlog: FileBacklog) -> None:
        self.hasher = hasher
        self.fd = fd
        self.backlog = backlog
        self.grew = asyncio.Event()
        self._parts = work.parts
        self._landed = set(work.done)
        self._next = 0
        self.end = 0
        self._advance()

    def land(self, part: Part, task: asyncio.Task[None]) -> None:
        """Done-callback of a part's task: a part that arrived may extend the prefix."""
        if not task.cancelled() and task.exception() is None:
            self._landed.add(part.index)
            self._advance()

    def _advance(self) -> None:
        while self._next < len(self._parts) and self._parts[self._next].index in self._landed:
            self.end = self._parts[self._next].end
            self._next += 1
            self.grew.set()


class Hashers:
    """The hashers of one pull's files, writing the staging files behind them."""

    def __init__(self, staging: Staging) -> None:
        self._staging = staging
        self._slots = asyncio.Semaphore(HASH_SLOTS)

    def hash_sha256(self) -> None:
        """A signed pull also computes SHA-256, ~6x slower than xxh3: hash one file per usable core."""
        self._slots = asyncio.Semaphore(sha256_slots())

    async def follow(self, prefix: LandedPrefix) -> None:
        """Hash each stretch of the file as soon as every part before its end has landed, a turn at a time."""
        loop = asyncio.get_running_loop()
        hasher = prefix.hasher
        while hasher.position < hasher.size_bytes:
            await prefix.grew.wait()
            prefix.grew.clear()
            while hasher.position < prefix.end:
                async with self._slots:
                    end = min(prefix.end, hasher.position + HASH_TURN_BYTES)
                    await in_thread(loop.run_in_executor(None, self.hash, hasher, prefix.fd, end))
                prefix.backlog.hashed(hasher.position)

    def hash(self, hasher: PrefixHasher, fd: int, end: int) -> None:
        """Hash up to `end` (in a worker thread); on disk, then write the hashed range behind.

        Waiting here until the range is on disk and dropping it from the page cache
        keeps a pull's dirty and cached pages to what is in flight, instead of a model's
        worth that the kernel must write back and reclaim while the download goes on:
        that halved the CPU of a 6 GiB pull to XFS and ext4 (docs/perf-lab.md). Nothing
        leaves the page cache before it is hashed.
        """
        start = hasher.position
        hasher.feed(fd, end)
        if self._staging.on_disk:
            with fs.storage_errors(self._staging.dir):
                writeback.write_behind(fd, start, hasher.position - start)
