"""The eviction plan: tables for the cases an operator meets, properties for the invariants.

The property tests check the planner against an independent oracle: bytes freed
are the unique bytes of the whole cache minus those of the survivors.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.entries import GRACE_S, NOW, entry

from modelsync.core.eviction import (
    Blob,
    CacheEntry,
    EvictionPlan,
    plan_eviction,
    plan_named,
    plan_to_size,
    plan_unused,
    plan_watermarks,
    unique_bytes,
)
from modelsync.core.lifecycle import CacheState
from modelsync.errors import NotFoundError, UsageError

HOUR = 3600.0
READY, PULLING, QUARANTINED = CacheState.READY, CacheState.PULLING, CacheState.QUARANTINED


# Three day-old models of 10 bytes each, a oldest.
A = entry("a", 3 * HOUR, (1, 10))
B = entry("b", 2 * HOUR, (2, 10))
C = entry("c", 1 * HOUR, (3, 10))


@pytest.mark.parametrize(
    ("entries", "needed", "protected", "victims", "freed", "satisfied"),
    [
        pytest.param([A, B, C], 15, {}, ("a", "b"), 20, True, id="oldest first until enough"),
        pytest.param([C, A, B], 10, {}, ("a",), 10, True, id="stops at an exact fit"),
        pytest.param([A, B, C], 0, {}, (), 0, True, id="nothing needed evicts nothing"),
        pytest.param([A, B, C], 31, {}, ("a", "b", "c"), 30, False, id="short of space"),
        pytest.param([], 1, {}, (), 0, False, id="empty cache cannot free"),
        pytest.param(
            [entry("a", 3 * HOUR, (1, 10), pinned=True), B, C],
            10, {}, ("b",), 10, True, id="skips pinned",
        ),
        pytest.param(
            [entry("a", 3 * HOUR, (1, 10), state=PULLING), B, C],
            10, {}, ("b",), 10, True, id="skips pulling",
        ),
        pytest.param(
            [entry("a", GRACE_S - 1, (1, 10)), B, C],
            20, {}, ("b", "c"), 20, True, id="skips used within grace",
        ),
        pytest.param(
            [entry("a", GRACE_S, (1, 10)), B, C],
            20, {}, ("b", "c"), 20, True, id="grace boundary is idle enough",
        ),
        pytest.param(
            [entry("a", 3 * HOUR, (1, 10), lease_s=60), B, C],
            10, {}, ("b",), 10, True, id="skips a live lease",
        ),
        pytest.param(
            [entry("a", 3 * HOUR, (1, 10), lease_s=0), B, C],
            10, {}, ("a",), 10, True, id="a lease ending now has expired",
        ),
        pytest.param(
            [A, B, C], 10, {"a": "scheduled"}, ("b",), 10, True, id="skips caller protected",
        ),
        pytest.param(
            [A, B, entry("q", GRACE_S, (4, 10), state=QUARANTINED)],
            10, {}, ("q",), 10, True, id="quarantined go first",
        ),
        pytest.param(
            [entry("y", HOUR, (1, 10)), entry("x", HOUR, (2, 10))],
            10, {}, ("x",), 10, True, id="ties break by name",
        ),
    ],
)  # fmt: skip
def test_plan_eviction_picks_eligible_entries_in_lru_order(
    entries: list[CacheEntry],
    needed: int,
    protected: Mapping[str, str],
    victims: tuple[str, ...],
    freed: int,
    satisfied: bool,
) -> None:
    plan = plan_eviction(entries, needed, NOW, GRACE_S, protected)
    assert (plan.victims, plan.freed_bytes, plan.needed_bytes, plan.satisfied) == (
        victims,
        freed,
        needed,
        satisfied,
    )


@pytest.mark.parametrize(
    ("entries", "needed", "victims", "freed", "satisfied"),
    [
        pytest.param(
            [entry("a", 3 * HOUR, (1, 10)), entry("b", 2 * HOUR, (1, 10))],
            10, ("a", "b"), 10, True, id="a shared blob frees only with its last holder",
        ),
        pytest.param(
            [entry("a", 3 * HOUR, (1, 10), (2, 4)), entry("b", 2 * HOUR, (1, 10))],
            4, ("a",), 4, True, id="a private blob frees at once",
        ),
        pytest.param(
            [entry("a", 3 * HOUR, (1, 10)), entry("p", 2 * HOUR, (1, 10), pinned=True), C],
            10, ("c",), 10, True, id="entry held wholly by a pinned one is passed over",
        ),
        pytest.param(
            [entry("a", 3 * HOUR, (1, 10), (2, 5)), entry("p", 2 * HOUR, (1, 10), pinned=True)],
            10, ("a",), 5, False, id="a pinned holder keeps the shared bytes",
        ),
        pytest.param(
            [entry(m, h * HOUR, (1, 9)) for m, h in (("a", 3), ("b", 2), ("c", 1))],
            9, ("a", "b", "c"), 9, True, id="three holders all have to go",
        ),
        pytest.param(
            [entry("a", 3 * HOUR, (1, 10), (1, 10)), entry("b", 2 * HOUR, (2, 1))],
            10, ("a",), 10, True, id="a blob listed twice by one entry counts once",
        ),
    ],
)  # fmt: skip
def test_plan_eviction_counts_hard_linked_blobs_once(
    entries: list[CacheEntry], needed: int, victims: tuple[str, ...], freed: int, satisfied: bool
) -> None:
    plan = plan_eviction(entries, needed, NOW, GRACE_S)
    assert (plan.victims, plan.freed_bytes, plan.satisfied) == (victims, freed, satisfied)


@pytest.mark.parametrize(
    ("entries", "expected"),
    [
        ([], 0),
        ([A, B, C], 30),
        ([entry("a", 0, (1, 10), (2, 5)), entry("b", 0, (1, 10))], 15),
        ([entry("a", 0, (1, 10)), CacheEntry("b", NOW, blobs=frozenset({Blob((2, 1), 10)}))], 20),
    ],
)
def test_unique_bytes_counts_each_physical_file_once(
    entries: list[CacheEntry], expected: int
) -> None:
    assert unique_bytes(entries) == expected


@pytest.mark.parametrize(
    ("target", "victims", "satisfied"),
    [(30, (), True), (25, ("a",), True), (20, ("a",), True), (5, ("a", "b", "c"), True)],
)
def test_plan_to_size_evicts_until_the_total_fits_the_target(
    target: int, victims: tuple[str, ...], satisfied: bool
) -> None:
    plan = plan_to_size([A, B, C], target, NOW, GRACE_S)
    assert (plan.victims, plan.satisfied, plan.needed_bytes) == (
        victims,
        satisfied,
        max(0, 30 - target),
    )


@pytest.mark.parametrize(
    ("incoming", "victims", "needed", "satisfied"),
    [
        pytest.param(0, (), 0, True, id="under the high watermark nothing goes"),
        pytest.param(20, (), 0, True, id="reaching exactly the high watermark is fine"),
        pytest.param(21, ("a", "b"), 0, True, id="over high evicts down to low"),
        pytest.param(30, ("a", "b", "c", "d"), 0, True, id="low watermark counts incoming"),
        pytest.param(45, ("a", "b", "c", "d", "e"), 5, True, id="must free what exceeds budget"),
        pytest.param(75, ("a", "b", "c", "d", "e"), 35, False, id="pinned bytes leave no room"),
    ],
)
def test_plan_watermarks_aims_for_low_and_requires_only_the_budget(
    incoming: int, victims: tuple[str, ...], needed: int, satisfied: bool
) -> None:
    # budget 100, high 0.8, low 0.7; 30 pinned + five 6-byte models = 60 used.
    cached = [entry("pinned", 9 * HOUR, (99, 30), pinned=True)] + [
        entry(m, (5 - i) * HOUR, (i, 6)) for i, m in enumerate("abcde")
    ]
    plan = plan_watermarks(cached, 100, 0.8, 0.7, incoming, NOW, GRACE_S)
    assert (plan.victims, plan.needed_bytes, plan.satisfied) == (victims, needed, satisfied)


def test_plan_watermarks_refuses_a_low_ratio_above_the_high_one() -> None:
    with pytest.raises(ValueError, match="low <= high"):
        plan_watermarks([A], 100, 0.5, 0.8, 0, NOW, GRACE_S)


@pytest.mark.parametrize(
    ("unused_for_s", "victims"),
    [(4 * HOUR, ()), (2 * HOUR, ("q", "a", "b")), (0, ("q", "a", "b", "c"))],
)
def test_plan_unused_takes_every_eligible_entry_idle_that_long(
    unused_for_s: float, victims: tuple[str, ...]
) -> None:
    cached = [
        C,
        B,
        A,
        entry("q", 2 * HOUR, (4, 1), state=QUARANTINED),
        entry("p", 5 * HOUR, (5, 1), pinned=True),
        entry("fresh", 0, (6, 1)),
    ]
    plan = plan_unused(cached, unused_for_s, NOW, GRACE_S)
    assert plan.victims == victims
    assert plan.satisfied


def test_plan_named_evicts_in_the_order_given_and_counts_shared_bytes() -> None:
    cached = [entry("a", 0, (1, 10), (2, 3)), entry("b", 0, (1, 10)), C]
    plan = plan_named(cached, ["c", "a", "c"], force=False)
    assert plan == EvictionPlan(victims=("c", "a"), freed_bytes=13, needed_bytes=0, satisfied=True)


def test_plan_named_ignores_recency_and_leases() -> None:
    plan = plan_named([entry("a", 0, (1, 10), lease_s=HOUR)], ["a"], force=False)
    assert plan.victims == ("a",)


def test_plan_named_reports_an_unknown_model_with_the_ls_hint() -> None:
    with pytest.raises(NotFoundError, match=r"no cached model 'x'; run `modelsync ls`"):
        plan_named([A], ["a", "x"], force=True)


def test_plan_named_refuses_a_pinned_model_with_the_unpin_hint() -> None:
    pinned = entry("a", 3 * HOUR, (1, 10), pinned=True)
    with pytest.raises(UsageError, match=r"modelsync unpin a.*--force"):
        plan_named([pinned], ["a"], force=False)


def test_plan_named_evicts_a_pinned_model_when_forced() -> None:
    pinned = entry("a", 3 * HOUR, (1, 10), pinned=True)
    assert plan_named([pinned], ["a"], force=True).victims == ("a",)


def test_plan_named_refuses_a_pulling_model_even_when_forced() -> None:
    pulling = entry("a", 0, (1, 10), state=PULLING)
    with pytest.raises(UsageError, match="being pulled"):
        plan_named([pulling], ["a"], force=True)


def test_plans_refuse_two_entries_for_one_model() -> None:
    with pytest.raises(ValueError, match="appears twice"):
        plan_eviction([A, A], 1, NOW, GRACE_S)


def test_plans_refuse_one_blob_with_two_sizes() -> None:
    with pytest.raises(ValueError, match="two sizes"):
        unique_bytes([entry("a", 0, (1, 10)), entry("b", 0, (1, 11))])


def test_plan_eviction_refuses_a_negative_need() -> None:
    with pytest.raises(ValueError, match="negative"):
        plan_eviction([A], -1, NOW, GRACE_S)


@pytest.mark.parametrize(
    ("cached", "protected", "reason"),
    [
        ([entry("a", 0, pinned=True)], {}, "pinned"),
        ([entry("a", 0, state=PULLING)], {}, "pulling"),
        ([entry("a", 180)], {}, "in use: used 3m ago, grace 10m"),
        ([entry("a", 0, lease_s=1800)], {}, "leased by a consumer until 2026-01-01T00:30:00Z"),
        ([entry("a", HOUR)], {"a": "scheduled for pool gpu-a at 14:00"}, "scheduled for pool"),
    ],
)
def test_plans_say_why_each_protected_model_stays(
    cached: list[CacheEntry], protected: Mapping[str, str], reason: str
) -> None:
    (protection,) = plan_eviction(cached, 1, NOW, GRACE_S, protected).protected
    assert protection.model == "a"
    assert protection.reason.startswith(reason)


def test_describe_lists_what_goes_and_what_stays() -> None:
    cached = [A, B, entry("p", HOUR, (3, 10), pinned=True)]
    assert plan_eviction(cached, 2048, NOW, GRACE_S).describe()[1:] == [
        "  evict a",
        "  evict b",
        "  keep p: pinned",
    ]
    big = [entry("a", HOUR, (1, 3 * 2**30)), entry("b", 0, (2, 1))]
    assert plan_eviction(big, 2**30, NOW, GRACE_S).describe() == [
        "evict 1 model, freeing 3.0 GiB (needed 1.0 GiB)",
        "  evict a",
        "  keep b: in use: used 0s ago, grace 10m",
    ]


def test_describe_summary_of_an_impossible_plan_names_what_is_protected() -> None:
    cached = [A] + [entry(f"p{i}", HOUR, (10 + i, 10), pinned=True) for i in range(7)]
    (summary, *_) = plan_eviction(cached, 1536, NOW, GRACE_S).describe()
    assert summary == (
        "cannot free 1.5 KiB: evicting every eligible model frees only 10 B; "
        "protected: p0 (pinned), p1 (pinned), p2 (pinned), p3 (pinned), p4 (pinned), and 2 more"
    )


def test_describe_says_when_there_is_nothing_to_evict() -> None:
    assert plan_eviction([A], 0, NOW, GRACE_S).describe() == ["nothing to evict"]


# --- properties -------------------------------------------------------------------------

#: no per-example deadline: a loaded machine must not turn a slow example into a failure
PROPERTIES = settings(deadline=None)


@st.composite
def caches(draw: st.DrawFn) -> tuple[list[CacheEntry], dict[str, str]]:
    """Small caches over a shared pool of blobs, with every kind of protection mixed in."""
    sizes = draw(st.lists(st.integers(0, 100), min_size=1, max_size=10))
    pool = [Blob((1, inode), size) for inode, size in enumerate(sizes)]
    cached = []
    for i in range(draw(st.integers(0, 10))):
        cached.append(
            CacheEntry(
                model=f"m{i}",
                last_used_at=NOW
                - draw(st.sampled_from([0, 60, GRACE_S - 1, GRACE_S, HOUR, 3 * HOUR])),
                pinned=draw(st.booleans()),
                state=draw(st.sampled_from(CacheState)),
                in_use_until=draw(st.none() | st.sampled_from([NOW - 1, NOW, NOW + 1])),
                blobs=draw(st.frozensets(st.sampled_from(pool), max_size=4)),
            )
        )
    protected = {e.model: "scheduled" for e in cached if draw(st.booleans())}
    return cached, protected


def eligible(e: CacheEntry, protected: Mapping[str, str]) -> bool:
    leased = e.in_use_until is not None and e.in_use_until > NOW
    recent = NOW - e.last_used_at < GRACE_S
    return not (e.pinned or e.state is PULLING or leased or recent or e.model in protected)


def true_freed(cached: Iterable[CacheEntry], victims: Iterable[str]) -> int:
    cached, gone = list(cached), set(victims)
    return unique_bytes(cached) - unique_bytes(e for e in cached if e.model not in gone)


def freeable(cached: list[CacheEntry], protected: Mapping[str, str]) -> int:
    return true_freed(cached, (e.model for e in cached if eligible(e, protected)))


def assert_sound(
    plan: EvictionPlan, cached: list[CacheEntry], protected: Mapping[str, str]
) -> None:
    """Only eligible victims, once each, freeing exactly what the oracle says."""
    by_model = {e.model: e for e in cached}
    assert all(eligible(by_model[m], protected) for m in plan.victims)
    assert len(set(plan.victims)) == len(plan.victims)
    assert plan.freed_bytes == true_freed(cached, plan.victims)
    assert plan.satisfied == (plan.freed_bytes >= plan.needed_bytes)
    assert {p.model for p in plan.protected} == {
        e.model for e in cached if not eligible(e, protected)
    }


def eviction_key(e: CacheEntry) -> tuple[bool, float, str]:
    return (e.state is not QUARANTINED, e.last_used_at, e.model)


def assert_lru_prefix(
    plan: EvictionPlan, cached: list[CacheEntry], protected: Mapping[str, str]
) -> None:
    """Victims are in eviction order, and no useful eligible entry before the last was skipped.

    Useful means holding a blob that no protected entry also holds.
    """
    by_model = {e.model: e for e in cached}
    keys = [eviction_key(by_model[m]) for m in plan.victims]
    assert keys == sorted(keys)
    if not keys:
        return
    kept = {b.key for e in cached if not eligible(e, protected) for b in e.blobs}
    for e in cached:
        useful = any(b.key not in kept for b in e.blobs)
        if eligible(e, protected) and useful and eviction_key(e) < keys[-1]:
            assert e.model in plan.victims


@PROPERTIES
@given(caches(), st.integers(0, 400))
def test_plan_eviction_is_sound_and_frees_enough_whenever_possible(
    cache: tuple[list[CacheEntry], dict[str, str]], needed: int
) -> None:
    cached, protected = cache
    plan = plan_eviction(cached, needed, NOW, GRACE_S, protected)
    assert_sound(plan, cached, protected)
    assert_lru_prefix(plan, cached, protected)
    assert plan.satisfied == (freeable(cached, protected) >= needed)


@PROPERTIES
@given(caches(), st.integers(0, 400))
def test_plan_eviction_stops_as_soon_as_it_is_satisfied(
    cache: tuple[list[CacheEntry], dict[str, str]], needed: int
) -> None:
    cached, protected = cache
    plan = plan_eviction(cached, needed, NOW, GRACE_S, protected)
    if plan.satisfied and plan.victims:
        assert true_freed(cached, plan.victims[:-1]) < needed


@PROPERTIES
@given(caches(), st.integers(0, 1000))
def test_plan_to_size_reaches_the_target_whenever_it_is_reachable(
    cache: tuple[list[CacheEntry], dict[str, str]], target: int
) -> None:
    cached, protected = cache
    plan = plan_to_size(cached, target, NOW, GRACE_S, protected)
    assert_sound(plan, cached, protected)
    assert_lru_prefix(plan, cached, protected)
    reachable = unique_bytes(cached) - freeable(cached, protected) <= target
    left = unique_bytes(e for e in cached if e.model not in plan.victims)
    assert plan.satisfied == reachable
    if reachable:
        assert left <= target


@PROPERTIES
@given(
    caches(),
    st.integers(0, 1000),
    st.floats(0, 1),
    st.floats(0, 1),
    st.integers(0, 400),
)
def test_plan_watermarks_makes_room_whenever_the_budget_allows(
    cache: tuple[list[CacheEntry], dict[str, str]],
    budget: int,
    ratio_a: float,
    ratio_b: float,
    incoming: int,
) -> None:
    cached, protected = cache
    low, high = sorted((ratio_a, ratio_b))
    plan = plan_watermarks(cached, budget, high, low, incoming, NOW, GRACE_S, protected)
    assert_sound(plan, cached, protected)
    assert_lru_prefix(plan, cached, protected)
    used = unique_bytes(cached)
    if used + incoming <= high * budget:
        assert plan.victims == ()
    fits = used - freeable(cached, protected) + incoming <= budget
    assert plan.satisfied == fits


@PROPERTIES
@given(caches(), st.sampled_from([0, GRACE_S, HOUR, 2 * HOUR, 4 * HOUR]))
def test_plan_unused_takes_exactly_the_eligible_entries_idle_that_long(
    cache: tuple[list[CacheEntry], dict[str, str]], unused_for_s: float
) -> None:
    cached, protected = cache
    plan = plan_unused(cached, unused_for_s, NOW, GRACE_S, protected)
    assert_sound(plan, cached, protected)
    expected = sorted(
        (e for e in cached if eligible(e, protected) and NOW - e.last_used_at >= unused_for_s),
        key=eviction_key,
    )
    assert plan.victims == tuple(e.model for e in expected)


# --- scale ------------------------------------------------------------------------------


def ten_thousand_entries() -> list[CacheEntry]:
    """Models of three blobs; each pair of revisions shares one; 1 in 10 pinned."""
    return [
        CacheEntry(
            model=f"models/org/m{i // 4}/rev{i % 4}",
            last_used_at=NOW - GRACE_S - (i * 7919) % 100_000,
            pinned=i % 10 == 0,
            state=QUARANTINED if i % 97 == 0 else READY,
            blobs=frozenset({Blob((1, i), 2**30), Blob((2, i), 2**20), Blob((3, i // 2), 2**10)}),
        )
        for i in range(10_000)
    ]


@pytest.mark.slow
def test_a_plan_over_ten_thousand_entries_builds_well_under_a_second() -> None:
    """Not a benchmark: a guard against an accidental quadratic step (this takes ~20 ms)."""
    cached = ten_thousand_entries()
    scheduled = {e.model: "scheduled" for e in cached[1::50]}
    started = time.perf_counter()
    plan = plan_eviction(cached, unique_bytes(cached) // 2, NOW, GRACE_S, scheduled)
    elapsed_s = time.perf_counter() - started
    assert plan.satisfied
    assert elapsed_s < 1.0, f"planning 10,000 entries took {elapsed_s:.2f} s"
