"""What the daemon would do on one node at one instant, as a frozen plan.

`modelsync plan` prints it (`core/plan_view.py`) and the daemon acts on it, so the dry run and the
real run cannot disagree. The plan is a pure function of the schedule, the
node's pool, `now`, what the cache holds, its budget and a bandwidth:

    fetch   wanted now (window open or inside its lead time) and not cached
    keep    cached, and not chosen for eviction
    evict   cached, unprotected, and chosen (LRU) to make room for the fetches
    later   not cached; its prefetch starts at `prefetch_at`
    skip    not cached and not wanted again (kept-after-window or expired)

Eviction happens only to make room, exactly as the pull engine's space
reservation does it: least recently used first, never a model the schedule
protects (active, inside its lead time, or within its keep time), never a
pinned one. A cache that cannot hold the protected set plus the fetches does
not fit: the plan says so instead of evicting what will be needed again soon.
The cache is seen as the engine sees it (`CacheEntry`, one blob per physical
file) and measured by `budget_use`, so files that revisions share through hard
links count once, and a revision is never evicted for bytes it would not free.

Expected ready times assume the daemon's behaviour: one model at a time, in
fetch order, at `bandwidth_bytes_per_s`. A model of unknown size gets no
estimate and does not delay the ones after it, so those are lower bounds.
A rate so low that a model would take more than READY_HORIZON_S saturates there.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from types import MappingProxyType

from modelsync.core.desired import DesiredModel, SchedulePhase, desired_models
from modelsync.core.eviction import CacheEntry, EvictionPlan, budget_use, plan_eviction
from modelsync.core.lifecycle import CacheState
from modelsync.core.schedule import Schedule
from modelsync.core.units import format_duration
from modelsync.core.windows import load_zone
from modelsync.errors import UsageError

__all__ = [
    "READY_HORIZON_S",
    "Action",
    "NodePlan",
    "PlannedModel",
    "parse_instant",
    "plan_node",
    "protection_reasons",
    "start_jitter_s",
]

_NO_SIZES: Mapping[str, int] = MappingProxyType({})
#: expected ready times saturate this far from now: at a rate that needs longer the model is
#: never ready in any useful sense (and a datetime ends at the year 9999)
READY_HORIZON_S = 100 * 365 * 86400.0
_WANTED_NOW = frozenset({SchedulePhase.ACTIVE, SchedulePhase.PREFETCH})


class Action(enum.StrEnum):
    FETCH = "fetch"
    KEEP = "keep"
    EVICT = "evict"
    LATER = "later"
    SKIP = "skip"


@dataclass(frozen=True, slots=True)
class PlannedModel:
    model_id: str
    #: the schedule's short name, else the model id
    label: str
    #: when the schedule wants it; `UNSCHEDULED` for a cached model it does not name
    phase: SchedulePhase
    action: Action
    #: None when neither the cache nor the caller knows it
    size_bytes: int | None
    #: the open or next window; None for `always` or when none opens again
    window_start: datetime | None
    #: when staging starts (window start - lead); None when it already may
    prefetch_at: datetime | None
    #: expected ready time for a model still to fetch; None when cached or unknown
    ready_at: datetime | None
    #: why eviction must leave it alone, or None
    protected: str | None
    #: True when it has an `always` window (open at every instant)
    always: bool = False
    #: True when `ready_at` saturated at READY_HORIZON_S from now: not ready in any useful time
    beyond_horizon: bool = False
    #: which variant of its name this pool gets (schedule `variants`), else None
    variant: str | None = None

    @property
    def shown(self) -> str:
        """The label with the variant, as tables show it: `qwen3-32b [nvfp4]`."""
        return self.label if self.variant is None else f"{self.label} [{self.variant}]"

    @property
    def margin_s(self) -> float | None:
        """Seconds between expected readiness and the window's start; negative when late."""
        if self.ready_at is None or self.window_start is None:
            return None
        return (self.window_start - self.ready_at).total_seconds()

    @property
    def late(self) -> bool:
        """Will not be ready when its window opens (or, for an open window, is missing now)."""
        if self.action is not Action.FETCH and self.action is not Action.LATER:
            return False
        margin = self.margin_s
        return (margin is not None and margin < 0) or self.always or self.phase is SchedulePhase.ACTIVE

    def note(self, now: datetime) -> str:
        """The one phrase a table shows about timing: "ready 4m after the window opens"."""
        if self.action is not Action.FETCH and self.action is not Action.LATER:
            return ""
        if self.ready_at is None:
            return "size unknown" if self.size_bytes is None else "no bandwidth estimate"
        if self.beyond_horizon:
            return "not ready within 100 years at this rate"
        margin = self.margin_s
        if margin is None:
            return f"window already open; ready in {format_duration((self.ready_at - now).total_seconds())}"
        side = "before" if margin >= 0 else "after"
        return f"ready {format_duration(abs(margin))} {side} the window opens"


