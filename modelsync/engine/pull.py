"""Pull one model revision into staging and make it ready: plan, fetch, verify, final check, make ready.

Shape of a pull (the caller, engine/ensure.py, holds the model's lock):
1. Learn the files: the manifest when there is one, else a listing.
2. Plan the parts still missing, given the journal of an interrupted pull;
   hard-link files the cache already holds (engine/dedup.py); claim the space.
3. Fetch each file (engine/file_pull.py) through one sliding window
   (engine/fetch.py); each body is written at its offset in a staging file by a
   transfer thread.
4. When a file's last part lands, check its digest (core/verify.py) against the
   manifest or the ETag, and enter it in the verification ledger
   (engine/ledger.py); a mismatch refetches the file. When the model's
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
from collections.abc import Collection
from pathlib import Path
from typing import NamedTuple

from modelsync.adapters.cache import JournalState, ModelLock
from modelsync.core.nesting import check_not_nested
from modelsync.core.parts import PullPlan, layout_bytes, plan_parts, plan_pull
from modelsync.core.units import format_bytes
from modelsync.core.verify import unchanged
from modelsync.engine.catalog import Catalog, open_catalog
from modelsync.engine.dedup import link_copies
from modelsync.engine.events import PullEvents
from modelsync.engine.evict import make_room, wait_for_room
from modelsync.engine.fetch import FetchWindow
from modelsync.engine.file_pull import FilePuller, batch_size, in_batches
from modelsync.engine.holder_note import ProgressNote
from modelsync.engine.ledger import VerificationLedger
from modelsync.engine.ports import Backends
from modelsync.engine.pull_job import PullJob
from modelsync.engine.source import source_files
from modelsync.engine.supervise import Abort, supervise
from modelsync.engine.tasks import first_error
from modelsync.engine.trust import SignatureCheck, final_check
from modelsync.errors import DiskFullError

#: files in progress at once (a batch of small files counts as one); bounds open descriptors
#: and per-file state
MAX_OPEN_FILES = 64


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
        self.files = FilePuller(
            self.ref, self.store, self.staging, self.window, self.ledger, self.signature, events
        )
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
        files = self.files
        batch = batch_size(sum(map(files.batchable, ordered)), self.settings.concurrency)
        with first_error():
            async with asyncio.TaskGroup() as tg:
                for item in in_batches(ordered, files.batchable, batch):
                    await file_slots.acquire()
                    if isinstance(item, list):
                        task = tg.create_task(files.small_files(item))
                    else:
                        known = state.files.get(item.file.path) == (
                            item.file.etag,
                            item.file.size_bytes,
                            layout_bytes(item.parts),
                        )
                        task = tg.create_task(files.file(item, known=resume and known))
                    task.add_done_callback(lambda _t: file_slots.release())

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
