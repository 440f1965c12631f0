"""The fetch window: every part of a pull through one sliding window of ranged GETs.

At most `concurrency` GETs are in flight (a semaphore, not batches), each run
by a transfer thread that writes the body at its offset in the staging file.
A hasher follows each file's contiguous prefix of landed parts
(engine/hashing.py), taking the part at its position from the transfer's buffer
as it is written; the window is shared evenly by the files being fetched
(`Spread`), so a model of many shards comes in order and is hashed that way
rather than read back. A part enters the window only while the bytes fetched
ahead of the hashers stay within the backlog's budget (engine/backlog.py), so
slow hashing paces the transfers instead of filling the page cache. A small
file of one part is made in one trip to a transfer thread instead: created,
fetched, hashed and closed there; a model's many small files are first tried a
batch a trip (`fetch_once_each`), one hand-off each way for the batch. Each part
lands through `PartTransfer` (engine/part_transfer.py): retried from the last
byte written, with URLs that are signed again before they get old
(engine/presigned.py).
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Sequence

from modelsync.adapters import fs, writeback
from modelsync.adapters.cache import Staging
from modelsync.adapters.digest import FileDigest, PrefixHasher
from modelsync.core.parts import FileWork, RemoteFile
from modelsync.core.verify import empty_but_etag_says_not, misstated_size
from modelsync.engine.backlog import BACKLOG_WINDOWS, Backlog, FileBacklog
from modelsync.engine.events import PullEvents
from modelsync.engine.hashing import Hashers, LandedPrefix
from modelsync.engine.part_transfer import FailedTry, OneTry, PartTransfer, Tried
from modelsync.engine.ports import Backends, RangeRequest
from modelsync.engine.pull_job import PullJob
from modelsync.engine.tasks import first_error
from modelsync.engine.transfer_threads import TransferThreads, in_thread, leave_signals_to_the_main_thread
from modelsync.errors import DiskFullError

#: a file of one part up to this size is created, fetched, hashed and closed in one trip to a
#: transfer thread: for a model of many small files, the tasks and thread hand-offs of the
#: general path cost more CPU than the bytes. It hashes outside the hash slots, so with this
#: bound a transfer thread hashes one 1 MiB read back at most; larger files gain nothing.
WHOLE_FILE_MAX_BYTES = 1024 * 1024


def whole_file(work: FileWork) -> bool:
    """Whether `work` is a file of one part, none of it written, small enough to be made in one trip."""
    return not work.done and len(work.parts) == 1 and work.file.size_bytes <= WHOLE_FILE_MAX_BYTES


class Spread:
    """How many parts of one file may be in flight: the window shared evenly by the files still
    being admitted, so that with a model of many shards each file's parts come in order and its
    hasher takes them from the receive buffer (engine/hashing.py `FrontHasher`) instead of
    reading them back; a model of one large file still gets the whole window for it."""

    def __init__(self, concurrency: int) -> None:
        self._concurrency = concurrency
        self._files: set[asyncio.Event] = set()

    def per_file(self) -> int:
        return max(1, -(-self._concurrency // max(1, len(self._files))))

    def join(self, freed: asyncio.Event) -> None:
        self._files.add(freed)

    def leave(self, freed: asyncio.Event) -> None:
        """A file has admitted all its parts: the others may each have more in flight."""
        self._files.discard(freed)
        for other in self._files:
            other.set()


class FetchWindow:
    """One pull's transfers: the window, its backlog, the transfer threads, and the staging files."""

    def __init__(self, job: PullJob, backends: Backends, staging: Staging, events: PullEvents) -> None:
        settings = job.settings
        self._bucket = job.source.bucket
        self._fetcher = backends.fetcher
        self._staging = staging
        self._window = asyncio.Semaphore(settings.concurrency)
        self._spread = Spread(settings.concurrency)
        #: bytes fetched ahead of the hashers, so of page cache held: bounded (engine/backlog.py)
        self._backlog = Backlog(BACKLOG_WINDOWS * settings.concurrency * settings.part_size_bytes)
        #: the staging directory, opened for the first file (after the pull prepared it) and kept
        self._staging_fd: int | None = None
        #: the transfer threads; each owns one connection per endpoint and one buffer
        self._threads = TransferThreads(
            asyncio.get_running_loop(),
            settings.concurrency,
            "modelsync-get",
            leave_signals_to_the_main_thread,
        )
        self._parts = PartTransfer(job, backends, staging, events, self._threads)
        self._hashers = Hashers(staging)

    def close(self) -> None:
        """Abort the transfers (their sockets close, blocked threads wake) and join the threads."""
        self._fetcher.close()
        self._threads.shutdown()
        if self._staging_fd is not None:
            os.close(self._staging_fd)
            self._staging_fd = None

    def forget_url(self, f: RemoteFile) -> None:
        """The object changed: its next part is signed afresh."""
        self._parts.forget_url(f)

    def hash_sha256(self) -> None:
        """A signed pull also computes SHA-256: more files are hashed at once (engine/hashing.py)."""
        self._hashers.hash_sha256()

    async def fetch_file(
        self, work: FileWork, hasher: PrefixHasher, failed: FailedTry | None = None
    ) -> FileDigest:
        """Fetch the missing parts while hashing the landed prefix; the digest once all are in.

        `failed`: how `fetch_once_each`'s try at this file (a `whole_file`) failed; it counts as
        the first attempt, and the next one resumes from its last byte.
        """
        self._open_staging()
        if empty_but_etag_says_not(work.file):
            raise misstated_size(f"s3://{self._bucket}/{work.file.key}", work.file, None)
        try:
            if whole_file(work):
                async with self._window:
                    whole = functools.partial(self._transfer_whole, work.file, hasher)
                    await self._parts.land(work.file, work.parts[0], whole, failed)
            else:
                assert failed is None, "only a whole file is tried in a batch"
                await self._fetch_parts(work, hasher)
            return hasher.digest()
        except DiskFullError:
            # the write that failed knows its path and the free space, not what this file needs
            raise fs.disk_full(self._staging.dir / work.file.path, work.missing_bytes) from None

    async def fetch_once_each(self, files: Sequence[tuple[FileWork, PrefixHasher]]) -> Tried:
        """A first try at each of `files` (each a `whole_file`) in one trip to a transfer thread, in
        one slot of the window; how many, from the front, landed and were hashed, and how the next
        one failed. The caller fetches the others with `fetch_file`, which retries."""
        self._open_staging()
        tries = [
            OneTry(w.file, w.parts[0], functools.partial(self._transfer_whole, w.file, hasher))
            for w, hasher in files
        ]
        async with self._window:
            return await self._parts.land_once_each(tries)

    def _open_staging(self) -> None:
        """Open the staging directory for the first file (after the pull prepared it), and keep it."""
        if self._staging_fd is None:
            with fs.storage_errors(self._staging.dir):
                self._staging_fd = fs.open_dir(self._staging.dir)

    async def _fetch_parts(self, work: FileWork, hasher: PrefixHasher) -> None:
        """The general path: the file open while its parts land in any order and a hasher follows."""
        fd = await self._open(work.file, fresh=not work.done)
        prefix = LandedPrefix(work, self._hashers.front(hasher, fd), fd, FileBacklog(self._backlog))
        try:
            with first_error():
                await self._fetch_missing(work, prefix)
            if self._staging.on_disk and len(work.parts) > 1:
                # Flush a large file as it completes, while other files still download,
                # rather than all of them at publish time (tmpfs has nothing to flush). Its
                # data is on disk already (write-behind); this makes its size and extents
                # durable. A one-part file waits for publish's single syncfs: thousands of
                # small files would each pay a journal commit here.
                await asyncio.to_thread(writeback.sync_data, fd, self._staging.dir / work.file.path)
        finally:
            prefix.backlog.close()
            os.close(fd)

    async def _open(self, f: RemoteFile, fresh: bool) -> int:
        """Create the staging file in a transfer thread: for small files, opening beneath the
        staging directory and allocating cost more than the GET, and the event loop is the
        one thread all files share."""

        def open_file() -> int:
            with fs.storage_errors(self._staging.dir / f.path, f.size_bytes):
                return self._staging.open_file(f.path, f.size_bytes, fresh=fresh, dir_fd=self._staging_fd)

        opening = self._threads.submit(open_file)
        try:
            return await in_thread(opening)
        except asyncio.CancelledError:
            if not opening.cancelled() and opening.exception() is None:
                os.close(opening.result())  # opened after all: do not leak it
            raise

    async def _fetch_missing(self, work: FileWork, prefix: LandedPrefix) -> None:
        """The parts through the shared window, and one hasher following them, as one task group."""
        into_file = functools.partial(self._parts.into_file, prefix.fd, on_written=prefix.front.offer)
        land = self._parts.land
        freed = asyncio.Event()  # set when one of its parts is done, or the spread widens
        in_flight = 0

        def done(_task: asyncio.Task[None]) -> None:
            nonlocal in_flight
            in_flight -= 1
            freed.set()
            self._window.release()

        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._hashers.follow(prefix))
            self._spread.join(freed)
            try:
                for part in work.missing:
                    while in_flight >= self._spread.per_file():
                        freed.clear()
                        await freed.wait()
                    await prefix.backlog.admit(part)
                    await self._window.acquire()
                    in_flight += 1
                    task = tg.create_task(land(work.file, part, into_file))
                    task.add_done_callback(done)
                    task.add_done_callback(functools.partial(prefix.land, part))
            finally:
                self._spread.leave(freed)

    def _transfer_whole(self, f: RemoteFile, hasher: PrefixHasher, req: RangeRequest, start: int) -> int:
        """A one-part file (in a transfer thread): create it, GET it, hash it, close it.

        The first attempt starts from a new file; a retry resumes in the one it created.
        Hashed from the receive buffer as it is written; what an earlier, broken attempt
        wrote is read back from the page cache.
        """
        with fs.storage_errors(self._staging.dir / f.path, f.size_bytes):
            fd = self._staging.open_file(f.path, f.size_bytes, fresh=start == 0, dir_fd=self._staging_fd)
        try:
            hashed = hasher.position
            written = self._parts.into_file(fd, req, start, on_written=hasher.take)
            self._hashers.hash(hasher, fd, hashed, f.size_bytes)
        finally:
            os.close(fd)
        return written
