"""What the engine needs from the object store and the data plane, as Protocols.

The engine never builds its backends: the edge (or `modelsync.backends`, the
factory it calls) opens them and passes them in. So the engine runs the same
code against aiobotocore and the range client in production and against small
in-memory fakes in tests, where ordering, dedup, verification failures, resume
and cancellation are checked without a server or a sleep.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from modelsync.core.ranges import OnWritten, RangeRequest
from modelsync.core.refs import ModelRef
from modelsync.engine.throttle import StoreGate

if TYPE_CHECKING:
    from modelsync.core.parts import ObjectInfo

#: the fetcher port's request type, owned by the port and defined in core so the adapter can name it
__all__ = [
    "Backends",
    "ObjectStore",
    "ObjectWriter",
    "OnWritten",
    "OpenBackends",
    "OpenWriter",
    "RangeFetcher",
    "RangeRequest",
]


class ObjectStore(Protocol):
    """The control plane: small, latency-bound reads and URL signing.

    adapters/store/sdk.py `S3` (aiobotocore), or adapters/store/data_plane.py `DataPlaneStore`, which
    signs URLs and reads the manifest without the SDK and hands it the rest.
    """

    async def get_manifest(self, ref: ModelRef, name: str) -> bytes | None:
        """The manifest's bytes, or None when the model has none."""

    async def list_model(self, ref: ModelRef) -> list[ObjectInfo]:
        """Every object under the model's prefix; an empty prefix is NotFoundError."""

    async def head(self, bucket: str, key: str) -> ObjectInfo:
        """One object's size and ETag now (after the source changed under a pull)."""

    async def first_part_bytes(self, bucket: str, key: str) -> int | None:
        """Size of part 1 of a multipart object, the slice its ETag was computed over."""

    async def presign_get(self, bucket: str, key: str, expiry_s: float) -> str:
        """A GET URL for the data plane, valid for `expiry_s`."""

    async def renew_credentials(self) -> None:
        """Resolve credentials afresh after the store called the token expired."""


class RangeFetcher(Protocol):
    """The data plane: one ranged GET written at an offset of a file (adapters/http/client.py).

    Called from transfer threads; raises `TransientFetchError` (retry from
    `start + bytes_written`) or `PresignedUrlExpiredError` (sign again).
    """

    def fetch_into(
        self,
        req: RangeRequest,
        fd: int,
        file_offset: int,
        on_progress: Callable[[int], None] | None = None,
        on_written: OnWritten | None = None,
    ) -> int:
        """Write bytes `[req.start, req.end)` at `file_offset` of `fd`; the bytes written.

        `on_written(offset, data)`: each stretch as it is written, in order, for the file's hasher.
        """

    def close(self) -> None:
        """Abort: every transfer blocked in this fetcher returns at once, and no new one starts."""


class ObjectWriter(Protocol):
    """What a publish needs: the reads that tell what the prefix holds, and the writes.

    adapters/store/sdk.py `S3` (aiobotocore); the engine's upload never opens it itself.
    """

    async def require_bucket(self, bucket: str) -> None:
        """Fail before any upload when the bucket is missing: a publish never creates one."""

    async def list_model(self, ref: ModelRef) -> list[ObjectInfo]:
        """Every object under the model's prefix; an empty prefix is NotFoundError."""

    async def get_manifest(self, ref: ModelRef, name: str) -> bytes | None:
        """The manifest's bytes, or None when the model has none."""

    async def first_part_bytes(self, bucket: str, key: str) -> int | None:
        """Size of part 1 of a multipart object, the slice its ETag was computed over."""

    async def put_bytes(self, bucket: str, key: str, data: bytes) -> str:
        """Write one whole object; its ETag."""

    async def delete(self, bucket: str, key: str) -> None:
        """Remove one object."""

    async def start_multipart(self, bucket: str, key: str) -> str:
        """Begin a multipart upload; its id."""

    async def upload_part(self, bucket: str, key: str, upload_id: str, number: int, data: bytes) -> str:
        """Send part `number` (from 1); its ETag."""

    async def complete_multipart(self, bucket: str, key: str, upload_id: str, etags: list[str]) -> str:
        """Join the parts, in order, into the object; its ETag."""

    async def abort_multipart(self, bucket: str, key: str, upload_id: str) -> None:
        """Drop an unfinished multipart upload and its parts."""


@dataclass(frozen=True, slots=True)
class Backends:
    store: ObjectStore
    #: one pull's fetcher; closing it aborts that pull's transfers
    fetcher: RangeFetcher
    #: paces the pull's requests while the store throttles; shared by every pull of the same
    #: store in the process (the edge's `store_gate`); by default one of the pull's own
    gate: StoreGate = field(default_factory=StoreGate)


#: opens the backends of one pull (in the pull's event loop) and closes them after it
OpenBackends = Callable[[], AbstractAsyncContextManager[Backends]]

#: opens the object store a publish writes to (in the upload's event loop) and closes it after
OpenWriter = Callable[[], AbstractAsyncContextManager[ObjectWriter]]
