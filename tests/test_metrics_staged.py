"""modelsync_model_staged{model}: which nodes are warm for which model, from the daemon's plan."""

from __future__ import annotations

from datetime import UTC, datetime

from prometheus_client.parser import text_string_to_metric_families

from modelsync.core.eviction import Blob, CacheEntry
from modelsync.core.plan import plan_node
from modelsync.core.schedule import load_schedule
from modelsync.metrics import DaemonMetrics

NOW = datetime(2026, 5, 4, 12, 0, tzinfo=UTC)


def schedule(*models: str) -> str:
    lines = ["version: 1", "timezone: UTC", "models:"]
    for n, source in enumerate(models):
        lines += [f"  - name: m{n}", f"    source: {source}", "    pools: [p]", "    windows: [always]"]
    return "\n".join(lines) + "\n"


def staged(metrics: DaemonMetrics) -> dict[str, float]:
    return {
        s.labels["model"]: s.value
        for family in text_string_to_metric_families(metrics.render().decode())
        for s in family.samples
        if s.name == "modelsync_model_staged"
    }


def test_the_staged_gauge_follows_the_plan_and_drops_models_that_left_it() -> None:
    metrics = DaemonMetrics()
    both = load_schedule(schedule("s3://models/a/r1/", "s3://models/b/r1/"), "schedule.yaml")
    cached = [CacheEntry("models/a/r1", last_used_at=0.0, blobs=frozenset({Blob((0, 1), 10)}))]
    metrics.observe_plan(plan_node(both, "p", NOW, cached, None, None), 0.0)
    assert staged(metrics) == {"models/a/r1": 1.0, "models/b/r1": 0.0}

    only_b = load_schedule(schedule("s3://models/b/r1/"), "schedule.yaml")
    metrics.observe_plan(plan_node(only_b, "p", NOW, (), None, None), 0.0)
    assert staged(metrics) == {"models/b/r1": 0.0}
