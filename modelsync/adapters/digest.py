"""Hashing files already on local disk: the one read pass that verifies a pull.

The pass reads from the page cache right after the download, in a worker
thread; xxhash and hashlib release the GIL on large buffers, so it overlaps
with the transfers still running. The buffer is the only memory it takes.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

import xxhash

HASH_BUFFER_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class FileDigest:
    xxh3_128: str
    #: raw MD5 of each `md5_part_bytes` slice, when asked for (ETag checks)
    part_md5s: tuple[bytes, ...] = ()


def hash_fd(fd: int, size_bytes: int, md5_part_bytes: int | None = None) -> FileDigest:
    """xxh3-128 of the first `size_bytes` of `fd`, and optionally MD5s per part."""
    xxh = xxhash.xxh3_128()
    part_md5s: list[bytes] = []
    md5 = hashlib.md5() if md5_part_bytes else None
    in_part = 0
    buf = bytearray(min(HASH_BUFFER_BYTES, max(size_bytes, 1)))
    view = memoryview(buf)
    offset = 0
    while offset < size_bytes:
        want = min(len(buf), size_bytes - offset)
        if md5_part_bytes:
            want = min(want, md5_part_bytes - in_part)
        n = os.preadv(fd, [view[:want]], offset)
        if n == 0:
            raise EOFError(f"file shorter than {size_bytes} bytes")
        chunk = view[:n]
        xxh.update(chunk)
        if md5 is not None and md5_part_bytes:
            md5.update(chunk)
            in_part += n
            if in_part == md5_part_bytes:
                part_md5s.append(md5.digest())
                md5, in_part = hashlib.md5(), 0
        offset += n
    if md5 is not None and in_part:
        part_md5s.append(md5.digest())
    return FileDigest(xxh3_128=xxh.hexdigest(), part_md5s=tuple(part_md5s))
