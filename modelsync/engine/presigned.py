"""A pull's presigned URLs: one a file, signed again before it gets old and after the store calls it expired.

Signing again also picks up credentials botocore refreshed on the way
(temporary credentials are refreshed before they expire), so a pull that
outlives its first credentials never sends a URL they no longer cover.
"""

from __future__ import annotations

import asyncio
import time

from modelsync.core.parts import RemoteFile
from modelsync.core.retry import presigned_expiry
from modelsync.engine.ports import ObjectStore

#: a presigned URL is signed again once less than this share of its lifetime is left. With
#: the default 15 min lifetime a URL is used for at most 7.5 min after signing, less than the
#: 10 min of validity botocore guarantees temporary credentials when it signs (it refreshes
#: them inside that window), so no URL outlives the credentials it carries.
PRESIGN_RENEW_SHARE = 0.5


class PresignedUrls:
    """The URL each file of `bucket` is fetched with, valid for `expiry_s` from its signing."""

    def __init__(self, store: ObjectStore, bucket: str, expiry_s: float) -> None:
        self._store = store
        self._bucket = bucket
        self._expiry_s = expiry_s
        self._urls: dict[str, str] = {}
        #: bumped each time the credentials are resolved afresh, so a burst of ExpiredToken renews once
        self.generation = 0
        self._credentials_lock = asyncio.Lock()

    async def get(self, f: RemoteFile) -> str:
        """The file's presigned URL, signed again when it is close to its own expiry."""
        url = self._urls.get(f.key)
        if url is not None:
            expiry = presigned_expiry(url)
            if expiry is None or expiry - time.time() > self._expiry_s * PRESIGN_RENEW_SHARE:
                return url
        url = self._urls[f.key] = await self._store.presign_get(self._bucket, f.key, self._expiry_s)
        return url

    def forget(self, f: RemoteFile) -> None:
        """The object changed: its next part is signed afresh."""
        self._urls.pop(f.key, None)

    async def renew(self, f: RemoteFile, url: str, generation: int, token_expired: bool) -> None:
        """Presign `f` again after `url` was called expired; for an expired token, resolve credentials first.

        Many parts see the same expired token at once: the first one to get here
        resolves the credentials, the others find the generation moved on and
        only presign.
        """
        if token_expired:
            async with self._credentials_lock:
                if self.generation == generation:
                    await self._store.renew_credentials()
                    self.generation += 1
        if self._urls.get(f.key) == url:
            del self._urls[f.key]
