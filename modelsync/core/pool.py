"""When the last node of a pool has each model, with every node sharing the store's egress.

A node plan (core/plan.py) times each fetch at the node's own rate. A pool whose
nodes open the same window pulls N copies of every model through one store, so
each node gets at most its share of what the store delivers:

    per-node rate = min(node rate, 0.9 × store rate / N)

A store at its egress limit delivers about nine tenths of it: one that sheds load
near saturation (AIStor, S3 at its link) answers new GETs with 503 SlowDown while
its streams run on, and refused nodes finish alone while it idles. Measured on a
pool of 16 against a store that sheds (docs/schedule.md, "The pool plan against a
measured pool"), uncapped nodes drew 80-92% of its egress and nodes capped at 90% of
their share 86-89%; a store that never refused would deliver the last tenth too, and
its last node would come a tenth before the plan, inside the ±15% the measured pool is
held to.

Every node runs the same plan, in the same order, from the same instant, so the
pool's timeline is the node plan walked at that rate, and the last node has a
model when that walk reaches it. Filling the pool with what is wanted now takes

    fill = N × bytes to fetch / min(0.9 × store rate, N × node rate)

e.g. 100 nodes × 700 GB at 50 GB/s of store egress: 70 TB / 45 GB/s = 25m56s,
however fast each node is.

A model is late *because of the store* when one node alone would have it before
its window opens but the last node of the pool would not. Two suggestions follow:

- cap each node at the pace a saturated store keeps (`--max-bandwidth` = 9/10 of
  store rate / N, rounded down, by at most a tenth): the pool is as fast, and the
  store refuses none of it, where uncapped nodes draw 503s and finish seconds apart.
  The plan times the pool at that cap as well;
- start earlier: lead = the model's lead + how late the last node is, rounded up
  to a minute. A window that is already open (or `always`) has no lead to change.

Start jitter (the daemon's `--jitter`) spreads the starts by seconds; it is left
out, since it moves the last node by at most that much.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from modelsync.core.plan import READY_HORIZON_S, Action, NodePlan, PlannedModel
from modelsync.core.units import MIN_RATE_CAP_BYTES_PER_S, format_bytes, format_duration
from modelsync.errors import UsageError

__all__ = ["PoolModel", "PoolPlan", "PoolShare", "plan_pool", "pool_json", "rate_flag", "render_pool"]

_TIMED = (Action.FETCH, Action.LATER)
_MINUTE_S = 60.0
#: a suggested rate keeps at least this many of its unit, so rounding down costs at most a tenth
_MIN_UNIT_COUNT = 10
_BINARY_RATE_UNITS = (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("ki", 2**10))
#: more nodes than any pool has: a typo, and a share that rounds to nothing
MAX_POOL_NODES = 100_000
#: the part of its egress a saturated store delivers to the pool, and so the part of the store's
#: share the suggested cap asks for: N capped nodes leave the rest spare, so a store that refuses
#: new GETs when (nearly) saturated refuses none (docs/schedule.md, "The pool plan against a
#: measured pool")
STORE_GOODPUT = 0.9


@dataclass(frozen=True, slots=True)
class PoolShare:
    """N nodes drawing from one store: who limits the rate each node gets."""

    nodes: int
    store_bytes_per_s: float
    #: the node's own limit (its link or --max-bandwidth); None when it is not the limit
    node_bytes_per_s: float | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.nodes <= MAX_POOL_NODES:
            raise UsageError(f"invalid --nodes {self.nodes}; a pool has 1 to {MAX_POOL_NODES} nodes")
        if not self.store_bytes_per_s > 0:
            raise UsageError("invalid --store-bandwidth; it must be more than 0, e.g. 50G/s")

    @property
    def share_bytes_per_s(self) -> float:
        """The store's egress divided evenly between the nodes."""
        return self.store_bytes_per_s / self.nodes

    @property
    def delivered_share_bytes_per_s(self) -> float:
        """The share of what a saturated store delivers: STORE_GOODPUT of the even share."""
        return self.share_bytes_per_s * STORE_GOODPUT

    @property
    def per_node_bytes_per_s(self) -> float:
        """What each node gets when all pull at once."""
        if self.node_bytes_per_s is None:
            return self.delivered_share_bytes_per_s
        return min(self.node_bytes_per_s, self.delivered_share_bytes_per_s)

    @property
    def store_bound(self) -> bool:
        """True when the store, not the node, sets the pace: the pool asks for more than it delivers."""
        return self.node_bytes_per_s is None or self.node_bytes_per_s > self.delivered_share_bytes_per_s


