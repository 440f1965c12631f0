"""Pull one model revision into the cache: plan, fetch through one window, verify, make ready.

Shape of a pull:
1. Take the model's lock (single-flight between processes); re-check readiness.
2. Learn the files: the manifest when there is one, else a listing.
3. Plan the parts still missing, given the journal of an interrupted pull.
4. Fetch parts through one sliding window of `concurrency` ranged GETs; each
   body is written at its offset in a staging file by a worker thread.
5. When a file's last part lands, hash it (from the page cache) and check it
   against the manifest digest or the ETag; a mismatch refetches the file once.
   When the model's signature is in play, SHA-256 is computed in the same pass.
6. Final check (engine/trust.py): the signature lists exactly these files and
   digests, and the safetensors headers add up; else nothing is made ready.
7. Make ready: record first, then one rename of the staging directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import random
import signal
import threading
import time
from collections.abc import AsyncIterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import TypeVar

from modelsync.adapters import fs
from modelsync.adapters.cache import Cache, JournalState, ModelLock, Staging
from modelsync.adapters.digest import FileDigest, PrefixHasher, sha256_slots
from modelsync.adapters.ranged_http import RangeClient, RangeRequest, make_ssl_context
from modelsync.adapters.s3 import S3, ObjectInfo, open_s3, retry_policy
from modelsync.config import Settings, check_ca_bundle
from modelsync.core.etag import EtagKind, etag_kind, multipart_count, multipart_etag, part_size_fits
from modelsync.core.keys import safe_relative_path
from modelsync.core.manifest import MANIFEST_NAME, FileEntry, parse_manifest
from modelsync.core.parts import FileWork, Part, PullPlan, RemoteFile, layout_bytes, plan_parts, plan_pull
from modelsync.core.record import CompletionRecord, weakest
from modelsync.core.refs import ModelRef, parse_model_name
from modelsync.core.retry import PartRetries, presigned_expiry
from modelsync.core.units import format_bytes, format_duration
from modelsync.engine.catalog import Catalog, open_catalog
from modelsync.engine.events import ByteCounter, PullEvents
from modelsync.engine.evict import make_room
from modelsync.engine.maintain import repair_ready
from modelsync.engine.ready import quick_check
from modelsync.engine.tasks import first_error
from modelsync.engine.throttle import StoreGate, TokenBucket, store_gate
from modelsync.engine.trust import SignatureCheck, final_check
from modelsync.errors import (
    AccessDeniedError,
    ChecksumMismatchError,
    DiskFullError,
    NotFoundError,
    ObjectChangedError,
    PresignedUrlExpiredError,
    PullCancelledError,
    RemoteUnavailableError,
    TransientFetchError,
)

#: files in progress at once; bounds open descriptors and per-file state
MAX_OPEN_FILES = 64
#: files hashed at once; each holds one hash buffer
HASH_SLOTS = 2
#: a presigned URL is signed again once less than this share of its lifetime is left. With
#: the default 15 min lifetime a URL is used for at most 7.5 min after signing, less than the
#: 10 min of validity botocore guarantees temporary credentials when it signs (it refreshes
#: them inside that window), so no URL outlives the credentials it carries.
PRESIGN_RENEW_SHARE = 0.5
#: a part answered "expired" this many times in a row, each time with a fresh URL, gives up
MAX_EXPIRED_IN_A_ROW = 3
_EMPTY_MD5 = "d41d8cd98f00b204e9800998ecf8427e"
#: how often a pull with a cancel event checks it; bounds how long a cancelled pull runs on
CANCEL_POLL_S = 0.1
#: how often the lock holder's progress note is rewritten for waiting pullers
HOLDER_NOTE_S = 2.0

_NOTHING: Mapping[str, str] = MappingProxyType({})
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class PullResult:
    path: Path
    total_bytes: int
    fetched_bytes: int
    elapsed_s: float
    files: int
    #: models the pull's space reservation evicted to make room, so callers can count them exactly
    evicted: tuple[str, ...] = ()


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


def pull(
    settings: Settings,
    ref: ModelRef,
    events: PullEvents,
    cancel: threading.Event | None = None,
    protected: Mapping[str, str] = _NOTHING,
    refresh: bool = False,
) -> PullResult:
    """Make `ref` ready in the cache and return where; waits for another puller of it.

    `cancel` lets a caller that runs the pull in a worker thread (the daemon)
    stop it: the transfer is cancelled like a Ctrl-C, its sockets closed and
    its threads joined, and `PullCancelledError` is raised. Waiting for another
    puller's lock is not interrupted.

    `protected` (model id -> reason) are models that making room must not evict.
    `refresh` checks a ready model against the source and, when its objects
    changed, pulls the new revision (reusing unchanged files) and swaps it in.
    A ready model without a verified signature, under a policy that now requires
    one, is checked again the same way: its files are reused (hard links), hashed,
    and compared with the signature before it is swapped in.
    """
    started = time.monotonic()
    cache = Cache(settings.cache_dir)
    cache.ensure()
    lock = cache.lock(ref)
    lock.acquire(on_wait=events.waiting)
    try:
        current = cache.ready_record(ref)
        damaged = quick_check(cache.ready_path(ref), current) if current is not None else []
        if current is not None and damaged:
            # never serve it while it is repaired; the intact files stay, only the bad ones are fetched
            repair_ready(cache, ref, current, {p.path for p in damaged}, settings.part_size_bytes)
            current = None
        unsigned = current is not None and current.signer is None and settings.requires_signature(ref)
        if current is not None and not refresh and not unsigned:
            cache.touch(ref)
            return PullResult(cache.ready_path(ref), current.total_bytes, 0, 0.0, len(current.files))
        with open_catalog(cache) as catalog:
            note = ProgressNote(events, lock)
            puller = _Puller(settings, cache, catalog, ref, note, protected, current, recheck=unsigned)
            try:
                path, plan = asyncio.run(_supervise(puller, cancel))
            finally:
                cache.release_reservation(ref)
        if current is None:
            # A new copy is a use; a refresh check of a ready model is not, or every
            # check would move it to the back of the eviction order.
            cache.touch(ref)
    finally:
        lock.release()
    return PullResult(
        path=path,
        total_bytes=plan.total_bytes,
        fetched_bytes=note.counter.fetched_bytes,
        elapsed_s=time.monotonic() - started,
        files=len(plan.files),
        evicted=puller.evicted,
    )


async def _supervise(puller: _Puller, cancel: threading.Event | None) -> tuple[Path, PullPlan]:
    """Run the pull; when it is cancelled (Ctrl-C, SIGTERM, or `cancel` set) abort the transfers first.

    The range client shuts its sockets down before closing them, which wakes every
    transfer thread blocked in `recv` at once (closing alone would leave each one
    waiting out its read timeout), and backoff and gate waits run on the event loop,
    where cancellation ends them. So a cancelled pull stops in well under a second
    even when every transfer is stalled; the journal keeps what was written for the
    next pull to resume.

    The pull's worker threads block SIGINT and SIGTERM, so the kernel hands those to
    the main thread: delivered to a worker, a signal would wait until the event loop
    woke for some other reason, a 30 s read timeout when every transfer is stalled.
    """
    asyncio.get_running_loop().set_default_executor(
        ThreadPoolExecutor(thread_name_prefix="modelsync-io", initializer=_leave_signals_to_the_main_thread)
    )
    task = asyncio.ensure_future(puller.run())
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=CANCEL_POLL_S if cancel is not None else None)
            if cancel is not None and cancel.is_set() and not task.done():
                raise PullCancelledError("the pull was cancelled; it resumes from its journal")
        return task.result()
    except (asyncio.CancelledError, PullCancelledError):
        puller.abort()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        raise


def _leave_signals_to_the_main_thread() -> None:
    """Block Ctrl-C and SIGTERM in the calling (worker) thread; see `_supervise`."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})