@dataclass(frozen=True, slots=True)
class NodePlan:
    pool: str
    at: datetime
    #: every model of the pool plus every cached model, fetches first in fetch order
    models: tuple[PlannedModel, ...]
    budget_bytes: int | None
    #: `budget_use` of the cache: each physical file once, plus what running pulls claimed
    used_bytes: int
    bandwidth_bytes_per_s: float | None
    eviction: EvictionPlan

    @property
    def fetch(self) -> tuple[PlannedModel, ...]:
        return self._with(Action.FETCH)

    @property
    def keep(self) -> tuple[PlannedModel, ...]:
        return self._with(Action.KEEP)

    @property
    def evict(self) -> tuple[PlannedModel, ...]:
        return self._with(Action.EVICT)

    @property
    def fetch_bytes(self) -> int:
        """Known bytes still to fetch now (models of unknown size count 0)."""
        return sum(m.size_bytes or 0 for m in self.fetch)

    @property
    def unknown_sizes(self) -> tuple[str, ...]:
        return tuple(m.model_id for m in self.models if m.size_bytes is None and m.action is Action.FETCH)

    @property
    def fits(self) -> bool:
        """The fetches fit the budget once the planned evictions are done (always, without a budget)."""
        return self.eviction.satisfied

    def model(self, model_id: str) -> PlannedModel | None:
        return next((m for m in self.models if m.model_id == model_id), None)

    def _with(self, action: Action) -> tuple[PlannedModel, ...]:
        return tuple(m for m in self.models if m.action is action)


def plan_node(
    schedule: Schedule,
    pool: str,
    now: datetime,
    entries: Iterable[CacheEntry],
    budget_bytes: int | None,
    bandwidth_bytes_per_s: float | None,
    remote_sizes: Mapping[str, int] = _NO_SIZES,
    grace_s: float = 0.0,
) -> NodePlan:
    """Decide fetch / keep / evict for `pool` at `now` (see the module docstring).

    `entries` is the cache as the eviction planner sees it (ready, quarantined,
    and pulls in progress with the space they claimed); `remote_sizes` gives the
    sizes of models not cached, when the caller could learn them. `grace_s`
    spares models used that recently, as the engine does.
    """
    entries = tuple(entries)
    cached = {e.model: e for e in entries if e.state is CacheState.READY}
    claimed = {e.model for e in entries if e.state is CacheState.PULLING}
    desired = desired_models(schedule, pool, now)
    reasons = protection_reasons(desired)
    fetching = [d for d in desired if d.phase in _WANTED_NOW and d.model.source.model_id not in cached]
    # a pull already running counts through the space it claimed, not twice
    incoming = sum(
        remote_sizes.get(model_id, 0)
        for model_id in (d.model.source.model_id for d in fetching)
        if model_id not in claimed
    )
    use = budget_use(entries, budget_bytes, incoming)
    eviction = plan_eviction(entries, use.over_bytes, now.timestamp(), grace_s, reasons)
    victims = frozenset(eviction.victims)
    ready_at = _expected_ready(desired, cached, remote_sizes, now, bandwidth_bytes_per_s)
    horizon = now + timedelta(seconds=READY_HORIZON_S)
    planned = [
        _planned(d, cached, remote_sizes, victims, reasons, ready_at.get(d.model.source.model_id), horizon)
        for d in desired
    ]
    scheduled = {d.model.source.model_id for d in desired}
    planned += [
        PlannedModel(
            model_id=model_id,
            label=model_id,
            phase=SchedulePhase.UNSCHEDULED,
            action=Action.EVICT if model_id in victims else Action.KEEP,
            size_bytes=entry.size_bytes,
            window_start=None,
            prefetch_at=None,
            ready_at=None,
            protected="pinned" if entry.pinned else None,
        )
        for model_id, entry in sorted(cached.items())
        if model_id not in scheduled
    ]
    order = list(Action)
    planned.sort(key=lambda m: order.index(m.action))  # stable: fetch order within each action
    return NodePlan(
        pool=pool,
        at=now,
        models=tuple(planned),
        budget_bytes=budget_bytes,
        used_bytes=use.used_bytes,
        bandwidth_bytes_per_s=bandwidth_bytes_per_s,
        eviction=eviction,
    )


