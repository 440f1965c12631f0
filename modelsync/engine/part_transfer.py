"""One part's transfer: a ranged GET in a transfer thread, retried from the last byte written.

Every attempt first passes the store's gate (engine/throttle.py), shared by
every pull of the process to that store; the URL comes from the pull's
`PresignedUrls` (engine/presigned.py). The fetch window (engine/fetch.py)
decides which parts run and when; this module only makes one of them land.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

from modelsync.adapters import writeback
from modelsync.adapters.cache import Staging
from modelsync.core.parts import Part, RemoteFile
from modelsync.core.retry import PartRetries, RetryPolicy
from modelsync.core.units import format_duration
from modelsync.core.verify import misstated_size
from modelsync.engine.events import PullEvents
from modelsync.engine.ports import Backends, OnWritten, RangeRequest
from modelsync.engine.presigned import PresignedUrls
from modelsync.engine.pull_job import PullJob
from modelsync.engine.transfer_threads import TransferThreads, in_thread
from modelsync.errors import (
    AccessDeniedError,
    PresignedUrlExpiredError,
    RemoteUnavailableError,
    SizeMismatchError,
    TransientFetchError,
)

#: a part answered "expired" this many times in a row, each time with a fresh URL, gives up
MAX_EXPIRED_IN_A_ROW = 3


class OneTry(NamedTuple):
    """A part for `PartTransfer.land_once_each`, with the call that makes one attempt at it."""

    file: RemoteFile
    part: Part
    #: `transfer(request, start)`, run in the transfer thread
    transfer: Callable[[RangeRequest, int], int]


class FailedTry(NamedTuple):
    """How an attempt failed, and the URL it was sent with, signed at credentials `generation`."""

    error: Exception
    url: str
    generation: int


class Tried(NamedTuple):
    """What `land_once_each` did: how many parts, from the front, landed; how the next one failed."""

    landed: int
    failed: FailedTry | None = None


class PartTransfer:
    """Lands the parts of one pull: its URLs, its retry policy, the store's gate and the throttle note."""

    def __init__(
        self, job: PullJob, backends: Backends, staging: Staging, events: PullEvents, threads: TransferThreads
    ) -> None:
        self._bucket = job.source.bucket
        self._policy = RetryPolicy.of(job.settings)
        self._fetcher = backends.fetcher
        #: paces requests when the store throttles; shared by every pull of this process to that store
        self._gate = backends.gate
        self._staging = staging
        self._events = events
        self._threads = threads
        self._urls = PresignedUrls(backends.store, job.source.bucket, job.settings.presign_expiry_s)
        #: whether the user was told that the store throttles (once per pull)
        self._throttle_noted = False

    async def land(
        self,
        f: RemoteFile,
        part: Part,
        transfer: Callable[[RangeRequest, int], int],
        failed: FailedTry | None = None,
    ) -> None:
        """One ranged GET, retried from the last byte written until it lands or the policy gives up.

        `transfer(request, start)` runs each attempt in a transfer thread.
        `failed`: the first attempt was made already (`land_once_each`), and failed so.

        A throttled answer slows the gate for every transfer and waits whole
        seconds (or the store's Retry-After); other transient failures wait
        briefly. The part gives up after `policy.attempts` consecutive
        non-throttle failures, or after `policy.budget_s` without progress,
        whichever comes first; a byte of progress resets both. An expired URL or
        token is presigned again (from freshly resolved credentials for a token)
        and does not count.
        """
        start = part.start
        retries = PartRetries(self._policy)
        expired = 0
        while True:
            if failed is None:
                failed = await self._try(f, part, start, transfer)
                if failed is None:
                    break
            exc, url, generation = failed
            failed = None
            if isinstance(exc, SizeMismatchError):
                raise misstated_size(f"s3://{self._bucket}/{f.key}", f, exc.store_bytes) from None
            if isinstance(exc, PresignedUrlExpiredError):
                expired += 1
                if expired >= MAX_EXPIRED_IN_A_ROW:
                    raise AccessDeniedError(
                        f"{exc}; {expired} fresh signatures in a row were refused as expired: the "
                        "credential chain hands out expired credentials, or this clock is far off"
                    ) from None
                await self._urls.renew(f, url, generation, token_expired=exc.token_expired)
            elif isinstance(exc, TransientFetchError):
                start += exc.bytes_written
                await self._wait_to_retry(f, start, part, retries, exc)
            else:
                raise exc
        self._gate.succeeded()
        self._staging.journal.part_written(f.path, part.index, part.size_bytes)

    async def _try(
        self, f: RemoteFile, part: Part, start: int, transfer: Callable[[RangeRequest, int], int]
    ) -> FailedTry | None:
        """One attempt from `start`, through the gate: None when it landed, else how it failed."""
        await self._gate.admit()  # first: a long wait here must not age the URL
        url = await self._urls.get(f)
        generation = self._urls.generation
        req = RangeRequest(url=url, start=start, end=part.end, etag=f.etag, size_bytes=f.size_bytes)
        try:
            await in_thread(self._threads.submit(transfer, req, start))
        except (SizeMismatchError, PresignedUrlExpiredError, TransientFetchError) as exc:
            return FailedTry(exc, url, generation)
        return None

    async def land_once_each(self, parts: Sequence[OneTry]) -> Tried:
        """A first attempt at each part, in order, all in one trip to a transfer thread.

        For a model of many small files: one hand-off each way for a batch instead of one
        per file. It stops before a part the gate would make wait, at the first failure,
        and at cancellation; the caller lands the others with `land`, the failed one
        with its `FailedTry`, so that it counts as the first of `land`'s attempts and
        the next one resumes from its last byte. The parts that landed are journaled.
        """
        urls = [await self._urls.get(p.file) for p in parts]
        generation = self._urls.generation
        stop = threading.Event()
        attempt = functools.partial(self._attempt_each, parts, urls, generation, stop)
        tried = await in_thread(self._threads.submit(attempt), stop.set)
        for p in parts[: tried.landed]:
            self._staging.journal.part_written(p.file.path, p.part.index, p.part.size_bytes)
        return tried

    def _attempt_each(
        self, parts: Sequence[OneTry], urls: Sequence[str], generation: int, stop: threading.Event
    ) -> Tried:
        """In a transfer thread: `land_once_each`'s attempts, through the gate without waiting."""
        for landed, (p, url) in enumerate(zip(parts, urls, strict=True)):
            if stop.is_set() or not self._gate.try_admit():
                return Tried(landed)
            f, part = p.file, p.part
            req = RangeRequest(url=url, start=part.start, end=part.end, etag=f.etag, size_bytes=f.size_bytes)
            try:
                p.transfer(req, part.start)
            except Exception as exc:  # `land` takes it up as its first attempt's failure
                return Tried(landed, FailedTry(exc, url, generation))
            self._gate.succeeded()
        return Tried(len(parts))

    async def _wait_to_retry(
        self, f: RemoteFile, start: int, part: Part, retries: PartRetries, exc: TransientFetchError
    ) -> None:
        """Count a failed attempt and wait before the next one; give up when the policy says so."""
        now = time.monotonic()
        retries.failed(now, progressed=exc.bytes_written > 0, throttled=exc.throttled)
        if exc.throttled:
            self._gate.throttled(exc.retry_after_s)
            self._note_throttling(exc)
        if retries.exhausted(now):
            raise RemoteUnavailableError(
                f"giving up on {f.key} bytes {start}-{part.end} after "
                f"{retries.failures + retries.throttles} failed attempts in "
                f"{retries.stuck_s(now):.0f} s without progress ({exc}); retry the pull later, "
                "it resumes where it stopped"
            ) from None
        import random  # here: only a retry needs jitter, and a cold pull need not import it

        await asyncio.sleep(
            retries.wait_s(
                now, throttled=exc.throttled, retry_after_s=exc.retry_after_s, jitter=random.random()
            )
        )

    def forget_url(self, f: RemoteFile) -> None:
        """The object changed: its next part is signed afresh."""
        self._urls.forget(f)

    def into_file(
        self,
        fd: int,
        req: RangeRequest,
        start: int,
        on_written: OnWritten | None = None,
    ) -> int:
        """One ranged GET into the file (in a transfer thread); on disk, each stretch starts on its
        way to the disk as it is written, before the hasher sees it, so the write-behind that
        follows the hasher finds it under way. `on_written`: the file's hasher, offered each
        stretch as it is written."""
        if self._staging.on_disk:
            on_written = functools.partial(_start_writeback, fd, on_written)
        return self._fetcher.fetch_into(req, fd, start, self._events.fetched, on_written)

    def _note_throttling(self, exc: TransientFetchError) -> None:
        """Say once why the pull slows down: a long quiet wait would look like a hang."""
        if not self._throttle_noted:
            self._throttle_noted = True
            self._events.note(
                f"the store asks for less load ({exc.status} {exc.reason}); every transfer slows down "
                f"and keeps retrying, for up to {format_duration(self._policy.budget_s)} without progress"
            )


def _start_writeback(fd: int, then: OnWritten | None, offset: int, data: memoryview) -> None:
    """Start writing a stretch just written to the disk, then offer it to `then` (the hasher)."""
    writeback.start_writeback(fd, offset, len(data))
    if then is not None:
        then(offset, data)
