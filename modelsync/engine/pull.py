"""Pull one model revision into staging and make it ready: plan, fetch, verify, final check, make ready.

Shape of a pull (the caller, engine/ensure.py, holds the model's lock):
1. Learn the files: the manifest when there is one, else a listing.
2. Plan the parts still missing, given the journal of an interrupted pull;
   hard-link files the cache already holds (engine/dedup.py); claim the space.
3. Fetch parts through one sliding window (engine/fetch.py); each body is
   written at its offset in a staging file by a transfer thread.
4. When a file's last part lands, check its digest (core/verify.py) against the
   manifest or the ETag; a mismatch refetches the file once. When the model's
   signature is in play, SHA-256 is computed in the same pass.
5. Final check (engine/trust.py): the signature lists exactly these files and
   digests, and the safetensors headers add up; else nothing is made ready.
6. Make ready: record first, then one rename of the staging directory.

The backends are passed in (engine/ports.py); this module never builds them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import time
from collections.abc import Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

from modelsync.adapters.cache import Cache, JournalState, ModelLock, Staging
from modelsync.adapters.digest import FileDigest, PrefixHasher
from modelsync.core.manifest import FileEntry
from modelsync.core.nesting import check_not_nested
from modelsync.core.parts import (
    FileWork,
    PullPlan,
    RemoteFile,
    layout_bytes,
    plan_parts,
    plan_pull,
)
from modelsync.core.record import CompletionRecord, weakest
from modelsync.core.retry import RetryPolicy
from modelsync.core.units import format_bytes
from modelsync.core.verify import (
    after_corrupt_fetch,
    check_file,
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
from modelsync.engine.fetch import FetchWindow, leave_signals_to_the_main_thread
from modelsync.engine.holder_note import ProgressNote
from modelsync.engine.ports import Backends, OpenBackends
from modelsync.engine.rules import PullRules
from modelsync.engine.source import source_files
from modelsync.engine.tasks import first_error
from modelsync.engine.trust import SignatureCheck, final_check
from modelsync.errors import (
    ChecksumMismatchError,
    DiskFullError,
    ObjectChangedError,
    PullCancelledError,
)

#: files in progress at once; bounds open descriptors and per-file state
MAX_OPEN_FILES = 64
#: how often a pull with a cancel event checks it; bounds how long a cancelled pull runs on
CANCEL_POLL_S = 0.1


class Pulled(NamedTuple):
    path: Path
    plan: PullPlan
    fetched_bytes: int
    #: models the pull's space reservation evicted to make room
    evicted: tuple[str, ...]


def pull_revision(
    rules: PullRules,
    cache: Cache,
    lock: ModelLock,
    events: PullEvents,
    backends: OpenBackends,
    *,
    current: CompletionRecord | None,
    recheck: bool,
    protected: Mapping[str, str],
    cancel: threading.Event | None,
) -> Pulled:
    """Fetch, verify and make `rules.source` ready, under `rules`, while the caller holds its `lock`.

    `current` is the ready revision when this is a refresh check: unchanged
    objects then return at once (unless `recheck`), changed ones pull the new
    revision, reusing unchanged files.
    """
    with open_catalog(cache) as catalog:
        note = ProgressNote(events, lock)
        puller = _Puller(rules, cache, catalog, note, backends, protected, current, recheck)
        try:
            path, plan = asyncio.run(_supervise(puller, cancel))
        finally:
            cache.release_reservation(rules.source)
    return Pulled(path, plan, note.counter.fetched_bytes, puller.evicted)


async def _supervise(puller: _Puller, cancel: threading.Event | None) -> tuple[Path, PullPlan]:
    """Run the pull; when it is cancelled (Ctrl-C, SIGTERM, or `cancel` set) abort the transfers first.

    Aborting closes the fetcher, which shuts its sockets down before closing them:
    that wakes every transfer thread blocked in `recv` at once (closing alone would
    leave each one waiting out its read timeout), and backoff and gate waits run on
    the event loop, where cancellation ends them. So a cancelled pull stops in well
    under a second even when every transfer is stalled; the journal keeps what was
    written for the next pull to resume.

    The pull's worker threads block SIGINT and SIGTERM (see
    `fetch.leave_signals_to_the_main_thread`).
    """
    asyncio.get_running_loop().set_default_executor(
        ThreadPoolExecutor(thread_name_prefix="modelsync-io", initializer=leave_signals_to_the_main_thread)
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


class _Puller:
    def __init__(
        self,
        rules: PullRules,
        cache: Cache,
        catalog: Catalog,
        events: PullEvents,
        backends: OpenBackends,
        protected: Mapping[str, str],
        current: CompletionRecord | None,
        recheck: bool = False,
    ) -> None:
        self.settings = rules.settings
        self.cache = cache
        self.catalog = catalog
        self.ref = ref = rules.source
        self.events = events
        self.open_backends = backends
        self.protected = protected
        self.current = current
        #: the ready revision must be checked again even when the source did not change
        self.recheck = recheck
        self.aborted = False
        self.evicted: tuple[str, ...] = ()
        self.staging: Staging = cache.staging(ref)
        self.verified: dict[str, tuple[str, str]] = {}
        #: the version of each file that was fetched and verified (a restart may change it)
        self.fetched: dict[str, RemoteFile] = {}
        self.signature = SignatureCheck(ref, rules.signature, rules.signature_name)
        self.manifest_mode = rules.manifest.mode
        #: SHA-256 of each file hashed while it downloaded (only when a signature is checked)
        self.sha256s: dict[str, str] = {}
        self.backends: Backends | None = None
        self.window: FetchWindow

    async def run(self) -> tuple[Path, PullPlan]:
        async with self.open_backends() as backends:
            self.backends = backends
            if self.aborted:
                backends.fetcher.close()
            policy = RetryPolicy.of(self.settings)
            self.window = FetchWindow(
                self.settings, self.ref, backends, self.staging, self.events, policy, backends.gate
            )
            try:
                return await self._pull(backends)
            finally:
                self.window.close()  # wakes threads blocked on a socket, then joins them
                self.staging.journal.close()

    async def _pull(self, backends: Backends) -> tuple[Path, PullPlan]:
        files = self.signature.select(await self._files(backends))
        if self.current is None:
            # a new model must neither hold a ready one nor lie inside one: its rename would
            # swap the other's directory out, and evicting it would delete the other
            check_not_nested(self.ref, self.catalog.ready_refs())
        if self.signature.active:
            self.window.hash_sha256()
        if self.current is not None and not self.recheck and unchanged(self.current, files):
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
        self.verified = {path: v for path, v in state.verified.items() if state.files[path][0] == etags[path]}
        self.sha256s = {path: h for path, h in state.sha256s.items() if path in self.verified}
        linked = link_copies(self.cache, self.catalog, self.staging, plan, state)
        self.verified.update({path: (copy.xxh3_128, copy.verified_by) for path, copy in linked.items()})
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
        claim = functools.partial(
            make_room, self.settings, self.cache, self.catalog, self.ref, needed, self.protected
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

    async def _make_ready(self, plan: PullPlan) -> Path:
        """The final check, then the record and the one rename that makes the model ready."""
        fetched = [self.fetched.get(w.file.path, w.file) for w in plan.files]
        signer = await asyncio.to_thread(final_check, self.staging.dir, fetched, self.signature, self.sha256s)
        record = CompletionRecord(
            source=self.ref.uri,
            completed_at=time.time(),
            verified_by=weakest([by for _digest, by in self.verified.values()]),
            files=tuple(FileEntry(f.path, f.size_bytes, self.verified[f.path][0], f.etag) for f in fetched),
            signer=signer,
        )
        check_not_nested(self.ref, self.catalog.ready_refs())  # again: one may have become ready meanwhile
        path = await asyncio.to_thread(self.cache.make_ready, self.ref, self.staging, record)
        self.catalog.register(self.ref, record)
        return path

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
        if self.backends is not None:
            self.backends.fetcher.close()

    # -- what to fetch ---------------------------------------------------------

    async def _files(self, backends: Backends) -> list[RemoteFile]:
        """The model's files: from its manifest (with digests) or from a listing of a whole model."""
        return await source_files(backends.store, self.ref, self.manifest_mode)

    # -- one file ----------------------------------------------------------------

    async def _file(self, work: FileWork, known: bool) -> None:
        """Fetch and verify one file; a changed object gets one fresh try, bad bytes up to
        `CORRUPT_FETCHES` fetches in all, and the error says whether the store or the way was wrong."""
        f = work.file
        if f.path in self.verified:  # linked from a cached copy, or verified before a restart
            return
        changed, corrupt = False, list[str]()
        while True:
            f = work.file
            if changed or corrupt or not known:
                self.staging.journal.begin_file(f.path, f.etag, f.size_bytes, layout_bytes(work.parts))
            try:
                md5_part = await self._md5_part_bytes(f)
                hasher = PrefixHasher(f.size_bytes, md5_part, sha256=self.signature.active)
                digest = await self.window.fetch_file(work, hasher)
                try:
                    self._accept(f, digest, md5_part)
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
                fresh = await self.window.store.head(self.ref.bucket, f.key)
                if fresh.etag == f.etag and fresh.size_bytes != f.size_bytes:
                    # the same object at another size: the manifest is wrong, whichever part saw it first
                    raise misstated_size(f"s3://{self.ref.bucket}/{f.key}", f, fresh.size_bytes) from None
                work = restart(work, replace(f, size_bytes=fresh.size_bytes, etag=fresh.etag))
                self.window.forget_url(f)

    def _accept(self, f: RemoteFile, digest: FileDigest, md5_part: int | None) -> None:
        """Check a complete file against what the source vouches for, and journal it as verified."""
        self.events.verifying(f.path)
        verified_by = check_file(f, digest.xxh3_128, digest.part_md5s, md5_part)
        self.verified[f.path] = (digest.xxh3_128, verified_by)
        if digest.sha256 is not None:
            self.sha256s[f.path] = digest.sha256
        self.fetched[f.path] = f
        self.staging.journal.file_verified(f.path, digest.xxh3_128, verified_by, f.size_bytes, digest.sha256)

    async def _md5_part_bytes(self, f: RemoteFile) -> int | None:
        """How to slice the file for an ETag check, or None when the ETag proves nothing."""
        first = None
        if needs_first_part(f):
            first = await self.window.store.first_part_bytes(self.ref.bucket, f.key)
        return md5_part_bytes(f, first)