@dataclass(frozen=True, slots=True)
class PoolModel:
    """One model's timing on one node alone and on the last node of the pool."""

    alone: PlannedModel
    last: PlannedModel

    @property
    def store_late(self) -> bool:
        """The last node misses the window while one node alone would not."""
        pool_margin = self.last.margin_s
        alone_margin = self.alone.margin_s
        return pool_margin is not None and pool_margin < 0 and (alone_margin is None or alone_margin >= 0)

    @property
    def lead_s(self) -> float | None:
        """The model's lead time, when it has a window ahead to lead."""
        if self.alone.window_start is None or self.alone.prefetch_at is None:
            return None
        return (self.alone.window_start - self.alone.prefetch_at).total_seconds()

    @property
    def suggested_lead_s(self) -> float | None:
        """A lead that lets the last node finish before the window opens; None when it already does."""
        margin, lead = self.last.margin_s, self.lead_s
        if margin is None or margin >= 0 or lead is None or self.last.beyond_horizon:
            return None  # on time already, or no lead would make it (the rate saturated the plan)
        return math.ceil((lead - margin) / _MINUTE_S) * _MINUTE_S


@dataclass(frozen=True, slots=True)
class PoolPlan:
    share: PoolShare
    at: datetime
    #: the models one node fetches now or later, in fetch order
    models: tuple[PoolModel, ...]
    #: bytes one node fetches now (models of unknown size count 0)
    node_fetch_bytes: int

    @property
    def pool_fetch_bytes(self) -> int:
        return self.share.nodes * self.node_fetch_bytes

    @property
    def fill_s(self) -> float:
        """Until the last node has everything wanted now, all starting at `at` (saturates at the horizon)."""
        return min(self.node_fetch_bytes / self.share.per_node_bytes_per_s, READY_HORIZON_S)

    @property
    def store_late(self) -> tuple[PoolModel, ...]:
        return tuple(m for m in self.models if m.store_late)

    @property
    def suggested_max_bandwidth_bytes_per_s(self) -> int | None:
        """STORE_GOODPUT of the store's share per node, rounded down to what `rate_flag` prints;
        None when that is below the smallest cap (`--max-bandwidth 0` would mean no cap at all)."""
        return _suggested_cap(self.share)[0]

    @property
    def suggested_fill_s(self) -> float | None:
        """`fill_s` with every node at the suggested cap (or its own rate, if lower); None without one."""
        cap = self.suggested_max_bandwidth_bytes_per_s
        if cap is None:
            return None
        own = self.share.node_bytes_per_s  # the cap is below the share, so only the node can be lower
        return min(self.node_fetch_bytes / (cap if own is None else min(own, cap)), READY_HORIZON_S)


def plan_pool(
    node: NodePlan, replan: Callable[[float], NodePlan], nodes: int, store_bytes_per_s: float
) -> PoolPlan:
    """The pool's timeline next to `node`'s.

    `replan(rate)` must build the same node plan at another bandwidth: the pool's
    timeline is that plan at the per-node rate the store leaves each node.
    """
    share = PoolShare(nodes, store_bytes_per_s, node.bandwidth_bytes_per_s)
    shared = replan(share.per_node_bytes_per_s)
    last = {m.model_id: m for m in shared.models}
    models = tuple(PoolModel(m, last[m.model_id]) for m in node.models if m.action in _TIMED)
    return PoolPlan(share=share, at=node.at, models=models, node_fetch_bytes=node.fetch_bytes)


def rate_flag(bytes_per_s: float) -> str:
    """A rate as a `--max-bandwidth` value, rounded down so N nodes never exceed the store: `476Mi/s`.

    The largest unit of which it holds at least ten, so rounding down costs at most a tenth
    (`3.6 MiB/s` is `3686ki/s`, not `3Mi/s`).
    """
    return _round_down_rate(bytes_per_s)[1]


def _suggested_cap(share: PoolShare) -> tuple[int, str] | tuple[None, None]:
    """The `--max-bandwidth` to suggest, or none when it would be below the smallest cap."""
    rate = share.delivered_share_bytes_per_s
    if rate < MIN_RATE_CAP_BYTES_PER_S:
        return None, None
    return _round_down_rate(rate)


