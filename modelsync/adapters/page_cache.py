"""Reading a file through without leaving it in the page cache: the pages a read brought in go.

A `verify --full` or a `publish` reads every byte of a model once. Left alone, the kernel keeps
all of it cached: on a DGX Spark, whose 128 GB are shared by the CPU and the GPU, verifying a
100 GB model would take 100 GB of the memory the GPU serves from (measured in BENCHMARKS.md,
"The page cache"). So a whole-file read asks, per stretch, which pages were resident before
(`mincore` on a throwaway mapping) and afterwards drops only the others
(`posix_fadvise(DONTNEED)`): pages vLLM or a warm pull had loaded stay where they were.

Without `mincore` (no libc found) nothing is dropped: the read is still correct, only hungrier.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import os

from modelsync.adapters.libc import load_libc

_PROT_READ, _MAP_SHARED = 1, 1
_MAP_FAILED = ctypes.c_void_p(-1).value
#: mincore's byte per page as 1 (cached) or 0, so runs are found with bytes.find, not a Python loop
_CACHED_BIT = bytes(i & 1 for i in range(256))


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """The process's one libc handle (adapters/libc.py), with the signatures of the calls used here."""
    libc = load_libc()
    if libc is None:
        return None
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int64]
    libc.mmap.restype = ctypes.c_void_p
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    return libc


def resident_pages(fd: int, offset: int, length: int) -> bytes | None:
    """One byte per page of `[offset, offset + length)`, bit 0 set where the page is cached.

    `offset` must be a multiple of the page size. None when it cannot be told (no libc, or the
    kernel refused the mapping): then the caller keeps every page.
    """
    libc = _libc()
    if libc is None or length <= 0:
        return None
    addr = libc.mmap(None, length, _PROT_READ, _MAP_SHARED, fd, offset)
    if addr is None or addr == _MAP_FAILED:
        return None
    try:
        vec = ctypes.create_string_buffer(-(-length // mmap.PAGESIZE))
        if libc.mincore(addr, length, vec) != 0:
            return None
        return vec.raw
    finally:
        libc.munmap(addr, length)


def drop_new_pages(fd: int, offset: int, before: bytes | None) -> None:
    """Drop from the page cache the pages of the stretch at `offset` that `before` says were not there."""
    if before is None:
        return
    page, cached = mmap.PAGESIZE, before.translate(_CACHED_BIT)
    start = cached.find(0)
    while start >= 0:
        end = cached.find(1, start)
        end = len(cached) if end < 0 else end
        os.posix_fadvise(fd, offset + start * page, (end - start) * page, os.POSIX_FADV_DONTNEED)
        start = cached.find(0, end)
