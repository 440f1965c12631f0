"""What the engine tells its caller while it works: progress and waits.

The engine reports through this protocol and never prints; the CLI renders a
bar or plain lines, the daemon turns the same calls into metrics.
"""

from __future__ import annotations

import threading
from typing import Protocol

from modelsync.core.units import format_bytes


class PullEvents(Protocol):
    def waiting(self, holder: str) -> None:
        """Another process holds the model's lock and is pulling it."""

    def planned(self, files: int, total_bytes: int, missing_bytes: int) -> None:
        """The plan is known: how much is there and how much must still be fetched."""

    def fetched(self, n_bytes: int) -> None:
        """Bytes written; called from worker threads."""

    def verifying(self, path: str) -> None:
        """A file is complete and is being hashed."""

    def note(self, message: str) -> None:
        """Something the user should know about how the pull runs (one line, no prefix)."""

    def damaged(self, path: str, reason: str) -> None:
        """A file of the ready model is damaged: the model leaves the ready set, the file is fetched again."""

    def refetching(self, n_bytes: int) -> None:
        """`n_bytes` already reported as fetched are fetched again (a file failed its check)."""


class ByteCounter:
    """Thread-safe running totals a renderer can poll."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.fetched_bytes = 0

    def fetched(self, n_bytes: int) -> None:
        with self._lock:
            self.fetched_bytes += n_bytes


class NoEvents:
    """For callers that want no reports (tests, the daemon's background work)."""

    def waiting(self, holder: str) -> None:
        pass

    def planned(self, files: int, total_bytes: int, missing_bytes: int) -> None:
        pass

    def fetched(self, n_bytes: int) -> None:
        pass

    def verifying(self, path: str) -> None:
        pass

    def note(self, message: str) -> None:
        pass

    def damaged(self, path: str, reason: str) -> None:
        pass

    def refetching(self, n_bytes: int) -> None:
        pass


def status(done_bytes: int, total_bytes: int, elapsed_s: float, again_bytes: int = 0) -> str:
    """`1.2 GiB/4.0 GiB  30.0% 120.5 MiB/s`: how far a transfer is and how fast it goes.

    Never past 100%: bytes fetched a second time (`again_bytes`, and any excess of
    `done_bytes` over the total) are shown apart, `(+61.3 MiB again)`, and count in the rate.
    """
    again = again_bytes + max(0, done_bytes - total_bytes)
    done = min(done_bytes, total_bytes)
    rate = (done + again) / max(elapsed_s, 1e-6)
    pct = 100.0 * done / total_bytes if total_bytes else 100.0
    extra = f" (+{format_bytes(again)} again)" if again else ""
    return f"{format_bytes(done)}/{format_bytes(total_bytes)} {pct:5.1f}%{extra} {format_bytes(int(rate))}/s"