def _round_down_rate(bytes_per_s: float) -> tuple[int, str]:
    for unit, factor in _BINARY_RATE_UNITS:
        count = int(bytes_per_s // factor)
        if count >= _MIN_UNIT_COUNT:
            return count * factor, f"{count}{unit}/s"
    return int(bytes_per_s), f"{int(bytes_per_s)}/s"


def pool_json(plan: PoolPlan) -> dict[str, object]:
    """The pool section of `modelsync plan --json`: bytes, bytes per second, seconds."""

    def iso(instant: datetime | None) -> str | None:
        return None if instant is None else instant.astimezone(UTC).isoformat().replace("+00:00", "Z")

    return {
        "nodes": plan.share.nodes,
        "store_bandwidth_bytes_per_s": plan.share.store_bytes_per_s,
        "node_bandwidth_bytes_per_s": plan.share.node_bytes_per_s,
        "per_node_bandwidth_bytes_per_s": plan.share.per_node_bytes_per_s,
        "store_bound": plan.share.store_bound,
        "pool_fetch_bytes": plan.pool_fetch_bytes,
        "fill_s": plan.fill_s,
        "suggested_max_bandwidth_bytes_per_s": plan.suggested_max_bandwidth_bytes_per_s,
        "suggested_max_bandwidth": _suggested_cap(plan.share)[1],
        "suggested_fill_s": plan.suggested_fill_s,
        "late": [m.alone.model_id for m in plan.store_late],
        "models": [
            {
                "model": m.alone.model_id,
                "label": m.alone.label,
                "variant": m.alone.variant,
                "node_ready_at": iso(m.alone.ready_at),
                "node_ready_before_window_s": m.alone.margin_s,
                "pool_ready_at": iso(m.last.ready_at),
                "pool_ready_before_window_s": m.last.margin_s,
                "late": m.store_late,
                "lead_s": m.lead_s,
                "suggested_lead_s": m.suggested_lead_s,
            }
            for m in plan.models
        ],
    }


def render_pool(plan: PoolPlan) -> list[str]:
    """The pool section of `modelsync plan`: the shared rate, the fill time, one row per model."""
    share = plan.share
    limit = (
        f"the store is the limit; saturated, it delivers {STORE_GOODPUT:.0%} of its egress"
        if share.store_bound
        else "each node is the limit, the store has room"
    )
    alone = "" if share.node_bytes_per_s is None else f"; one node alone: {_rate(share.node_bytes_per_s)}"
    lines = [
        f"pool: {share.nodes} nodes share {_rate(share.store_bytes_per_s)} of store egress: "
        f"{_rate(share.per_node_bytes_per_s)} per node ({limit}{alone})",
        f"to fetch now across the pool: {format_bytes(plan.pool_fetch_bytes)}; "
        f"the last node is done in {_duration(plan.fill_s)}",
    ]
    cap = _suggested_cap(share)[1]
    if share.store_bound and cap is not None and plan.suggested_fill_s is not None:
        capped_fill = _duration(plan.suggested_fill_s)
        lines.append(
            f"suggest: --max-bandwidth {cap} per node ({STORE_GOODPUT:.0%} of the store's share: the pace of "
            f"a saturated store, without its 503 SlowDown); capped so, the last node is done in {capped_fill}"
        )
    elif share.store_bound:
        lines.append(
            f"suggest: fewer nodes pulling at once, or more store bandwidth: the store's share per node "
            f"is under {_rate(MIN_RATE_CAP_BYTES_PER_S)}, the smallest cap (--max-bandwidth 0 means no cap)"
        )
    if plan.store_late:
        names = ", ".join(m.alone.shown for m in plan.store_late)
        lines.append(f"LATE: the store makes {len(plan.store_late)} model(s) miss the window: {names}")
    if not plan.models:
        return lines
    rows = [("MODEL", "ONE NODE", f"LAST OF {share.nodes} NODES")]
    for m in plan.models:
        pool_note = m.last.note(plan.at)
        if m.store_late:
            pool_note = "LATE: " + pool_note
        if m.suggested_lead_s is not None:
            pool_note += f" (lead {format_duration(m.suggested_lead_s)} would fit)"
        rows.append((m.alone.shown, m.alone.note(plan.at) or "-", pool_note))
    widths = [max(len(row[i]) for row in rows) for i in range(2)]
    lines.append("")
    lines += [f"{r[0].ljust(widths[0])}  {r[1].ljust(widths[1])}  {r[2]}".rstrip() for r in rows]
    return lines


def _duration(seconds: float) -> str:
    return "over 100 years" if seconds >= READY_HORIZON_S else format_duration(seconds)


def _rate(bytes_per_s: float) -> str:
    if bytes_per_s < 1:  # a share too small for whole bytes still reads as what it is
        return f"{bytes_per_s:.3g} B/s"
    return f"{format_bytes(int(bytes_per_s))}/s"
