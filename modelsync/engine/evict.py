"""Executing eviction plans, and making room for a pull under the cache budget.

Plans come from core/eviction.py; this module only carries them out, in the
safe order: take the model's lock (a model being pulled is skipped), make the
ready path disappear in one rename, drop its record and index row, then delete
the data. A reader never sees half a model; files it already has open stay
readable until it closes them.

Space is decided under one cache-wide lock, so two pulls never both count the
same free bytes: each computes what it needs, evicts if the budget or the disk
requires it, and records a reservation that other pulls see as used space.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from modelsync.adapters import fs
from modelsync.adapters.cache import Cache
from modelsync.config import Settings
from modelsync.core.eviction import EvictionPlan, plan_eviction, plan_watermarks
from modelsync.core.nesting import held_by
from modelsync.core.refs import ModelRef, parse_model_name
from modelsync.core.units import format_bytes
from modelsync.engine.catalog import Catalog
from modelsync.errors import DiskFullError


@dataclass(frozen=True, slots=True)
class EvictionResult:
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
    return settings.cache_budget.resolve(fs.total_bytes(settings.cache_dir))


def make_room(
    settings: Settings,
    cache: Cache,
    catalog: Catalog,
    ref: ModelRef,
    needed_bytes: int,
    protected: Mapping[str, str],
) -> EvictionResult:
    """Reserve `needed_bytes` for pulling `ref`, evicting LRU models when budget or disk demand it.

    Files are allocated only as the pull opens them, so the free space counted here
    is the disk's, less what other live pulls claimed and have not allocated yet.
    Raises DiskFullError, naming what is pinned or protected, when it can never fit.
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
            plan = plan_watermarks(
                catalog.eviction_entries(),
                budget,
                settings.high_watermark,
                settings.low_watermark,
                needed_bytes,
                now,
                settings.in_use_grace_s,
                protected,
            )
            _refuse_unless_satisfied(plan, ref, needed_bytes, f"a cache budget of {format_bytes(budget)}")
            result = evict(cache, catalog, plan.victims)
            evicted += result.evicted
            skipped += result.skipped
        free = fs.free_bytes(cache.root) - sum(
            cache.outstanding_bytes(slug, claim)
            for slug, claim in cache.reservations().items()
            if slug != ref.slug
        )
        if needed_bytes > free:
            plan = plan_eviction(
                catalog.eviction_entries(), needed_bytes - free, now, settings.in_use_grace_s, protected
            )
            _refuse_unless_satisfied(plan, ref, needed_bytes, f"{format_bytes(free)} free on {cache.root}")
            result = evict(cache, catalog, plan.victims)
            evicted += result.evicted
            skipped += result.skipped
        cache.reserve(ref, needed_bytes)
        return EvictionResult(tuple(evicted), tuple(skipped))
    finally:
        space_lock.release()


def _refuse_unless_satisfied(plan: EvictionPlan, ref: ModelRef, needed_bytes: int, limit: str) -> None:
    if not plan.satisfied:
        raise DiskFullError(
            f"{ref.uri} needs {format_bytes(needed_bytes)}, with {limit}; {plan.describe()[0]}; "
            "unpin or evict models, raise MODELSYNC_CACHE_MAX_BYTES, or free disk space"
        )
