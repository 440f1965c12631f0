"""Pull one model revision into staging and make it ready: plan, fetch, verify, final check, make ready.

Shape of a pull (the caller, engine/ensure.py, holds the model's lock):
1. Learn the files: the manifest when there is one, else a listing.
2. Plan the parts still missing, given the journal of an interrupted pull;
   hard-link files the cache already holds (engine/dedup.py); claim the space.
3. Fetch parts through one sliding window (engine/fetch.py); each body is
   written at its offset in a staging file by a transfer thread.
4. When a file's last part lands, check its digest (core/verify.py) against the
   manifest or the ETag, and enter it in the verification ledger
   (engine/ledger.py); a mismatch refetches the file once. When the model's
   signature is in play, SHA-256 is computed in the same pass.
5. Final check (engine/trust.py): the signature lists exactly these files and
   digests, and the safetensors headers add up; else nothing is made ready.
6. Make ready: record first, then one rename of the staging directory.

What the pull is comes in as one value (engine/pull_job.py `PullJob`), the
backends with it (engine/ports.py): this module never builds them. The pull
runs in its own event loop, supervised for cancellation (engine/supervise.py).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

from modelsync.adapters.cache import JournalState, ModelLock
from modelsync.adapters.digest import PrefixHasher
from modelsync.core.nesting import check_not_nested
from modelsync.core.parts import FileWork, PullPlan, RemoteFile, layout_bytes, plan_parts, plan_pull
from modelsync.core.units import format_bytes
from modelsync.core.verify import (
    after_corrupt_fetch,
    md5_part_bytes,
    misstated_size,
    needs_first_part,
    restart,
    unchanged,
)
from modelsync.engine.catalog import Catalog, open_catalog
from modelsync.engine.dedup import link_copies
from modelsync.engine.events import PullEvents
from modelsync.engine.evict import make_room, wait_for_room
from modelsync.engine.fetch import FetchWindow, whole_file
from modelsync.engine.holder_note import ProgressNote
from modelsync.engine.ledger import VerificationLedger
from modelsync.engine.part_transfer import FailedTry
from modelsync.engine.ports import Backends
from modelsync.engine.pull_job import PullJob
from modelsync.engine.source import source_files
from modelsync.engine.supervise import Abort, supervise
from modelsync.engine.tasks import first_error
from modelsync.engine.trust import SignatureCheck, final_check
from modelsync.errors import ChecksumMismatchError, DiskFullError, ObjectChangedError

#: files in progress at once (a batch of small files counts as one); bounds open descriptors
#: and per-file state
MAX_OPEN_FILES = 64
#: small files a transfer thread fetches in one trip at most (`_small_files`): one hand-off each
#: way for the batch instead of a task, a gate, a URL and two hand-offs for every file
BATCH_FILES = 16
#: trips each transfer thread gets at least while a model's small files last, so none idles
BATCHES_PER_THREAD = 4


class Pulled(NamedTuple):
    path: Path
    plan: PullPlan
    fetched_bytes: int
    #: models the pull's space reservation evicted to make room
    evicted: tuple[str, ...]


def pull_revision(job: PullJob, lock: ModelLock, events: PullEvents) -> Pulled:
    """Fetch, verify and make `job.source` ready, under `job.rules`, while the caller holds its `lock`.

    `job.current` is the ready revision when this is a refresh check: unchanged
    objects return at once (unless `job.recheck`), changed ones pull the new
    revision, reusing unchanged files. Cancelled (Ctrl-C, SIGTERM, `job.cancel`), it aborts
    its transfers first and stops within a second (engine/supervise.py).
    """
    with open_catalog(job.cache) as catalog:
        note = ProgressNote(events, lock)
        try:
            run = functools.partial(_pull, job, catalog, note)
            path, plan, evicted = asyncio.run(supervise(run, job.cancel))
        finally:
            job.cache.release_reservation(job.source)
    return Pulled(path, plan, note.counter.fetched_bytes, evicted)


async def _pull(
    job: PullJob, catalog: Catalog, events: PullEvents, abort: Abort
) -> tuple[Path, PullPlan, tuple[str, ...]]:
    """The pull with its backends open, in its own event loop; what is ready, its plan, what was evicted."""
    async with job.backends() as backends:
        abort.watch(backends.fetcher)
        puller = _Puller(job, catalog, events, backends)
        try:
            path, plan = await puller.pull()
            return path, plan, puller.evicted
        finally:
            puller.close()


class _Puller:
    """One revision: files, plan, linked copies, space, then every file fetched and verified, then ready."""

    def __init__(self, job: PullJob, catalog: Catalog, events: PullEvents, backends: Backends) -> None:
        self.job = job
        self.ref = job.source
        self.settings = job.settings
        self.catalog = catalog
        self.events = events
        self.store = backends.store
        self.staging = job.cache.staging(job.source)
        self.ledger = VerificationLedger(self.staging.journal)
        self.signature = SignatureCheck(job.source, job.rules.signature, job.rules.signature_name)
        self.window = FetchWindow(job, backends, self.staging, events)
        self.evicted: tuple[str, ...] = ()

    def close(self) -> None:
        """Stop the transfers and close the journal, whether the pull succeeded or not."""
        self.window.close()  # wakes threads blocked on a socket, then joins them
        self.staging.journal.close()

    async def pull(self) -> tuple[Path, PullPlan]:
        """Where the revision is ready, and the plan it was pulled by (steps 1-6 above)."""
        job = self.job
        files = self.signature.select(await source_files(self.store, self.ref, job.rules.manifest.mode))
        if job.current is None:
            # a new model must neither hold a ready one nor lie inside one: its rename would
            # swap the other's directory out, and evicting it would delete the other
            check_not_nested(self.ref, self.catalog.ready_refs())
        if self.signature.active:
            self.window.hash_sha256()
        if job.current is not None and not job.recheck and unchanged(job.current, files):
            self.events.planned(len(files), job.current.total_bytes, 0)
            return job.cache.ready_path(self.ref), plan_pull(files, self.settings.part_size_bytes, {})
        state = self.staging.journal.load()
        if not set(state.files) <= {f.path for f in files}:
            # A journal naming a file the model no longer has would make a stray file ready: start over.
            state = JournalState()
        resume = bool(state.files)
        plan = plan_pull(files, self.settings.part_size_bytes, state.done_parts(), state.part_sizes())
        _note_kept_part_size(plan, state, self.settings.part_size_bytes, self.events)
        self.staging.prepare(resume=resume)
        self.ledger.resume(state, files)
        linked = link_copies(job.cache, self.catalog, self.staging, plan, state)
        self.ledger.linked(linked)
        await self._claim_space(plan, state, linked.keys(), resume)
        await self._fetch_all(plan, state, resume)
        return await self._make_ready(plan), plan

    async def _claim_space(
        self, plan: PullPlan, state: JournalState, linked: Collection[str], resume: bool
    ) -> None:
        """Make room for what is still to be written (waiting for it when it is coming); refused
        before a byte is fetched, nothing stays."""
        needed = sum(
            w.file.size_bytes
            for w in plan.files
            if w.file.path not in state.files and w.file.path not in linked
        )
        job = self.job
        claim = functools.partial(
            make_room, self.settings, job.cache, self.catalog, self.ref, needed, job.protected
        )
        try:
            room = await wait_for_room(claim, self.settings.room_wait_s, self.events.note)
        except DiskFullError:
            if not resume:
                self.staging.discard()
            raise
        self.evicted = room.evicted

    async def _fetch_all(self, plan: PullPlan, state: JournalState, resume: bool) -> None:
        """Every file not verified yet, at most MAX_OPEN_FILES at once, in the signature's order."""
        to_fetch = sum(w.missing_bytes for w in plan.files if w.file.path not in self.ledger)
        self.events.planned(len(plan.files), plan.total_bytes, to_fetch)
        file_slots = asyncio.Semaphore(MAX_OPEN_FILES)
        ordered = self.signature.ordered(plan.files)
        batch = batch_size(sum(map(self._batchable, ordered)), self.settings.concurrency)
        with first_error():
            async with asyncio.TaskGroup() as tg:
                for item in in_batches(ordered, self._batchable, batch):
                    await file_slots.acquire()
                    if isinstance(item, list):
                        task = tg.create_task(self._small_files(item))
                    else:
                        known = state.files.get(item.file.path) == (
                            item.file.etag,
                            item.file.size_bytes,
                            layout_bytes(item.parts),
                        )
                        task = tg.create_task(self._file(item, known=resume and known))
                    task.add_done_callback(lambda _t: file_slots.release())

    def _batchable(self, work: FileWork) -> bool:
        """A small file to fetch that `_small_files` can take (no store call before its GET)."""
        f = work.file
        return (
            whole_file(work)
            and f.path not in self.ledger
            and not needs_first_part(f)
            and not (self.signature.active and f.path == self.signature.name)
        )

    async def _small_files(self, works: list[FileWork]) -> None:
        """Small files fetched and hashed in one trip to a transfer thread, then each verified as
        `_file` verifies; the ones that did not land take `_file`'s whole path, which retries."""
        tries = []
        for work in works:
            f = work.file
            self.staging.journal.begin_file(f.path, f.etag, f.size_bytes, layout_bytes(work.parts))
            tries.append((work, self._hasher(f, md5_part_bytes(f))))
        tried = await self.window.fetch_once_each(tries)
        for work, hasher in tries[: tried.landed]:
            await self._file(work, known=True, tried=hasher)
        if tried.landed < len(tries):
            with first_error():
                async with asyncio.TaskGroup() as tg:
                    for i, (work, _hasher) in enumerate(tries[tried.landed :]):
                        tg.create_task(self._file(work, known=True, tried=tried.failed if i == 0 else None))

    async def _make_ready(self, plan: PullPlan) -> Path:
        """The final check, then the record and the one rename that makes the model ready."""
        fetched = self.ledger.fetched(plan.files)
        signer = await asyncio.to_thread(
            final_check, self.staging.dir, fetched, self.signature, self.ledger.sha256s
        )
        record = self.ledger.record(self.ref, fetched, signer)
        check_not_nested(self.ref, self.catalog.ready_refs())  # again: one may have become ready meanwhile
        path = await asyncio.to_thread(self.job.cache.make_ready, self.ref, self.staging, record)
        self.catalog.register(self.ref, record)
        return path

    async def _file(self, work: FileWork, known: bool, tried: PrefixHasher | FailedTry | None = None) -> None:
        """Fetch and verify one file; a changed object gets one fresh try, bad bytes up to
        `CORRUPT_FETCHES` fetches in all, and the error says whether the store or the way was wrong.

        `tried`: `_small_files` made the first attempt: the hasher of the file it fetched, to
        verify, or how the attempt failed, to go on from.
        """
        f = work.file
        if f.path in self.ledger:  # linked from a cached copy, or verified before a restart
            return
        changed, corrupt = False, list[str]()
        while True:
            f = work.file
            if changed or corrupt or not known:
                self.staging.journal.begin_file(f.path, f.etag, f.size_bytes, layout_bytes(work.parts))
            try:
                md5_part = await self._md5_part_bytes(f)
                if isinstance(tried, PrefixHasher):
                    digest = tried.digest()
                else:
                    digest = await self.window.fetch_file(work, self._hasher(f, md5_part), tried)
                tried = None
                self.events.verifying(f.path)
                try:
                    self.ledger.accept(f, digest, md5_part)
                except ChecksumMismatchError as exc:
                    corrupt.append(digest.xxh3_128)
                    if (stop := after_corrupt_fetch(exc, corrupt)) is not None:
                        raise stop from None
                    self.events.refetching(work.missing_bytes)
                    work = restart(work, f)
                    continue
                if self.signature.active and f.path == self.signature.name:
                    await asyncio.to_thread(self.signature.signed, self.staging.dir)  # a bad one fails now
                return
            except ObjectChangedError:
                if changed:
                    raise
                changed = True
                fresh = await self.store.head(self.ref.bucket, f.key)
                if fresh.etag == f.etag and fresh.size_bytes != f.size_bytes:
                    # the same object at another size: the manifest is wrong, whichever part saw it first
                    raise misstated_size(f"s3://{self.ref.bucket}/{f.key}", f, fresh.size_bytes) from None
                work = restart(work, replace(f, size_bytes=fresh.size_bytes, etag=fresh.etag))
                self.window.forget_url(f)

    def _hasher(self, f: RemoteFile, md5_part: int | None) -> PrefixHasher:
        """The digests a file's check needs: SHA-256 too when the pull verifies a signature."""
        return PrefixHasher(f.size_bytes, md5_part, sha256=self.signature.active)

    async def _md5_part_bytes(self, f: RemoteFile) -> int | None:
        """How to slice the file for an ETag check, or None when the ETag proves nothing."""
        first = None
        if needs_first_part(f):
            first = await self.store.first_part_bytes(self.ref.bucket, f.key)
        return md5_part_bytes(f, first)


def batch_size(batchable: int, concurrency: int) -> int:
    """Small files per trip: up to `BATCH_FILES`, while every transfer thread still gets
    `BATCHES_PER_THREAD` trips (a model's few side files go one a trip, all at once)."""
    return max(1, min(BATCH_FILES, batchable // (BATCHES_PER_THREAD * concurrency)))


def in_batches(
    works: Iterable[FileWork], batchable: Callable[[FileWork], bool], size: int
) -> Iterator[FileWork | list[FileWork]]:
    """`works` in order: the batchable ones in lists of `size` (the last one shorter), the others alone."""
    batch: list[FileWork] = []
    for work in works:
        if not batchable(work):
            yield work
            continue
        batch.append(work)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _note_kept_part_size(plan: PullPlan, state: JournalState, wanted: int, events: PullEvents) -> None:
    """Say so when a resume keeps the journal's part size for files it had started.

    Their written parts are laid out in that size, so they keep it rather than
    fetch again what is on disk; files not started yet use the size asked for
    (`wanted`).
    """
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
        events.note(
            f"resuming with the part size of the interrupted pull ({sizes}) for the files it had "
            f"started, to keep their written parts; {format_bytes(wanted)} applies to the others"
        )
