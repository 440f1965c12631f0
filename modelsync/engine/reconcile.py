"""The daemon's reconcile loop: bring this node's cache to what the schedule wants, one pull at a time.

Every tick, and at once when something changes (a new schedule, an API
request, a pull ending), the loop computes the node plan (core/plan.py) and
starts the next pull. Between ticks it wakes every `poll_s` to notice
foreground pulls and due retries. Decisions are the plan's; this module only
sequences them:

- **Order.** Requests from `modelsync prefetch` first, in arrival order; then
  the plan's fetches in fetch order (window start, then priority).
- **Jitter.** A model the schedule asks for starts after `start_jitter_s`,
  counted from when it first appeared in the plan, so a pool of nodes does not
  hit the object store in the same second. Requests skip the jitter.
- **One pull at a time.** The model at the head of the order gets the whole
  bandwidth cap, which makes ready times predictable (the plan assumes it).
- **Backoff.** A failed model is retried after 2^n seconds (capped, jittered)
  while the loop goes on with others and keeps serving; an S3 outage thus
  costs one cheap attempt per model per backoff period. A schedule too big
  for the budget fails the same way (`disk_full`), so it never thrashes.
- **Sizes.** A fetch whose size nobody knows counts as 0 bytes in the plan,
  which would call an over-budget schedule fitting; the loop asks S3 for such
  sizes in the background (again after `SIZE_RETRY_S` when S3 cannot tell),
  so the misfit is logged and exported before a pull fails for want of room.
- **Evictions** are counted from what each pull's space reservation reports,
  not inferred from models that left the cache (an operator's `modelsync
  evict` is not the daemon's doing).
- **Foreground first.** While a foreground pull is announced (adapters/
  foreground.py), background work pauses: a running pull of another model is
  cancelled (it resumes from its journal later) and none starts. A running
  pull of the announced model goes on: the foreground pull is waiting for its
  lock and will return its path.
- **Stopping.** `run` returns after cancelling the running pull and waiting at
  most `stop_grace_s` for it; the journal keeps the parts written.

Pulls run in a daemon thread each, never in the event loop's default executor:
a pull blocked on another process's lock cannot be interrupted, and a daemon
thread cannot keep the process from exiting on SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, TypeVar

from modelsync.adapters.cache import Cache
from modelsync.config import Settings
from modelsync.core.desired import desired_models
from modelsync.core.eviction import CacheEntry
from modelsync.core.plan import NodePlan, plan_node, protection_reasons, start_jitter_s
from modelsync.core.refs import ModelRef
from modelsync.core.schedule import Schedule
from modelsync.core.units import format_bytes
from modelsync.engine.ensure import PullResult, ReadyOptions
from modelsync.engine.events import PullEvents, status
from modelsync.engine.evict import budget_bytes
from modelsync.engine.inventory import RemoteSizes
from modelsync.engine.ready import warm_path
from modelsync.errors import IntegrityError, ModelsyncError, PullCancelledError, UsageError
from modelsync.metrics import DaemonMetrics

log = logging.getLogger("modelsync.daemon")
_T = TypeVar("_T")

#: the longest a failed model waits before its next attempt
MAX_RETRY_S = 300.0
#: seconds between progress lines of a daemon pull in the log
PROGRESS_LOG_S = 30.0
#: how long before asking S3 again for a size it could not tell
SIZE_RETRY_S = 300.0


class MakeReady(Protocol):
    """`engine.ensure.ensure_ready` with the node's backends bound, as the loop calls it."""

    def __call__(
        self, ref: ModelRef, *, settings: Settings, events: PullEvents, options: ReadyOptions
    ) -> PullResult: ...


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
class _Job:
    ref: ModelRef
    label: str
    requested: bool
    refresh: bool = False
    cancel: threading.Event = field(default_factory=threading.Event)
    paused: bool = False


@dataclass(slots=True)
class _Retry:
    failures: int
    at: float


