"""Foreground pulls announce themselves, so the daemon's background prefetch yields to them.

An init container blocked on `modelsync pull` holds a vLLM pod; the daemon's
prefetch of a model needed in an hour can wait. While a foreground pull waits
or pulls, it holds a shared flock on `<cache>/.modelsync/foreground/<slug>`
(the file holds the model id). The last announcer of a model removes the file
as it leaves. The daemon lists that directory every second: a file whose lock
it can take exclusively belongs to a pull that died (or has just ended), and is
removed; the others are live. `gc` removes such files too. flock works across containers that
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
            _release(foreground_dir(cache_root) / ref.slug, fd)


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


def _release(path: Path, fd: int) -> None:
    """Stop announcing; the last announcer of the model removes the file, so markers never pile up.

    The file is removed only under an exclusive lock, which no other announcer can
    hold at once; one that opened it meanwhile sees it gone and makes a new one.
    """
    try:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino:
                path.unlink()
    finally:
        os.close(fd)  # drops the lock


def live_foreground(cache_root: Path) -> frozenset[str]:
    """Model ids that a running foreground pull has announced; stale markers are removed."""
    live = _sweep(cache_root, remove=True)[0]
    return frozenset(live)


def stale_markers(cache_root: Path) -> list[Path]:
    """Markers no pull holds any more (a pull killed before it could remove its own), for `gc`."""
    return _sweep(cache_root, remove=False)[1]


def remove_if_stale(path: Path) -> bool:
    """Remove a marker under its exclusive lock, unless a pull holds it (again)."""
    try:
        return _live_model(path, remove=True) is None
    except OSError:
        return False


def _sweep(cache_root: Path, remove: bool) -> tuple[set[str], list[Path]]:
    """The live markers' model ids, and the stale markers (removed under their lock when `remove`)."""
    directory = foreground_dir(cache_root)
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return set(), []
    live: set[str] = set()
    stale: list[Path] = []
    for name in names:
        with contextlib.suppress(OSError):
            model_id = _live_model(directory / name, remove)
            if model_id is None:
                stale.append(directory / name)
            elif model_id:
                live.add(model_id)
    return live, stale


def _live_model(path: Path, remove: bool) -> str | None:
    """The model id of a held marker; None when nobody holds it."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return os.pread(fd, 4096, 0).decode("utf-8", "replace")  # "" while it is being written
        if remove:
            path.unlink()  # nobody holds it: the pull has ended
        return None
    finally:
        os.close(fd)
