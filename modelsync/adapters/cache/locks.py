"""Per-model locks: an exclusive flock per model, and who holds it.

The kernel releases a flock when its holder dies, even by kill -9. Correctness
never rests on the lock (see adapters/cache/ready.py); it only spares duplicate
downloads and keeps maintenance off a model being pulled.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from modelsync.adapters import fs
from modelsync.core.units import format_bytes


class ModelLock:
    """An exclusive flock per model; the kernel releases it when its holder dies, even by kill -9."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.holder_path = path.with_suffix(".holder")
        self._fd: int | None = None

    def acquire(self, on_wait: Callable[[str], None] | None = None, poll_s: float = 0.2) -> None:
        """Block until held; `on_wait` is called now and then with who holds it and how far it is."""
        next_report = 0.0
        while not self.try_acquire():
            now = time.monotonic()
            if on_wait is not None and now >= next_report:
                on_wait(self.describe_holder())
                next_report = now + 5.0
            time.sleep(poll_s)
        self.update_holder()

    def try_acquire(self) -> bool:
        """Take the lock if it is free; never waits."""
        with fs.storage_errors(self.path):
            fd = os.open(self.path, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, fs.FILE_MODE)
        fs.share_with_group(fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def update_holder(self, done_bytes: int = 0, total_bytes: int = 0) -> None:
        """Tell waiters who holds the model and how far the pull is (best effort)."""
        holder = {
            "pid": os.getpid(),
            "host": os.uname().nodename,
            "done_bytes": done_bytes,
            "total_bytes": total_bytes,
        }
        with contextlib.suppress(OSError):
            fs.write_atomic(self.holder_path, json.dumps(holder).encode(), fsync=False)

    def describe_holder(self) -> str:
        try:
            holder = json.loads(self.holder_path.read_bytes())
            who = f"pid {holder['pid']} on {holder['host']}"
            done, total = int(holder["done_bytes"]), int(holder["total_bytes"])
        except (OSError, ValueError, KeyError, TypeError):
            return "another process"
        return f"{who} ({format_bytes(done)} of {format_bytes(total)})" if total else who

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):  # gone already, or a read-only mount
                self.holder_path.unlink()
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None


def lock_is_held(path: Path) -> bool:
    """Whether some process holds the lock at `path` (a pull in progress), without waiting."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False
