"""The one private botocore name modelsync uses: a client's credentials, swapped when they are renewed.

botocore has no public way to change a live client's credentials, and the store may
call a token expired that botocore still trusts (adapters/store/sdk.py `renew_credentials`).
So the renewal writes the request signer's credentials, and botocore is pinned to the
range this was written against (pyproject.toml). This checks the behaviour relied on,
against a real S3 server: after a renewal, the URLs botocore signs and the ones the
cached signer (core/sigv4.py) signs both carry the new key.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from botocore.client import BaseClient
from support.s3env import S3Env

from modelsync.adapters.store.sdk import open_s3
from modelsync.config import Settings


def key_id(url: str) -> str:
    """The access key a presigned URL was signed with."""
    return parse_qs(urlsplit(url).query)["X-Amz-Credential"][0].split("/")[0]


def test_after_the_credentials_are_renewed_every_url_is_signed_with_the_new_key(
    tmp_path: Path,
    s3_env: S3Env,
    aws_credentials: S3Env,
    s3_client: BaseClient,
    bucket: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    other = f"{bucket}-other"
    s3_client.create_bucket(Bucket=other)
    settings = Settings(cache_dir=tmp_path, endpoint_url=s3_env.endpoint_url)

    async def sign() -> tuple[str, str, str, str]:
        async with open_s3(settings) as s3:
            first = await s3.presign_get(bucket, "m/a.bin", 600)  # botocore signs it; the cache learns
            cached = await s3.presign_get(bucket, "m/b.bin", 600)
            monkeypatch.setenv("AWS_ACCESS_KEY_ID", "RENEWEDKEYID")
            monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "renewed-secret")
            await s3.renew_credentials()
            by_botocore = await s3.presign_get(other, "m/a.bin", 600)  # a new bucket: botocore signs
            by_cache = await s3.presign_get(bucket, "m/c.bin", 600)
            return first, cached, by_botocore, by_cache

    first, cached, by_botocore, by_cache = asyncio.run(sign())

    assert [key_id(first), key_id(cached)] == [aws_credentials.access_key_id] * 2
    assert [key_id(by_botocore), key_id(by_cache)] == ["RENEWEDKEYID"] * 2