def protection_reasons(desired: Iterable[DesiredModel]) -> dict[str, str]:
    """model id -> why eviction must leave it alone, for the models the schedule protects.

    This is the `protected` mapping both the plan and the pull engine's space
    reservation honour, so a model inside its lead time is never evicted.
    """
    return {
        d.model.source.model_id: f"the schedule needs it: {d.phase.value} on {d.model.label}"
        for d in desired
        if d.protected
    }


def start_jitter_s(node: str, model_id: str, jitter_max_s: float) -> float:
    """A per-node, per-model delay in [0, jitter_max_s): a pool's nodes spread their starts.

    Deterministic, so a restarted daemon waits the same time and every node's
    delay can be predicted from its name; differs per model so one node does
    not always go first.
    """
    if jitter_max_s <= 0:
        return 0.0
    digest = hashlib.sha256(f"{node}\0{model_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 * jitter_max_s


#: instants `plan --at` accepts: the planner looks windows up before and after the instant, and
#: datetime stops at the years 1 and 9999
EARLIEST_INSTANT = datetime(1970, 1, 1, tzinfo=UTC)
LATEST_INSTANT = datetime(9000, 1, 1, tzinfo=UTC)


def parse_instant(text: str, default_zone: str) -> datetime:
    """ISO 8601 (`2026-05-04T07:30`, `...Z`, `...+09:00`); a time without offset is in `default_zone`."""
    try:
        instant = datetime.fromisoformat(text.strip())
    except ValueError:
        raise UsageError(
            f"invalid time {text!r}; use ISO 8601, e.g. 2026-05-04T07:30 or 2026-05-04T07:30:00+09:00"
        ) from None
    if instant.tzinfo is None:
        zone = load_zone(default_zone)
        # fold=0: an ambiguous wall time means its first occurrence, as for windows
        instant = instant.replace(tzinfo=zone)
    try:
        in_range = EARLIEST_INSTANT <= instant < LATEST_INSTANT
    except OverflowError:  # an offset that takes it past year 1 or 9999
        in_range = False
    if not in_range:
        raise UsageError(
            f"time {text!r} is outside what the planner handles: {EARLIEST_INSTANT:%Y-%m-%d} "
            f"to {LATEST_INSTANT:%Y-%m-%d} UTC (windows, leads and keeps are looked up around it)"
        )
    return instant


def _expected_ready(
    desired: tuple[DesiredModel, ...],
    cached: Mapping[str, CacheEntry],
    remote_sizes: Mapping[str, int],
    now: datetime,
    bandwidth_bytes_per_s: float | None,
) -> dict[str, datetime]:
    """Walk the fetch order as the daemon would: one model at a time, each starting at its prefetch time."""
    if not bandwidth_bytes_per_s or bandwidth_bytes_per_s <= 0:
        return {}
    cursor = now
    ready: dict[str, datetime] = {}
    for d in desired:
        model_id = d.model.source.model_id
        size = remote_sizes.get(model_id)
        if model_id in cached or size is None:
            continue
        if d.phase in _WANTED_NOW:
            start = cursor
        elif d.phase is SchedulePhase.UPCOMING and d.prefetch_at is not None:
            start = max(cursor, d.prefetch_at)
        else:
            continue
        horizon = now + timedelta(seconds=READY_HORIZON_S)
        cursor = min(start + timedelta(seconds=min(size / bandwidth_bytes_per_s, READY_HORIZON_S)), horizon)
        ready[model_id] = cursor
    return ready


def _planned(
    d: DesiredModel,
    cached: Mapping[str, CacheEntry],
    remote_sizes: Mapping[str, int],
    victims: frozenset[str],
    reasons: Mapping[str, str],
    ready_at: datetime | None,
    horizon: datetime,
) -> PlannedModel:
    model_id = d.model.source.model_id
    entry = cached.get(model_id)
    if entry is not None:
        action = Action.EVICT if model_id in victims else Action.KEEP
    elif d.phase in _WANTED_NOW:
        action = Action.FETCH
    elif d.phase is SchedulePhase.UPCOMING:
        action = Action.LATER
    else:
        action = Action.SKIP
    window = d.window
    return PlannedModel(
        model_id=model_id,
        label=d.model.label,
        phase=d.phase,
        action=action,
        size_bytes=entry.size_bytes if entry is not None else remote_sizes.get(model_id),
        window_start=None if window is None else window.start,
        prefetch_at=d.prefetch_at,
        ready_at=ready_at if entry is None else None,
        protected=("pinned" if entry is not None and entry.pinned else reasons.get(model_id)),
        always=window is not None and window.start is None,
        beyond_horizon=entry is None and ready_at is not None and ready_at >= horizon,
        variant=d.model.variant,
    )
