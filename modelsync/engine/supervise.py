"""A pull's event loop, supervised: a cancelled pull aborts its transfers first, then its tasks.

Cancelled means Ctrl-C, SIGTERM, or the caller's cancel event set from
another thread (the daemon stopping a pull). Aborting closes the fetcher, which
shuts its sockets down before closing them: that wakes every transfer thread
blocked in `recv` at once (closing alone would leave each one waiting out its
read timeout), and backoff and gate waits run on the event loop, where
cancellation ends them. So a cancelled pull stops in well under a second even
when every transfer is stalled; the journal keeps what was written for the
next pull to resume.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from modelsync.engine.ports import RangeFetcher
from modelsync.engine.transfer_threads import leave_signals_to_the_main_thread
from modelsync.errors import PullCancelledError

#: how often a pull with a cancel event checks it; bounds how long a cancelled pull runs on
CANCEL_POLL_S = 0.1

_T = TypeVar("_T")


class Abort:
    """Stops every transfer of the pull now (their sockets close), or as soon as its fetcher opens."""

    def __init__(self) -> None:
        self._fetcher: RangeFetcher | None = None
        self._aborted = False

    def watch(self, fetcher: RangeFetcher) -> None:
        """The pull's fetcher, open now: closed at once if the pull was aborted meanwhile."""
        self._fetcher = fetcher
        if self._aborted:
            fetcher.close()

    def __call__(self) -> None:
        self._aborted = True
        if self._fetcher is not None:
            self._fetcher.close()


async def supervise(
    run: Callable[[Abort], Coroutine[Any, Any, _T]], cancel: threading.Event | None
) -> _T:
    """Run `run(abort)`; when it is cancelled, or `cancel` is set, abort the transfers, then cancel it.

    The loop's worker threads block SIGINT and SIGTERM (see
    `transfer_threads.leave_signals_to_the_main_thread`).
    """
    asyncio.get_running_loop().set_default_executor(
        ThreadPoolExecutor(thread_name_prefix="modelsync-io", initializer=leave_signals_to_the_main_thread)
    )
    abort = Abort()
    task = asyncio.ensure_future(run(abort))
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=CANCEL_POLL_S if cancel is not None else None)
            if cancel is not None and cancel.is_set() and not task.done():
                raise PullCancelledError("the pull was cancelled; it resumes from its journal")
        return task.result()
    except (asyncio.CancelledError, PullCancelledError):
        abort()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        raise