class _Events:
    """PullEvents of a daemon pull: bytes go to the metrics, waits and progress to the log.

    Progress is logged at most every PROGRESS_LOG_S, from the worker thread that
    reports bytes, so a pull of hours shows how far it is between "pulling" and "ready".
    """

    def __init__(
        self, metrics: DaemonMetrics, label: str, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._metrics = metrics
        self._label = label
        self._clock = clock
        self._lock = threading.Lock()
        self._missing = 0
        self._done = 0
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
        self._metrics.fetched(n_bytes)
        with self._lock:
            self._done += n_bytes
            now = self._clock()
            if now < self._next_log:
                return
            self._next_log = now + PROGRESS_LOG_S
            done, missing, elapsed_s = self._done, self._missing, now - self._started
        log.info(
            "pulling %s: %s",
            self._label,
            status(done, missing, elapsed_s),
            extra={"model": self._label, "fetched_bytes": done, "missing_bytes": missing},
        )

    def verifying(self, path: str) -> None:
        pass

    def note(self, message: str) -> None:
        log.info("%s: %s", self._label, message, extra={"model": self._label})

    def damaged(self, path: str, reason: str) -> None:
        log.warning("%s/%s: %s; fetching it again", self._label, path, reason, extra={"model": self._label})


class Reconciler:
    def __init__(
        self,
        settings: Settings,
        config: LoopConfig,
        metrics: DaemonMetrics,
        make_ready: MakeReady,
        inventory: Callable[[Cache], list[CacheEntry]],
        foreground: Callable[[Path], frozenset[str]],
        sizer: Callable[[Settings, list[ModelRef]], RemoteSizes],
        wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.config = config
        self.metrics = metrics
        self.cache = Cache(settings.cache_dir)
        self._make_ready = make_ready
        self._inventory = inventory
        self._foreground = foreground
        self._sizer = sizer
        self._wall_clock = wall_clock
        self._clock = clock
        self.schedule: Schedule | None = None
        self.plan: NodePlan | None = None
        self.current: _Job | None = None
        self.paused = False
        self._requested: dict[str, ModelRef] = {}
        self._waiters: dict[str, list[asyncio.Future[Path]]] = {}
        self._retries: dict[str, _Retry] = {}
        self._eligible_at: dict[str, float] = {}
        self._refresh_at: dict[str, float] = {}
        self._sizes: dict[str, int] = {}
        self._size_due: dict[str, float] = {}
        self._sizing = False
        self._dirty = True
        self._wake = asyncio.Event()

    # -- inputs from the edge ------------------------------------------------------------

    def set_schedule(self, schedule: Schedule) -> None:
        self.schedule = schedule
        self._changed()

    def request(self, refs: list[ModelRef], preempt: bool = False) -> list[asyncio.Future[Path]]:
        """Stage `refs` now, ahead of the schedule; each future ends with the ready path or an error.

        `preempt`: a pod is waiting (a tenant's pull), so a running background
        prefetch of another model is cancelled, as for a foreground pull; it
        resumes from its journal later.
        """
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[Path]] = []
        pending = set()
        for ref in refs:
            future: asyncio.Future[Path] = loop.create_future()
            futures.append(future)
            path = warm_path(self.settings.cache_dir, ref, self._settings_for(ref).requires_signature(ref))
            if path is not None:
                future.set_result(path)
                continue
            pending.add(ref.model_id)
            self._waiters.setdefault(ref.model_id, []).append(future)
            self._requested.setdefault(ref.model_id, ref)
            self._retries.pop(ref.model_id, None)  # an operator asking is a reason to try now
        job = self.current
        if preempt and pending and job is not None and not job.requested and job.ref.model_id not in pending:
            log.info("prefetch of %s yields to a waiting pod's pull", job.label, extra={"model": job.label})
            job.paused = True
            job.cancel.set()
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
                    await _first(self._wake.wait(), stop.wait())
        await self._stop()

    async def reconcile(self) -> None:
        """Recompute the plan and the metrics; a failure is logged and retried next tick."""
        schedule = self.schedule
        if schedule is None:
            return
        try:
            cached = await asyncio.to_thread(self._inventory, self.cache)
            plan = plan_node(
                schedule,
                self.config.pool,
                self._wall_clock(),
                cached,
                await asyncio.to_thread(budget_bytes, self.settings),
                self._bandwidth(),
                self._sizes,
                self.settings.in_use_grace_s,
            )
        except ModelsyncError as exc:
            log.error("reconcile failed: %s", exc, extra={"code": exc.code})
            return
        if plan.fits != (self.plan.fits if self.plan is not None else True):
            level = logging.INFO if plan.fits else logging.ERROR
            log.log(level, "cache budget: %s", plan.eviction.describe()[0], extra={"code": "over_budget"})
        self.plan = plan
        self._track_eligibility(plan)
        self._learn_sizes(plan)
        self.metrics.observe_plan(plan, time.time())

    def _learn_sizes(self, plan: NodePlan) -> None:
        """Ask S3, in a background thread, for the sizes of planned fetches nobody knows yet."""
        if self._sizing:
            return
        now = self._clock()
        refs = [
            ref
            for m in plan.fetch
            if m.size_bytes is None
            and self._size_due.get(m.model_id, -math.inf) <= now
            and (ref := self._scheduled_ref(m.model_id)) is not None
        ]
        if not refs:
            return
        for ref in refs:
            self._size_due[ref.model_id] = now + SIZE_RETRY_S
        self._sizing = True
        future = _in_daemon_thread(lambda: self._sizer(self.settings, refs), "modelsync-sizes")
        future.add_done_callback(self._sized)

    def _sized(self, future: asyncio.Future[RemoteSizes]) -> None:
        self._sizing = False
        exc = future.exception()
        if exc is not None:
            log.error("looking up model sizes failed (a bug)", exc_info=exc)
            return
        sizes = future.result()
        for model_id, reason in sizes.unknown.items():
            log.warning("size of %s unknown: %s", model_id, reason, extra={"model": model_id})
        if sizes.known:
            self._sizes.update(sizes.known)
            self._changed()

    # -- choosing and starting work ------------------------------------------------------

    def _track_eligibility(self, plan: NodePlan) -> None:
        """Start the jitter clock of each newly wanted fetch or refresh; forget what is no longer wanted."""
        now = self._clock()
        staged = {m.model_id for m in plan.keep if m.protected} if self.config.refresh_s else set()
        fetch = {m.model_id for m in plan.fetch}
        for due, wanted in ((self._eligible_at, fetch), (self._refresh_at, staged)):
            for model_id in wanted - due.keys():
                due[model_id] = now + start_jitter_s(self.config.node, model_id, self.config.jitter_max_s)
            for model_id in due.keys() - wanted:
                del due[model_id]

    def _pause_for_foreground(self, announced: frozenset[str]) -> None:
        paused = bool(announced)
        if paused != self.paused:
            log.info("background prefetch %s", "paused for a foreground pull" if paused else "resumed")
            self.paused = paused
            self.metrics.paused.set(1 if paused else 0)
        job = self.current
        if paused and job is not None and job.ref.model_id not in announced and not job.paused:
            job.paused = True
            job.cancel.set()

    def _start_next(self) -> None:
        if self.current is not None or self.paused:
            return
        job = self._next()
        if job is None:
            return
        self.current = job
        what = "refresh check of" if job.refresh else "prefetch"
        log.info("%s %s", what, job.label, extra={"model": job.label, "requested": job.requested})
        protected = self._protected()
        settings = self._settings_for(job.ref)
        future = _in_daemon_thread(
            lambda: self._make_ready(
                job.ref,
                settings=settings,
                events=_Events(self.metrics, job.label),
                options=ReadyOptions(
                    use=not job.refresh, refresh=job.refresh, protected=protected, cancel=job.cancel
                ),
            ),
            "modelsync-prefetch",
        )
        future.add_done_callback(lambda f: self._finished(job, f))

    def _next(self) -> _Job | None:
        """Requests first, then due fetches in fetch order, then due refresh checks."""
        if self._requested:
            model_id, requested = next(iter(self._requested.items()))
            return _Job(requested, model_id, requested=True)
        plan = self.plan
        if plan is None:
            return None
        queues = ((plan.fetch, self._eligible_at, False), (plan.keep, self._refresh_at, True))
        for candidates, due, refresh in queues:
            for m in candidates:
                scheduled = self._scheduled_ref(m.model_id)
                if scheduled is not None and m.model_id in due and self._due(m.model_id, due):
                    return _Job(scheduled, m.label, requested=False, refresh=refresh)
        return None

    def _due(self, model_id: str, due: dict[str, float]) -> bool:
        now = self._clock()
        retry = self._retries.get(model_id)
        return now >= due[model_id] and (retry is None or now >= retry.at)

    def _protected(self) -> dict[str, str]:
        """What the schedule needs now: the engine's space reservation must not evict these."""
        if self.schedule is None:
            return {}
        return protection_reasons(desired_models(self.schedule, self.config.pool, self._wall_clock()))

    def _settings_for(self, ref: ModelRef) -> Settings:
        """The node's settings, with the schedule's signature policy for `ref` as its most specific rule."""
        for model in self.schedule.models if self.schedule is not None else ():
            if model.source == ref and model.signature is not None:
                rules = (*self.settings.signature_rules, model.signature)
                return replace(self.settings, signature_rules=rules)
        return self.settings

    def _scheduled_ref(self, model_id: str) -> ModelRef | None:
        for model in self.schedule.models if self.schedule is not None else ():
            if model.source.model_id == model_id:
                return model.source
        return None

    def _finished(self, job: _Job, future: asyncio.Future[PullResult]) -> None:
        self.current = None
        model_id = job.ref.model_id
        exc = future.exception()
        if isinstance(exc, PullCancelledError):
            # paused or stopping: a request stays queued, and the journal keeps the parts
            log.info("prefetch of %s stopped; it resumes later", job.label, extra={"model": job.label})
        else:
            self._requested.pop(model_id, None)
            if job.refresh and model_id in self._refresh_at:
                self._refresh_at[model_id] = self._clock() + self.config.refresh_s
            if exc is not None:
                self._failed(job, exc)
            else:
                self._succeeded(job, future.result())
        self._changed()

    def _succeeded(self, job: _Job, result: PullResult) -> None:
        model_id = job.ref.model_id
        self._retries.pop(model_id, None)
        self._sizes[model_id] = result.total_bytes
        if result.evicted:
            self.metrics.evictions.inc(len(result.evicted))
            log.info(
                "evicted %s to make room for %s",
                ", ".join(result.evicted),
                job.label,
                extra={"model": job.label, "evicted": list(result.evicted)},
            )
        if job.refresh:
            if result.fetched_bytes:
                log.info("%s changed at its source and was refreshed", job.label, extra={"model": job.label})
            return
        if self.config.refresh_s:
            self._refresh_at[model_id] = self._clock() + self.config.refresh_s  # it was just checked
        margin = self._margin_s(model_id)
        self.metrics.pull_succeeded(job.label, result.elapsed_s, margin)
        log.info(
            "%s is ready at %s",
            job.label,
            result.path,
            extra={
                "model": job.label,
                "seconds": round(result.elapsed_s, 3),
                "ready_before_window_s": margin,
            },
        )
        for waiter in self._waiters.pop(model_id, []):
            if not waiter.done():
                waiter.set_result(result.path)

    def _failed(self, job: _Job, exc: BaseException) -> None:
        model_id = job.ref.model_id
        retry = self._retries.get(model_id, _Retry(0, 0.0))
        delay = min(MAX_RETRY_S, 2.0**retry.failures) * random.uniform(0.5, 1.0)
        self._retries[model_id] = _Retry(retry.failures + 1, self._clock() + delay)
        code = exc.code if isinstance(exc, ModelsyncError) else "internal"
        self.metrics.pull_failed(code, isinstance(exc, IntegrityError))
        extra = {"model": job.label, "code": code, "retry_in_s": round(delay, 1)}
        if isinstance(exc, ModelsyncError):
            log.error("prefetch of %s failed: %s; retrying in %.0f s", job.label, exc, delay, extra=extra)
        else:
            log.error("prefetch of %s failed (a bug)", job.label, exc_info=exc, extra=extra)
        error = exc if isinstance(exc, ModelsyncError) else ModelsyncError(f"internal error: {exc!r}")
        for waiter in self._waiters.pop(model_id, []):
            if not waiter.done():
                waiter.set_exception(error)

    def _margin_s(self, model_id: str) -> float | None:
        """Seconds before its window that the model became ready (negative when late)."""
        for m in self.plan.models if self.plan is not None else ():
            if m.model_id == model_id and m.window_start is not None:
                return (m.window_start - self._wall_clock()).total_seconds()
        return None

    def _bandwidth(self) -> float | None:
        return float(self.settings.max_bandwidth_bytes_per_s) or None

    def _changed(self) -> None:
        self._dirty = True
        self._wake.set()

    async def _stop(self) -> None:
        job = self.current
        if job is not None:
            job.cancel.set()
            deadline = self._clock() + self.config.stop_grace_s
            while self.current is job and self._clock() < deadline:
                await asyncio.sleep(0.05)
            if self.current is job:
                log.warning("stopping while %s is still being pulled; it resumes from its journal", job.label)
        for waiters in self._waiters.values():
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_exception(UsageError("the daemon is stopping; run the command again"))
        self._waiters.clear()


async def _first(*waits: Coroutine[Any, Any, object]) -> None:
    """Return when the first of the coroutines finishes; cancel the rest."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()


def _in_daemon_thread(work: Callable[[], _T], name: str) -> asyncio.Future[_T]:
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
