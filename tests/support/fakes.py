"""In-memory fakes of the engine's backends (engine/ports.py): an object store and a range fetcher.

They let engine tests check ordering, dedup, verification, resume and
cancellation with no server and no sleep. They fake the *Protocols*, the
boundary the engine was given on purpose; the adapters behind them (aiobotocore,
the range client) keep their real-server tests, the integration tier.

The fetcher writes real bytes into the real staging files, so everything the
engine does on disk (journal, hashing, make_ready) runs for real.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import xxhash

from modelsync.core.manifest import MANIFEST_NAME, FileEntry, render_manifest
from modelsync.core.parts import ObjectInfo
from modelsync.core.refs import ModelRef
from modelsync.engine.ports import Backends, OnWritten, OpenBackends, RangeRequest
from modelsync.errors import NotFoundError, ObjectChangedError, TransientFetchError

_SCHEME = "fake://"


@dataclass(frozen=True, slots=True)
class Fetch:
    """One ranged GET the fetcher answered: which object, which bytes."""

    key: str
    start: int
    end: int


class FakeStore:
    """Objects in a dict; ETags are the MD5 of the bytes, as S3 gives a single-part upload."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], bytes] = {}
        self.renewals = 0

    def put(self, ref: ModelRef, path: str, data: bytes) -> str:
        self.objects[(ref.bucket, ref.prefix + path)] = data
        return hashlib.md5(data).hexdigest()

    def put_model(self, ref: ModelRef, files: dict[str, bytes], manifest: bool = True) -> None:
        """The model's files, and (by default) a manifest with their xxh3-128, written last."""
        entries = [
            FileEntry(path, len(data), xxhash.xxh3_128_hexdigest(data), self.put(ref, path, data))
            for path, data in files.items()
        ]
        if manifest:
            self.put(ref, MANIFEST_NAME, render_manifest(entries))

    def etag(self, bucket: str, key: str) -> str:
        return hashlib.md5(self.objects[(bucket, key)]).hexdigest()

    async def get_manifest(self, ref: ModelRef, name: str) -> bytes | None:
        return self.objects.get((ref.bucket, ref.prefix + name))

    async def list_model(self, ref: ModelRef) -> list[ObjectInfo]:
        found = [
            ObjectInfo(key, len(data), self.etag(bucket, key))
            for (bucket, key), data in sorted(self.objects.items())
            if bucket == ref.bucket and key.startswith(ref.prefix)
        ]
        if not found:
            raise NotFoundError(f"no objects under {ref.uri}; check the prefix")
        return found

    async def head(self, bucket: str, key: str) -> ObjectInfo:
        if (bucket, key) not in self.objects:
            raise NotFoundError(f"not found: s3://{bucket}/{key}")
        return ObjectInfo(key, len(self.objects[(bucket, key)]), self.etag(bucket, key))

    async def first_part_bytes(self, bucket: str, key: str) -> int | None:
        return None

    async def presign_get(self, bucket: str, key: str, expiry_s: float) -> str:
        return f"{_SCHEME}{bucket}/{key}"

    async def renew_credentials(self) -> None:
        self.renewals += 1


#: what the fetcher does before answering one GET (req, fd, file offset, the object's bytes); may raise
Fault = Callable[[RangeRequest, int, int, bytes], None]


@dataclass
class FakeFetcher:
    """Answers ranged GETs from a FakeStore, writing at the offset asked, as the range client does.

    `faults` maps an object key to the faults its next GETs meet, first one
    first; `corrupt` keys get their bytes flipped; `on_start` sees each GET as it
    starts. Each answered GET is recorded. The body is written, and offered to `on_written`,
    `buffer_bytes` at a time, as the range client does with its receive buffer (whole if None).
    """

    store: FakeStore
    faults: dict[str, list[Fault]] = field(default_factory=dict)
    corrupt: set[str] = field(default_factory=set)
    fetches: list[Fetch] = field(default_factory=list)
    closed: threading.Event = field(default_factory=threading.Event)
    on_start: Callable[[RangeRequest], None] | None = None
    buffer_bytes: int | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def fetch_into(
        self,
        req: RangeRequest,
        fd: int,
        file_offset: int,
        on_progress: Callable[[int], None] | None = None,
        on_written: OnWritten | None = None,
    ) -> int:
        if self.closed.is_set():
            raise RuntimeError("the fetcher is closed")
        if self.on_start is not None:
            self.on_start(req)
        bucket, _, key = req.url.removeprefix(_SCHEME).partition("/")
        with self._lock:
            queue = self.faults.get(key)
            fault = queue.pop(0) if queue else None
        data = self.store.objects[(bucket, key)]
        if fault is not None:
            fault(req, fd, file_offset, data)
        if req.etag is not None and req.etag != self.store.etag(bucket, key):
            raise ObjectChangedError(f"s3://{bucket}/{key}: 412 Precondition Failed; the object changed")
        body = data[req.start : req.end]
        if key in self.corrupt:
            body = bytes(b ^ 0xFF for b in body)
        step = self.buffer_bytes or max(1, len(body))
        for at in range(0, len(body), step):
            os.pwrite(fd, body[at : at + step], file_offset + at)
            if on_written is not None:
                on_written(file_offset + at, memoryview(body)[at : at + step])
        with self._lock:
            self.fetches.append(Fetch(key, req.start, req.end))
        if on_progress is not None:
            on_progress(len(body))
        return len(body)

    def close(self) -> None:
        self.closed.set()

    def fetched_keys(self) -> list[str]:
        with self._lock:
            return [f.key for f in self.fetches]


def cut_after(n_bytes: int) -> Fault:
    """The connection drops after `n_bytes` of the body were written (a transient failure)."""

    def fault(req: RangeRequest, fd: int, file_offset: int, data: bytes) -> None:
        os.pwrite(fd, data[req.start : req.start + n_bytes], file_offset)
        raise TransientFetchError("connection reset", bytes_written=n_bytes, reason="reset")

    return fault


def hang_until_closed(fetcher: FakeFetcher, started: threading.Event) -> Fault:
    """The GET stalls until the pull aborts (closes the fetcher), as a stalled socket wakes on shutdown."""

    def fault(req: RangeRequest, fd: int, file_offset: int, data: bytes) -> None:
        started.set()
        fetcher.closed.wait()
        raise TransientFetchError("socket shut down", bytes_written=0, reason="reset")

    return fault


def fake_backends(store: FakeStore, fetcher: FakeFetcher) -> OpenBackends:
    """The engine's `backends` argument over the fakes; the same fetcher serves every pull."""

    @contextlib.asynccontextmanager
    async def open_backends() -> AsyncIterator[Backends]:
        fetcher.closed.clear()
        yield Backends(store=store, fetcher=fetcher)

    return open_backends
