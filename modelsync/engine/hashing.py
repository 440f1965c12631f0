"""The hand-off from transfers to hashing: a hasher follows each file's contiguous prefix of landed parts.

So when a file's last part lands, the file is almost hashed. The transfer of the
part at a hasher's position feeds it each buffer as it is written (`FrontHasher`),
so those bytes are hashed from the receive buffer and never read back: reading a
landed part back from the page cache cost 0.87-0.89 CPU s/GiB on a 2-core VM, all
of what a pull spent beyond rclone (BENCHMARKS.md, "A cold pull's timeline").
What landed ahead of the hasher is read back, through a mapping of the staging
file (`PrefixHasher.feed_mapped`), in the default executor's threads, a
few files at a time (`HASH_SLOTS`, or one per usable core when SHA-256 is computed
too), a turn of `HASH_TURN_BYTES` each; every turn frees its share of the backlog
(engine/backlog.py). On disk, what is hashed is written behind and dropped from the page
cache by whichever thread hashed it: a hash slot after its turn, a transfer thread every
`FOLLOW_BEHIND_BYTES` it fed, so the hashed front of a 32 MiB part leaves the page cache
before the part has landed.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable

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
#: on disk, a transfer thread that fed its file's hasher writes behind once this much is hashed and
#: not yet written behind: each write-behind waits for the disk, which a few MiB at a time keeps
#: short, and a part's hashed front leaves the page cache while the rest of it is received
FOLLOW_BEHIND_BYTES = 8 * 1024 * 1024


class FrontHasher:
    """One file's hasher, fed by one thread at a time: whichever is at its position.

    A transfer thread offers each buffer it wrote (`offer`); the hasher takes it when
    the buffer starts where the hasher is and no one else is feeding it, and turns it
    away otherwise: those bytes are read back later (`feed`, in a hash slot, which waits
    while a transfer feeds). So bytes are hashed in file order, each once, whether
    from a receive buffer or from the page cache. The lock is held while feeding (the
    digests release the interpreter lock as they run), and an offer never waits for it.

    On disk, what is hashed is written behind (`catch_up`) by one thread at a time under
    a lock of its own, so two threads never wait for the same range and `behind` only grows.
    """

    def __init__(self, hasher: PrefixHasher, write_behind: Callable[[int, int], None] | None) -> None:
        self.hasher = hasher
        #: everything before this offset is hashed and, on disk, written behind
        self.behind = 0
        #: `write_behind(start, end)`: wait for `[start, end)` to reach the disk and drop it from
        #: the page cache; None where there is no disk (tmpfs)
        self._write_behind = write_behind
        self._feeding = threading.Lock()
        self._writing = threading.Lock()

    def offer(self, offset: int, data: memoryview) -> None:
        """Hash `data`, just written at `offset`, if the hasher is there and free (a transfer thread);
        then write behind, once `FOLLOW_BEHIND_BYTES` are hashed and not written behind."""
        if not self._feeding.acquire(blocking=False):
            return
        try:
            self.hasher.take(offset, data)
        finally:
            self._feeding.release()
        self.catch_up(FOLLOW_BEHIND_BYTES, wait=False)

    def feed(self, fd: int, end: int) -> None:
        """Read back and hash from the hasher's position to `end` (nothing if it is there already)."""
        with self._feeding:
            self.hasher.feed_mapped(fd, end)

    def lags(self) -> bool:
        """Whether, on disk, some hashed bytes are not written behind yet."""
        return self._write_behind is not None and self.behind < self.hasher.position

    def catch_up(self, at_least: int = 1, wait: bool = True) -> None:
        """On disk, write behind all that is hashed, if that is at least `at_least` bytes.

        `wait=False` (a transfer thread): if another thread is writing behind, leave it to that one.
        """
        if self._write_behind is None or not self._writing.acquire(blocking=wait):
            return
        try:
            start, end = self.behind, self.hasher.position
            if end - start >= at_least:
                self._write_behind(start, end)
                self.behind = end
        finally:
            self._writing.release()


class LandedPrefix:
    """How far from the front a file's parts have all landed, for its hasher to follow."""

    def __init__(self, work: FileWork, front: FrontHasher, fd: int, backlog: FileBacklog) -> None:
        self.front = front
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

    def front(self, hasher: PrefixHasher, fd: int) -> FrontHasher:
        """The hasher of a file open at `fd`, which on disk writes behind what it hashed."""
        if not self._staging.on_disk:
            return FrontHasher(hasher, None)
        return FrontHasher(hasher, functools.partial(self._write_behind, fd))

    async def follow(self, prefix: LandedPrefix) -> None:
        """Hash each stretch of the file as soon as every part before its end has landed, a turn at a
        time, unless its transfer hashed it already; free the backlog and write behind what is hashed."""
        loop = asyncio.get_running_loop()
        front = prefix.front
        hasher = front.hasher
        while True:
            if hasher.position < prefix.end or front.lags():
                async with self._slots:
                    end = min(prefix.end, hasher.position + HASH_TURN_BYTES)
                    await in_thread(loop.run_in_executor(None, self._turn, front, prefix.fd, end))
                prefix.backlog.hashed(hasher.position)
                continue
            prefix.backlog.hashed(hasher.position)
            if hasher.position >= hasher.size_bytes:
                return
            await prefix.grew.wait()
            prefix.grew.clear()

    def hash(self, hasher: PrefixHasher, fd: int, start: int, end: int) -> None:
        """Hash the rest of a one-part file up to `end` (in its transfer thread), which took what it
        could from its receive buffer; on disk, then write behind what it wrote from `start`."""
        hasher.feed(fd, end)
        self._write_behind(fd, start, hasher.position)

    def _turn(self, front: FrontHasher, fd: int, end: int) -> None:
        """A hash slot's turn (in a worker thread): read back and hash up to `end`, then write behind
        all that is hashed, by this turn or by the transfers."""
        front.feed(fd, end)
        front.catch_up()

    def _write_behind(self, fd: int, start: int, end: int) -> None:
        """On disk, wait until `[start, end)` is written and drop it from the page cache.

        That keeps a pull's dirty and cached pages to what is in flight, instead of a model's
        worth that the kernel must write back and reclaim while the download goes on: that
        halved the CPU of a 6 GiB pull to XFS and ext4 (docs/perf-lab.md). Nothing leaves the
        page cache before it is hashed.
        """
        if self._staging.on_disk and end > start:
            with fs.storage_errors(self._staging.dir):
                writeback.write_behind(fd, start, end - start)
