"""Hashing files on local disk, front to back, while their later parts are still arriving.

Parts of a file land in any order, but xxh3-128 and MD5 must see the bytes in
order. A `PrefixHasher` follows the contiguous prefix of landed parts and hashes
each newly completed stretch straight from the page cache, so when the last part
lands almost nothing is left to hash: the verification pass overlaps with the
download instead of following it.

A whole-file read (`hash_fd`: verify, publish) uses `preadv` into one 1 MiB buffer per
thread, which the digests then take from the CPU cache. Both the read and the hashing release
the interpreter lock (xxhash above 64 KiB, hashlib above 2 KiB), so hashing runs beside the
transfer threads and holds the lock only between calls: about 1,000 times a GiB. A pull's read
back of the parts that landed ahead of its hasher maps the staging file instead, a window at a
time (`feed_mapped`): the pages are hashed where they lie, without the copy out, which on this
machine's kernel ran at 1-1.5 GB/s. Its mappings are made through ctypes, which lets go of the
lock for `mmap` and `munmap`; Python's `mmap`, used before, held it through both while they
waited for the address-space lock that every other thread's page faults take (270 ms of lock
per GiB with two hashers, BENCHMARKS.md, "The serial ceiling"). Memory: one buffer per thread
that reads, whatever the file's size; a mapping holds no memory of its own.

SHA-256 (what an OpenSSF model signature lists) is computed in the same pass, from the same
buffer, only when the caller asks: unsigned pulls pay nothing. The digests take the buffer
one after the other while it is still in the CPU cache, each in one call: a digest fed a
slice at a time (as from a mapping, whose reads of the page cache cost as much CPU as xxh3
itself) took the interpreter lock again for every slice.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import threading
from typing import NamedTuple

import xxhash

from modelsync.adapters import page_cache

#: bytes read and hashed per call: the CPU cache still holds them when the digests read them,
#: and the interpreter lock is taken once per MiB
READ_BYTES = 1024 * 1024
#: a read back maps this much of the file at a time (`PrefixHasher.feed_mapped`)
MAP_BYTES = 8 * 1024 * 1024
#: a whole-file read manages the page cache a window at a time (adapters/page_cache.py)
WINDOW_BYTES = 8 * 1024 * 1024
#: a file up to this size is read without asking which of its pages were cached: for a 64 KiB
#: file, the mapping `mincore` needs costs three times the CPU of the read
SMALL_FILE_BYTES = 256 * 1024


class _ReadBuffer(threading.local):
    buf: bytearray | None = None


_read_buffer = _ReadBuffer()


def _buffer() -> memoryview:
    """This thread's read buffer, made on its first hash: threads that never hash take none."""
    if _read_buffer.buf is None:
        _read_buffer.buf = bytearray(READ_BYTES)
    return memoryview(_read_buffer.buf)


def sha256_slots() -> int:
    """Files to hash at once when SHA-256 is on: one per usable core, at least 2, at most 16.

    One file's SHA-256 is sequential and runs at about 1.6 GiB/s on a core with the SHA
    extensions (xxh3 at about 10): the two hashers that keep up with any link for xxh3 would
    cap a signed pull at about 3 GiB/s on a node that downloads faster. Each hasher maps one
    window at a time, so this is also the bound on mapped page cache.
    """
    return max(2, min(16, len(os.sched_getaffinity(0))))


class FileDigest(NamedTuple):
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
        buf = _buffer()
        while self.position < end:
            view = buf[: min(READ_BYTES, end - self.position)]
            n = os.preadv(fd, [view], self.position)
            if n == 0:
                raise ValueError(f"file ends at {self.position}, before {end}")
            self._update(view if n == len(view) else view[:n])
            self.position += n

    def feed_mapped(self, fd: int, end: int) -> None:
        """Hash `[position, end)` of `fd` through read-only mappings, a window at a time: a pull's
        read back of the parts that landed ahead of the hasher.

        A mapped page is hashed where it lies, not copied out first: reading back the three
        16 MiB parts of a cold 64 MiB pull took 32-48 ms with `preadv` and 16-19 ms mapped
        (BENCHMARKS.md, "Issue 18: reading back through a mapping"). Only for a file no one
        else can shorten, a pull's staging file under its model's lock: a mapped page past the
        end of the file is SIGBUS, not an exception. A file already shorter than `end` (its
        journal claimed what a crash lost) is read instead, which says where it ends. Blocking,
        like `feed`.
        """
        end = min(end, self.size_bytes)
        if end > self.position and os.fstat(fd).st_size < end:
            self.feed(fd, end)
            return
        while self.position < end:
            base = self.position - self.position % mmap.PAGESIZE
            stop = min(end, base + MAP_BYTES)
            with page_cache.mapped(fd, base, stop - base) as window:
                if window is None:
                    self.feed(fd, end)
                    return
                with window[self.position - base :] as stretch:
                    self._update(stretch)
            self.position = stop

    def update(self, data: memoryview) -> None:
        """Hash `data`, the bytes at `position`: a stretch still in a receive buffer, not read back."""
        self._update(data)
        self.position += len(data)

    def take(self, offset: int, data: memoryview) -> None:
        """Hash `data`, just written at `offset`, if it continues the prefix; bytes anywhere else
        are left for `feed` to read back."""
        if offset == self.position:
            self.update(data)

    def _update(self, data: memoryview) -> None:
        self._xxh.update(data)
        if self._sha256 is not None:
            self._sha256.update(data)
        self._update_md5(data)

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
    if size_bytes <= SMALL_FILE_BYTES:
        hasher.feed(fd, size_bytes)
        return hasher.digest()
    # The read-ahead is this loop's own, one window ahead, after asking which pages of that
    # window were cached: the kernel's would reach past it (up to the device's read_ahead_kb,
    # 8 MiB here) into pages not yet asked about, which would then count as cached and stay.
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
    try:
        ahead = _ask_and_read_ahead(fd, 0, size_bytes)
        for start in range(0, size_bytes, WINDOW_BYTES):
            end = min(size_bytes, start + WINDOW_BYTES)
            before, ahead = ahead, _ask_and_read_ahead(fd, end, size_bytes)
            hasher.feed(fd, end)
            page_cache.drop_new_pages(fd, start, before)
    finally:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_NORMAL)
    return hasher.digest()


def _ask_and_read_ahead(fd: int, start: int, size_bytes: int) -> bytes | None:
    """Which pages of the window at `start` are cached; then have the kernel read it in."""
    if start >= size_bytes:
        return None
    length = min(WINDOW_BYTES, size_bytes - start)
    resident = page_cache.resident_pages(fd, start, length)
    os.posix_fadvise(fd, start, length, os.POSIX_FADV_WILLNEED)
    return resident


def xxh3_of(data: bytes) -> str:
    """xxh3-128 of a small object held in memory (a signature bundle)."""
    return str(xxhash.xxh3_128(data).hexdigest())
