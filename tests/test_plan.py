"""The node plan as a pure function (fetch, keep, evict, fits, ready times) and the desired set over time."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from modelsync.core.desired import SchedulePhase, desired_models
from modelsync.core.eviction import Blob, CacheEntry
from modelsync.core.lifecycle import CacheState
from modelsync.core.plan import Action, parse_instant, plan_node, start_jitter_s
from modelsync.core.plan_view import plan_json, render_plan
from modelsync.core.refs import parse_source
from modelsync.core.schedule import Schedule, ScheduledModel
from modelsync.core.windows import ALWAYS, CronWindow, Window
from modelsync.errors import UsageError

GB = 10**9
AT_0730 = datetime(2026, 5, 4, 7, 30, tzinfo=UTC)  # a Monday


def model(
    name: str,
    windows: tuple[Window, ...],
    pools: tuple[str, ...] = ("p",),
    lead_s: float = 1800,
    keep_s: float = 3600,
    priority: int = 50,
) -> ScheduledModel:
    return ScheduledModel(
        source=parse_source(f"s3://models/org/{name}/r1/"),
        name=name,
        pools=pools,
        priority=priority,
        lead_s=lead_s,
        keep_s=keep_s,
        windows=windows,
        line=1,
    )


def daily(hour: int, minute: int = 0, hours: float = 2) -> CronWindow:
    return CronWindow(cron=f"{minute} {hour} * * *", duration_s=hours * 3600, timezone="UTC")


def sched(*models: ScheduledModel) -> Schedule:
    return Schedule(version=1, timezone="UTC", models=models)


def cached(model_id: str, size_bytes: int, last_used: float, pinned: bool = False) -> CacheEntry:
    """A ready model whose files nothing else shares."""
    blob = Blob((0, int.from_bytes(hashlib.sha256(model_id.encode()).digest()[:8], "big")), size_bytes)
    return CacheEntry(model_id, last_used, pinned, blobs=frozenset({blob}))


def mid(name: str) -> str:
    return f"models/org/{name}/r1"


def test_plan_fetches_a_model_inside_its_lead_time_and_says_when_it_will_be_ready() -> None:
    plan = plan_node(sched(model("a", (daily(8),))), "p", AT_0730, (), None, 1e6, {mid("a"): GB})
    (a,) = plan.fetch
    assert (a.phase, a.ready_at) == ("prefetch", AT_0730 + timedelta(seconds=1000))
    assert a.margin_s == 1800 - 1000 and not a.late
    assert a.note(AT_0730) == "ready 13m20s before the window opens"


def test_plan_flags_a_model_that_will_be_ready_after_its_window_opens() -> None:
    plan = plan_node(sched(model("a", (daily(8),))), "p", AT_0730, (), None, 0.4e6, {mid("a"): GB})
    (a,) = plan.fetch
    assert a.late and a.margin_s == 1800 - 2500
    assert a.note(AT_0730) == "ready 11m40s after the window opens"
    assert "LATE: ready 11m40s after the window opens" in "\n".join(render_plan(plan))


def test_plan_fetches_one_model_at_a_time_and_upcoming_ones_start_at_their_prefetch_time() -> None:
    schedule = sched(
        model("always", (ALWAYS,)),
        model("soon", (daily(8),), priority=10),
        model("sooner-high", (daily(8),), priority=90),
        model("later", (daily(12),)),
    )
    sizes = {mid(n): GB for n in ("always", "soon", "sooner-high", "later")}
    plan = plan_node(schedule, "p", AT_0730, (), None, 1e6, sizes)
    assert [m.label for m in plan.fetch] == ["always", "sooner-high", "soon"]
    ready = {m.label: m.ready_at for m in plan.models}
    assert ready["always"] == AT_0730 + timedelta(seconds=1000)
    assert ready["sooner-high"] == AT_0730 + timedelta(seconds=2000)
    assert ready["soon"] == AT_0730 + timedelta(seconds=3000)
    assert ready["later"] == datetime(2026, 5, 4, 11, 30, tzinfo=UTC) + timedelta(seconds=1000)
    assert [m.action for m in plan.models if m.label == "later"] == [Action.LATER]
    assert plan.models[0].late, "a missing model whose window is always open is late"


def test_plan_keeps_cached_models_and_evicts_the_least_recently_used_only_to_make_room() -> None:
    schedule = sched(model("a", (daily(8),)))
    entries = (cached("models/old/x", 5 * GB, last_used=1.0), cached("models/new/y", 5 * GB, last_used=2.0))
    roomy = plan_node(schedule, "p", AT_0730, entries, 20 * GB, None, {mid("a"): 4 * GB})
    assert roomy.evict == () and roomy.fits
    assert {m.model_id for m in roomy.keep} == {"models/old/x", "models/new/y"}
    tight = plan_node(schedule, "p", AT_0730, entries, 12 * GB, None, {mid("a"): 4 * GB})
    assert [m.model_id for m in tight.evict] == ["models/old/x"]
    assert tight.fits and [m.phase for m in tight.evict] == [SchedulePhase.UNSCHEDULED]


def test_plan_counts_files_that_revisions_share_once_and_evicts_only_for_bytes_it_frees() -> None:
    schedule = sched(model("a", (daily(8),)))
    shared = Blob((1, 100), 5 * GB)
    old, new = (
        CacheEntry(model_id, last_used, blobs=frozenset({shared, Blob((1, ino), 1000)}))
        for model_id, last_used, ino in (("models/m/r1", 1.0, 101), ("models/m/r2", 2.0, 102))
    )
    roomy = plan_node(schedule, "p", AT_0730, (old, new), 6 * GB, None, {mid("a"): 0})
    assert roomy.used_bytes == 5 * GB + 2000 and roomy.fits and roomy.evict == ()

    tight = plan_node(schedule, "p", AT_0730, (old, new), 5 * GB + 1500, None, {mid("a"): 0})
    assert [m.model_id for m in tight.evict] == ["models/m/r1"]
    assert tight.eviction.freed_bytes == 1000, "r1 frees its own file, not the one r2 still links"

    pinned_new = CacheEntry("models/m/r2", 2.0, pinned=True, blobs=new.blobs)
    short = plan_node(schedule, "p", AT_0730, (old, pinned_new), 5 * GB, None, {mid("a"): 0})
    assert not short.fits and short.eviction.freed_bytes == 1000


def test_a_fetch_already_running_counts_once_through_the_space_its_pull_claimed() -> None:
    schedule = sched(model("a", (daily(8),)))
    claim = CacheEntry(mid("a"), 0.0, state=CacheState.PULLING, blobs=frozenset({Blob((-2, 1), 3 * GB)}))
    plan = plan_node(schedule, "p", AT_0730, [claim], 5 * GB, None, {mid("a"): 4 * GB})
    assert plan.used_bytes == 3 * GB and plan.fits
    assert [m.model_id for m in plan.fetch] == [mid("a")]


def test_plan_does_not_fit_when_protected_models_and_fetches_exceed_the_budget() -> None:
    schedule = sched(model("active", (daily(7),)), model("next", (daily(8),)))
    entries = [cached(mid("active"), 10 * GB, last_used=0.0)]
    plan = plan_node(schedule, "p", AT_0730, entries, 12 * GB, None, {mid("next"): 5 * GB})
    assert not plan.fits and plan.evict == ()
    assert plan.keep[0].protected is not None and "active" in plan.keep[0].protected
    text = "\n".join(render_plan(plan))
    assert "fits the budget: NO" in text and "cannot free" in text
    assert plan_json(plan)["fits"] is False


def test_plan_skips_models_whose_windows_closed_and_never_evicts_pinned_ones() -> None:
    schedule = sched(model("kept", (daily(6, hours=1),)), model("gone", (daily(3, hours=1),), keep_s=0))
    entries = [cached("models/pinned/z", 9 * GB, last_used=0.0, pinned=True)]
    sizes = {mid("kept"): GB, mid("gone"): GB}
    plan = plan_node(schedule, "p", AT_0730, entries, 10 * GB, None, sizes)
    actions = {m.label: (m.phase, m.action) for m in plan.models}
    assert actions["kept"] == ("keep", Action.SKIP)
    assert actions["gone"] == ("upcoming", Action.LATER)
    assert actions["models/pinned/z"] == (SchedulePhase.UNSCHEDULED, Action.KEEP)


def test_plan_shows_unknown_sizes_and_no_estimate_without_a_bandwidth() -> None:
    plan = plan_node(sched(model("a", (daily(8),))), "p", AT_0730, (), 10 * GB, None)
    assert plan.unknown_sizes == (mid("a"),)
    assert plan.fetch[0].note(AT_0730) == "size unknown"
    sized = plan_node(sched(model("a", (daily(8),))), "p", AT_0730, (), 10 * GB, None, {mid("a"): GB})
    assert sized.fetch[0].note(AT_0730) == "no bandwidth estimate"


def test_start_jitter_is_deterministic_per_node_and_model_and_within_its_bound() -> None:
    values = [start_jitter_s(f"node-{i}", "models/a", 30.0) for i in range(200)]
    assert values == [start_jitter_s(f"node-{i}", "models/a", 30.0) for i in range(200)]
    assert all(0 <= v < 30 for v in values)
    assert max(values) - min(values) > 20, "nodes spread over the whole range"
    assert start_jitter_s("node-1", "models/a", 0) == 0


def test_parse_instant_reads_a_time_without_offset_in_the_schedule_time_zone() -> None:
    assert parse_instant("2026-05-04T08:00", "Asia/Seoul") == datetime(2026, 5, 3, 23, 0, tzinfo=UTC)
    assert parse_instant("2026-05-04T08:00Z", "Asia/Seoul") == datetime(2026, 5, 4, 8, 0, tzinfo=UTC)
    assert parse_instant("2026-05-04T08:00+02:00", "UTC") == datetime(2026, 5, 4, 6, 0, tzinfo=UTC)
    with pytest.raises(UsageError, match="use ISO 8601"):
        parse_instant("tomorrow", "UTC")


def test_desired_state_moves_through_a_day_minute_by_minute() -> None:
    """upcoming -> prefetch (lead 30m) -> active (2h) -> keep (1h) -> upcoming, at every minute of a day."""
    schedule = sched(model("a", (daily(8),)))
    start = datetime(2026, 5, 4, tzinfo=UTC)
    states = []
    for minute in range(24 * 60):
        (entry,) = desired_models(schedule, "p", start + timedelta(minutes=minute))
        if not states or states[-1][1] != entry.phase:
            states.append((minute, entry.phase))
    assert states == [
        (0, SchedulePhase.UPCOMING),
        (7 * 60 + 30, SchedulePhase.PREFETCH),
        (8 * 60, SchedulePhase.ACTIVE),
        (10 * 60, SchedulePhase.COOLDOWN),
        (11 * 60, SchedulePhase.UPCOMING),
    ]


def test_desired_state_across_the_spring_dst_jump_follows_the_wall_clock_rules() -> None:
    window = CronWindow(cron="30 2 * * *", duration_s=3600, timezone="Europe/Berlin")
    schedule = sched(model("a", (window,), lead_s=600))
    berlin = ZoneInfo("Europe/Berlin")
    # 02:30 does not exist on 2026-03-29: the window opens at the jump, 03:00 CEST (01:00 UTC)
    before = datetime(2026, 3, 29, 0, 55, tzinfo=UTC)
    (entry,) = desired_models(schedule, "p", before)
    assert entry.phase is SchedulePhase.PREFETCH
    assert entry.window is not None and entry.window.start == datetime(2026, 3, 29, 3, 0, tzinfo=berlin)


# ---- properties ---------------------------------------------------------------------

POOLS = ("p", "q", "r")


@st.composite
def schedules(draw: st.DrawFn) -> Schedule:
    count = draw(st.integers(1, 6))
    models = []
    for i in range(count):
        windows: tuple[Window, ...]
        if draw(st.booleans()):
            windows = (ALWAYS,)
        else:
            windows = tuple(
                CronWindow(
                    cron=f"{draw(st.integers(0, 59))} {draw(st.integers(0, 23))} * * *",
                    duration_s=draw(st.sampled_from([600.0, 3600.0, 8 * 3600.0])),
                    timezone=draw(st.sampled_from(["UTC", "Asia/Seoul", "Europe/Berlin"])),
                )
                for _ in range(draw(st.integers(1, 2)))
            )
        pools = tuple(draw(st.lists(st.sampled_from(POOLS), min_size=1, max_size=3, unique=True)))
        models.append(
            model(
                f"m{i}",
                windows,
                pools=pools,
                lead_s=draw(st.sampled_from([0.0, 600.0, 3600.0])),
                keep_s=draw(st.sampled_from([0.0, 600.0, 7200.0])),
                priority=draw(st.integers(0, 1000)),
            )
        )
    return sched(*models)


instants = st.datetimes(
    min_value=datetime(2026, 1, 1), max_value=datetime(2027, 1, 1), timezones=st.just(UTC)
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schedule=schedules(), pool=st.sampled_from(POOLS), now=instants)
def test_the_desired_set_never_includes_a_model_outside_its_pool(
    schedule: Schedule, pool: str, now: datetime
) -> None:
    for entry in desired_models(schedule, pool, now):
        assert pool in entry.model.pools


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    schedule=schedules(),
    now=instants,
    budget_gb=st.integers(0, 40),
    sizes=st.lists(st.integers(1, 10), min_size=6, max_size=6),
    used=st.lists(st.floats(0, 1e9), min_size=6, max_size=6),
)
def test_a_model_inside_its_lead_time_is_never_planned_for_eviction(
    schedule: Schedule, now: datetime, budget_gb: int, sizes: list[int], used: list[float]
) -> None:
    entries = [
        cached(m.source.model_id, sizes[i] * GB, used[i]) for i, m in enumerate(schedule.models) if i % 2 == 0
    ]
    remote = {m.source.model_id: sizes[i] * GB for i, m in enumerate(schedule.models)}
    plan = plan_node(schedule, "p", now, entries, budget_gb * GB, 1e8, remote)
    wanted = {
        e.model.source.model_id
        for e in desired_models(schedule, "p", now)
        if e.phase in (SchedulePhase.PREFETCH, SchedulePhase.ACTIVE, SchedulePhase.COOLDOWN)
    }
    assert not wanted & {m.model_id for m in plan.evict}
    assert plan.fits == (plan.eviction.freed_bytes >= plan.eviction.needed_bytes)
