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
- **The running pull** is engine/pull_slot.py's: starting it, telling it to
  yield to a foreground pull or a waiting pod, what its end means, stopping.
- **Requests** from tenants (engine/tenant_requests.py) go ahead of the
  schedule; a model ready by the readiness rule is answered at once.

Every pull goes through `engine.ensure.ensure_ready`, in a daemon thread
(engine/background.py), and reports through `LoopObserver`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from modelsync.adapters.cache import Cache
from modelsync.config import Settings
from modelsync.core.desired import desired_models
from modelsync.core.eviction import CacheEntry
from modelsync.core.plan import NodePlan, protection_reasons
from modelsync.core.queue import JobQueue
from modelsync.core.refs import ModelRef
from modelsync.core.schedule import Schedule
from modelsync.engine.background import LoopObserver, first_of
from modelsync.engine.inventory import RemoteSizes, SizeLookup
from modelsync.engine.node_plan import node_plan
from modelsync.engine.pull_slot import EnsureReady, PullSlot, Running
from modelsync.engine.ready import warm_path
from modelsync.engine.rules import PullRules, pull_rules
from modelsync.engine.tenant_requests import TenantRequests
from modelsync.errors import ModelsyncError, UsageError

log = logging.getLogger("modelsync.daemon")


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
        self._inventory = inventory
        self._foreground = foreground
        self._wall_clock = wall_clock
        self._clock = clock
        self.schedule: Schedule | None = None
        self.plan: NodePlan | None = None
        self.queue = JobQueue(config.node, config.jitter_max_s, config.refresh_s)
        self._requests = TenantRequests()
        self._sizes = SizeLookup(sizer, self._changed)
        self._slot = PullSlot(
            ensure_ready, observer, self.queue, self._requests, self._sizes,
            margin_s=self._margin_s, on_ended=self._changed, clock=clock,
        )
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
        futures, pending = [], set()
        for ref in refs:
            ready = warm_path(self.settings.cache_dir, ref, self.rules_for(ref).signed_only)
            futures.append(self._requests.ask(ref, ready))
            if ready is None:
                pending.add(ref.model_id)
                self.queue.request(ref.model_id)
        if preempt:
            self._slot.yield_to_request(pending)
        self._changed()
        return futures

    @property
    def ready(self) -> bool:
        """A schedule is loaded and the loop has reconciled at least once."""
        return self.schedule is not None and self.plan is not None

    @property
    def current(self) -> Running | None:
        """The pull under way, if any."""
        return self._slot.current

    @property
    def paused(self) -> bool:
        """Background prefetch waits for a foreground pull."""
        return self._slot.paused

    # -- the loop ------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        next_full = 0.0
        while not stop.is_set():
            if self._dirty or self._clock() >= next_full:
                self._dirty = False
                next_full = self._clock() + self.config.tick_s
                await self.reconcile()
            announced = await asyncio.to_thread(self._foreground, self.settings.cache_dir)
            self._slot.pause_for_foreground(announced)
            self._start_next()
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.config.poll_s):
                    await first_of(self._wake.wait(), stop.wait())
        await self._slot.stop(self.config.stop_grace_s)
        self._requests.fail_all(UsageError("the daemon is stopping; run the command again"))

    async def reconcile(self) -> None:
        """Recompute the plan and the metrics; a failure is logged and retried next tick."""
        schedule = self.schedule
        if schedule is None:
            return
        try:
            cached = await asyncio.to_thread(self._inventory, self.cache)
            pool, at, known = self.config.pool, self._wall_clock(), dict(self._sizes.known)
            plan = await asyncio.to_thread(node_plan, self.settings, schedule, pool, at, cached, known)
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
        unsized = [schedule.source_of(m.model_id) for m in plan.fetch if m.size_bytes is None]
        self._sizes.learn([ref for ref in unsized if ref is not None], self._clock())
        self.observer.observe_plan(plan, time.time())

    # -- starting work -------------------------------------------------------------------

    def _start_next(self) -> None:
        if self._slot.current is not None:
            return
        job = self.queue.next(self._clock(), paused=self._slot.paused)
        ref = self._requests.ref(job.model_id) if job is not None and job.requested else None
        if job is None or (ref := ref or self._scheduled_ref(job.model_id)) is None:
            return
        planned = self.plan.model(job.model_id) if self.plan is not None and not job.requested else None
        label = planned.label if planned is not None else job.model_id
        self._slot.start(job, ref, label, self.rules_for(ref), self._protected())

    def _protected(self) -> dict[str, str]:
        """What the schedule needs now: the engine's space reservation must not evict these."""
        if self.schedule is None:
            return {}
        return protection_reasons(desired_models(self.schedule, self.config.pool, self._wall_clock()))

    def rules_for(self, ref: ModelRef, lease_s: float | None = None) -> PullRules:
        """What a pull of `ref` obeys here: the node's settings and the loaded schedule's entry for it."""
        return pull_rules(self.settings, ref, self.schedule, lease_s=lease_s)

    def _scheduled_ref(self, model_id: str) -> ModelRef | None:
        return self.schedule.source_of(model_id) if self.schedule is not None else None

    def _margin_s(self, model_id: str) -> float | None:
        """Seconds before its window that the model became ready (negative when late)."""
        planned = self.plan.model(model_id) if self.plan is not None else None
        if planned is None or planned.window_start is None:
            return None
        return (planned.window_start - self._wall_clock()).total_seconds()

    def _changed(self) -> None:
        self._dirty = True
        self._wake.set()
