"""The daemon loop's one pull at a time: starting it, telling it to yield, and what its end means.

The loop (engine/reconcile.py) chooses what to pull; the slot runs it through
`ensure_ready` in a daemon thread (engine/background.py) and settles its end:

- **Yielding.** A pull that yields to a foreground pull (adapters/cache/
  foreground.py) or to a waiting pod is cancelled; a cancelled pull keeps its
  place in the queue and resumes from its journal.
- **Failures** wait their backoff (core/queue.py); one whose published model is
  at fault waits the longest at once, since only a republish fixes it.
- **Evictions** are counted from what each pull's space reservation reports,
  not inferred from models that left the cache (an operator's `modelsync
  evict` is not the daemon's doing).
- **Stopping** cancels the running pull and waits at most a grace period for
  it; the journal keeps the parts written.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from modelsync.core.queue import Job, JobQueue, yields_to_foreground, yields_to_request
from modelsync.core.refs import ModelRef
from modelsync.engine.background import LoopObserver, PullLog, in_daemon_thread
from modelsync.engine.ensure import PullResult, ReadyOptions
from modelsync.engine.events import PullEvents
from modelsync.engine.inventory import SizeLookup
from modelsync.engine.rules import PullRules
from modelsync.engine.tenant_requests import TenantRequests
from modelsync.errors import IntegrityError, ModelsyncError, ObjectChangedError, PullCancelledError

log = logging.getLogger("modelsync.daemon")


class EnsureReady(Protocol):
    """`engine.ensure.ensure_ready` with the node's backends bound, as the loop calls it."""

    def __call__(self, rules: PullRules, *, events: PullEvents, options: ReadyOptions) -> PullResult: ...


@dataclass(slots=True)
class Running:
    """The pull the loop runs now."""

    job: Job
    ref: ModelRef
    label: str
    cancel: threading.Event = field(default_factory=threading.Event)
    #: it was told to yield (foreground pull, waiting pod); a request stays queued
    paused: bool = False

    def pause(self) -> None:
        self.paused = True
        self.cancel.set()


class PullSlot:
    def __init__(
        self,
        ensure_ready: EnsureReady,
        observer: LoopObserver,
        queue: JobQueue,
        requests: TenantRequests,
        sizes: SizeLookup,
        margin_s: Callable[[str], float | None],
        on_ended: Callable[[], None],
        clock: Callable[[], float],
    ) -> None:
        """`margin_s`: seconds before its window a model became ready; `on_ended`: the loop wakes."""
        self._ensure_ready = ensure_ready
        self._observer = observer
        self._queue = queue
        self._requests = requests
        self._sizes = sizes
        self._margin_s = margin_s
        self._on_ended = on_ended
        self._clock = clock
        self.current: Running | None = None
        #: background prefetch waits while a foreground pull is announced
        self.paused = False

    def start(self, job: Job, ref: ModelRef, label: str, rules: PullRules, protected: dict[str, str]) -> None:
        """Run `job` in a daemon thread; `protected`: what its space reservation must not evict."""
        running = self.current = Running(job, ref, label)
        what = "refresh check of" if job.refresh else "prefetch"
        log.info("%s %s", what, label, extra={"model": label, "requested": job.requested})
        options = ReadyOptions(
            use=not job.refresh, refresh=job.refresh, protected=protected, cancel=running.cancel
        )
        future = in_daemon_thread(
            lambda: self._ensure_ready(rules, events=PullLog(self._observer, label), options=options),
            "modelsync-prefetch",
        )
        future.add_done_callback(lambda f: self._finished(running, f))

    # -- yielding --------------------------------------------------------------------------

    def pause_for_foreground(self, announced: frozenset[str]) -> None:
        paused = bool(announced)
        if paused != self.paused:
            log.info("background prefetch %s", "paused for a foreground pull" if paused else "resumed")
            self.paused = paused
            self._observer.set_paused(paused)
        running = self.current
        if running is not None and not running.paused and yields_to_foreground(running.job, announced):
            running.pause()

    def yield_to_request(self, pending: set[str]) -> None:
        """A pod waits for `pending`: a background prefetch of another model yields."""
        running = self.current
        if running is not None and yields_to_request(running.job, pending):
            label = running.label
            log.info("prefetch of %s yields to a waiting pod's pull", label, extra={"model": label})
            running.pause()

    async def stop(self, grace_s: float) -> None:
        running = self.current
        if running is None:
            return
        running.cancel.set()
        deadline = self._clock() + grace_s
        while self.current is running and self._clock() < deadline:
            await asyncio.sleep(0.05)
        if self.current is running:
            log.warning("stopping while %s is still being pulled; it resumes from its journal", running.label)

    # -- outcomes --------------------------------------------------------------------------

    def _finished(self, running: Running, future: asyncio.Future[PullResult]) -> None:
        self.current = None
        job, label = running.job, running.label
        exc = future.exception()
        if isinstance(exc, PullCancelledError):
            # paused or stopping: a request stays queued, and the journal keeps the parts
            log.info("prefetch of %s stopped; it resumes later", label, extra={"model": label})
        elif exc is not None:
            self._requests.ended(job.model_id)
            broken = isinstance(exc, IntegrityError) and not isinstance(exc, ObjectChangedError)
            now, rand = self._clock(), random.random()
            delay_s = self._queue.finished(job, now, failed=True, rand=rand, store_at_fault=broken) or 0.0
            self._failed(running, exc, delay_s)
        else:
            self._requests.ended(job.model_id)
            self._queue.finished(job, self._clock(), failed=False)
            self._succeeded(running, future.result())
        self._on_ended()

    def _succeeded(self, running: Running, result: PullResult) -> None:
        model_id, label = running.job.model_id, running.label
        self._sizes.known[model_id] = result.total_bytes
        if result.evicted:
            self._observer.evicted(len(result.evicted))
            log.info(
                "evicted %s to make room for %s",
                ", ".join(result.evicted),
                label,
                extra={"model": label, "evicted": list(result.evicted)},
            )
        if running.job.refresh:
            # each check logs its end too: "busy" in a verify run meanwhile then has an explanation
            found = "unchanged at its source"
            if result.fetched_bytes:
                found = "changed at its source and was refreshed"
            log.info("%s %s", label, found, extra={"model": label})
        else:
            margin = self._margin_s(model_id)
            self._observer.pull_succeeded(label, result.elapsed_s, margin)
            extra = {"model": label, "seconds": round(result.elapsed_s, 3), "ready_before_window_s": margin}
            log.info("%s is ready at %s", label, result.path, extra=extra)
        # a request made while a refresh check ran ends with it (the queue dropped it too)
        self._requests.answer(model_id, result.path)

    def _failed(self, running: Running, exc: BaseException, delay_s: float) -> None:
        label = running.label
        code = exc.code if isinstance(exc, ModelsyncError) else "internal"
        self._observer.pull_failed(code, isinstance(exc, IntegrityError))
        extra = {"model": label, "code": code, "retry_in_s": round(delay_s, 1)}
        if isinstance(exc, ModelsyncError):
            log.error("prefetch of %s failed: %s; retrying in %.0f s", label, exc, delay_s, extra=extra)
        else:
            log.error("prefetch of %s failed (a bug)", label, exc_info=exc, extra=extra)
        error = exc if isinstance(exc, ModelsyncError) else ModelsyncError(f"internal error: {exc!r}")
        self._requests.fail(running.job.model_id, error)
