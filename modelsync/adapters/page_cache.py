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

import contextlib
import ctypes
import functools
import mmap
import os
from collections.abc import Callable, Iterator
from typing import cast

from modelsync.adapters.libc import load_libc

_PROT_READ, _MAP_SHARED = 1, 1
_MAP_FAILED = ctypes.c_void_p(-1).value
#: PyBUF_READ: the view refuses writes (the pages are mapped read-only: a write would be SIGSEGV)
_PYBUF_READ = 0x100
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


@functools.cache
def _memory_view() -> Callable[[int, int, int], memoryview]:
    """The C API's `PyMemoryView_FromMemory`: a view of memory Python does not own, read-only from
    the start, in one call (a ctypes array over it would need a new array type per length)."""
    make = ctypes.pythonapi.PyMemoryView_FromMemory
    make.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int]
    make.restype = ctypes.py_object
    return cast("Callable[[int, int, int], memoryview]", make)


@contextlib.contextmanager
def _mapping(fd: int, offset: int, length: int) -> Iterator[int | None]:
    """The address of `[offset, offset + length)` of `fd` mapped read-only for the block, or None
    when it cannot be (no libc, or the kernel refused)."""
    libc = _libc()
    addr = None
    if libc is not None and length > 0:
        addr = libc.mmap(None, length, _PROT_READ, _MAP_SHARED, fd, offset)
    if libc is None or addr is None or addr == _MAP_FAILED:
        yield None
        return
    try:
        yield addr
    finally:
        libc.munmap(addr, length)


@contextlib.contextmanager
def mapped(fd: int, offset: int, length: int) -> Iterator[memoryview | None]:
    """`[offset, offset + length)` of `fd` as a read-only view for the block, or None when it cannot
    be mapped: the caller then reads it instead.

    Through ctypes, which lets go of the interpreter lock for `mmap` and `munmap`: Python's own
    `mmap` holds it through both, and they wait for the address-space lock that every other
    thread's page faults take. The view is released on the way out, before the unmap. `offset`
    must be a multiple of the page size, and the file at least `offset + length` long: a mapped
    page past its end is SIGBUS, not an exception.
    """
    with _mapping(fd, offset, length) as addr:
        if addr is None:
            yield None
            return
        view = _memory_view()(addr, length, _PYBUF_READ)
        try:
            yield view
        finally:
            view.release()


def resident_pages(fd: int, offset: int, length: int) -> bytes | None:
    """One byte per page of `[offset, offset + length)`, bit 0 set where the page is cached.

    `offset` must be a multiple of the page size. None when it cannot be told (no libc, or the
    kernel refused the mapping): then the caller keeps every page.
    """
    libc = _libc()
    with _mapping(fd, offset, length) as addr:
        if libc is None or addr is None:
            return None
        vec = ctypes.create_string_buffer(-(-length // mmap.PAGESIZE))
        if libc.mincore(addr, length, vec) != 0:
            return None
        return vec.raw


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
