"""Pull one model revision into the cache: plan, fetch through one window, verify, publish.

Shape of a pull:
1. Take the model's lock (single-flight between processes); re-check readiness.
2. Learn the files: the manifest when there is one, else a listing.
3. Plan the parts still missing, given the journal of an interrupted pull.
4. Fetch parts through one sliding window of `concurrency` ranged GETs; each
   body is written at its offset in a staging file by a worker thread.
5. When a file's last part lands, hash it (from the page cache) and check it
   against the manifest digest or the ETag; a mismatch refetches the file once.
6. Publish: record first, then one rename of the staging directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import AsyncIterator, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_random_exponential,
)

from modelsync.adapters import fs
from modelsync.adapters.cache import Cache, JournalState, Staging
from modelsync.adapters.digest import FileDigest, hash_fd
from modelsync.adapters.ranged_http import (
    PresignedUrlExpiredError,
    RangeClient,
    RangeRequest,
    TransientFetchError,
    make_ssl_context,
)
from modelsync.adapters.s3 import S3, ObjectInfo, open_s3
from modelsync.config import Settings
from modelsync.core.etag import EtagKind, etag_kind, multipart_count, multipart_etag, part_size_fits
from modelsync.core.keys import safe_relative_path
from modelsync.core.manifest import MANIFEST_NAME, FileEntry, parse_manifest
from modelsync.core.parts import FileWork, Part, PullPlan, RemoteFile, plan_parts, plan_pull
from modelsync.core.record import CompletionRecord, weakest
from modelsync.core.refs import ModelRef
from modelsync.engine.events import PullEvents
from modelsync.engine.ready import quick_check
from modelsync.engine.tasks import first_error
from modelsync.engine.throttle import TokenBucket
from modelsync.errors import (
    ChecksumMismatchError,
    DiskFullError,
    NotFoundError,
    ObjectChangedError,
    RemoteUnavailableError,
)

#: files in progress at once; bounds open descriptors and per-file state
MAX_OPEN_FILES = 64
#: files hashed at once; each holds one hash buffer
HASH_SLOTS = 2
#: a retry of a part waits at most this long
MAX_BACKOFF_S = 5.0
_EMPTY_MD5 = "d41d8cd98f00b204e9800998ecf8427e"
#: how often a pull with a cancel event checks it; bounds how long a cancelled pull runs on
CANCEL_POLL_S = 0.1

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class PullResult:
    path: Path
    total_bytes: int
    fetched_bytes: int
    seconds: float
    files: int


class PullCancelledError(Exception):
    """The caller set the pull's cancel event; the journal keeps what was written, so a later pull resumes."""


def pull(
    settings: Settings, ref: ModelRef, events: PullEvents, cancel: threading.Event | None = None
) -> PullResult:
    """Make `ref` ready in the cache and return where; waits for another puller of it.

    `cancel` lets a caller that runs the pull in a worker thread (the daemon)
    stop it: the transfer is cancelled like a Ctrl-C, its sockets closed and
    its threads joined, and `PullCancelledError` is raised. Waiting for another
    puller's lock is not interrupted.
    """
    started = time.monotonic()
    cache = Cache(settings.cache_dir)
    cache.ensure()
    with cache.locked(ref, on_wait=events.waiting):
        record = cache.ready_record(ref)
        if record is not None:
            if not quick_check(cache, ref, record):
                return PullResult(cache.ready_path(ref), record.total_bytes, 0, 0.0, len(record.files))
            cache.unpublish(ref)  # damaged: never serve it while it is pulled again
        path, plan = asyncio.run(_cancellable(_Puller(settings, cache, ref, events).run(), cancel))
    return PullResult(
        path=path,
        total_bytes=plan.total_bytes,
        fetched_bytes=plan.missing_bytes,
        seconds=time.monotonic() - started,
        files=len(plan.files),
    )


async def _cancellable(work: Coroutine[Any, Any, _T], cancel: threading.Event | None) -> _T:
    """Await `work`, cancelling it once `cancel` is set; its cleanup closes sockets and joins threads."""
    task = asyncio.ensure_future(work)
    while cancel is not None and not task.done():
        await asyncio.wait({task}, timeout=CANCEL_POLL_S)
        if cancel.is_set() and task.cancel():
            with contextlib.suppress(asyncio.CancelledError):
                await task
            raise PullCancelledError("the pull was cancelled; it resumes from its journal")
    return await task


