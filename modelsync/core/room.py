"""When a pull that does not fit now would fit: a forecast from the instants protections end.

A model in use (touched within the grace), leased, or being pulled is protected
only for a while: the grace runs out at `last_used_at + grace_s`, a lease at
`in_use_until`, and a running pull makes its model ready (and so in use for one
grace) at the earliest now. Pinned models and the ones the caller protects (the
model being pulled, the schedule's) stay. So "can it ever fit" and "from when"
are one question, answered here without a clock or a disk: the earliest instant
at which `plan_eviction` would be satisfied, or None when it never would.

Eligibility only grows with time, so a plan satisfied at some instant is
satisfied at every later one, and the earliest instant is found by bisecting the
instants at which protections end.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import NamedTuple

from modelsync.core.eviction import CacheEntry, Protection, plan_eviction
from modelsync.core.lifecycle import CacheState

#: how a forecast names the models it waits for before saying "and N more"
_NAMED = 4
#: past the instant a protection ends, so float rounding of `last_used_at + grace_s` cannot keep it
_PAST_S = 0.001


class RoomForecast(NamedTuple):
    """The earliest instant (epoch seconds) the space frees, and what it waits for.

    `at` is None when the space never frees: what stands in the way does not end
    on its own. `waits_for` are the protections that must end first (none when
    `at` is the forecast's `now`, or when `at` is None).
    """

    at: float | None
    waits_for: tuple[Protection, ...] = ()

    def describe(self) -> str:
        """`org/a (in use: used 3s ago, grace 10s), org/b (pulling)`: one line's worth."""
        named = [f"{p.model} ({p.reason})" for p in self.waits_for[:_NAMED]]
        if len(self.waits_for) > _NAMED:
            named.append(f"and {len(self.waits_for) - _NAMED} more")
        return ", ".join(named)


def forecast_room(
    entries: Iterable[CacheEntry],
    needed_bytes: int,
    now: float,
    grace_s: float,
    protected: Mapping[str, str],
) -> RoomForecast:
    """The earliest instant from `now` on at which evicting eligible entries frees `needed_bytes`.

    A pull in progress is taken to finish at once (the earliest it could), after
    which its model is in use for one grace; the forecast is a lower bound, to be
    asked again as the cache changes.
    """
    real = tuple(entries)
    now_plan = plan_eviction(real, needed_bytes, now, grace_s, protected)
    if now_plan.satisfied:
        return RoomForecast(now)
    cached = tuple(_finished(entry, now, protected) for entry in real)
    ends = {e.model: end for e in cached if (end := _protected_until(e, grace_s, protected)) is not None}
    instants = sorted({end for end in ends.values() if end >= now})

    def fits(at: float) -> bool:
        return plan_eviction(cached, needed_bytes, at, grace_s, protected).satisfied

    if not instants or not fits(instants[-1]):
        return RoomForecast(None)
    low, high = 0, len(instants) - 1  # the first instant that fits lies in [low, high]
    while low < high:
        middle = (low + high) // 2
        if fits(instants[middle]):
            high = middle
        else:
            low = middle + 1
    at = instants[low]
    return RoomForecast(at, tuple(p for p in now_plan.protected if ends.get(p.model, at + 1) <= at))


def _finished(entry: CacheEntry, now: float, protected: Mapping[str, str]) -> CacheEntry:
    """A model being pulled as it will be at the earliest: ready now, so in use for one grace."""
    if entry.state is not CacheState.PULLING or entry.model in protected:
        return entry
    return entry._replace(state=CacheState.READY, last_used_at=max(entry.last_used_at, now))


def _protected_until(entry: CacheEntry, grace_s: float, protected: Mapping[str, str]) -> float | None:
    """When `entry`'s protections all end; None when one of them never ends (or it has none)."""
    if entry.pinned or entry.model in protected or entry.state is CacheState.PULLING:
        return None
    ends = [entry.last_used_at + grace_s]
    if entry.in_use_until is not None:
        ends.append(entry.in_use_until)
    return max(ends) + _PAST_S


def instant(at: float) -> str:
    """`03:50:12Z`: when, in a line a person reads on the same day."""
    return datetime.fromtimestamp(at, UTC).strftime("%H:%M:%SZ")
