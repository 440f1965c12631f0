"""When a pull that does not fit now would fit: tables at chosen instants, and the invariant.

The forecast is pure: it reads the instants at which protections end (the in-use
grace, leases, a running pull's model becoming ready) and never the clock.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.entries import GRACE_S, NOW, entry

from modelsync.core.eviction import CacheEntry, plan_eviction
from modelsync.core.lifecycle import CacheState
from modelsync.core.room import forecast_room

PULLING = CacheState.PULLING


@pytest.mark.parametrize(
    ("entries", "needed", "protected", "at", "waits_for"),
    [
        pytest.param([entry("a", 3600, (1, 10))], 10, {}, NOW, [], id="fits now: no wait"),
        pytest.param(
            [entry("a", 3, (1, 10))], 10, {}, NOW + GRACE_S - 3, ["a"], id="used 3s ago: when its grace ends"
        ),
        pytest.param(
            [entry("a", 3, (1, 10)), entry("b", 500, (2, 10))],
            10,
            {},
            NOW + GRACE_S - 500,
            ["b"],
            id="the first grace to end is enough",
        ),
        pytest.param(
            [entry("a", 3, (1, 10)), entry("b", 500, (2, 10))],
            20,
            {},
            NOW + GRACE_S - 3,
            ["a", "b"],
            id="needs both: when the later grace ends",
        ),
        pytest.param(
            [entry("a", 3600, (1, 10), lease_s=7200)],
            10,
            {},
            NOW + 7200,
            ["a"],
            id="a lease: when it runs out",
        ),
        pytest.param(
            [entry("a", 3, (1, 10), lease_s=60)],
            10,
            {},
            NOW + GRACE_S - 3,
            ["a"],
            id="a lease shorter than the grace: the grace decides",
        ),
        pytest.param(
            [entry("a", 3600, (1, 10), state=PULLING)],
            10,
            {},
            NOW + GRACE_S,
            ["a"],
            id="a running pull: ready at the earliest now, then in use for one grace",
        ),
        pytest.param([entry("a", 3, (1, 10), pinned=True)], 10, {}, None, [], id="pinned: never"),
        pytest.param(
            [entry("a", 3, (1, 10))],
            10,
            {"a": "the schedule needs it"},
            None,
            [],
            id="protected by the caller: never",
        ),
        pytest.param(
            [entry("a", 3, (1, 10)), entry("b", 3600, (2, 10), pinned=True)],
            20,
            {},
            None,
            [],
            id="in use and pinned: never",
        ),
        pytest.param([entry("a", 3, (1, 10))], 11, {}, None, [], id="more than the whole cache: never"),
        pytest.param(
            [entry("a", 3, (1, 10), state=PULLING)],
            10,
            {"a": "being pulled"},
            None,
            [],
            id="the model being pulled itself: never",
        ),
    ],
)
def test_a_forecast_is_the_first_instant_a_protection_ends_that_makes_enough_room(
    entries: list[CacheEntry],
    needed: int,
    protected: dict[str, str],
    at: float | None,
    waits_for: list[str],
) -> None:
    forecast = forecast_room(entries, needed, NOW, GRACE_S, protected)

    if at is None:
        assert forecast.at is None
    else:
        assert forecast.at == pytest.approx(at, abs=0.01)
    assert [p.model for p in forecast.waits_for] == waits_for


def test_a_forecast_names_what_it_waits_for_with_the_reason() -> None:
    forecast = forecast_room(
        [entry("org/a", 3, (1, 10)), entry("org/b", 0, (2, 10), state=PULLING)], 20, NOW, 10, {}
    )

    assert forecast.at == pytest.approx(NOW + 10, abs=0.01)
    assert forecast.describe() == "org/a (in use: used 3s ago, grace 10s), org/b (pulling)"


entries_strategy = st.lists(
    st.builds(
        lambda model, idle_s, inode, **kw: entry(model, idle_s, (inode, 10), **kw),
        model=st.sampled_from("abcdefgh"),
        idle_s=st.floats(0, 2 * GRACE_S),
        inode=st.integers(1, 6),
        pinned=st.booleans(),
        state=st.sampled_from([CacheState.READY, PULLING]),
        lease_s=st.none() | st.floats(-100, 3 * GRACE_S),
    ),
    unique_by=lambda e: e.model,
    max_size=6,
)


@settings(max_examples=300, deadline=None)
@given(entries=entries_strategy, needed=st.integers(0, 70))
def test_the_forecast_instant_fits_and_no_earlier_protection_end_does(
    entries: list[CacheEntry], needed: int
) -> None:
    """At the forecast instant the plan is satisfied (running pulls taken as ready now), and just
    before the protection that decides it ends, not; None means it is not satisfied even far ahead."""
    forecast = forecast_room(entries, needed, NOW, GRACE_S, {})
    finished = [
        CacheEntry(e.model, NOW, e.pinned, CacheState.READY, e.in_use_until, e.blobs)
        if e.state is PULLING
        else e
        for e in entries
    ]
    far = NOW + 100 * GRACE_S

    if forecast.at is None:
        assert not plan_eviction(finished, needed, far, GRACE_S).satisfied
    elif forecast.at == NOW:
        assert plan_eviction(entries, needed, NOW, GRACE_S).satisfied
    else:
        assert plan_eviction(finished, needed, forecast.at, GRACE_S).satisfied
        # forecast.at is a protection's end plus 1 ms: just before that end, it did not fit yet
        assert not plan_eviction(finished, needed, forecast.at - 0.0015, GRACE_S).satisfied
