"""Hashing files on local disk, front to back, while their later parts are still arriving.

Parts of a file land in any order, but xxh3-128 and MD5 must see the bytes in
order. A `PrefixHasher` follows the contiguous prefix of landed parts and hashes
each newly completed stretch straight from the page cache, so when the last part
lands almost nothing is left to hash: the verification pass overlaps with the
download instead of following it.

It reads through read-only mmap windows rather than pread into a buffer: the
hash then reads the page cache in place, without a copy (measured in
docs/perf-lab.md: about a quarter of the CPU of a pread pass). A short stretch
(a small file) is read instead: there the syscalls of a mapping cost more than
the copy. xxhash and hashlib
release the GIL on large buffers, so hashing runs beside the transfer threads.
Memory: one window mapping (or one read of at most READ_MAX_BYTES) at a time per hasher.

SHA-256 (what an OpenSSF model signature lists) is computed in the same pass,
from the same window, only when the caller asks: unsigned pulls pay nothing.
When more than one digest is computed, each takes the window a slice at a time,
so the second reads the slice from the CPU cache the first just filled it into:
reading the page cache from memory costs as much CPU as xxh3 itself, and more
under load (measured in BENCHMARKS.md, "The cost of verifying a signature").
"""

from __future__ import annotations

import hashlib
import mmap
import os
from dataclasses import dataclass

import xxhash

from modelsync.adapters import page_cache

#: bytes mapped at a time
WINDOW_BYTES = 8 * 1024 * 1024
#: a stretch up to this size is read (one pread, a copy) rather than mapped: mapping costs five
#: syscalls (fstat, dup, mmap, munmap, close), which for a 64 KiB file is three times the CPU of
#: the copy (15 us against 5); the copy costs more from about 256 KiB on
READ_MAX_BYTES = 256 * 1024
#: bytes each digest takes in turn when several are computed: well inside a core's L2 cache,
#: and far above the 2 KiB (hashlib) and 64 KiB (xxhash) from which they release the GIL
SLICE_BYTES = 256 * 1024


def sha256_slots() -> int:
    """Files to hash at once when SHA-256 is on: one per usable core, at least 2, at most 16.

    One file's SHA-256 is sequential and runs at about 1.6 GiB/s on a core with the SHA
    extensions (xxh3 at about 10): the two hashers that keep up with any link for xxh3 would
    cap a signed pull at about 3 GiB/s on a node that downloads faster. Each hasher maps one
    window at a time, so this is also the bound on mapped page cache.
    """
    return max(2, min(16, len(os.sched_getaffinity(0))))


@dataclass(frozen=True, slots=True)
class FileDigest:
    xxh3_128: str
    #: raw MD5 of each `md5_part_bytes` slice, when asked for (ETag checks)
    part_md5s: tuple[bytes, ...] = ()
    #: hex SHA-256 of the whole file, when asked for (signature checks)
    sha256: str | None = None


