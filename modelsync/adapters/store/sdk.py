"""The S3 control plane over aiobotocore: list, head, manifest, presign (a publish's writes: sdk_writes.py).

Bulk bytes of a pull do not pass through here (see adapters/http/client.py);
what does is small and latency-bound. botocore retries throttling, 5xx and
connection errors itself (standard mode). Only when its attempts end on
throttling do the reads a pull needs (manifest, listing, heads) keep waiting,
with the same floor-of-seconds schedule and budget as the data plane
(`RetryPolicy`): a store that throttles a whole pool for minutes is busy, not
down. Every SDK failure is translated into modelsync.errors at this boundary,
by `adapters/store/sdk_errors.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.exceptions import (
    ClientError,
    ProfileNotFound,
)

from modelsync.adapters.http.tls import checked_ca_bundle
from modelsync.adapters.store.presign import Presigner
from modelsync.adapters.store.sdk_errors import (
    CONTROL_ATTEMPTS,
    code_and_status,
    is_missing_key,
    s3_errors,
    strip_etag,
)
from modelsync.adapters.store.sdk_writes import SdkWrites
from modelsync.config import Settings
from modelsync.core.manifest import MAX_MANIFEST_BYTES
from modelsync.core.parts import ObjectInfo
from modelsync.core.refs import ModelRef
from modelsync.core.retry import RetryPolicy, Verdict, backoff_s, classify
from modelsync.core.sigv4 import Credentials
from modelsync.errors import (
    AccessDeniedError,
    ConfigError,
    ManifestError,
    ModelsyncError,
    NotFoundError,
)

_T = TypeVar("_T")


class S3(SdkWrites):
    """One aiobotocore client for a command's lifetime; `policy` bounds riding out throttling.

    Here the reads, which ride out throttling and an expired token, and the signing;
    a publish's writes are `SdkWrites`'.
    """

    def __init__(self, client: Any, policy: RetryPolicy | None = None, credentials: Any = None) -> None:
        self._client = client
        self._policy = policy or RetryPolicy()
        self._presigner = Presigner()
        #: the credentials object the client signs with (its session's, `get_credentials`); None:
        #: unknown, so every URL is signed by botocore
        self._credentials = credentials

    async def _read(self, what: str, bucket: str, call: Callable[[], Awaitable[_T]]) -> _T:
        """Run a read, riding out what another try can fix.

        When botocore's own attempts end on throttling, wait (the throttling
        schedule) and run it again, within the retry budget. When the store says
        the token expired, resolve the credentials afresh once and run it again.
        """
        started = time.monotonic()
        throttles = 0
        renewed = False
        while True:
            with s3_errors(what, bucket):
                try:
                    return await call()
                except ClientError as exc:
                    code, status = code_and_status(exc)
                    verdict = classify(status, code or None)
                    spent_s = time.monotonic() - started
                    renew = verdict is Verdict.EXPIRED and not renewed
                    if not renew and (verdict is not Verdict.THROTTLED or spent_s >= self._policy.budget_s):
                        raise
            if renew:
                renewed = True
                await self.renew_credentials()
                continue
            throttles += 1
            wait_s = backoff_s(self._policy, throttles, throttled=True, jitter=random.random())
            await asyncio.sleep(min(wait_s, max(0.0, self._policy.budget_s - spent_s)))

    async def get_manifest(self, ref: ModelRef, name: str) -> bytes | None:
        """The manifest's bytes, or None when the model has none (a plain prefix).

        Only a missing key means "no manifest"; a missing bucket is an error.
        """

        async def fetch() -> bytes | None:
            try:
                resp = await self._client.get_object(Bucket=ref.bucket, Key=ref.prefix + name)
            except ClientError as exc:
                if is_missing_key(exc):
                    return None
                raise
            size_bytes = int(resp.get("ContentLength") or 0)
            if size_bytes > MAX_MANIFEST_BYTES:  # refused by its size, before a byte of it is read
                resp["Body"].close()
                raise ManifestError(
                    f"malformed manifest {ref.uri}{name}: {size_bytes} bytes, over the limit of "
                    f"{MAX_MANIFEST_BYTES}; republish the model"
                )
            async with resp["Body"] as body:
                data: bytes = await body.read(MAX_MANIFEST_BYTES + 1)
                return data

        return await self._read(f"reading {ref.uri}{name}", ref.bucket, fetch)

    async def list_model(self, ref: ModelRef) -> list[ObjectInfo]:
        """Every object under the prefix; an empty prefix is NotFoundError."""

        async def listing() -> list[ObjectInfo]:
            objects: list[ObjectInfo] = []
            paginator = self._client.get_paginator("list_objects_v2")
            async for page in paginator.paginate(Bucket=ref.bucket, Prefix=ref.prefix):
                for item in page.get("Contents", ()):
                    objects.append(ObjectInfo(item["Key"], int(item["Size"]), strip_etag(item["ETag"])))
            return objects

        objects = await self._read(f"listing {ref.uri}", ref.bucket, listing)
        if not objects:
            await self._refuse_object_as_prefix(ref)
            raise NotFoundError(f"no objects under {ref.uri}; check the prefix")
        return objects

    async def _refuse_object_as_prefix(self, ref: ModelRef) -> None:
        """A source naming one object (say its .safetensors) instead of the model's prefix."""
        key = ref.prefix.rstrip("/")
        try:
            await self.head(ref.bucket, key)
        except ModelsyncError:
            return
        parent = key.rpartition("/")[0]
        hint = f", s3://{ref.bucket}/{parent}/" if parent else ""
        raise NotFoundError(
            f"no model at {ref.uri}: s3://{ref.bucket}/{key} is an object, not a model prefix; "
            f"give the model's prefix{hint}"
        )

    async def head(self, bucket: str, key: str) -> ObjectInfo:
        resp = await self._read(
            f"reading s3://{bucket}/{key}", bucket, lambda: self._client.head_object(Bucket=bucket, Key=key)
        )
        return ObjectInfo(key, int(resp["ContentLength"]), strip_etag(resp["ETag"]))

    async def first_part_bytes(self, bucket: str, key: str) -> int | None:
        """Size of part 1 of a multipart object: the part size its ETag was computed with."""
        resp = await self._read(
            f"reading part 1 of s3://{bucket}/{key}",
            bucket,
            lambda: self._client.head_object(Bucket=bucket, Key=key, PartNumber=1),
        )
        return int(resp["ContentLength"]) if resp.get("PartsCount") else None

    async def presign_get(self, bucket: str, key: str, expiry_s: float) -> str:
        """A GET URL valid for `expiry_s`, signed with the current credentials.

        botocore refreshes temporary credentials (STS, web identity, a credential
        process with an Expiration) before they run out when it hands them out, so a
        URL signed late in a long pull carries fresh ones. botocore signs the first
        URL of a bucket and so decides its layout (endpoint, path or virtual host,
        signing region); the rest are signed by adapters/store/presign.py (10 µs a
        URL against 0.75 ms here), once it has reproduced botocore's URL.
        """
        expires_s = max(1, int(expiry_s))
        with s3_errors(f"signing a URL for s3://{bucket}/{key}", bucket):
            creds = None
            if self._credentials is not None:
                frozen = await self._credentials.get_frozen_credentials()
                creds = Credentials(frozen.access_key, frozen.secret_key, frozen.token)
            url = self._presigner.sign(bucket, key, creds, dt.datetime.now(dt.UTC), expires_s)
            if url is None:
                url = await self._client.generate_presigned_url(
                    "get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=expires_s
                )
                if creds is not None:
                    self._presigner.learn(bucket, key, creds, url)
        return url

    async def renew_credentials(self) -> None:
        """Resolve the credential chain afresh and sign with what it gives from now on.

        For when the store said the token expired although botocore still trusted
        it (a revoked session, a clock apart from the store's, a chain that only
        re-reads its source when asked).
        """
        with s3_errors("resolving the credentials again", ""):
            fresh = await get_session().get_credentials()
        if fresh is None:
            raise AccessDeniedError(
                "the credentials expired and the credential chain has no new ones; check "
                "AWS_WEB_IDENTITY_TOKEN_FILE, AWS_PROFILE or the credential process"
            )
        # botocore has no public way to change a client's credentials; its signer reads
        # this attribute for every signature, presigned URLs and control-plane calls alike.
        # The one private name this module uses: botocore is pinned to the range it was
        # written against (pyproject.toml), and tests/test_s3_credentials.py checks it.
        self._client._request_signer._credentials = fresh
        self._credentials = fresh


