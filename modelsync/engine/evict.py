"""Executing eviction plans, and making room for a pull under the cache budget.

Plans come from core/eviction.py; this module only carries them out, in the
safe order: take the model's lock (a model being pulled is skipped), make the
ready path disappear in one rename, drop its record and index row, then delete
the data. A reader never sees half a model; files it already has open stay
readable until it closes them.

Space is decided under one cache-wide lock, so two pulls never both count the
same free bytes: each computes what it needs, evicts if the budget or the disk
requires it, and records a reservation that other pulls see as used space.

When the space is not there yet but comes once models in use, leased or being
pulled are done (core/room.py), `make_room` says when instead of failing, and
the pull waits outside the lock (engine/pull.py) until then or its deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple

from modelsync.adapters import volume
from modelsync.adapters.cache import Cache
from modelsync.config import Settings
from modelsync.core.eviction import CacheEntry, EvictionPlan, budget_use, plan_eviction, plan_watermarks
from modelsync.core.nesting import held_by
from modelsync.core.refs import ModelRef, parse_model_name
from modelsync.core.room import RoomForecast, forecast_room, instant
from modelsync.core.units import format_bytes, format_duration
from modelsync.engine.catalog import Catalog
from modelsync.errors import DiskFullError


class EvictionResult(NamedTuple):
    evicted: tuple[str, ...]
    #: models the plan named that were being pulled (or refreshed) by then, left alone
    skipped: tuple[str, ...]


def evict(cache: Cache, catalog: Catalog, models: Iterable[str]) -> EvictionResult:
    """Take `models` out of the ready set, delete them; one whose lock is held is skipped, not awaited."""
    evicted, skipped = [], []
    ready = catalog.ready_refs()
    for model in models:
        ref = parse_model_name(model)
        with contextlib.ExitStack() as locks:
            # a ready model inside this one (a cache from before models could not nest) stays
            inside = held_by(ref, ready)
            if not try_lock_all(cache, (ref, *inside), locks):  # one is being pulled: leave them alone
                skipped.append(model)
                continue
            # A quarantined copy goes too (nothing there when the model is not quarantined); no
            # per-victim lookup of its state, which would read every model's markers again.
            cache.drop_quarantine(ref)
            if inside:
                cache.remove_ready_keeping(ref, inside)
            else:
                cache.remove_ready(ref)
            cache.finish_removal(ref)  # what an eviction stopped midway left in the trash
            cache.prune_parents(ref)
            cache.forget(ref)
            catalog.index.remove([model])
        ready = [r for r in ready if r != ref]
        evicted.append(model)
    return EvictionResult(tuple(evicted), tuple(skipped))


#: how often a pull waiting for room looks again: a pull that fails or a model evicted by hand frees it early
ROOM_POLL_S = 1.0


class RoomLater(NamedTuple):
    """The space is not there now, but is forecast by `at` (epoch seconds), before the deadline."""

    at: float
    #: one line: what is short and which protections must end
    waiting_for: str


def try_lock_all(cache: Cache, refs: Iterable[ModelRef], locks: contextlib.ExitStack) -> bool:
    """Take each model's lock without waiting (released as `locks` closes); False when one is held."""
    for ref in refs:
        lock = cache.lock(ref)
        if not lock.try_acquire():
            return False
        locks.callback(lock.release)
    return True


def budget_bytes(settings: Settings) -> int | None:
    if settings.cache_budget is None:
        return None
    return settings.cache_budget.resolve(volume.total_bytes(settings.cache_dir))


async def wait_for_room(
    claim: Callable[..., EvictionResult | RoomLater], room_wait_s: float, note: Callable[[str], None]
) -> EvictionResult:
    """Call `claim` (`make_room` for one pull) until it reserves, waiting up to `room_wait_s`
    while room is coming; says once what for.

    The wait is a sleep on the event loop, outside the space lock, so a signal or a
    cancelled pull ends it at once.
    """
    until = time.time() + room_wait_s
    waited = False
    while True:
        room = await asyncio.to_thread(claim, wait_until=until, waited=waited)
        if isinstance(room, EvictionResult):
            return room
        if not waited:
            note(f"no room yet: waiting up to {format_duration(room_wait_s)} for {room.waiting_for}")
            waited = True
        await asyncio.sleep(min(max(room.at - time.time(), 0.1), ROOM_POLL_S))


