"""The daemon's Prometheus metrics, on a registry of its own.

A registry per daemon (not the library's global one) keeps tests that start
several daemons in one process independent, and keeps the process collectors'
noise out of the scrape. Every name is prefixed `modelsync_`; units are in the
names as Prometheus recommends.

Throughput is a gauge computed at scrape time from the bytes of the last few
seconds, so it drops to 0 when transfers stop instead of holding a stale value.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from modelsync.core.desired import SchedulePhase
from modelsync.core.plan import Action, NodePlan

__all__ = ["CONTENT_TYPE", "DaemonMetrics", "ThroughputMeter"]

#: pulls of large models take minutes to hours
PULL_DURATION_BUCKETS_S = (1, 5, 15, 60, 300, 900, 1800, 3600, 7200, 14400, float("inf"))
#: the window over which current throughput is averaged
THROUGHPUT_WINDOW_S = 5.0
_PHASES = tuple(SchedulePhase)


class ThroughputMeter:
    """Bytes per second over the last `window_s`; `add` is called from transfer threads."""

    def __init__(self, window_s: float = THROUGHPUT_WINDOW_S, clock: Callable[[], float] = time.monotonic):
        self._window_s = window_s
        self._clock = clock
        self._lock = threading.Lock()
        self._samples: deque[tuple[float, int]] = deque()

    def add(self, n_bytes: int) -> None:
        with self._lock:
            self._samples.append((self._clock(), n_bytes))

    def rate(self) -> float:
        with self._lock:
            horizon = self._clock() - self._window_s
            while self._samples and self._samples[0][0] < horizon:
                self._samples.popleft()
            return sum(n for _, n in self._samples) / self._window_s


class DaemonMetrics:
    """Every metric the daemon exports, with methods named for what happened."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.throughput = ThroughputMeter()
        self.fetched_bytes = Counter(
            "modelsync_fetched_bytes", "Bytes written to the cache by the daemon's pulls.", registry=r
        )
        Gauge(
            "modelsync_throughput_bytes_per_second",
            f"Download rate over the last {THROUGHPUT_WINDOW_S:g} s.",
            registry=r,
        ).set_function(self.throughput.rate)
        self.cache_used = Gauge(
            "modelsync_cache_used_bytes",
            "Bytes the cache holds against its budget (shared files once, plus running pulls' claims).",
            registry=r,
        )
        self.cache_budget = Gauge(
            "modelsync_cache_budget_bytes",
            "The cache budget; 0 when none is set (free space is the limit).",
            registry=r,
        )
        self.models = Gauge(
            "modelsync_models",
            "Models of this node's pool (and cached unscheduled ones) by schedule state and whether staged.",
            ["state", "staged"],
            registry=r,
        )
        self.staged = Gauge(
            "modelsync_model_staged",
            "1 when the model (bucket/prefix) is ready in this node's cache, 0 when the pool wants it and it "
            "is not: which nodes are warm for a model. `name` is the schedule's name for it (else its URI), "
            "`variant` which of the name's variants it is (empty when it has none).",
            ["model", "name", "variant"],
            registry=r,
        )
        self._staged_models: set[tuple[str, str, str]] = set()
        #: the schedule's name and variant of each model of the last plan, by model id
        self._names: dict[str, tuple[str, str]] = {}
        self.fits = Gauge(
            "modelsync_schedule_fits_budget",
            "1 when the protected models and the fetches fit the budget, else 0.",
            registry=r,
        )
        self.evictions = Counter(
            "modelsync_evictions", "Ready models the daemon's pulls evicted to make room.", registry=r
        )
        self.verification_failures = Counter(
            "modelsync_verification_failures", "Pulls that failed an integrity check.", registry=r
        )
        self.pull_failures = Counter(
            "modelsync_pull_failures", "Pulls that failed, by error code.", ["code"], registry=r
        )
        self.pull_duration = Histogram(
            "modelsync_pull_duration_seconds",
            "Wall time of the daemon's completed pulls.",
            buckets=PULL_DURATION_BUCKETS_S,
            registry=r,
        )
        self.ready_margin = Gauge(
            "modelsync_ready_before_window_seconds",
            "Seconds a model (bucket/prefix; `name` and `variant` as in modelsync_model_staged) became ready "
            "before its window opened; negative when late.",
            ["model", "name", "variant"],
            registry=r,
        )
        self.last_reconcile = Gauge(
            "modelsync_last_reconcile_timestamp_seconds",
            "Unix time of the last successful reconcile.",
            registry=r,
        )
        self.schedule_errors = Counter(
            "modelsync_schedule_load_errors",
            "Schedule files refused at load, by error code.",
            ["code"],
            registry=r,
        )
        self.schedule_ok = Gauge(
            "modelsync_schedule_last_load_ok",
            "1 when the latest schedule file loaded; 0 when it was refused and the last good one is used.",
            registry=r,
        )
        self.pool_matched = Gauge(
            "modelsync_schedule_pool_matched",
            "1 when some model of the loaded schedule names this node's pool; 0 when none does (a typo?).",
            registry=r,
        )
        self.paused = Gauge(
            "modelsync_prefetch_paused",
            "1 while background prefetch yields to a foreground pull.",
            registry=r,
        )

    def render(self) -> bytes:
        """The exposition text for /metrics."""
        return generate_latest(self.registry)

    def fetched(self, n_bytes: int) -> None:
        """Called from transfer threads; prometheus_client's counters are thread-safe."""
        self.fetched_bytes.inc(n_bytes)
        self.throughput.add(n_bytes)

    def observe_plan(self, plan: NodePlan, reconciled_at: float) -> None:
        counts = {(phase, staged): 0 for phase in _PHASES for staged in ("true", "false")}
        for m in plan.models:
            staged = "true" if m.action in (Action.KEEP, Action.EVICT) else "false"
            counts[(m.phase, staged)] += 1
        for (phase, staged), count in counts.items():
            self.models.labels(state=phase.value, staged=staged).set(count)
        self._names = {m.model_id: (m.label, m.variant or "") for m in plan.models}
        kept = (Action.KEEP, Action.EVICT)
        self._observe_staged({(m.model_id, m.label, m.variant or ""): m.action in kept for m in plan.models})
        self.cache_used.set(plan.used_bytes)
        self.cache_budget.set(plan.budget_bytes or 0)
        self.fits.set(1 if plan.fits else 0)
        self.last_reconcile.set(reconciled_at)

    def _observe_staged(self, staged: dict[tuple[str, str, str], bool]) -> None:
        """One series per model of the plan; a model that left the plan drops its series."""
        for labels in self._staged_models - staged.keys():
            self.staged.remove(*labels)
        for (model, name, variant), is_staged in staged.items():
            self.staged.labels(model=model, name=name, variant=variant).set(1 if is_staged else 0)
        self._staged_models = set(staged)

    def pull_succeeded(self, label: str, seconds: float, margin_s: float | None) -> None:
        """`label` is the loop's name for the model: the schedule's name, else its id."""
        self.pull_duration.observe(seconds)
        if margin_s is not None:
            model = next((m for m, (name, _) in self._names.items() if name == label), label)
            variant = self._names.get(model, (label, ""))[1]
            self.ready_margin.labels(model=model, name=label, variant=variant).set(margin_s)

    def pull_failed(self, code: str, integrity: bool) -> None:
        self.pull_failures.labels(code=code).inc()
        if integrity:
            self.verification_failures.inc()

    def evicted(self, models: int) -> None:
        self.evictions.inc(models)

    def set_paused(self, paused: bool) -> None:
        self.paused.set(1 if paused else 0)

    def schedule_loaded(self, pool_models: int) -> None:
        self.schedule_ok.set(1)
        self.pool_matched.set(1 if pool_models else 0)

    def schedule_refused(self, code: str) -> None:
        self.schedule_errors.labels(code=code).inc()
        self.schedule_ok.set(0)