class _Puller:
    def __init__(self, settings: Settings, cache: Cache, ref: ModelRef, events: PullEvents) -> None:
        self.settings = settings
        self.cache = cache
        self.ref = ref
        self.events = events
        self.staging: Staging = cache.staging(ref)
        self.window = asyncio.Semaphore(settings.concurrency)
        self.hash_slots = asyncio.Semaphore(HASH_SLOTS)
        self.verified: dict[str, tuple[str, str]] = {}
        #: the version of each file that was fetched and verified (a restart may change it)
        self.fetched: dict[str, RemoteFile] = {}
        self.urls: dict[str, str] = {}
        self.s3: S3
        self.client: RangeClient
        self.executor: ThreadPoolExecutor

    async def run(self) -> tuple[Path, PullPlan]:
        async with open_s3(self.settings) as s3, self._data_plane():
            self.s3 = s3
            files = await self._files()
            state = self.staging.journal.load()
            plan = plan_pull(files, self.settings.part_size_bytes, state.done_parts(), state.part_sizes())
            # A journal naming a file the model no longer has would publish a stray file: start over.
            resume = bool(state.files) and set(state.files) <= {f.path for f in files}
            self.staging.prepare(resume=resume)
            self.verified = {
                path: v for path, v in state.verified.items() if self._journal_matches(state, path, files)
            }
            self._check_space(plan, state)
            self.events.planned(len(plan.files), plan.total_bytes, plan.missing_bytes)
            file_slots = asyncio.Semaphore(MAX_OPEN_FILES)
            with first_error():
                async with asyncio.TaskGroup() as tg:
                    for work in plan.files:
                        await file_slots.acquire()
                        known = state.files.get(work.file.path) == (
                            work.file.etag,
                            work.file.size_bytes,
                            _part_size(work),
                        )
                        task = tg.create_task(self._file(work, known=resume and known))
                        task.add_done_callback(lambda _t: file_slots.release())
            record = CompletionRecord(
                source=self.ref.uri,
                completed_at=time.time(),
                verified_by=weakest([by for _digest, by in self.verified.values()]),
                files=tuple(
                    FileEntry(f.path, f.size_bytes, self.verified[f.path][0], f.etag)
                    for f in (self.fetched.get(w.file.path, w.file) for w in plan.files)
                ),
            )
            path = await asyncio.to_thread(self.cache.publish, self.ref, self.staging, record)
            return path, plan

    @contextlib.asynccontextmanager
    async def _data_plane(self) -> AsyncIterator[None]:
        s = self.settings
        https = (s.endpoint_url or "https://").startswith("https")
        self.client = RangeClient(
            ssl_context=make_ssl_context(ca_bundle=s.ca_bundle, insecure=s.insecure) if https else None,
            connect_timeout_s=s.connect_timeout_s,
            read_timeout_s=s.read_timeout_s,
            buffer_bytes=s.read_chunk_bytes,
            rate_limiter=TokenBucket(s.max_bandwidth_bytes_per_s) if s.max_bandwidth_bytes_per_s else None,
        )
        self.executor = ThreadPoolExecutor(s.concurrency, thread_name_prefix="modelsync-get")
        try:
            yield
        finally:
            self.client.close()  # wakes threads blocked on a socket
            self.executor.shutdown(wait=True, cancel_futures=True)
            self.staging.journal.close()

    # -- what to fetch ---------------------------------------------------------

    async def _files(self) -> list[RemoteFile]:
        """The model's files: from its manifest (with digests) or from a listing."""
        data = await self.s3.get_manifest(self.ref, MANIFEST_NAME)
        if data is not None:
            manifest = parse_manifest(data, f"{self.ref.uri}{MANIFEST_NAME}")
            etags = {}
            if any(f.etag is None for f in manifest.files):
                etags = {o.key: o.etag for o in await self.s3.list_model(self.ref)}
            files = []
            for f in manifest.files:
                key = self.ref.prefix + f.path
                etag = f.etag or etags.get(key)
                if etag is None:
                    raise NotFoundError(
                        f"not found: s3://{self.ref.bucket}/{key} is in the manifest but not in "
                        "the bucket; republish the model"
                    )
                files.append(RemoteFile(key, f.path, f.size, etag, f.xxh3_128))
            return files
        listing = await self.s3.list_model(self.ref)
        return [self._remote(o) for o in listing if not o.key.endswith("/")]

    def _remote(self, obj: ObjectInfo) -> RemoteFile:
        path = self.ref.relative_key(obj.key)
        safe_relative_path(path)
        return RemoteFile(obj.key, path, obj.size_bytes, obj.etag)

    def _journal_matches(self, state: JournalState, path: str, files: list[RemoteFile]) -> bool:
        by_path = {f.path: f for f in files}
        return path in by_path and state.files.get(path, ("",))[0] == by_path[path].etag

    def _check_space(self, plan: PullPlan, state: JournalState) -> None:
        needed = sum(w.file.size_bytes for w in plan.files if w.file.path not in state.files)
        free = fs.free_bytes(self.staging.dir)
        if needed > free:
            raise DiskFullError(
                f"not enough space in {self.cache.root} for {self.ref.uri}: needs {needed} bytes, "
                f"{free} bytes free; evict models (modelsync evict) or enlarge the cache"
            )

    # -- one file ----------------------------------------------------------------

    async def _file(self, work: FileWork, known: bool) -> None:
        """Fetch and verify one file; a changed object or a bad checksum gets one fresh try."""
        f = work.file
        if f.path in self.verified and not work.missing:
            return
        for attempt in (1, 2):
            if attempt == 2 or not known:
                self.staging.journal.begin_file(f.path, f.etag, f.size_bytes, _part_size(work))
            try:
                await self._fetch_parts(work)
                await self._verify(work)
                return
            except ObjectChangedError:
                if attempt == 2:
                    raise
                fresh = await self.s3.head(self.ref.bucket, f.key)
                work = _restart(work, replace(f, size_bytes=fresh.size_bytes, etag=fresh.etag))
                self.urls.pop(f.key, None)
            except ChecksumMismatchError:
                if attempt == 2:
                    raise
                work = _restart(work, f)

    async def _fetch_parts(self, work: FileWork) -> None:
        with fs.storage_errors(self.staging.dir / work.file.path, work.file.size_bytes):
            fd = self.staging.open_file(work.file.path, work.file.size_bytes)
        try:
            with first_error():
                await self._fetch_missing(work, fd)
        except DiskFullError as exc:
            raise DiskFullError(
                f"disk full writing {self.staging.dir / work.file.path}: needs {work.missing_bytes} "
                f"bytes for this file, {fs.free_bytes(self.staging.dir)} bytes free ({exc}); "
                "free space (modelsync evict) or raise the volume's size"
            ) from None
        finally:
            os.close(fd)

    async def _fetch_missing(self, work: FileWork, fd: int) -> None:
        async with asyncio.TaskGroup() as tg:
            for part in work.missing:
                await self.window.acquire()
                task = tg.create_task(self._part(work.file, part, fd))
                task.add_done_callback(lambda _t: self.window.release())

    async def _part(self, f: RemoteFile, part: Part, fd: int) -> None:
        """One ranged GET, retried from the last byte written when the transfer breaks."""
        start = part.start
        loop = asyncio.get_running_loop()
        retrying = AsyncRetrying(
            retry=retry_if_exception_type((TransientFetchError, PresignedUrlExpiredError)),
            stop=stop_after_attempt(self.settings.part_attempts),
            wait=wait_random_exponential(multiplier=0.1, max=MAX_BACKOFF_S),
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    url = await self._url(f, fresh=attempt.retry_state.attempt_number > 1)
                    req = RangeRequest(url=url, start=start, end=part.end, etag=f.etag)
                    try:
                        await _in_thread(
                            loop.run_in_executor(
                                self.executor,
                                self.client.fetch_into,
                                req,
                                fd,
                                start,
                                self.events.fetched,
                            )
                        )
                    except TransientFetchError as exc:
                        start += exc.bytes_written
                        raise
        except TransientFetchError as exc:
            raise RemoteUnavailableError(
                f"giving up on {f.key} bytes {start}-{part.end} after "
                f"{self.settings.part_attempts} attempts ({exc}); retry the pull later, "
                "it resumes where it stopped"
            ) from None
        self.staging.journal.part_written(f.path, part.index)

    async def _url(self, f: RemoteFile, fresh: bool) -> str:
        if fresh or f.key not in self.urls:
            self.urls[f.key] = await self.s3.presign_get(self.ref.bucket, f.key)
        return self.urls[f.key]

    # -- verification ------------------------------------------------------------

    async def _verify(self, work: FileWork) -> None:
        f = work.file
        self.events.verifying(f.path)
        md5_part = await self._md5_part_bytes(f)
        async with self.hash_slots:
            digest = await asyncio.to_thread(self._hash, f, md5_part)
        verified_by = _check(f, digest, md5_part)
        self.verified[f.path] = (digest.xxh3_128, verified_by)
        self.fetched[f.path] = f
        self.staging.journal.file_verified(f.path, digest.xxh3_128, verified_by)

    async def _md5_part_bytes(self, f: RemoteFile) -> int | None:
        """How to slice the file for an ETag check, or None when the ETag proves nothing."""
        if f.xxh3_128 is not None or f.size_bytes == 0:
            return None
        kind = etag_kind(f.etag)
        if kind is EtagKind.MD5:
            return f.size_bytes
        if kind is EtagKind.MULTIPART:
            part_bytes = await self.s3.first_part_bytes(self.ref.bucket, f.key)
            if part_bytes and part_size_fits(f.size_bytes, part_bytes, multipart_count(f.etag)):
                return part_bytes
        return None

    def _hash(self, f: RemoteFile, md5_part_bytes: int | None) -> FileDigest:
        fd = os.open(self.staging.dir / f.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            return hash_fd(fd, f.size_bytes, md5_part_bytes)
        finally:
            os.close(fd)


async def _in_thread(future: asyncio.Future[int]) -> int:
    """Await a transfer thread; when cancelled, first wait until the thread has stopped.

    A cancelled task cannot stop a thread blocked on its socket: it keeps writing at
    its offsets until the body ends or `read_timeout_s` passes. The descriptor it
    writes to must stay open until then, or its late writes land on a closed
    descriptor, or on whatever file reuses that number (the restarted file, another
    file of the model, the journal). So cancellation waits, bounded by the timeout.
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


def _check(f: RemoteFile, digest: FileDigest, md5_part_bytes: int | None) -> str:
    """Compare a file's digest with what the source vouches for; returns how it was verified."""
    if f.xxh3_128 is not None:
        if digest.xxh3_128 != f.xxh3_128:
            raise _mismatch(f, f"xxh3-128 {digest.xxh3_128}, manifest says {f.xxh3_128}")
        return "manifest"
    kind = etag_kind(f.etag)
    if f.size_bytes == 0 and kind is EtagKind.MD5:
        if f.etag != _EMPTY_MD5:
            raise _mismatch(f, f"empty file, ETag {f.etag}")
        return str(kind.value)
    if md5_part_bytes is None:
        return "size"
    got = digest.part_md5s[0].hex() if kind is EtagKind.MD5 else multipart_etag(digest.part_md5s)
    if got != f.etag:
        raise _mismatch(f, f"computed ETag {got}, server says {f.etag}")
    return str(kind.value)


def _mismatch(f: RemoteFile, detail: str) -> ChecksumMismatchError:
    return ChecksumMismatchError(
        f"checksum mismatch for {f.key} ({detail}) after a re-fetch; the stored object or "
        "its manifest is corrupt, republish it"
    )


def _part_size(work: FileWork) -> int:
    return work.parts[0].size_bytes if work.parts else 1


def _restart(work: FileWork, f: RemoteFile) -> FileWork:
    """The same file, all parts missing again, for its one fresh try."""
    return FileWork(file=f, parts=plan_parts(f.size_bytes, _part_size(work)), done=frozenset())
