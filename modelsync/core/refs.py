"""Model references: `s3://bucket/prefix/` parsed once, with the names derived from it.

A model revision is a prefix. Its ready path in the cache mirrors S3
(`<cache>/<bucket>/<prefix>`) so vLLM paths are predictable, and its internal
state files are named by a slug that is unique, readable and fits NAME_MAX.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import PurePosixPath
from typing import NamedTuple

from modelsync.core.keys import safe_relative_path
from modelsync.errors import UnsafeKeyError, UsageError

# S3 bucket rules, relaxed to what MinIO also accepts (no underscore, no uppercase).
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_SLUG_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_SLUG_READABLE_CHARS = 80


class ModelRef(NamedTuple):
    bucket: str
    #: the key prefix, always ending in "/"
    prefix: str

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    @property
    def model_id(self) -> str:
        """`bucket/prefix` without the trailing slash: the name operators type."""
        return f"{self.bucket}/{self.prefix.rstrip('/')}"

    @property
    def cache_path(self) -> PurePosixPath:
        """The ready path relative to the cache root."""
        return PurePosixPath(self.bucket, *self.prefix.rstrip("/").split("/"))

    @property
    def slug(self) -> str:
        """A unique file name for this model's state (locks, journals, records)."""
        readable = slug_readable(self.model_id)
        digest = hashlib.sha256(self.model_id.encode()).hexdigest()[:12]
        return f"{readable}-{digest}"

    def relative_key(self, key: str) -> str:
        """The part of `key` below this model's prefix."""
        if not key.startswith(self.prefix):
            raise UnsafeKeyError(f"key {key!r} is outside the model prefix {self.uri}")
        return key[len(self.prefix) :]


def slug_readable(model_id: str) -> str:
    """The readable part of a slug: `model_id` (or the start of one) made filesystem-safe, truncated.

    The slug of `a/b/c` starts with the readable part of `a/b`, until the truncation: so a
    model can be found again from its slug by descending only where the readable part leads.
    """
    return _SLUG_UNSAFE.sub("-", model_id.replace("/", "--"))[:_SLUG_READABLE_CHARS]


def is_bucket_name(name: str) -> bool:
    return bool(_BUCKET.match(name)) and ".." not in name


def parse_source(text: str) -> ModelRef:
    """Parse `s3://bucket/prefix/`; a model is always a prefix below the bucket root."""
    if not text.startswith("s3://"):
        raise UsageError(f"source {text!r} is not an s3:// URI; use s3://bucket/prefix/")
    bucket, _, prefix = text[len("s3://") :].partition("/")
    if not is_bucket_name(bucket):
        raise UsageError(
            f"source {text!r}: {bucket!r} is not a valid bucket name "
            "(3-63 lowercase letters, digits, dots, hyphens)"
        )
    prefix = prefix.rstrip("/")
    if not prefix:
        raise UsageError(
            f"source {text!r} names a whole bucket; name the model's prefix, "
            f"e.g. s3://{bucket}/org/model/revision/"
        )
    try:
        safe_relative_path(prefix)
    except UnsafeKeyError as exc:
        raise UsageError(f"source {text!r}: unsafe prefix ({exc})") from None
    return ModelRef(bucket=bucket, prefix=prefix + "/")


def parse_model_name(text: str) -> ModelRef:
    """Accept what operators type for a cached model: an s3:// URI or `bucket/prefix`."""
    return parse_source(text if text.startswith("s3://") else f"s3://{text}")
