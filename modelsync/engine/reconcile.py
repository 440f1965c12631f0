"""The daemon's reconcile loop: bring this node's cache to what the schedule wants, one pull at a time.

Every tick, and at once when something changes (a new schedule, an API
request, a pull ending), the loop computes the node plan (core/plan.py) and
starts the next pull. Between ticks it wakes every `poll_s` to notice
foreground pulls and due retries. Decisions are pure and live elsewhere: the
plan's in core/plan.py, the order of the work, its jitter, backoff and
foreground precedence in core/queue.py. This module only sequences them:

- **One pull at a time.** The model at the head of the order gets the whole
  bandwidth cap, which makes ready times predictable (the plan assumes it).
- **Failures.** A failed model waits its backoff while the loop goes on with
  others and keeps serving; an S3 outage thus costs one cheap attempt per model
  per backoff period. A schedule too big for the budget fails the same way
  (`disk_full`), so it never thrashes.
- **Sizes.** A fetch whose size nobody knows counts as 0 bytes in the plan,
  which would call an over-budget schedule fitting; the loop asks S3 for such
  sizes in the background (again after `SIZE_RETRY_S` when S3 cannot tell),
  so the misfit is logged and exported before a pull fails for want of room.
- **Evictions** are counted from what each pull's space reservation reports,
  not inferred from models that left the cache (an operator's `modelsync
  evict` is not the daemon's doing).
- **Foreground first.** A pull that yields to a foreground pull (adapters/
  foreground.py) or to a waiting pod is cancelled; it resumes from its journal.
- **Stopping.** `run` returns after cancelling the running pull and waiting at
  most `stop_grace_s` for it; the journal keeps the parts written.

Every pull goes through `engine.ensure.ensure_ready`, in a daemon thread
(engine/background.py), and reports through `LoopObserver`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from modelsync.adapters.cache import Cache
from modelsync.config import Settings
from modelsync.core.desired import desired_models
from modelsync.core.eviction import CacheEntry
from modelsync.core.plan import NodePlan, protection_reasons
from modelsync.core.queue import Job, JobQueue, yields_to_foreground, yields_to_request
from modelsync.core.refs import ModelRef
from modelsync.core.schedule import Schedule
from modelsync.engine.background import LoopObserver, PullLog, first_of, in_daemon_thread
from modelsync.engine.ensure import PullResult, ReadyOptions
from modelsync.engine.events import PullEvents
from modelsync.engine.inventory import RemoteSizes, SizeLookup
from modelsync.engine.node_plan import node_plan
from modelsync.engine.ready import warm_path
from modelsync.engine.rules import PullRules, pull_rules
from modelsync.errors import (
    IntegrityError,
    ModelsyncError,
    ObjectChangedError,
    PullCancelledError,
    UsageError,
)

log = logging.getLogger("modelsync.daemon")

class EnsureReady(Protocol):
    """`engine.ensure.ensure_ready` with the node's backends bound, as the loop calls it."""

    def __call__(self, rules: PullRules, *, events: PullEvents, options: ReadyOptions) -> PullResult: ...


@dataclass(frozen=True, slots=True)
class LoopConfig:
    pool: str
    #: this node's name, for the start jitter
    node: str
    #: seconds between full reconciles when nothing happens
    tick_s: float = 30.0
    #: the largest start jitter, seconds
    jitter_max_s: float = 30.0
    #: seconds between checks of foreground pulls and due work
    poll_s: float = 1.0
    #: how long `run` waits for a cancelled pull to stop
    stop_grace_s: float = 8.0
    #: seconds between checks that a staged model's source is unchanged; 0 = never
    refresh_s: float = 900.0


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


