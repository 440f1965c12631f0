"""The node plan for people and tools: the table `modelsync plan` prints, and its JSON.

The JSON is also what the daemon's `status` answers; ids, bytes, ISO 8601 UTC
times. The table shows times in the plan's own zone (the schedule's).
"""

from __future__ import annotations

from datetime import UTC, datetime

from modelsync.core.plan import NodePlan, PlannedModel
from modelsync.core.units import format_bytes, format_duration

__all__ = ["plan_json", "render_plan"]


def plan_json(plan: NodePlan) -> dict[str, object]:
    """The plan for tools (`modelsync plan --json`): ids, bytes, ISO 8601 UTC times."""

    def iso(instant: datetime | None) -> str | None:
        return None if instant is None else instant.astimezone(UTC).isoformat().replace("+00:00", "Z")

    return {
        "pool": plan.pool,
        "at": iso(plan.at),
        "fits": plan.fits,
        "budget_bytes": plan.budget_bytes,
        "used_bytes": plan.used_bytes,
        "fetch_bytes": plan.fetch_bytes,
        "unknown_sizes": list(plan.unknown_sizes),
        "bandwidth_bytes_per_s": plan.bandwidth_bytes_per_s,
        "eviction": {
            "needed_bytes": plan.eviction.needed_bytes,
            "freed_bytes": plan.eviction.freed_bytes,
            "summary": plan.eviction.describe()[0],
        },
        "fetch": [m.model_id for m in plan.fetch],
        "keep": [m.model_id for m in plan.keep],
        "evict": [m.model_id for m in plan.evict],
        "models": [
            {
                "model": m.model_id,
                "label": m.label,
                "variant": m.variant,
                "state": m.phase.value,
                "action": m.action.value,
                "size_bytes": m.size_bytes,
                "window_start": iso(m.window_start),
                "always": m.always,
                "prefetch_at": iso(m.prefetch_at),
                "ready_at": iso(m.ready_at),
                "ready_before_window_s": m.margin_s,
                "late": m.late,
                "protected": m.protected,
                "note": m.note(plan.at),
            }
            for m in plan.models
        ],
    }


def render_plan(plan: NodePlan) -> list[str]:
    """The human table of `modelsync plan`: a summary, then one row per model, times in `plan.at`'s zone."""
    budget = "no budget" if plan.budget_bytes is None else f"budget {format_bytes(plan.budget_bytes)}"
    unknown = f" ({len(plan.unknown_sizes)} of unknown size not counted)" if plan.unknown_sizes else ""
    speed = (
        "unknown" if not plan.bandwidth_bytes_per_s else f"{format_bytes(int(plan.bandwidth_bytes_per_s))}/s"
    )
    lines = [
        f"pool {plan.pool} at {plan.at.isoformat(timespec='seconds')}",
        f"cache: {format_bytes(plan.used_bytes)} used, {budget}; to fetch now: "
        f"{format_bytes(plan.fetch_bytes)}{unknown}; bandwidth {speed}",
        f"fits the budget: {'yes' if plan.fits else 'NO'}"
        + ("" if plan.eviction.needed_bytes == 0 else f"; {plan.eviction.describe()[0]}"),
        "",
    ]
    rows = [("ACTION", "MODEL", "STATE", "SIZE", "WINDOW OPENS", "NOTE")]
    for m in plan.models:
        rows.append(
            (
                m.action.value,
                m.shown,
                m.phase.value,
                "?" if m.size_bytes is None else format_bytes(m.size_bytes),
                _window_text(m, plan.at),
                ("LATE: " if m.late else "") + m.note(plan.at),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines += [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)) + "  " + row[-1]
        for row in rows
    ]
    return [line.rstrip() for line in lines]


def _window_text(m: PlannedModel, now: datetime) -> str:
    if m.always:
        return "always"
    if m.window_start is None:
        return "-"
    local = m.window_start.astimezone(now.tzinfo)
    delta = (m.window_start - now).total_seconds()
    relative = f"in {format_duration(delta)}" if delta > 0 else f"open {format_duration(-delta)}"
    return f"{local.strftime('%Y-%m-%d %H:%M')} ({relative})"
