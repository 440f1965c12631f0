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
  decides them for every other read (s3.py, s3_errors.py), not by a copy of it.
- `presign_get`: signed here with the environment's keys; by the SDK once it
  renewed the credentials, and for S3 Express buckets (botocore signs those
  for another host and service).
- `list_model` (a model without a manifest): ListObjectsV2 pages signed here and read
  over the range client (core/listing.py); a refusal, a malformed page or an empty
  listing is asked again of the SDK, as for the manifest.
- `head`, `first_part_bytes`, `renew_credentials`: the SDK.

`static_route` decides whether a route can be signed here; when it cannot,
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
import re
import zlib
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from modelsync.adapters.http.answer import s3_error_fields
from modelsync.config import Settings
from modelsync.core.manifest import MAX_MANIFEST_BYTES
from modelsync.core.refs import ModelRef
from modelsync.core.retry import missing_object
from modelsync.core.sigv4 import Credentials, QuerySigner, quote_key
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
#: variables that, when set, make botocore resolve credentials or build URLs in ways not
#: reproduced here: a named profile (a missing one is an error), keys it refreshes, FIPS or
#: dual-stack endpoints (refused with a custom endpoint)
_SDK_VARIABLES = (
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_CREDENTIAL_EXPIRATION",
    "AWS_USE_FIPS_ENDPOINT",
    "AWS_USE_DUALSTACK_ENDPOINT",
)
#: a region botocore accepts and signs as written (its own rule is a host label)
_REGION = re.compile(r"(?!\d+$)[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
#: S3 Express buckets: botocore addresses and signs them differently even on a custom endpoint
_EXPRESS_SUFFIXES = ("--x-s3", "--xa-s3")


@dataclass(frozen=True, slots=True)
class StaticRoute:
    """A route this store signs itself: the endpoint's base URL, the region, the environment's keys."""

    #: the endpoint URL as configured, without a trailing slash; objects are at <base>/<bucket>/<key>
    base_url: str
    region: str
    credentials: Credentials

    def object_url(self, bucket: str, key: str) -> str:
        """The unsigned path-style URL of an object, as botocore writes it for a custom endpoint."""
        return f"{self.base_url}/{bucket}/{quote_key(key)}"


def static_route(settings: Settings, env: Mapping[str, str]) -> StaticRoute | None:
    """The route when every request can be signed here exactly as botocore would sign it, else None.

    That needs static keys (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, which
    botocore's chain takes before anything else) and a path-style custom
    endpoint. Anything else is botocore's to resolve: profiles, web identity,
    container and instance roles, credential_process; AWS's own endpoints
    (botocore's rules pick the host by region and follow region redirects); a
    shared config file, which may change either; virtual-host addressing.
    """
    access_key = env.get("AWS_ACCESS_KEY_ID", "")
    secret_key = env.get("AWS_SECRET_ACCESS_KEY", "")
    if not (access_key and secret_key) or any(env.get(name) for name in _SDK_VARIABLES):
        return None
    if os.path.exists(os.path.expanduser(env.get("AWS_CONFIG_FILE") or "~/.aws/config")):
        return None
    endpoint = settings.endpoint_url
    if endpoint is None or settings.addressing_style != "path" or not _REGION.fullmatch(settings.region):
        return None
    parts = urlsplit(endpoint)
    unusual = parts.query or parts.fragment or "@" in parts.netloc  # botocore's to judge, or refuse
    if unusual or not endpoint.startswith(("http://", "https://")):
        return None
    # botocore reads the token from the first of these that is set and not empty
    token = env.get("AWS_SECURITY_TOKEN") or env.get("AWS_SESSION_TOKEN") or None
    return StaticRoute(endpoint.rstrip("/"), settings.region, Credentials(access_key, secret_key, token))


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
        self._signer = QuerySigner(route.region)
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
        if self._signs(ref.bucket):
            url = self._sign(ref.bucket, ref.prefix + name, MANIFEST_URL_EXPIRY_S, _CHECKSUM_MODE)
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
        if self._signs(bucket):
            return self._sign(bucket, key, max(1, int(expiry_s)))
        return await (await self._s3()).presign_get(bucket, key, expiry_s)

    async def list_model(self, ref: ModelRef) -> list[ObjectInfo]:
        """Every object under the prefix, listed here page by page; anything else is the SDK's.

        An empty listing goes to the SDK too: whether the prefix names an object instead
        is its question to ask, in its words.
        """
        if self._signs(ref.bucket):
            listed = await self._list_here(ref)
            if listed:
                return listed
        return await (await self._s3()).list_model(ref)

    async def _list_here(self, ref: ModelRef) -> list[ObjectInfo] | None:
        from modelsync.core.listing import list_params, parse_list_page

        objects: list[ObjectInfo] = []
        token = None
        for _ in range(MAX_LIST_PAGES):
            url = self._signer.presign_get(f"{self._route.base_url}/{quote_key(ref.bucket)}",
                                           self._route.credentials, self._now(), MANIFEST_URL_EXPIRY_S,
                                           params=list_params(ref.prefix, token))
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

    def _signs(self, bucket: str) -> bool:
        return not self._renewed and not bucket.endswith(_EXPRESS_SUFFIXES)

    def _sign(self, bucket: str, key: str, expires_s: int, headers: Mapping[str, str] | None = None) -> str:
        url = self._route.object_url(bucket, key)
        return self._signer.presign_get(url, self._route.credentials, self._now(), expires_s, headers)

    async def _s3(self) -> S3:
        """The SDK's store, opened on first need (one opening, however many ask at once)."""
        async with self._opening:
            if self._sdk is None:
                from modelsync.adapters.store.sdk import (
                    open_s3,  # here: importing it is what this store avoids
                )

                self._sdk = await self._stack.enter_async_context(open_s3(self._settings))
        return self._sdk