class PrefixHasher:
    """xxh3-128 (and optionally per-part MD5s, SHA-256) of `[0, size)`, fed in increasing prefixes."""

    def __init__(self, size_bytes: int, md5_part_bytes: int | None = None, sha256: bool = False) -> None:
        self.size_bytes = size_bytes
        #: everything before this offset has been hashed
        self.position = 0
        self._xxh = xxhash.xxh3_128()
        self._md5_part_bytes = md5_part_bytes
        self._md5 = hashlib.md5() if md5_part_bytes else None
        self._in_part = 0
        self._part_md5s: list[bytes] = []
        self._sha256 = hashlib.sha256() if sha256 else None

    def feed(self, fd: int, end: int) -> None:
        """Hash `[position, end)` of `fd`; blocking, so callers run it in a worker thread."""
        end = min(end, self.size_bytes)
        if 0 < end - self.position <= READ_MAX_BYTES:
            data = os.pread(fd, end - self.position, self.position)
            if len(data) != end - self.position:
                raise ValueError(f"file ends at {self.position + len(data)}, before {end}")
            self._update(memoryview(data))
            self.position = end
            return
        while self.position < end:
            aligned = self.position - self.position % mmap.ALLOCATIONGRANULARITY
            length = min(WINDOW_BYTES, end - aligned)
            window = mmap.mmap(fd, length, prot=mmap.PROT_READ, offset=aligned)
            with memoryview(window)[self.position - aligned :] as view:
                self._update(view)
            # Closed only after a whole update. An exception (Ctrl-C, SIGTERM) raised inside
            # one keeps its frames, and the slices they hold, alive in its traceback: closing
            # the map then would raise BufferError over it. The map goes with its last slice.
            window.close()
            self.position = aligned + length

    def _update(self, data: memoryview) -> None:
        if self._sha256 is None and self._md5 is None:
            self._xxh.update(data)
            return
        for start in range(0, len(data), SLICE_BYTES):
            piece = data[start : start + SLICE_BYTES]
            self._xxh.update(piece)
            if self._sha256 is not None:
                self._sha256.update(piece)
            self._update_md5(piece)
            piece.release()

    def _update_md5(self, data: memoryview) -> None:
        """MD5 of each `md5_part_bytes` slice of the file, as S3 computes an ETag."""
        if self._md5 is None or not self._md5_part_bytes:
            return
        while len(data):
            take = min(len(data), self._md5_part_bytes - self._in_part)
            self._md5.update(data[:take])
            self._in_part += take
            data = data[take:]
            if self._in_part == self._md5_part_bytes:
                self._part_md5s.append(self._md5.digest())
                self._md5, self._in_part = hashlib.md5(), 0

    def digest(self) -> FileDigest:
        if self.position != self.size_bytes:
            raise RuntimeError(f"hashed {self.position} of {self.size_bytes} bytes")
        md5s = list(self._part_md5s)
        if self._md5 is not None and (self._in_part or not md5s):
            md5s.append(self._md5.digest())  # the last, shorter part (or an empty file)
        return FileDigest(
            xxh3_128=self._xxh.hexdigest(),
            part_md5s=tuple(md5s),
            sha256=self._sha256.hexdigest() if self._sha256 is not None else None,
        )


def hash_fd(fd: int, size_bytes: int, md5_part_bytes: int | None = None, sha256: bool = False) -> FileDigest:
    """The digest of the first `size_bytes` of a file that is already complete.

    The page cache is left as it was found (adapters/page_cache.py): a verify or a publish reads
    the whole model, and must not take memory the size of it from the GPU that shares it.
    """
    hasher = PrefixHasher(size_bytes, md5_part_bytes, sha256)
    if size_bytes <= READ_MAX_BYTES:
        hasher.feed(fd, size_bytes)
        return hasher.digest()
    # Which pages were cached is asked a window ahead (the kernel's readahead of one window
    # brings in the start of the next), and pages are dropped a window behind (a mapping's
    # read-around reaches back into the window before).
    before = {0: page_cache.resident_pages(fd, 0, min(WINDOW_BYTES, size_bytes))}
    for start in range(0, size_bytes, WINDOW_BYTES):
        end = min(size_bytes, start + WINDOW_BYTES)
        if end < size_bytes:
            before[end] = page_cache.resident_pages(fd, end, min(WINDOW_BYTES, size_bytes - end))
        hasher.feed(fd, end)
        if start >= WINDOW_BYTES:
            page_cache.drop_new_pages(fd, start - WINDOW_BYTES, before.pop(start - WINDOW_BYTES))
    last = max(before)
    page_cache.drop_new_pages(fd, last, before[last])
    return hasher.digest()


def xxh3_of(data: bytes) -> str:
    """xxh3-128 of a small object held in memory (a signature bundle)."""
    return str(xxhash.xxh3_128(data).hexdigest())
