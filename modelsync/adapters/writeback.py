"""When written pages reach the disk: started early, waited for and dropped once hashed, made durable.

Written data otherwise sits dirty until the kernel's limits force writeback, and
then every writer is throttled at once (docs/perf-lab.md, the write path); pages a
pull has already hashed are not needed in memory again.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path

from modelsync.adapters import fs
from modelsync.adapters.libc import last_errno, load_libc

_SYNC_FILE_RANGE_WAIT_BEFORE, _SYNC_FILE_RANGE_WRITE, _SYNC_FILE_RANGE_WAIT_AFTER = 1, 2, 4


@functools.cache
def _sync_file_range() -> Callable[[int, int, int, int], int] | None:
    libc = load_libc()
    fn = getattr(libc, "sync_file_range", None) if libc is not None else None
    if fn is None:
        return None
    import ctypes

    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn  # type: ignore[no-any-return]


def start_writeback(fd: int, start: int, length: int) -> None:
    """Ask the kernel to start writing this range to disk now, without waiting for it.

    Written data otherwise sits dirty until the kernel's limits force writeback, and
    then every writer is throttled at once (see docs/perf-lab.md, the write path).
    """
    fn = _sync_file_range()
    if fn is not None:
        fn(fd, start, length, _SYNC_FILE_RANGE_WRITE)


def write_behind(fd: int, start: int, length: int) -> None:
    """Wait until this range is written to disk, then drop it from the page cache.

    For data already read back (hashed): it is not needed in memory again before the
    final fdatasync, and keeping it would fill the page cache with a model's worth of
    pages that the kernel must reclaim while the download goes on. Not a durability
    guarantee (metadata is not flushed); the per-file fdatasync still is.
    """
    fn = _sync_file_range()
    if fn is None:
        return
    if fn(fd, start, length, _SYNC_FILE_RANGE_WAIT_BEFORE | _SYNC_FILE_RANGE_WRITE
          | _SYNC_FILE_RANGE_WAIT_AFTER) != 0:
        err = last_errno()
        raise OSError(err, os.strerror(err))
    os.posix_fadvise(fd, start, length, os.POSIX_FADV_DONTNEED)


def sync_data(fd: int, path: Path) -> None:
    """fdatasync `fd`, the file at `path`: its data and size are durable; errno becomes a storage error.

    A full or failing disk can refuse here what the writes before were allowed to
    queue (ENOSPC, EDQUOT, EIO); the caller hears it as DiskFullError or
    LocalStorageError naming the file, not as a bare OSError.
    """
    with fs.storage_errors(path):
        os.fdatasync(fd)


def syncfs(fd: int) -> bool:
    """Flush the whole file system holding `fd` (data and metadata); False where libc lacks it.

    Errors (EIO) are raised: since Linux 5.8 syncfs reports writeback errors.
    """
    libc = load_libc()
    fn = getattr(libc, "syncfs", None) if libc is not None else None
    if fn is None:
        return False
    if fn(fd) != 0:
        err = last_errno()
        raise OSError(err, os.strerror(err))
    return True
