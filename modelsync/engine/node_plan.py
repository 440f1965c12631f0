"""The node plan from the cache and the node's settings: one step for `modelsync plan` and the daemon.

The decisions are pure (core/plan.py `plan_node`); what this adds is how the
node's settings enter them (the budget resolved against the cache's filesystem,
the bandwidth cap, the in-use grace), so the dry run and the daemon cannot come
to read the same settings differently.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from modelsync.config import Settings
from modelsync.core.eviction import CacheEntry
from modelsync.core.plan import NodePlan, plan_node
from modelsync.core.schedule import Schedule
from modelsync.engine.evict import budget_bytes


def node_plan(
    settings: Settings,
    schedule: Schedule,
    pool: str,
    now: datetime,
    entries: list[CacheEntry],
    sizes: Mapping[str, int],
    *,
    rate_bytes_per_s: float | None = None,
) -> NodePlan:
    """What the node fetches, keeps and evicts at `now`, as the daemon decides it.

    `entries` is the cache as eviction sees it (engine/inventory.py `cache_entries`),
    `sizes` the known sizes of the models it lacks. A dry run may assume another
    download rate (by default the settings' cap), and another budget by passing
    settings that hold it. Reads the cache's filesystem size when the budget is a
    share of it.
    """
    rate = rate_bytes_per_s or float(settings.max_bandwidth_bytes_per_s) or None
    budget = budget_bytes(settings)
    return plan_node(schedule, pool, now, entries, budget, rate, sizes, settings.in_use_grace_s)
