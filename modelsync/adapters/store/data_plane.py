"""The object store of a pull that starts on the data plane: no S3 SDK until something needs it.

Why: a cold `modelsync pull` spent 0.5-0.9 s before its first ranged GET, nearly
all of it importing aiobotocore and botocore and creating a client, only to GET
one small manifest. With static keys in the environment and an endpoint whose
URLs core.sigv4 signs exactly as botocore does, this store presigns the
manifest's URL itself, GETs it over the range client, and presigns every file's
URL the same way: a pull of a model with a manifest never imports the SDK, nor
does one without a manifest whose objects are single-part (a multipart ETag needs
the SDK's HEAD of the first part).

What it serves itself, and what it leaves to the SDK (adapters/store/sdk.py `S3`,
opened on first need and closed with this store):

- `get_manifest`: a 200 is the manifest, a missing key (not a missing bucket)
  is None. Every other answer (a missing bucket, 403, a throttle, an expired
  token, a redirect, a failed connection, a malformed answer) is asked again of
  the SDK, so errors, retries and throttling are decided by the code that
  decides them for every other read (sdk.py, sdk_errors.py), not by a copy of it.
- `presign_get`: signed here with the environment's keys (adapters/store/presign.py,
  whose rule leaves S3 Express buckets to the SDK); by the SDK once it renewed
  the credentials.
- `list_model` (a model without a manifest): ListObjectsV2 pages signed here and read
  over the range client (core/listing.py); a refusal, a malformed page or an empty
  listing is asked again of the SDK, as for the manifest.
- `head`, `first_part_bytes`, `renew_credentials`: the SDK.

`presign.static_route` decides whether a route can be signed here; when it cannot,
`open_store` opens the SDK's store alone, as every pull did before.

The manifest's GET asks for the store's checksum of the body, as botocore does
(`x-amz-checksum-mode`, signed: S3 refuses an unsigned `x-amz-*` header), and a
CRC32, SHA-1 or SHA-256 that comes back is checked here; a body that does not
match it, or a checksum computed otherwise (CRC32C, CRC64NVME), goes to the SDK.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import hashlib
import os
import zlib
from collections.abc import AsyncIterator, Callable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING

from modelsync.adapters.http.answer import s3_error_fields
from modelsync.adapters.store.presign import Presigner, StaticRoute, static_route
from modelsync.config import Settings
from modelsync.core.manifest import MAX_MANIFEST_BYTES
from modelsync.core.refs import ModelRef
from modelsync.core.retry import missing_object
from modelsync.core.sigv4 import Credentials
from modelsync.errors import ModelsyncError, TransientFetchError

if TYPE_CHECKING:  # importing either at the top would load what this store exists to avoid
    from modelsync.adapters.http.client import RangeClient
    from modelsync.adapters.store.sdk import S3
    from modelsync.core.parts import ObjectInfo

#: lifetime of the manifest's URL (and a listing page's), seconds: it is used at once, once
MANIFEST_URL_EXPIRY_S = 60
#: a listing page of 1,000 keys is a few hundred KiB; a larger answer is not a page
MAX_LIST_PAGE_BYTES = 16 * 1024 * 1024
#: pages listed here before the SDK is asked instead (a model of a million files is not a model)
MAX_LIST_PAGES = 1000
#: sent (and signed) with the manifest's GET, as botocore sends it: the store returns its checksum
_CHECKSUM_MODE = {"x-amz-checksum-mode": "ENABLED"}
#: the store's checksums of a body checked here: header -> the digest it carries, base64-encoded
_DIGESTS: dict[str, Callable[[bytes], bytes]] = {
    "x-amz-checksum-crc32": lambda body: zlib.crc32(body).to_bytes(4, "big"),
    "x-amz-checksum-sha1": lambda body: hashlib.sha1(body).digest(),
    "x-amz-checksum-sha256": lambda body: hashlib.sha256(body).digest(),
}
def body_intact(headers: Mapping[str, str], body: bytes) -> bool:
    """Whether `body` matches the store's checksum of it, or the store sent none that can be checked.

    A composite checksum (of a multipart upload's parts, "...-N") is not a checksum of
    the body; botocore passes it unchecked too. One this store does not compute is
    not passed: the SDK checks it.
    """
    for name, value in headers.items():
        if not name.startswith("x-amz-checksum-") or name == "x-amz-checksum-type" or "-" in value:
            continue
        digest = _DIGESTS.get(name)
        return digest is not None and base64.b64encode(digest(body)).decode("ascii") == value
    return True


@contextlib.asynccontextmanager
async def open_store(
    settings: Settings, client: RangeClient, env: Mapping[str, str] | None = None
) -> AsyncIterator[DataPlaneStore | S3]:
    """The store of one pull: this one where the route allows it, else the SDK's alone.

    `env` defaults to the process environment, where botocore reads its keys too:
    both must sign with the same ones.
    """
    route = static_route(settings, os.environ if env is None else env)
    if route is None:
        from modelsync.adapters.store.sdk import open_s3

        async with open_s3(settings) as s3:
            yield s3
        return
    async with DataPlaneStore(settings, route, client) as store:
        yield store


class DataPlaneStore:
    """The control plane's reads and signatures without the SDK where it can; see the module docstring."""

    def __init__(
        self,
        settings: Settings,
        route: StaticRoute,
        client: RangeClient,
        now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        self._settings = settings
        self._route = route
        self._client = client
        self._presigner = Presigner(route)
        self._now = now
        self._stack = contextlib.AsyncExitStack()
        self._opening = asyncio.Lock()
        self._sdk: S3 | None = None
        #: the SDK resolved the credentials afresh: from then on it signs everything
        self._renewed = False

    async def __aenter__(self) -> DataPlaneStore:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._stack.aclose()

    @property
    def sdk_opened(self) -> bool:
        """Whether something needed the S3 SDK (and so imported it)."""
        return self._sdk is not None

    async def get_manifest(self, ref: ModelRef, name: str) -> bytes | None:
        """The manifest's bytes, None when the model has none; anything else is the SDK's to decide."""
        url = self._presigner.sign(
            ref.bucket, ref.prefix + name, self._creds(), self._now(), MANIFEST_URL_EXPIRY_S, _CHECKSUM_MODE
        )
        if url is not None:
            get = self._client.get_small
            try:
                answer = await asyncio.to_thread(get, url, MAX_MANIFEST_BYTES, _CHECKSUM_MODE)
            except (ModelsyncError, TransientFetchError):
                pass  # the SDK tries again and reports it as for any read
            else:
                if answer.status == 200 and body_intact(answer.headers, answer.body):
                    return answer.body
                if missing_object(answer.status, s3_error_fields(answer.body)[0]):
                    return None
        return await (await self._s3()).get_manifest(ref, name)

    async def presign_get(self, bucket: str, key: str, expiry_s: float) -> str:
        """A GET URL valid for `expiry_s`, signed here with the environment's keys."""
        url = self._presigner.sign(bucket, key, self._creds(), self._now(), max(1, int(expiry_s)))
        if url is not None:
            return url
        return await (await self._s3()).presign_get(bucket, key, expiry_s)

    async def list_model(self, ref: ModelRef) -> list[ObjectInfo]:
        """Every object under the prefix, listed here page by page; anything else is the SDK's.

        An empty listing goes to the SDK too: whether the prefix names an object instead
        is its question to ask, in its words.
        """
        listed = await self._list_here(ref)
        if listed:
            return listed
        return await (await self._s3()).list_model(ref)

    async def _list_here(self, ref: ModelRef) -> list[ObjectInfo] | None:
        from modelsync.core.listing import list_params, parse_list_page

        objects: list[ObjectInfo] = []
        token = None
        for _ in range(MAX_LIST_PAGES):
            params = list_params(ref.prefix, token)
            url = self._presigner.sign_listing(
                ref.bucket, self._creds(), self._now(), MANIFEST_URL_EXPIRY_S, params
            )
            if url is None:
                return None
            try:
                answer = await asyncio.to_thread(self._client.get_small, url, MAX_LIST_PAGE_BYTES)
            except (ModelsyncError, TransientFetchError):
                return None
            page = parse_list_page(answer.body) if answer.status == 200 else None
            if page is None:
                return None
            objects += page.objects
            if page.next_token is None:
                return objects
            token = page.next_token
        return None

    async def head(self, bucket: str, key: str) -> ObjectInfo:
        return await (await self._s3()).head(bucket, key)

    async def first_part_bytes(self, bucket: str, key: str) -> int | None:
        return await (await self._s3()).first_part_bytes(bucket, key)

    async def renew_credentials(self) -> None:
        """Resolve the credentials through botocore's chain; the SDK signs with them from now on."""
        await (await self._s3()).renew_credentials()
        self._renewed = True

    def _creds(self) -> Credentials | None:
        """The keys URLs are signed with here: the environment's, until the SDK renewed the credentials."""
        return None if self._renewed else self._route.credentials

    async def _s3(self) -> S3:
        """The SDK's store, opened on first need (one opening, however many ask at once)."""
        async with self._opening:
            if self._sdk is None:
                from modelsync.adapters.store.sdk import (
                    open_s3,  # here: importing it is what this store avoids
                )

                self._sdk = await self._stack.enter_async_context(open_s3(self._settings))
        return self._sdk
