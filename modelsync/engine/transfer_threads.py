"""The transfer threads: blocking calls run for the event loop, their results handed back in batches.

`loop.run_in_executor` costs each call a concurrent future chained to an asyncio
one, and a wake-up of the event loop (a write to its self-pipe) when it ends:
about 65 µs of CPU a call on this machine, against 13 µs for the task that waits
on it. A model of thousands of small files pays that once a file, on the one
thread every file shares. Here a finished call is queued, and only the first one
of a batch schedules a callback on the loop, which settles every future finished
by then (about 25 µs a call, measured the same way).

Semantics are those of a `ThreadPoolExecutor` the engine relies on: a call that
has started runs to its end and its future stays pending until then (`in_thread`
waits for it on cancellation), and `shutdown` cancels the calls no thread has
taken yet, then joins the threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import signal
import threading
from collections.abc import Callable
from typing import Any, TypeVar

_T = TypeVar("_T")

_Job = tuple["asyncio.Future[Any]", Callable[..., Any], tuple[Any, ...]]
_Outcome = tuple["asyncio.Future[Any]", Any, BaseException | None]


def leave_signals_to_the_main_thread() -> None:
    """Block Ctrl-C and SIGTERM in the calling (worker) thread.

    The kernel then hands those signals to the main thread: delivered to a worker,
    a signal would wait until the event loop woke for some other reason, a 30 s
    read timeout when every transfer is stalled.
    """
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})


class TransferThreads:
    """`threads` threads running calls submitted from the event loop `loop` (and only from it)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        threads: int,
        name: str,
        initializer: Callable[[], None],
    ) -> None:
        self._loop = loop
        self._initializer = initializer
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._finished: list[_Outcome] = []
        self._settle_scheduled = False
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True) for i in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, fn: Callable[..., _T], *args: Any) -> asyncio.Future[_T]:
        """Run `fn(*args)` in a transfer thread; its future, settled on the loop."""
        future: asyncio.Future[_T] = self._loop.create_future()
        self._jobs.put((future, fn, args))
        return future

    def shutdown(self) -> None:
        """Cancel the calls no thread has started, then stop and join the threads (blocks)."""
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job[0].cancel()
        for _ in self._threads:
            self._jobs.put(None)
        for thread in self._threads:
            thread.join()

    def _work(self) -> None:
        self._initializer()
        while True:
            job = self._jobs.get()
            if job is None:
                return
            future, fn, args = job
            try:
                outcome: _Outcome = (future, fn(*args), None)
            except BaseException as exc:  # handed to the awaiting task, as an executor does
                outcome = (future, None, exc)
            del job, fn, args  # the call's arguments (a file's descriptor) are not kept alive here
            with self._lock:
                self._finished.append(outcome)
                schedule = not self._settle_scheduled
                self._settle_scheduled = True
            del outcome
            if schedule:
                with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
                    self._loop.call_soon_threadsafe(self._settle)

    def _settle(self) -> None:
        """On the loop: settle every future whose call has finished since the last batch."""
        with self._lock:
            finished, self._finished = self._finished, []
            self._settle_scheduled = False
        for future, result, exc in finished:
            if future.done():  # cancelled by its waiter meanwhile
                continue
            if exc is None:
                future.set_result(result)
            else:
                future.set_exception(exc)


async def in_thread(future: asyncio.Future[_T], on_cancel: Callable[[], None] | None = None) -> _T:
    """Await a transfer thread; when cancelled, first wait until the thread has stopped.

    A cancelled task cannot stop a thread blocked on its socket: it keeps writing at
    its offsets until the body ends, its socket is shut down (`FetchWindow.close`), or
    `read_timeout_s` passes. The descriptor it writes to must stay open until then,
    or its late writes land on a closed descriptor, or on whatever file reuses that
    number (the restarted file, another file of the model, the journal). So
    cancellation waits for the thread; after an abort that is at once. `on_cancel` tells a
    call that runs several transfers to stop after the one under way.
    """
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        if on_cancel is not None:
            on_cancel()
        while not future.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait([future])
        if not future.cancelled():
            future.exception()  # retrieved: the cancellation is what propagates
        raise