class Reconciler:
    def __init__(
        self,
        settings: Settings,
        config: LoopConfig,
        observer: LoopObserver,
        ensure_ready: EnsureReady,
        inventory: Callable[[Cache], list[CacheEntry]],
        foreground: Callable[[Path], frozenset[str]],
        sizer: Callable[[list[ModelRef]], RemoteSizes],
        wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.config = config
        self.observer = observer
        self.cache = Cache(settings.cache_dir)
        self._ensure_ready = ensure_ready
        self._inventory = inventory
        self._foreground = foreground
        self._sizer = sizer
        self._wall_clock = wall_clock
        self._clock = clock
        self.schedule: Schedule | None = None
        self.plan: NodePlan | None = None
        self.current: Running | None = None
        self.paused = False
        self.queue = JobQueue(config.node, config.jitter_max_s, config.refresh_s)
        self._requested: dict[str, ModelRef] = {}
        self._waiters: dict[str, list[asyncio.Future[Path]]] = {}
        self._sizes = SizeLookup(sizer, self._changed)
        self._dirty = True
        self._wake = asyncio.Event()

    # -- inputs from the edge ------------------------------------------------------------

    def set_schedule(self, schedule: Schedule) -> None:
        self.schedule = schedule
        self._changed()

    def request(self, refs: list[ModelRef], preempt: bool = False) -> list[asyncio.Future[Path]]:
        """Stage `refs` now, ahead of the schedule; each future ends with the ready path or an error.

        A model that is ready by the readiness rule (engine/ready.py) is answered
        at once. `preempt`: a pod is waiting (a tenant's pull), so a running
        background prefetch of another model yields, as for a foreground pull; it
        resumes from its journal later.
        """
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[Path]] = []
        pending = set()
        for ref in refs:
            future: asyncio.Future[Path] = loop.create_future()
            futures.append(future)
            path = warm_path(self.settings.cache_dir, ref, self.rules_for(ref).signed_only)
            if path is not None:
                future.set_result(path)
                continue
            pending.add(ref.model_id)
            self._waiters.setdefault(ref.model_id, []).append(future)
            self._requested.setdefault(ref.model_id, ref)
            self.queue.request(ref.model_id)
        running = self.current
        if preempt and running is not None and yields_to_request(running.job, pending):
            label = running.label
            log.info("prefetch of %s yields to a waiting pod's pull", label, extra={"model": label})
            running.pause()
        self._changed()
        return futures

    @property
    def ready(self) -> bool:
        """A schedule is loaded and the loop has reconciled at least once."""
        return self.schedule is not None and self.plan is not None

    # -- the loop ------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        next_full = 0.0
        while not stop.is_set():
            if self._dirty or self._clock() >= next_full:
                self._dirty = False
                next_full = self._clock() + self.config.tick_s
                await self.reconcile()
            self._pause_for_foreground(await asyncio.to_thread(self._foreground, self.settings.cache_dir))
            self._start_next()
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.config.poll_s):
                    await first_of(self._wake.wait(), stop.wait())
        await self._stop()

    async def reconcile(self) -> None:
        """Recompute the plan and the metrics; a failure is logged and retried next tick."""
        schedule = self.schedule
        if schedule is None:
            return
        try:
            cached = await asyncio.to_thread(self._inventory, self.cache)
            plan = await asyncio.to_thread(
                node_plan,
                self.settings,
                schedule,
                self.config.pool,
                self._wall_clock(),
                cached,
                dict(self._sizes.known),
            )
        except ModelsyncError as exc:
            log.error("reconcile failed: %s", exc, extra={"code": exc.code})
            return
        if plan.fits != (self.plan.fits if self.plan is not None else True):
            level = logging.INFO if plan.fits else logging.ERROR
            log.log(level, "cache budget: %s", plan.eviction.describe()[0], extra={"code": "over_budget"})
        self.plan = plan
        scheduled = {m.source.model_id for m in schedule.models}
        self.queue.plan(
            (m.model_id for m in plan.fetch if m.model_id in scheduled),
            (m.model_id for m in plan.keep if m.protected and m.model_id in scheduled),
            self._clock(),
        )
        unsized = [self._scheduled_ref(m.model_id) for m in plan.fetch if m.size_bytes is None]
        self._sizes.learn([ref for ref in unsized if ref is not None], self._clock())
        self.observer.observe_plan(plan, time.time())

    # -- starting work -------------------------------------------------------------------

    def _pause_for_foreground(self, announced: frozenset[str]) -> None:
        paused = bool(announced)
        if paused != self.paused:
            log.info("background prefetch %s", "paused for a foreground pull" if paused else "resumed")
            self.paused = paused
            self.observer.set_paused(paused)
        running = self.current
        if running is not None and not running.paused and yields_to_foreground(running.job, announced):
            running.pause()

    def _start_next(self) -> None:
        if self.current is not None:
            return
        job = self.queue.next(self._clock(), paused=self.paused)
        ref = self._requested.get(job.model_id) if job is not None and job.requested else None
        if job is None or (ref := ref or self._scheduled_ref(job.model_id)) is None:
            return
        label = job.model_id if job.requested else self._label(job.model_id)
        running = self.current = Running(job, ref, label)
        what = "refresh check of" if job.refresh else "prefetch"
        log.info("%s %s", what, label, extra={"model": label, "requested": job.requested})
        options = ReadyOptions(
            use=not job.refresh, refresh=job.refresh, protected=self._protected(), cancel=running.cancel
        )
        rules = self.rules_for(ref)
        future = in_daemon_thread(
            lambda: self._ensure_ready(rules, events=PullLog(self.observer, label), options=options),
            "modelsync-prefetch",
        )
        future.add_done_callback(lambda f: self._finished(running, f))

    def _label(self, model_id: str) -> str:
        for m in self.plan.models if self.plan is not None else ():
            if m.model_id == model_id:
                return m.label
        return model_id

    def _protected(self) -> dict[str, str]:
        """What the schedule needs now: the engine's space reservation must not evict these."""
        if self.schedule is None:
            return {}
        return protection_reasons(desired_models(self.schedule, self.config.pool, self._wall_clock()))

    def rules_for(self, ref: ModelRef, lease_s: float | None = None) -> PullRules:
        """What a pull of `ref` obeys here: the node's settings and the loaded schedule's entry for it."""
        return pull_rules(self.settings, ref, self.schedule, lease_s=lease_s)

    def _scheduled_ref(self, model_id: str) -> ModelRef | None:
        for model in self.schedule.models if self.schedule is not None else ():
            if model.source.model_id == model_id:
                return model.source
        return None

    # -- outcomes ------------------------------------------------------------------------

    def _finished(self, running: Running, future: asyncio.Future[PullResult]) -> None:
        self.current = None
        job, label = running.job, running.label
        exc = future.exception()
        if isinstance(exc, PullCancelledError):
            # paused or stopping: a request stays queued, and the journal keeps the parts
            log.info("prefetch of %s stopped; it resumes later", label, extra={"model": label})
        elif exc is not None:
            self._requested.pop(job.model_id, None)
            broken = isinstance(exc, IntegrityError) and not isinstance(exc, ObjectChangedError)
            now, rand = self._clock(), random.random()
            delay_s = self.queue.finished(job, now, failed=True, rand=rand, store_at_fault=broken) or 0.0
            self._failed(running, exc, delay_s)
        else:
            self._requested.pop(job.model_id, None)
            self.queue.finished(job, self._clock(), failed=False)
            self._succeeded(running, future.result())
        self._changed()

    def _succeeded(self, running: Running, result: PullResult) -> None:
        model_id, label = running.job.model_id, running.label
        self._sizes.known[model_id] = result.total_bytes
        if result.evicted:
            self.observer.evicted(len(result.evicted))
            log.info(
                "evicted %s to make room for %s",
                ", ".join(result.evicted),
                label,
                extra={"model": label, "evicted": list(result.evicted)},
            )
        if running.job.refresh:
            if result.fetched_bytes:
                log.info("%s changed at its source and was refreshed", label, extra={"model": label})
            return
        margin = self._margin_s(model_id)
        self.observer.pull_succeeded(label, result.elapsed_s, margin)
        log.info(
            "%s is ready at %s",
            label,
            result.path,
            extra={"model": label, "seconds": round(result.elapsed_s, 3), "ready_before_window_s": margin},
        )
        for waiter in self._waiters.pop(model_id, []):
            if not waiter.done():
                waiter.set_result(result.path)

    def _failed(self, running: Running, exc: BaseException, delay_s: float) -> None:
        label = running.label
        code = exc.code if isinstance(exc, ModelsyncError) else "internal"
        self.observer.pull_failed(code, isinstance(exc, IntegrityError))
        extra = {"model": label, "code": code, "retry_in_s": round(delay_s, 1)}
        if isinstance(exc, ModelsyncError):
            log.error("prefetch of %s failed: %s; retrying in %.0f s", label, exc, delay_s, extra=extra)
        else:
            log.error("prefetch of %s failed (a bug)", label, exc_info=exc, extra=extra)
        error = exc if isinstance(exc, ModelsyncError) else ModelsyncError(f"internal error: {exc!r}")
        for waiter in self._waiters.pop(running.job.model_id, []):
            if not waiter.done():
                waiter.set_exception(error)

    def _margin_s(self, model_id: str) -> float | None:
        """Seconds before its window that the model became ready (negative when late)."""
        for m in self.plan.models if self.plan is not None else ():
            if m.model_id == model_id and m.window_start is not None:
                return (m.window_start - self._wall_clock()).total_seconds()
        return None

    def _changed(self) -> None:
        self._dirty = True
        self._wake.set()

    async def _stop(self) -> None:
        running = self.current
        if running is not None:
            running.cancel.set()
            deadline = self._clock() + self.config.stop_grace_s
            while self.current is running and self._clock() < deadline:
                await asyncio.sleep(0.05)
            if self.current is running:
                what = running.label
                log.warning("stopping while %s is still being pulled; it resumes from its journal", what)
        for waiters in self._waiters.values():
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_exception(UsageError("the daemon is stopping; run the command again"))
        self._waiters.clear()
