"""A publish's writes through the S3 SDK: the bucket check, whole objects, multipart uploads.

The writes of `adapters/store/sdk.py` `S3` (the `ObjectWriter` engine/upload.py is
given), apart from its reads and signing. A write is not retried here beyond
botocore's own attempts: a publish run again resumes where it stopped.
"""

from __future__ import annotations

import contextlib
from typing import Any

from botocore.exceptions import ClientError

from modelsync.adapters.store.sdk_errors import s3_errors, strip_etag
from modelsync.errors import BucketNotFoundError, ModelsyncError


class SdkWrites:
    """The writes of the SDK's store, on its aiobotocore client."""

    _client: Any

    async def require_bucket(self, bucket: str) -> None:
        """Fail before any upload when the destination bucket is missing: a publish never creates one."""
        with s3_errors(f"checking bucket {bucket}", bucket):
            try:
                await self._client.head_bucket(Bucket=bucket)
                return
            except ClientError as exc:
                if exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") != 404:
                    raise
        raise BucketNotFoundError(
            f"bucket {bucket!r} does not exist; publish needs an existing bucket: create it first "
            f"(e.g. `aws s3 mb s3://{bucket}`)"
        )

    async def put_bytes(self, bucket: str, key: str, data: bytes) -> str:
        with s3_errors(f"writing s3://{bucket}/{key}", bucket):
            resp = await self._client.put_object(Bucket=bucket, Key=key, Body=data)
        return strip_etag(resp["ETag"])

    async def delete(self, bucket: str, key: str) -> None:
        """Delete one object; a missing one is no error (S3 answers 204 either way)."""
        with s3_errors(f"deleting s3://{bucket}/{key}", bucket):
            await self._client.delete_object(Bucket=bucket, Key=key)

    async def ensure_bucket(self, bucket: str) -> None:
        """Used by the demo only: create the bucket if it is missing."""
        with s3_errors(f"creating bucket {bucket}", bucket):
            try:
                await self._client.head_bucket(Bucket=bucket)
            except ClientError:
                await self._client.create_bucket(Bucket=bucket)

    async def start_multipart(self, bucket: str, key: str) -> str:
        with s3_errors(f"starting an upload to s3://{bucket}/{key}", bucket):
            resp = await self._client.create_multipart_upload(Bucket=bucket, Key=key)
        upload_id: str = resp["UploadId"]
        return upload_id

    async def upload_part(self, bucket: str, key: str, upload_id: str, number: int, data: bytes) -> str:
        with s3_errors(f"uploading part {number} of s3://{bucket}/{key}", bucket):
            resp = await self._client.upload_part(
                Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=data
            )
        return strip_etag(resp["ETag"])

    async def complete_multipart(self, bucket: str, key: str, upload_id: str, etags: list[str]) -> str:
        parts = [{"PartNumber": i + 1, "ETag": f'"{e}"'} for i, e in enumerate(etags)]
        with s3_errors(f"completing the upload of s3://{bucket}/{key}", bucket):
            resp = await self._client.complete_multipart_upload(
                Bucket=bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}
            )
        return strip_etag(resp["ETag"])

    async def abort_multipart(self, bucket: str, key: str, upload_id: str) -> None:
        with (
            contextlib.suppress(ModelsyncError),
            s3_errors(f"aborting s3://{bucket}/{key}", bucket),
        ):
            await self._client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
