"""One file of a pull fetched and verified, with the fresh tries a changed object or bad bytes earn.

engine/pull.py decides which files a revision needs and in what order; this
module gets each one into staging and into the verification ledger (steps 3-4
of a pull): the small ones a batch a trip to a transfer thread, the others
part by part through the fetch window. A file the store changed meanwhile gets
one fresh try, bad bytes up to `CORRUPT_FETCHES` fetches in all.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Iterator

from modelsync.adapters.cache import Staging
from modelsync.adapters.digest import PrefixHasher
from modelsync.core.parts import FileWork, RemoteFile, layout_bytes
from modelsync.core.refs import ModelRef
from modelsync.core.verify import (
    after_corrupt_fetch,
    md5_part_bytes,
    misstated_size,
    needs_first_part,
    restart,
)
from modelsync.engine.events import PullEvents
from modelsync.engine.fetch import FetchWindow, whole_file
from modelsync.engine.ledger import VerificationLedger
from modelsync.engine.part_transfer import FailedTry
from modelsync.engine.ports import ObjectStore
from modelsync.engine.tasks import first_error
from modelsync.engine.trust import SignatureCheck
from modelsync.errors import ChecksumMismatchError, ObjectChangedError

#: small files a transfer thread fetches in one trip at most (`FilePuller.small_files`): one
#: hand-off each way for the batch instead of a task, a gate, a URL and two hand-offs for every file
BATCH_FILES = 16
#: trips each transfer thread gets at least while a model's small files last, so none idles
BATCHES_PER_THREAD = 4


class FilePuller:
    """Fetches one revision's files into `staging` and enters each verified one in `ledger`."""

    def __init__(
        self,
        ref: ModelRef,
        store: ObjectStore,
        staging: Staging,
        window: FetchWindow,
        ledger: VerificationLedger,
        signature: SignatureCheck,
        events: PullEvents,
    ) -> None:
        self.ref = ref
        self.store = store
        self.staging = staging
        self.window = window
        self.ledger = ledger
        self.signature = signature
        self.events = events

    def batchable(self, work: FileWork) -> bool:
        """A small file to fetch that `small_files` can take (no store call before its GET)."""
        f = work.file
        return (
            whole_file(work)
            and f.path not in self.ledger
            and not needs_first_part(f)
            and not (self.signature.active and f.path == self.signature.name)
        )

    async def small_files(self, works: list[FileWork]) -> None:
        """Small files fetched and hashed in one trip to a transfer thread, then each verified as
        `file` verifies; the ones that did not land take `file`'s whole path, which retries."""
        tries = []
        for work in works:
            f = work.file
            self.staging.journal.begin_file(f.path, f.etag, f.size_bytes, layout_bytes(work.parts))
            tries.append((work, self._hasher(f, md5_part_bytes(f))))
        tried = await self.window.fetch_once_each(tries)
        for work, hasher in tries[: tried.landed]:
            await self.file(work, known=True, tried=hasher)
        if tried.landed < len(tries):
            with first_error():
                async with asyncio.TaskGroup() as tg:
                    for i, (work, _hasher) in enumerate(tries[tried.landed :]):
                        tg.create_task(self.file(work, known=True, tried=tried.failed if i == 0 else None))

    async def file(self, work: FileWork, known: bool, tried: PrefixHasher | FailedTry | None = None) -> None:
        """Fetch and verify one file; the error says whether the store or the way was wrong.

        `known`: the journal already holds this file's entry (a resume, or `small_files` wrote
        it). `tried`: `small_files` made the first attempt: the hasher of the file it fetched, to
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
                work = restart(work, f._replace(size_bytes=fresh.size_bytes, etag=fresh.etag))
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
