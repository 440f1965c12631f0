"""What an S3 ETag can prove about the bytes behind it.

A single-part upload's ETag is the MD5 of the object; a multipart upload's is
`md5(md5(part1) || md5(part2) ...)-N`. Anything else (SSE, compression, nginx's
`mtime-size`) is an opaque version token: good for If-Match, useless as a digest.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from enum import Enum

_MD5 = re.compile(r"^[0-9a-f]{32}$")
_MULTIPART = re.compile(r"^([0-9a-f]{32})-(\d{1,5})$")


class EtagKind(Enum):
    MD5 = "etag-md5"
    MULTIPART = "etag-multipart"
    OPAQUE = "opaque"


def etag_kind(etag: str) -> EtagKind:
    if _MD5.match(etag):
        return EtagKind.MD5
    if _MULTIPART.match(etag):
        return EtagKind.MULTIPART
    return EtagKind.OPAQUE


def multipart_count(etag: str) -> int:
    match = _MULTIPART.match(etag)
    if not match:
        raise ValueError(f"{etag!r} is not a multipart ETag")
    return int(match.group(2))


def multipart_etag(part_md5s: Sequence[bytes]) -> str:
    """The ETag S3 gives an object uploaded in parts with these raw MD5 digests."""
    return f"{hashlib.md5(b''.join(part_md5s)).hexdigest()}-{len(part_md5s)}"


def part_size_fits(size_bytes: int, part_bytes: int, parts: int) -> bool:
    """Whether `parts` parts of `part_bytes` (the last one shorter) make `size_bytes`."""
    return part_bytes > 0 and -(-size_bytes // part_bytes) == parts
