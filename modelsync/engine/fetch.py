"""The fetch window: every part of a pull through one sliding window of ranged GETs.

At most `concurrency` GETs are in flight (a semaphore, not batches), each run
by a transfer thread that writes the body at its offset in the staging file.
A hasher follows each file's contiguous prefix of landed parts, so when the
last part lands the file is almost hashed; a part enters the window only while
the bytes fetched ahead of the hashers stay within the backlog's budget
(engine/backlog.py), so slow hashing paces the transfers instead of filling the
page cache. A small file of one part is made in one trip to a transfer thread
instead: created, fetched, hashed and closed there. Each part is retried from
the last byte written until it lands or the retry policy gives up; a presigned
URL is signed again before it gets old, and after the store calls it expired.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import random
import signal
import time
from collections.abc import Callable
from typing import TypeVar

from modelsync.adapters import fs
from modelsync.adapters.cache import Staging
from modelsync.adapters.digest import FileDigest, PrefixHasher, sha256_slots
from modelsync.config import Settings
from modelsync.core.parts import FileWork, Part, RemoteFile
from modelsync.core.refs import ModelRef
from modelsync.core.retry import PartRetries, RetryPolicy, presigned_expiry
from modelsync.core.units import format_bytes, format_duration
from modelsync.core.verify import empty_but_etag_says_not, misstated_size
from modelsync.engine.backlog import BACKLOG_WINDOWS, Backlog, FileBacklog
from modelsync.engine.events import PullEvents
from modelsync.engine.ports import Backends, ObjectStore, RangeFetcher, RangeRequest
from modelsync.engine.tasks import first_error
from modelsync.engine.throttle import StoreGate
from modelsync.engine.transfer_threads import TransferThreads
from modelsync.errors import (
    AccessDeniedError,
    DiskFullError,
    PresignedUrlExpiredError,
    RemoteUnavailableError,
    SizeMismatchError,
    TransientFetchError,
)

#: files hashed at once when only xxh3 is computed (~10 GiB/s a core: two keep up with any link)
HASH_SLOTS = 2
#: a file of one part up to this size is created, fetched, hashed and closed in one trip to a
#: transfer thread: for a model of many small files, the tasks and thread hand-offs of the
#: general path cost more CPU than the bytes. It hashes outside the hash slots, so with this
#: bound each transfer thread maps at most 1 MiB of page cache; larger files gain nothing.
WHOLE_FILE_MAX_BYTES = 1024 * 1024
#: bytes a hasher takes per turn of its slot: each turn then frees its share of the backlog and
#: writes it behind, rather than a lagging hasher holding both until a long stretch is hashed
HASH_TURN_BYTES = 32 * 1024 * 1024
#: a presigned URL is signed again once less than this share of its lifetime is left. With
#: the default 15 min lifetime a URL is used for at most 7.5 min after signing, less than the
#: 10 min of validity botocore guarantees temporary credentials when it signs (it refreshes
#: them inside that window), so no URL outlives the credentials it carries.
PRESIGN_RENEW_SHARE = 0.5
#: a part answered "expired" this many times in a row, each time with a fresh URL, gives up
MAX_EXPIRED_IN_A_ROW = 3

_T = TypeVar("_T")


def leave_signals_to_the_main_thread() -> None:
    """Block Ctrl-C and SIGTERM in the calling (worker) thread.

    The kernel then hands those signals to the main thread: delivered to a worker,
    a signal would wait until the event loop woke for some other reason, a 30 s
    read timeout when every transfer is stalled.
    """
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})


class FetchWindow:
    """One pull's transfers: the window, the transfer threads, the URLs and the retry state."""

    def __init__(
        self,
        settings: Settings,
        ref: ModelRef,
        backends: Backends,
        staging: Staging,
        events: PullEvents,
        policy: RetryPolicy,
        gate: StoreGate,
    ) -> None:
        self.settings = settings
        self.ref = ref
        self.store: ObjectStore = backends.store
        self.fetcher: RangeFetcher = backends.fetcher
        self.staging = staging
        self.events = events
        self.policy = policy
        #: paces requests when the store throttles; shared by every pull of this process to that store
        self.gate = gate
        self.window = asyncio.Semaphore(settings.concurrency)
        #: bytes fetched ahead of the hashers, so of page cache held: bounded (engine/backlog.py)
        self.backlog = Backlog(BACKLOG_WINDOWS * settings.concurrency * settings.part_size_bytes)
        self.hash_slots = asyncio.Semaphore(HASH_SLOTS)
        self.urls: dict[str, str] = {}
        #: the staging directory, opened for the first file (after the pull prepared it) and kept
        self.staging_fd: int | None = None
        #: whether the user was told that the store throttles (once per pull)
        self.throttle_noted = False
        #: bumped each time the credentials are resolved afresh, so a burst of ExpiredToken renews once
        self.credentials_generation = 0
        self.credentials_lock = asyncio.Lock()
        #: the transfer threads; each owns one connection per endpoint and one buffer
        self.threads = TransferThreads(
            asyncio.get_running_loop(),
            settings.concurrency,
            "modelsync-get",
            leave_signals_to_the_main_thread,
        )

    def close(self) -> None:
        """Abort the transfers (their sockets close, blocked threads wake) and join the threads."""
        self.fetcher.close()
        self.threads.shutdown()
        if self.staging_fd is not None:
            os.close(self.staging_fd)
            self.staging_fd = None

    def forget_url(self, f: RemoteFile) -> None:
        """The object changed: its next part is signed afresh."""
        self.urls.pop(f.key, None)

    async def fetch_file(self, work: FileWork, hasher: PrefixHasher) -> FileDigest:
        """Fetch the missing parts while hashing the landed prefix; the digest once all are in."""
        if self.staging_fd is None:
            with fs.storage_errors(self.staging.dir):
                self.staging_fd = fs.open_dir(self.staging.dir)
        if empty_but_etag_says_not(work.file):
            raise misstated_size(f"s3://{self.ref.bucket}/{work.file.key}", work.file, None)
        try:
            if not work.done and len(work.parts) == 1 and work.file.size_bytes <= WHOLE_FILE_MAX_BYTES:
                async with self.window:
                    whole = functools.partial(self._transfer_whole, work.file, hasher)
                    await self._part(work.file, work.parts[0], whole)
            else:
                await self._fetch_parts(work, hasher)
            return hasher.digest()
        except DiskFullError as exc:
            raise DiskFullError(
                f"disk full writing {self.staging.dir / work.file.path}: needs "
                f"{format_bytes(work.missing_bytes)} for this file, "
                f"{format_bytes(fs.free_bytes(self.staging.dir))} free ({exc}); "
                "free space (modelsync evict) or raise the volume's size"
            ) from None

    async def _fetch_parts(self, work: FileWork, hasher: PrefixHasher) -> None:
        """The general path: the file open while its parts land in any order and a hasher follows."""
        fd = await self._open(work.file, fresh=not work.done)
        prefix = _Prefix(work, hasher, fd, FileBacklog(self.backlog))
        try:
            with first_error():
                await self._fetch_missing(work, prefix)
            if self.staging.on_disk and len(work.parts) > 1:
                # Flush a large file as it completes, while other files still download,
                # rather than all of them at publish time (tmpfs has nothing to flush). Its
                # data is on disk already (write-behind); this makes its size and extents
                # durable. A one-part file waits for publish's single syncfs: thousands of
                # small files would each pay a journal commit here.
                await asyncio.to_thread(fs.sync_data, fd, self.staging.dir / work.file.path)
        finally:
            prefix.backlog.close()
            os.close(fd)

    async def _open(self, f: RemoteFile, fresh: bool) -> int:
        """Create the staging file in a transfer thread: for small files, opening beneath the
        staging directory and allocating cost more than the GET, and the event loop is the
        one thread all files share."""

        def open_file() -> int:
            with fs.storage_errors(self.staging.dir / f.path, f.size_bytes):
                return self.staging.open_file(f.path, f.size_bytes, fresh=fresh, dir_fd=self.staging_fd)

        opening = self.threads.submit(open_file)
        try:
            return await in_thread(opening)
        except asyncio.CancelledError:
            if not opening.cancelled() and opening.exception() is None:
                os.close(opening.result())  # opened after all: do not leak it
            raise

    async def _fetch_missing(self, work: FileWork, prefix: _Prefix) -> None:
        """The parts through the shared window, and one hasher following them, as one task group."""
        into_file = functools.partial(self._transfer, prefix.fd)
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._follow(prefix))
            for part in work.missing:
                await prefix.backlog.admit(part)
                await self.window.acquire()
                task = tg.create_task(self._part(work.file, part, into_file))
                task.add_done_callback(lambda _t: self.window.release())
                task.add_done_callback(functools.partial(prefix.land, part))

    def hash_sha256(self) -> None:
        """A signed pull also computes SHA-256, ~6x slower than xxh3: hash one file per usable core."""
        self.hash_slots = asyncio.Semaphore(sha256_slots())

    async def _follow(self, prefix: _Prefix) -> None:
        """Hash each stretch of the file as soon as every part before its end has landed, a turn at a time."""
        loop = asyncio.get_running_loop()
        hasher = prefix.hasher
        while hasher.position < hasher.size_bytes:
            await prefix.grew.wait()
            prefix.grew.clear()
            while hasher.position < prefix.end:
                async with self.hash_slots:
                    end = min(prefix.end, hasher.position + HASH_TURN_BYTES)
                    await in_thread(loop.run_in_executor(None, self._hash, hasher, prefix.fd, end))
                prefix.backlog.hashed(hasher.position)

    def _hash(self, hasher: PrefixHasher, fd: int, end: int) -> None:
        """Hash up to `end` (in a worker thread); on disk, then write the hashed range behind.

        Waiting here until the range is on disk and dropping it from the page cache
        keeps a pull's dirty and cached pages to what is in flight, instead of a model's
        worth that the kernel must write back and reclaim while the download goes on:
        that halved the CPU of a 6 GiB pull to XFS and ext4 (docs/perf-lab.md). Nothing
        leaves the page cache before it is hashed.
        """
        start = hasher.position
        hasher.feed(fd, end)
        if self.staging.on_disk:
            with fs.storage_errors(self.staging.dir):
                fs.write_behind(fd, start, hasher.position - start)

    async def _part(self, f: RemoteFile, part: Part, transfer: Callable[[RangeRequest, int], int]) -> None:
        """One ranged GET, retried from the last byte written until it lands or the policy gives up.

        `transfer(request, start)` runs each attempt in a transfer thread.

        Every attempt first passes the store's gate. A throttled answer slows the
        gate for every transfer and waits whole seconds (or the store's
        Retry-After); other transient failures wait briefly. The part gives up
        after `policy.attempts` consecutive non-throttle failures, or after
        `policy.budget_s` without progress, whichever comes first; a byte of
        progress resets both. An expired URL or token is presigned again (from
        freshly resolved credentials for a token) and does not count.
        """
        start = part.start
        retries = PartRetries(self.policy)
        expired = 0
        while True:
            await self.gate.admit()  # first: a long wait here must not age the URL
            url = await self._url(f)
            generation = self.credentials_generation
            req = RangeRequest(url=url, start=start, end=part.end, etag=f.etag, size_bytes=f.size_bytes)
            try:
                await in_thread(self.threads.submit(transfer, req, start))
            except SizeMismatchError as exc:
                raise misstated_size(f"s3://{self.ref.bucket}/{f.key}", f, exc.store_bytes) from None
            except PresignedUrlExpiredError as exc:
                expired += 1
                if expired >= MAX_EXPIRED_IN_A_ROW:
                    raise AccessDeniedError(
                        f"{exc}; {expired} fresh signatures in a row were refused as expired: the "
                        "credential chain hands out expired credentials, or this clock is far off"
                    ) from None
                await self._renew(f, url, generation, token_expired=exc.token_expired)
                continue
            except TransientFetchError as exc:
                now = time.monotonic()
                start += exc.bytes_written
                retries.failed(now, progressed=exc.bytes_written > 0, throttled=exc.throttled)
                if exc.throttled:
                    self.gate.throttled(exc.retry_after_s)
                    self._note_throttling(exc)
                if retries.exhausted(now):
                    raise RemoteUnavailableError(
                        f"giving up on {f.key} bytes {start}-{part.end} after "
                        f"{retries.failures + retries.throttles} failed attempts in "
                        f"{retries.stuck_s(now):.0f} s without progress ({exc}); retry the pull later, "
                        "it resumes where it stopped"
                    ) from None
                await asyncio.sleep(
                    retries.wait_s(
                        now, throttled=exc.throttled, retry_after_s=exc.retry_after_s, jitter=random.random()
                    )
                )
                continue
            break
        self.gate.succeeded()
        self.staging.journal.part_written(f.path, part.index, part.size_bytes)

    def _transfer(self, fd: int, req: RangeRequest, start: int) -> int:
        """One ranged GET into the file (in a transfer thread); on disk, start writing it back."""
        written = self.fetcher.fetch_into(req, fd, start, self.events.fetched)
        if self.staging.on_disk:
            fs.start_writeback(fd, start, written)
        return written

    def _transfer_whole(self, f: RemoteFile, hasher: PrefixHasher, req: RangeRequest, start: int) -> int:
        """A one-part file (in a transfer thread): create it, GET it, hash it, close it.

        The first attempt starts from a new file; a retry resumes in the one it created.
        Hashed from the page cache once the bytes have landed, as every other file is.
        """
        with fs.storage_errors(self.staging.dir / f.path, f.size_bytes):
            fd = self.staging.open_file(f.path, f.size_bytes, fresh=start == 0, dir_fd=self.staging_fd)
        try:
            written = self._transfer(fd, req, start)
            self._hash(hasher, fd, f.size_bytes)
        finally:
            os.close(fd)
        return written

    def _note_throttling(self, exc: TransientFetchError) -> None:
        """Say once why the pull slows down: a long quiet wait would look like a hang."""
        if not self.throttle_noted:
            self.throttle_noted = True
            self.events.note(
                f"the store asks for less load ({exc.status} {exc.reason}); every transfer slows down "
                f"and keeps retrying, for up to {format_duration(self.policy.budget_s)} without progress"
            )

    async def _url(self, f: RemoteFile) -> str:
        """The file's presigned URL, signed again when it is close to its own expiry.

        Signing again also picks up credentials botocore refreshed on the way
        (temporary credentials are refreshed before they expire), so a pull that
        outlives its first credentials never sends a URL they no longer cover.
        """
        url = self.urls.get(f.key)
        if url is not None:
            expiry = presigned_expiry(url)
            if expiry is None or expiry - time.time() > self.settings.presign_expiry_s * PRESIGN_RENEW_SHARE:
                return url
        url = self.urls[f.key] = await self.store.presign_get(
            self.ref.bucket, f.key, self.settings.presign_expiry_s
        )
        return url

    async def _renew(self, f: RemoteFile, url: str, generation: int, token_expired: bool) -> None:
        """Presign `f` again after an "expired" answer; for an expired token, resolve credentials first.

        Many parts see the same expired token at once: the first one to get here
        resolves the credentials, the others find the generation moved on and
        only presign.
        """
        if token_expired:
            async with self.credentials_lock:
                if self.credentials_generation == generation:
                    await self.store.renew_credentials()
                    self.credentials_generation += 1
        if self.urls.get(f.key) == url:
            del self.urls[f.key]


class _Prefix:
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


async def in_thread(future: asyncio.Future[_T]) -> _T:
    """Await a transfer thread; when cancelled, first wait until the thread has stopped.

    A cancelled task cannot stop a thread blocked on its socket: it keeps writing at
    its offsets until the body ends, its socket is shut down (`FetchWindow.close`), or
    `read_timeout_s` passes. The descriptor it writes to must stay open until then,
    or its late writes land on a closed descriptor, or on whatever file reuses that
    number (the restarted file, another file of the model, the journal). So
    cancellation waits for the thread; after an abort that is at once.
    """
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        while not future.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait([future])
        if not future.cancelled():
            future.exception()  # retrieved: the cancellation is what propagates
        raise
