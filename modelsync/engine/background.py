"""How the daemon's loop runs a pull in the background and reports it.

The loop reports through `LoopObserver`, which the edge's Prometheus metrics
(modelsync/metrics.py) implement: the engine never imports the edge. A pull's
own events go to the observer (bytes) and to the log (waits, progress, notes).

Pulls run in a daemon thread each, never in the event loop's default executor:
a pull blocked on another process's lock cannot be interrupted, and a daemon
thread cannot keep the process from exiting on SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, Protocol, TypeVar

from modelsync.core.plan import NodePlan
from modelsync.core.units import format_bytes
from modelsync.engine.events import status

log = logging.getLogger("modelsync.daemon")
_T = TypeVar("_T")

#: seconds between progress lines of a daemon pull in the log
PROGRESS_LOG_S = 30.0


class LoopObserver(Protocol):
    """What the daemon's loop reports; `modelsync.metrics.DaemonMetrics` exports it."""

    def fetched(self, n_bytes: int) -> None:
        """Bytes written by a pull; called from transfer threads."""

    def observe_plan(self, plan: NodePlan, reconciled_at: float) -> None:
        """A new node plan (epoch seconds of the reconcile)."""

    def pull_succeeded(self, label: str, seconds: float, margin_s: float | None) -> None:
        """A model became ready, `margin_s` before its window (negative when late)."""

    def pull_failed(self, code: str, integrity: bool) -> None:
        """A pull failed with the error `code`; `integrity`: its bytes were not what the source vouched."""

    def evicted(self, models: int) -> None:
        """A pull's space reservation evicted this many models."""

    def set_paused(self, paused: bool) -> None:
        """Background work paused for a foreground pull, or resumed."""


class PullLog:
    """PullEvents of a daemon pull: bytes go to the observer, waits and progress to the log.

    Progress is logged at most every PROGRESS_LOG_S, from the worker thread that
    reports bytes, so a pull of hours shows how far it is between "pulling" and "ready".
    """

    def __init__(
        self, observer: LoopObserver, label: str, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._observer = observer
        self._label = label
        self._clock = clock
        self._lock = threading.Lock()
        self._missing = 0
        self._done = 0
        self._again = 0
        self._started = clock()
        self._next_log = math.inf

    def waiting(self, holder: str) -> None:
        log.info("waiting for %s, which is pulling %s", holder, self._label, extra={"model": self._label})

    def planned(self, files: int, total_bytes: int, missing_bytes: int) -> None:
        if not missing_bytes:
            return  # a refresh check that found nothing to fetch
        with self._lock:
            self._missing, self._done = missing_bytes, 0
            self._started = self._clock()
            self._next_log = self._started + PROGRESS_LOG_S
        log.info(
            "pulling %s: %d %s, %s to fetch",
            self._label,
            files,
            "file" if files == 1 else "files",
            format_bytes(missing_bytes),
            extra={"model": self._label, "total_bytes": total_bytes, "missing_bytes": missing_bytes},
        )

    def fetched(self, n_bytes: int) -> None:
        self._observer.fetched(n_bytes)
        with self._lock:
            self._done += n_bytes
            now = self._clock()
            if now < self._next_log:
                return
            self._next_log = now + PROGRESS_LOG_S
            done, missing, elapsed_s, again = self._done, self._missing, now - self._started, self._again
        log.info(
            "pulling %s: %s",
            self._label,
            status(done, missing, elapsed_s, again),
            extra={"model": self._label, "fetched_bytes": done, "missing_bytes": missing},
        )

    def refetching(self, n_bytes: int) -> None:
        with self._lock:
            moved = min(n_bytes, self._done)
            self._done -= moved
            self._again += moved

    def verifying(self, path: str) -> None:
        pass

    def note(self, message: str) -> None:
        log.info("%s: %s", self._label, message, extra={"model": self._label})

    def damaged(self, path: str, reason: str) -> None:
        log.warning("%s/%s: %s; fetching it again", self._label, path, reason, extra={"model": self._label})


async def first_of(*waits: Coroutine[Any, Any, object]) -> None:
    """Return when the first of the coroutines finishes; cancel the rest."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()


def in_daemon_thread(work: Callable[[], _T], name: str) -> asyncio.Future[_T]:
    """Run `work` in a daemon thread; the future resolves on the calling loop."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[_T] = loop.create_future()

    def deliver(result: _T | None, exc: BaseException | None) -> None:
        if future.done():
            return
        if exc is not None:
            future.set_exception(exc)
        else:
            assert result is not None
            future.set_result(result)

    def target() -> None:
        try:
            result = work()
        except BaseException as exc:  # the loop decides what a failure means
            with contextlib.suppress(RuntimeError):  # the loop has closed: nobody is waiting
                loop.call_soon_threadsafe(deliver, None, exc)
        else:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(deliver, result, None)

    threading.Thread(target=target, name=name, daemon=True).start()
    return future
