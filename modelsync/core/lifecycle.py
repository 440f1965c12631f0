"""Where a cached model is in its life: one name for what eviction, the index and `ls` see.

    pulling      a running pull holds its staging and the space it claimed; no ready path yet
    ready        its ready directory and completion record both exist: it is served
    quarantined  a check found it damaged; data and record are kept for `verify --repair`

The values are the strings the index stores and `ls` prints. This is not the
schedule's phase of a model (`core.desired.SchedulePhase`: when the schedule
wants it) nor a plan's action (`core.plan.Action`: what the daemon does now).
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["CacheState"]


class CacheState(StrEnum):
    PULLING = "pulling"
    READY = "ready"
    QUARANTINED = "quarantined"