def make_room(
    settings: Settings,
    cache: Cache,
    catalog: Catalog,
    ref: ModelRef,
    needed_bytes: int,
    protected: Mapping[str, str],
    *,
    wait_until: float = 0.0,
    waited: bool = False,
) -> EvictionResult | RoomLater:
    """Reserve `needed_bytes` for pulling `ref`, evicting LRU models when budget or disk demand it.

    Files are allocated only as the pull opens them, so the free space counted here
    is the disk's, less what other live pulls claimed and have not allocated yet.
    When the space comes only once protections end, and by `wait_until` (epoch
    seconds), returns when instead; raises DiskFullError, naming what is pinned or
    protected, when it cannot fit even then or not in time (`waited`: the caller's
    wait ran out).
    """
    space_lock = cache.space_lock()
    space_lock.acquire()
    try:
        now = time.time()
        budget = budget_bytes(settings)
        # The model being pulled may have an older revision cached: it is replaced, never evicted.
        protected = {**protected, ref.model_id: "being pulled"}
        evicted: list[str] = []
        skipped: list[str] = []
        if budget is not None:
            entries = catalog.eviction_entries()
            plan = plan_watermarks(
                entries,
                budget,
                settings.high_watermark,
                settings.low_watermark,
                needed_bytes,
                now,
                settings.in_use_grace_s,
                protected,
            )
            if not plan.satisfied:
                short = budget_use(entries, budget, needed_bytes).over_bytes
                limit = f"a cache budget of {format_bytes(budget)}"
                shortfall = (needed_bytes, short)
                return _later(settings, entries, plan, protected, ref, shortfall, limit, (wait_until, waited))
            result = evict(cache, catalog, plan.victims)
            evicted += result.evicted
            skipped += result.skipped
        free = volume.free_bytes(cache.root) - sum(
            cache.outstanding_bytes(slug, claim)
            for slug, claim in cache.reservations().items()
            if slug != ref.slug
        )
        if needed_bytes > free:
            entries = catalog.eviction_entries()
            plan = plan_eviction(entries, needed_bytes - free, now, settings.in_use_grace_s, protected)
            if not plan.satisfied:
                limit = f"{format_bytes(free)} free on {cache.root}"
                shortfall = (needed_bytes, needed_bytes - free)
                return _later(settings, entries, plan, protected, ref, shortfall, limit, (wait_until, waited))
            result = evict(cache, catalog, plan.victims)
            evicted += result.evicted
            skipped += result.skipped
        cache.reserve(ref, needed_bytes)
        return EvictionResult(tuple(evicted), tuple(skipped))
    finally:
        space_lock.release()


def _later(
    settings: Settings,
    entries: list[CacheEntry],
    plan: EvictionPlan,
    protected: Mapping[str, str],
    ref: ModelRef,
    needed_and_short: tuple[int, int],
    limit: str,
    wait: tuple[float, bool],
) -> RoomLater:
    """When the space comes, if it does by the wait's end; else the DiskFullError that says why not.

    `needed_and_short` is what the pull needs and how much of it is missing; `wait`
    is when waiting must end, and whether the caller has been waiting already.
    """
    needed_bytes, short_bytes = needed_and_short
    wait_until, waited = wait
    now = time.time()
    forecast = forecast_room(entries, short_bytes, now, settings.in_use_grace_s, protected)
    if forecast.at is not None and forecast.at <= wait_until:
        return RoomLater(forecast.at, _waiting_for(forecast, short_bytes, limit))
    if forecast.at is None:
        why = "it cannot fit even once the models in use or being pulled are done"
    else:
        if settings.room_wait_s <= 0:
            ends = "is off"
        elif waited:
            ends = f"ran out after {format_duration(settings.room_wait_s)}"
        else:
            ends = f"ends at {instant(wait_until)}"
        why = (
            f"room is expected only at {instant(forecast.at)}, when {forecast.describe()} end, and the "
            f"wait for room (MODELSYNC_ROOM_WAIT, --room-wait) {ends}"
        )
    raise DiskFullError(
        f"{ref.uri} needs {format_bytes(needed_bytes)}, with {limit}; {plan.describe()[0]}; {why}; "
        "unpin or evict models, raise MODELSYNC_CACHE_MAX_BYTES, or free disk space"
    )


def _waiting_for(forecast: RoomForecast, short_bytes: int, limit: str) -> str:
    assert forecast.at is not None
    if not forecast.waits_for:
        return f"{format_bytes(short_bytes)} more with {limit}"
    return (
        f"{format_bytes(short_bytes)} more with {limit}, expected by {instant(forecast.at)} when "
        f"{forecast.describe()} end"
    )
