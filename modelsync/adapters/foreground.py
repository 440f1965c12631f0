"""Foreground pulls announce themselves, so the daemon's background prefetch yields to them.

An init container blocked on `modelsync pull` holds a vLLM pod; the daemon's
prefetch of a model needed in an hour can wait. While a foreground pull waits
or pulls, it holds a shared flock on `<cache>/.modelsync/foreground/<slug>`
(the file holds the model id). The daemon lists that directory every second:
a file whose lock it can take exclusively belongs to a pull that has ended or
died, and is removed; the others are live. flock works across containers that
share the cache's filesystem, and the kernel drops it when its holder dies,
even by kill -9, so a crashed pull never pauses the daemon for good.

Announcing is best effort: a cache where the file cannot be made (read-only,
permissions) must not fail the pull itself.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from modelsync.adapters import fs
from modelsync.adapters.cache import STATE_DIR
from modelsync.core.refs import ModelRef

FOREGROUND_DIR = "foreground"
_OPEN_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC


def foreground_dir(cache_root: Path) -> Path:
    return cache_root / STATE_DIR / FOREGROUND_DIR


@contextlib.contextmanager
def announce(cache_root: Path, ref: ModelRef) -> Iterator[None]:
    """Hold this model's foreground marker for the duration of the block."""
    fd = None
    with contextlib.suppress(OSError):
        fd = _hold(foreground_dir(cache_root), ref)
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)  # drops the lock; the daemon removes the file


def _hold(directory: Path, ref: ModelRef) -> int:
    fs.make_dirs(directory)
    path = directory / ref.slug
    while True:
        fd = os.open(path, _OPEN_FLAGS, fs.FILE_MODE)
        fcntl.flock(fd, fcntl.LOCK_SH)
        # The daemon may have removed a stale file between our open and our lock:
        # a lock on an unlinked inode would announce nothing, so open it again.
        try:
            if os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino:
                os.pwrite(fd, ref.model_id.encode(), 0)
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


def live_foreground(cache_root: Path) -> frozenset[str]:
    """Model ids that a running foreground pull has announced; stale markers are removed."""
    directory = foreground_dir(cache_root)
    try:
        names = os.listdir(directory)
    except OSError:
        return frozenset()
    live: set[str] = set()
    for name in names:
        with contextlib.suppress(OSError):
            model_id = _live_model(directory / name)
            if model_id is not None:
                live.add(model_id)
    return frozenset(live)


def _live_model(path: Path) -> str | None:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return os.pread(fd, 4096, 0).decode("utf-8", "replace") or None
        path.unlink()  # nobody holds it: the pull has ended
        return None
    finally:
        os.close(fd)