def client_config(settings: Settings) -> AioConfig:
    return AioConfig(
        signature_version="s3v4",
        s3={"addressing_style": settings.addressing_style},
        retries={"mode": "standard", "total_max_attempts": CONTROL_ATTEMPTS},
        connect_timeout=settings.connect_timeout_s,
        read_timeout=settings.read_timeout_s,
        max_pool_connections=max(10, settings.concurrency),
        # A manifest or listing is small; checksums of full GETs stay on (botocore's default).
    )


def sdk_verify(settings: Settings) -> bool | str | None:
    """The S3 SDK's `verify`: off with `insecure`, else the CA bundle, checked first for an
    https endpoint (the SDK builds its TLS context from it; a bad one is one line, exit 2)."""
    return False if settings.insecure else checked_ca_bundle(settings)


@contextlib.asynccontextmanager
async def open_s3(settings: Settings) -> AsyncIterator[S3]:
    """An S3 client configured from Settings; TLS follows ca_bundle or the insecure switch."""
    session = get_session()
    try:
        session.get_scoped_config()  # reads the shared config files: a missing profile fails here
    except ProfileNotFound as exc:
        known = ", ".join(session.available_profiles) or "none are defined"
        raise ConfigError(
            f"AWS profile {exc.kwargs.get('profile')!r} (AWS_PROFILE) is not in the AWS config or "
            f"credentials files (profiles there: {known}); fix AWS_PROFILE or unset it"
        ) from None
    verify = sdk_verify(settings)
    async with session.create_client(
        "s3",
        region_name=settings.region,
        endpoint_url=settings.endpoint_url,
        config=client_config(settings),
        verify=verify,
    ) as client:
        # the session resolved the client's credentials once and keeps that object
        yield S3(client, RetryPolicy.of(settings), await session.get_credentials())
