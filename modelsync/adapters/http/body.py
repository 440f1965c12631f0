"""A response body from a socket into a file at its offset: the data plane's copy loop.

Two copies and no more: the kernel fills one preallocated buffer per thread
(``recv_into``, with ``MSG_WAITALL`` on plain TCP so one call fills it), and
``os.pwrite`` writes each full buffer at its offset; both release the GIL. A
body that breaks off still leaves every byte received on disk, and the error
says how many, so the caller resumes exactly there. Each buffer, once written,
is offered to ``on_written`` (the file's hasher takes it when it is at its
front: engine/hashing.py), so it need not be read back from the page cache.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import Protocol

from modelsync.adapters.fs import storage_error
from modelsync.core.ranges import OnWritten
from modelsync.errors import LocalStorageError, TransientFetchError

#: How often a transfer reports progress. Every report takes two locks and a clock read while
#: holding the interpreter lock; once per 1 MiB buffer that was a per-byte cost of the serial
#: ceiling, once per 8 MiB it is an eighth of it, and a progress line still moves many times
#: a second at any rate worth showing.
PROGRESS_EVERY_BYTES = 8 * 1024 * 1024


class RateLimiter(Protocol):
    """A shared bandwidth cap; ``consume`` blocks until ``n_bytes`` may pass."""

    def consume(self, n_bytes: int) -> None: ...


def receive_into_file(
    sock: socket.socket,
    buf: memoryview,
    early: int,
    want: int,
    fd: int,
    file_offset: int,
    flags: int,
    limiter: RateLimiter | None,
    on_progress: Callable[[int], None] | None,
    on_written: OnWritten | None = None,
) -> int:
    """Receive ``want`` body bytes through ``buf`` (its first ``early`` already there) into ``fd``.

    Writes each full buffer at its offset; returns the bytes written (``want``).
    ``on_progress`` is called with the bytes written at least every ``PROGRESS_EVERY_BYTES``
    and once more with the rest, also when the body breaks off.
    """
    cap = len(buf)
    fill = early
    remaining = want - early
    written = reported = 0
    try:
        while remaining > 0:
            ask = min(cap - fill, remaining)
            try:
                n = sock.recv_into(buf[fill : fill + ask], ask, flags)
            except OSError as exc:
                written += pwrite_all(fd, buf[:fill], file_offset + written)
                raise transient_error(exc, written) from exc
            if n == 0:
                written += pwrite_all(fd, buf[:fill], file_offset + written)
                raise TransientFetchError(
                    f"body ended after {written} of {want} bytes",
                    bytes_written=written,
                    reason="truncated",
                )
            if limiter is not None:
                limiter.consume(n)
            fill += n
            remaining -= n
            if fill == cap:
                written += _write(fd, buf[:fill], file_offset + written, on_written)
                fill = 0
                if on_progress is not None and written - reported >= PROGRESS_EVERY_BYTES:
                    on_progress(written - reported)
                    reported = written
        if fill:  # the tail, or a body that arrived whole with the head
            written += _write(fd, buf[:fill], file_offset + written, on_written)
    finally:
        if on_progress is not None and written > reported:
            on_progress(written - reported)
    return written


def _write(
    fd: int, data: memoryview, offset: int, on_written: OnWritten | None
) -> int:
    """`pwrite_all`, then the written bytes to `on_written` while they are still in the buffer."""
    n = pwrite_all(fd, data, offset)
    if on_written is not None:
        on_written(offset, data)
    return n


def pwrite_all(fd: int, data: memoryview, offset: int) -> int:
    """Write all of ``data`` at ``offset``; a failure is ``fs.storage_error``'s (full disk: DiskFullError)."""
    done = 0
    total = len(data)
    while done < total:
        try:
            n = os.pwrite(fd, data[done:], offset + done)
        except OSError as exc:
            raise storage_error(exc, _fd_path(fd)) from exc
        if n == 0:
            raise LocalStorageError("pwrite wrote nothing")
        done += n
    return total


def _fd_path(fd: int) -> str:
    """Where the file being written lives, for the error's message (Linux names it in /proc)."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return f"the download (file descriptor {fd})"


def transient_error(exc: OSError, written: int) -> TransientFetchError:
    """A socket failure as a retryable error that says how many bytes of the range were written."""
    if isinstance(exc, TimeoutError | BlockingIOError):
        reason = "timeout"
    elif isinstance(exc, ConnectionError):
        reason = "reset"
    else:
        reason = "io"
    return TransientFetchError(f"{reason}: {exc}", bytes_written=written, reason=reason)