class _Puller:
    def __init__(
        self,
        settings: Settings,
        cache: Cache,
        catalog: Catalog,
        ref: ModelRef,
        events: PullEvents,
        protected: Mapping[str, str],
        current: CompletionRecord | None,
        recheck: bool = False,
    ) -> None:
        self.settings = settings
        self.cache = cache
        self.catalog = catalog
        self.ref = ref
        self.events = events
        self.protected = protected
        self.current = current
        #: the ready revision must be checked again even when the source did not change
        self.recheck = recheck
        self.aborted = False
        self.evicted: tuple[str, ...] = ()
        self.staging: Staging = cache.staging(ref)
        self.window = asyncio.Semaphore(settings.concurrency)
        self.hash_slots = asyncio.Semaphore(HASH_SLOTS)
        self.verified: dict[str, tuple[str, str]] = {}
        #: the version of each file that was fetched and verified (a restart may change it)
        self.fetched: dict[str, RemoteFile] = {}
        self.urls: dict[str, str] = {}
        self.signature = SignatureCheck(ref, settings.signature_rule(ref), settings.signature_name)
        #: SHA-256 of each file hashed while it downloaded (only when a signature is checked)
        self.sha256s: dict[str, str] = {}
        self.policy = retry_policy(settings)
        #: paces requests when the store throttles; shared by every pull of this process to that store
        self.gate: StoreGate = store_gate(
            settings.endpoint_url or f"aws:{settings.region}", self.policy.time_scale
        )
        #: whether the user was told that the store throttles (once per pull)
        self.throttle_noted = False
        #: bumped each time the credentials are resolved afresh, so a burst of ExpiredToken renews once
        self.credentials_generation = 0
        self.credentials_lock = asyncio.Lock()
        self.s3: S3
        self.client: RangeClient
        self.executor: ThreadPoolExecutor

    async def run(self) -> tuple[Path, PullPlan]:
        async with open_s3(self.settings) as s3, self._data_plane():
            self.s3 = s3
            files = self.signature.select(await self._files())
            if self.signature.active:  # SHA-256 is ~6x slower than xxh3: a hasher per core
                self.hash_slots = asyncio.Semaphore(sha256_slots())
            if self.current is not None and not self.recheck and _unchanged(self.current, files):
                self.events.planned(len(files), self.current.total_bytes, 0)
                return self.cache.ready_path(self.ref), plan_pull(files, self.settings.part_size_bytes, {})
            state = self.staging.journal.load()
            if not set(state.files) <= {f.path for f in files}:
                # A journal naming a file the model no longer has would make a stray file ready: start over.
                state = JournalState()
            resume = bool(state.files)
            plan = plan_pull(files, self.settings.part_size_bytes, state.done_parts(), state.part_sizes())
            self._note_kept_part_size(plan, state)
            self.staging.prepare(resume=resume)
            etags = {f.path: f.etag for f in files}
            self.verified = {
                path: v for path, v in state.verified.items() if state.files[path][0] == etags[path]
            }
            self.sha256s = {path: h for path, h in state.sha256s.items() if path in self.verified}
            linked = self._link_copies(plan, state)
            needed = sum(
                w.file.size_bytes
                for w in plan.files
                if w.file.path not in state.files and w.file.path not in linked
            )
            try:
                room = await asyncio.to_thread(
                    make_room, self.settings, self.cache, self.catalog, self.ref, needed, self.protected
                )
            except DiskFullError:
                if not resume:
                    self.staging.discard()  # refused before a byte was fetched: leave nothing behind
                raise
            self.evicted = room.evicted
            to_fetch = sum(w.missing_bytes for w in plan.files if w.file.path not in self.verified)
            self.events.planned(len(plan.files), plan.total_bytes, to_fetch)
            file_slots = asyncio.Semaphore(MAX_OPEN_FILES)
            with first_error():
                async with asyncio.TaskGroup() as tg:
                    for work in self.signature.ordered(plan.files):
                        await file_slots.acquire()
                        known = state.files.get(work.file.path) == (
                            work.file.etag,
                            work.file.size_bytes,
                            layout_bytes(work.parts),
                        )
                        task = tg.create_task(self._file(work, known=resume and known))
                        task.add_done_callback(lambda _t: file_slots.release())
            fetched = [self.fetched.get(w.file.path, w.file) for w in plan.files]
            signer = await asyncio.to_thread(
                final_check, self.staging.dir, fetched, self.signature, self.sha256s
            )
            record = CompletionRecord(
                source=self.ref.uri,
                completed_at=time.time(),
                verified_by=weakest([by for _digest, by in self.verified.values()]),
                files=tuple(
                    FileEntry(f.path, f.size_bytes, self.verified[f.path][0], f.etag) for f in fetched
                ),
                signer=signer,
            )
            path = await asyncio.to_thread(self.cache.make_ready, self.ref, self.staging, record)
            self.catalog.register(self.ref, record)
            return path, plan

    def _note_kept_part_size(self, plan: PullPlan, state: JournalState) -> None:
        """Say so when a resume keeps the journal's part size for files it had started.

        Their written parts are laid out in that size, so they keep it rather than
        fetch again what is on disk; files not started yet use the size asked for.
        """
        wanted = self.settings.part_size_bytes
        kept = {
            layout_bytes(w.parts)
            for w in plan.files
            if w.file.path in state.files
            and w.file.path not in state.verified
            and w.missing
            and layout_bytes(w.parts) != layout_bytes(plan_parts(w.file.size_bytes, wanted))
        }
        if kept:
            sizes = " and ".join(format_bytes(size) for size in sorted(kept))
            self.events.note(
                f"resuming with the part size of the interrupted pull ({sizes}) for the files it had "
                f"started, to keep their written parts; {format_bytes(wanted)} applies to the others"
            )

    def abort(self) -> None:
        """Stop every transfer now (their sockets close); the caller then cancels the tasks."""
        self.aborted = True
        if hasattr(self, "client"):
            self.client.close()

    @contextlib.asynccontextmanager
    async def _data_plane(self) -> AsyncIterator[None]:
        s = self.settings
        https = (s.endpoint_url or "https://").startswith("https")
        if https and s.ca_bundle and not s.insecure:
            check_ca_bundle(s.ca_bundle)  # the file may have changed since the settings were read
        self.client = RangeClient(
            ssl_context=make_ssl_context(ca_bundle=s.ca_bundle, insecure=s.insecure) if https else None,
            connect_timeout_s=s.connect_timeout_s,
            read_timeout_s=s.read_timeout_s,
            buffer_bytes=s.read_chunk_bytes,
            rate_limiter=TokenBucket(s.max_bandwidth_bytes_per_s) if s.max_bandwidth_bytes_per_s else None,
        )
        self.executor = ThreadPoolExecutor(
            s.concurrency, thread_name_prefix="modelsync-get", initializer=_leave_signals_to_the_main_thread
        )
        if self.aborted:
            self.client.close()
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
                files.append(RemoteFile(key, f.path, f.size_bytes, etag, f.xxh3_128))
            return files
        listing = await self.s3.list_model(self.ref)
        return [self._remote(o) for o in listing if not o.key.endswith("/")]

    def _remote(self, obj: ObjectInfo) -> RemoteFile:
        path = self.ref.relative_key(obj.key)
        safe_relative_path(path)
        return RemoteFile(obj.key, path, obj.size_bytes, obj.etag)

    def _link_copies(self, plan: PullPlan, state: JournalState) -> dict[str, int]:
        """Hard-link files the cache already holds with the same content, instead of fetching them.

        Same content means same size and xxh3-128 (manifest), or same size and an
        ETag that is an MD5 of the bytes; an opaque ETag proves nothing across keys.
        Returns the bytes linked per path.
        """
        linked: dict[str, int] = {}
        for work in plan.files:
            f = work.file
            if f.path in state.files or f.size_bytes == 0:
                continue
            proving_etag = None if etag_kind(f.etag) is EtagKind.OPAQUE else f.etag
            for copy in self.catalog.index.find_copy(f.size_bytes, f.xxh3_128, proving_etag):
                source = parse_model_name(copy.model).cache_path / copy.path
                if not self.staging.link_from(self.cache.root, source, (copy.dev, copy.ino), f.path):
                    continue
                by = "manifest" if f.xxh3_128 is not None else etag_kind(f.etag).value
                self.staging.journal.begin_file(f.path, f.etag, f.size_bytes, layout_bytes(work.parts))
                self.staging.journal.file_verified(f.path, copy.xxh3_128, by)
                self.verified[f.path] = (copy.xxh3_128, by)
                linked[f.path] = f.size_bytes
                break
        return linked

    # -- one file ----------------------------------------------------------------

    async def _file(self, work: FileWork, known: bool) -> None:
        """Fetch and verify one file; a changed object or a bad checksum gets one fresh try."""
        f = work.file
        if f.path in self.verified:  # linked from a cached copy, or verified before a restart
            return
        for attempt in (1, 2):
            f = work.file
            if attempt == 2 or not known:
                self.staging.journal.begin_file(f.path, f.etag, f.size_bytes, layout_bytes(work.parts))
            try:
                md5_part = await self._md5_part_bytes(f)
                hasher = PrefixHasher(f.size_bytes, md5_part, sha256=self.signature.active)
                digest = await self._fetch_parts(work, hasher)
                self._accept(f, digest, md5_part)
                if self.signature.active and f.path == self.signature.name:
                    await asyncio.to_thread(self.signature.signed, self.staging.dir)  # a bad one fails now
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

    async def _fetch_parts(self, work: FileWork, hasher: PrefixHasher) -> FileDigest:
        """Fetch the missing parts while hashing the landed prefix; the digest once all are in."""
        fd = await self._open(work.file)
        try:
            with first_error():
                await self._fetch_missing(work, _Prefix(work, hasher, fd))
            if self.staging.on_disk and len(work.parts) > 1:
                # Flush a large file as it completes, while other files still download,
                # rather than all of them at make-ready time (tmpfs has nothing to flush). Its
                # data is on disk already (write-behind); this makes its size and extents
                # durable. A one-part file waits for make_ready's single syncfs: thousands of
                # small files would each pay a journal commit here.
                await asyncio.to_thread(os.fdatasync, fd)
            return hasher.digest()
        except DiskFullError as exc:
            raise DiskFullError(
                f"disk full writing {self.staging.dir / work.file.path}: needs "
                f"{format_bytes(work.missing_bytes)} for this file, "
                f"{format_bytes(fs.free_bytes(self.staging.dir))} free ({exc}); "
                "free space (modelsync evict) or raise the volume's size"
            ) from None
        finally:
            os.close(fd)

    async def _open(self, f: RemoteFile) -> int:
        """Create the staging file in a transfer thread: for small files, opening beneath the
        staging directory and allocating cost more than the GET, and the event loop is the
        one thread all files share."""

        def open_file() -> int:
            with fs.storage_errors(self.staging.dir / f.path, f.size_bytes):
                return self.staging.open_file(f.path, f.size_bytes)

        opening = asyncio.get_running_loop().run_in_executor(self.executor, open_file)
        try:
            return await _in_thread(opening)
        except asyncio.CancelledError:
            if not opening.cancelled() and opening.exception() is None:
                os.close(opening.result())  # opened after all: do not leak it
            raise

    async def _fetch_missing(self, work: FileWork, prefix: _Prefix) -> None:
        """The parts through the shared window, and one hasher following them, as one task group."""
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._follow(prefix))
            for part in work.missing:
                await self.window.acquire()
                task = tg.create_task(self._part(work.file, part, prefix.fd))
                task.add_done_callback(lambda _t: self.window.release())
                task.add_done_callback(functools.partial(prefix.land, part))

    async def _follow(self, prefix: _Prefix) -> None:
        """Hash each stretch of the file as soon as every part before its end has landed."""
        loop = asyncio.get_running_loop()
        hasher = prefix.hasher
        while hasher.position < hasher.size_bytes:
            await prefix.grew.wait()
            prefix.grew.clear()
            while hasher.position < prefix.end:
                async with self.hash_slots:
                    await _in_thread(loop.run_in_executor(None, self._hash, hasher, prefix.fd, prefix.end))

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

    async def _part(self, f: RemoteFile, part: Part, fd: int) -> None:
        """One ranged GET, retried from the last byte written until it lands or the policy gives up.

        Every attempt first passes the store's gate. A throttled answer slows the
        gate for every transfer and waits whole seconds (or the store's
        Retry-After); other transient failures wait briefly. The part gives up
        after `policy.attempts` consecutive non-throttle failures, or after
        `policy.budget_s` without progress, whichever comes first; a byte of
        progress resets both. An expired URL or token is presigned again (from
        freshly resolved credentials for a token) and does not count.
        """
        start = part.start
        loop = asyncio.get_running_loop()
        retries = PartRetries(self.policy)
        expired = 0
        while True:
            await self.gate.admit()  # first: a long wait here must not age the URL
            url = await self._url(f)
            generation = self.credentials_generation
            req = RangeRequest(url=url, start=start, end=part.end, etag=f.etag)
            try:
                await _in_thread(
                    loop.run_in_executor(
                        self.executor, self._transfer, req, fd, start
                    )
                )
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
        self.staging.journal.part_written(f.path, part.index)

    def _transfer(self, req: RangeRequest, fd: int, start: int) -> int:
        """One ranged GET into the file (in a transfer thread); on disk, start writing it back."""
        written = self.client.fetch_into(req, fd, start, self.events.fetched)
        if self.staging.on_disk:
            fs.start_writeback(fd, start, written)
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
        url = self.urls[f.key] = await self.s3.presign_get(
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
                    await self.s3.renew_credentials()
                    self.credentials_generation += 1
        if self.urls.get(f.key) == url:
            del self.urls[f.key]

    # -- verification ------------------------------------------------------------

    def _accept(self, f: RemoteFile, digest: FileDigest, md5_part: int | None) -> None:
        """Check a complete file against what the source vouches for, and journal it as verified."""
        self.events.verifying(f.path)
        verified_by = _check(f, digest, md5_part)
        self.verified[f.path] = (digest.xxh3_128, verified_by)
        if digest.sha256 is not None:
            self.sha256s[f.path] = digest.sha256
        self.fetched[f.path] = f
        self.staging.journal.file_verified(f.path, digest.xxh3_128, verified_by, digest.sha256)

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


class _Prefix:
    """How far from the front a file's parts have all landed, for its hasher to follow."""

    def __init__(self, work: FileWork, hasher: PrefixHasher, fd: int) -> None:
        self.hasher = hasher
        self.fd = fd
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


async def _in_thread(future: asyncio.Future[_T]) -> _T:
    """Await a transfer thread; when cancelled, first wait until the thread has stopped.

    A cancelled task cannot stop a thread blocked on its socket: it keeps writing at
    its offsets until the body ends, its socket is shut down (`_Puller.abort`), or
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


def _unchanged(record: CompletionRecord, files: list[RemoteFile]) -> bool:
    """Whether the source still holds exactly the objects the ready revision was made from."""
    have = {(f.path, f.size_bytes, f.etag) for f in record.files}
    return have == {(f.path, f.size_bytes, f.etag) for f in files}


def _restart(work: FileWork, f: RemoteFile) -> FileWork:
    """The same file, all parts missing again, for its one fresh try."""
    return FileWork(file=f, parts=plan_parts(f.size_bytes, layout_bytes(work.parts)), done=frozenset())
