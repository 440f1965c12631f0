"""The desired set: what the schedule wants on one pool's nodes at one instant.

This is the daemon's and `modelsync plan`'s shared decision, as a pure function
of (schedule, pool, now). Each model that targets the pool gets a phase:

    active    one of its windows is open now
    prefetch  a window opens within the model's lead time: stage it now
    keep      cooldown: its last window closed less than `keep` ago
    upcoming  none of the above; a window will open later
    expired   no window will ever open again and keep has passed

The phase says when the schedule wants a model; it is not the model's state in
the cache (`core.lifecycle.CacheState`) nor what a plan does about it
(`core.plan.Action`, whose `keep` means "cached, and stays").

`active`, `prefetch` and `keep` are *protected*: eviction must never pick them,
because a model evicted inside its lead time would be fetched again minutes
later, and one evicted while serving would break a starting pod.

The set is ordered as the daemon should fetch: by window start (an `always`
window first, since it is open already), then by priority, higher first.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum

from modelsync.core.refs import ModelRef
from modelsync.core.schedule import Schedule, ScheduledModel
from modelsync.core.windows import Occurrence, current_or_next, previous

__all__ = ["DesiredModel", "SchedulePhase", "desired_models", "protected"]


class SchedulePhase(StrEnum):
    ACTIVE = "active"
    PREFETCH = "prefetch"
    #: shown as `keep`, after the schedule field that sets how long it lasts
    COOLDOWN = "keep"
    UPCOMING = "upcoming"
    EXPIRED = "expired"
    #: a cached model the schedule does not name for the pool (plans only)
    UNSCHEDULED = "unscheduled"


_PROTECTED_PHASES = frozenset({SchedulePhase.ACTIVE, SchedulePhase.PREFETCH, SchedulePhase.COOLDOWN})


@dataclass(frozen=True, slots=True)
class DesiredModel:
    model: ScheduledModel
    phase: SchedulePhase
    #: the open window, else the next one; None when no window opens again
    window: Occurrence | None
    #: when staging should begin (window start - lead); None when the window is `always`
    prefetch_at: datetime | None
    #: until when the model is held: the last closed window's end + keep in phase `keep`,
    #: else the reported window's end + keep; None when that is never
    keep_until: datetime | None

    @property
    def protected(self) -> bool:
        """True when eviction must not pick this model now."""
        return self.phase in _PROTECTED_PHASES


def desired_models(schedule: Schedule, pool: str, now: datetime) -> tuple[DesiredModel, ...]:
    """Every model of `pool` with its phase at `now`, in fetch order (see the module docstring)."""
    if now.tzinfo is None or now.utcoffset() is None:
        raise ValueError(f"now must be an aware datetime, got {now!r}")
    found = [_assess(model, now) for model in schedule.for_pool(pool)]
    return tuple(sorted(found, key=_fetch_order))


def protected(desired: Iterable[DesiredModel]) -> frozenset[ModelRef]:
    """The sources eviction must leave alone: active, inside their lead time, or kept."""
    return frozenset(entry.model.source for entry in desired if entry.protected)


def _assess(model: ScheduledModel, now: datetime) -> DesiredModel:
    lead = timedelta(seconds=model.lead_s)
    keep = timedelta(seconds=model.keep_s)
    open_now: list[Occurrence] = []
    upcoming: list[Occurrence] = []
    last_closed: datetime | None = None
    for window in model.windows:
        occurrence = current_or_next(window, now)
        if occurrence is not None:
            (open_now if occurrence.is_open(now) else upcoming).append(occurrence)
        closed = previous(window, now)
        if closed is not None and closed.end is not None:
            last_closed = closed.end if last_closed is None else max(last_closed, closed.end)

    if open_now:
        # the one that closes last decides how long the model stays
        chosen = max(open_now, key=lambda o: _end_key(o.end))
        return _desired(model, SchedulePhase.ACTIVE, chosen, lead, keep)
    chosen_next = min(upcoming, key=lambda o: _start_key(o.start)) if upcoming else None
    starts_in = None if chosen_next is None or chosen_next.start is None else chosen_next.start - now
    if starts_in is not None and starts_in <= lead:
        return _desired(model, SchedulePhase.PREFETCH, chosen_next, lead, keep)
    if last_closed is not None and now < last_closed + keep:
        entry = _desired(model, SchedulePhase.COOLDOWN, chosen_next, lead, keep)
        return replace(entry, keep_until=last_closed + keep)
    phase = SchedulePhase.UPCOMING if chosen_next is not None else SchedulePhase.EXPIRED
    return _desired(model, phase, chosen_next, lead, keep)


def _desired(
    model: ScheduledModel,
    phase: SchedulePhase,
    window: Occurrence | None,
    lead: timedelta,
    keep: timedelta,
) -> DesiredModel:
    if window is None:
        return DesiredModel(model, phase, None, prefetch_at=None, keep_until=None)
    return DesiredModel(
        model,
        phase,
        window,
        prefetch_at=None if window.start is None else window.start - lead,
        keep_until=None if window.end is None else window.end + keep,
    )


def _fetch_order(entry: DesiredModel) -> tuple[int, float, int, str]:
    """(no window last, window start with `always` first, higher priority first, source)."""
    window = entry.window
    if window is None:
        return (1, 0.0, -entry.model.priority, entry.model.source.uri)
    start = float("-inf") if window.start is None else window.start.timestamp()
    return (0, start, -entry.model.priority, entry.model.source.uri)


def _start_key(start: datetime | None) -> float:
    return float("-inf") if start is None else start.timestamp()


def _end_key(end: datetime | None) -> float:
    return float("inf") if end is None else end.timestamp()
