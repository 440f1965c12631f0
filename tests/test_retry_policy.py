"""The pure retry policy: one classification of every answer, the backoff schedule, the shared gate."""

from __future__ import annotations

import calendar
import itertools
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from modelsync.core.retry import (
    PartRetries,
    RetryPolicy,
    Verdict,
    backoff_s,
    classify,
    presigned_expiry,
)
from modelsync.core.send_gate import SendGate

POLICY = RetryPolicy()


@pytest.mark.parametrize(
    ("status", "code", "url_expired", "verdict"),
    [
        (200, None, False, Verdict.OK),
        (206, None, False, Verdict.OK),
        (503, "SlowDown", False, Verdict.THROTTLED),
        (503, None, False, Verdict.THROTTLED),
        (429, None, False, Verdict.THROTTLED),
        (400, "Throttling", False, Verdict.THROTTLED),
        (500, "InternalError", False, Verdict.RETRY),
        (502, None, False, Verdict.RETRY),
        (504, None, False, Verdict.RETRY),
        (408, None, False, Verdict.RETRY),
        (400, "RequestTimeout", False, Verdict.RETRY),
        (501, "NotImplemented", False, Verdict.INVALID),
        (505, None, False, Verdict.INVALID),
        (400, "ExpiredToken", False, Verdict.EXPIRED),
        (403, "ExpiredToken", False, Verdict.EXPIRED),
        (403, "AccessDenied", True, Verdict.EXPIRED),
        (403, "AccessDenied", False, Verdict.DENIED),
        (403, "SignatureDoesNotMatch", False, Verdict.DENIED),
        (403, None, False, Verdict.DENIED),
        (407, None, False, Verdict.DENIED),
        (404, "NoSuchKey", False, Verdict.NOT_FOUND),
        (404, "NoSuchBucket", False, Verdict.NOT_FOUND),
        (412, "PreconditionFailed", False, Verdict.CHANGED),
        (416, "InvalidRange", False, Verdict.CHANGED),
        (301, "PermanentRedirect", False, Verdict.REDIRECT),
        (307, None, False, Verdict.REDIRECT),
        (400, "InvalidArgument", False, Verdict.INVALID),
        (400, "AuthorizationHeaderMalformed", False, Verdict.INVALID),
    ],
)
def test_every_answer_is_classified_by_status_and_code(
    status: int, code: str | None, url_expired: bool, verdict: Verdict
) -> None:
    assert classify(status, code, url_expired=url_expired) is verdict


def test_a_message_mentioning_expiry_does_not_make_an_access_denied_expired() -> None:
    # classify has no message parameter at all: only the URL's own expiry counts.
    assert classify(403, "AccessDenied") is Verdict.DENIED


@given(st.integers(1, 200), st.floats(0, 0.999))
def test_throttled_backoff_never_goes_below_the_floor_nor_above_floor_plus_cap(
    failures: int, jitter: float
) -> None:
    wait = backoff_s(POLICY, failures, throttled=True, jitter=jitter)
    assert POLICY.throttle_floor_s <= wait <= POLICY.throttle_floor_s + POLICY.throttle_cap_s


@given(st.integers(1, 200), st.floats(0, 0.999))
def test_other_failures_wait_a_jittered_share_of_a_capped_ceiling(failures: int, jitter: float) -> None:
    wait = backoff_s(POLICY, failures, throttled=False, jitter=jitter)
    assert 0 <= wait <= POLICY.error_cap_s


@given(st.integers(1, 50), st.booleans(), st.floats(0, 1000), st.floats(0, 0.999))
def test_retry_after_is_a_lower_bound_clipped_to_its_cap(
    failures: int, throttled: bool, retry_after_s: float, jitter: float
) -> None:
    wait = backoff_s(POLICY, failures, throttled=throttled, retry_after_s=retry_after_s, jitter=jitter)
    assert wait >= min(retry_after_s, POLICY.retry_after_cap_s)


def test_throttled_ceiling_doubles_per_failure_up_to_its_cap() -> None:
    policy = RetryPolicy(throttle_cap_s=20.0)
    waits = [backoff_s(policy, n, throttled=True, jitter=0.999) for n in (1, 2, 3, 4, 5, 6)]
    assert waits == pytest.approx([1 + 0.999 * s for s in (1, 2, 4, 8, 16, 20)])


def test_a_throttled_part_waits_at_most_three_seconds_the_gate_slows_the_process() -> None:
    """A part asleep for 20 s after the store has room again leaves its egress idle: a pool of 16
    against a store that sheds load finished +48% late against the plan that way, +9% to +19% with
    this cap (docs/schedule.md, "The pool plan against a measured pool")."""
    waits = [backoff_s(POLICY, n, throttled=True, jitter=0.999) for n in (1, 2, 3, 10)]
    assert waits == pytest.approx([1 + 0.999 * s for s in (1, 2, 2, 2)])


def test_scaled_policy_shrinks_every_wait() -> None:
    fast = POLICY.scaled(0.01)
    assert backoff_s(fast, 3, throttled=True, jitter=0.5) == pytest.approx(
        backoff_s(POLICY, 3, throttled=True, jitter=0.5) * 0.01
    )
    assert (fast.budget_s, fast.retry_after_cap_s, fast.time_scale) == (POLICY.budget_s, 60.0, 0.01)


# -- one part's retries ---------------------------------------------------------------


def test_throttling_does_not_count_against_attempts_only_against_the_budget() -> None:
    retries = PartRetries(RetryPolicy(attempts=3, budget_s=600))
    for second in range(500):
        retries.failed(float(second), progressed=False, throttled=True)
        assert not retries.exhausted(float(second))
    retries.failed(600.0, progressed=False, throttled=True)
    assert retries.exhausted(600.0)


def test_other_failures_give_up_after_the_attempts() -> None:
    retries = PartRetries(RetryPolicy(attempts=3))
    for _ in range(2):
        retries.failed(0.0, progressed=False, throttled=False)
        assert not retries.exhausted(0.0)
    retries.failed(0.0, progressed=False, throttled=False)
    assert retries.exhausted(0.0)


def test_progress_starts_the_count_and_the_budget_afresh() -> None:
    retries = PartRetries(RetryPolicy(attempts=2, budget_s=10))
    retries.failed(0.0, progressed=False, throttled=False)
    retries.failed(9.0, progressed=True, throttled=False)
    assert (retries.failures, retries.stuck_s(9.0)) == (1, 0.0)
    assert not retries.exhausted(18.0)
    assert retries.exhausted(19.0)


def test_a_wait_never_runs_past_the_budget() -> None:
    retries = PartRetries(RetryPolicy(budget_s=10))
    retries.failed(0.0, progressed=False, throttled=True)
    assert retries.wait_s(9.5, throttled=True, retry_after_s=60, jitter=0.5) == pytest.approx(0.5)


# -- the gate -------------------------------------------------------------------------


def test_an_unthrottled_gate_lets_every_request_start_at_once() -> None:
    gate = SendGate()
    assert [gate.reserve(10.0) for _ in range(100)] == [0.0] * 100
    assert gate.rate_per_s is None


def test_a_throttle_paces_every_start_below_the_measured_rate() -> None:
    gate = SendGate(window_s=1.0)
    for i in range(20):
        gate.reserve(i * 0.05)  # 20 starts in one second
    gate.throttled(1.0)
    assert gate.rate_per_s == pytest.approx(20 * 0.7)
    starts = [1.0 + gate.reserve(1.0) for _ in range(5)]
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert gaps == pytest.approx([1 / gate.rate_per_s] * 4)


def test_a_waiting_request_starts_at_the_rate_of_when_it_starts_not_of_when_it_asked() -> None:
    """Requests book no slot ahead: after a throttle, the parts waiting for their start follow
    the rate as it recovers, rather than slots booked a second apart at the throttled rate."""
    gate = SendGate(min_rate_per_s=1.0, doubling_s=1.0)
    gate.throttled(0.0)
    assert gate.wait_s(0.0) == pytest.approx(1.0)
    assert [gate.wait_s(0.0) for _ in range(8)] == [pytest.approx(1.0)] * 8  # asking books nothing

    gate.succeeded(0.5)  # the rate is now 2 ** 0.5 a second

    assert gate.wait_s(0.5) == pytest.approx(2**-0.5 - 0.5)
    assert gate.reserve(2**-0.5) == 0.0
    assert gate.wait_s(0.75) == pytest.approx(2**-0.5 + 2**-0.5 - 0.75)


def test_a_burst_of_throttles_to_one_overload_counts_once() -> None:
    gate = SendGate(window_s=1.0, decrease_every_s=0.5)
    for _ in range(10):
        gate.reserve(0.0)
    for _ in range(8):
        gate.throttled(0.1)
    assert gate.rate_per_s == pytest.approx(10 * 0.7)
    gate.throttled(0.7)
    assert gate.rate_per_s == pytest.approx(10 * 0.7 * 0.7)


def test_sustained_throttling_never_drops_below_the_minimum_rate() -> None:
    gate = SendGate(min_rate_per_s=0.5)
    for i in range(200):
        gate.throttled(float(i))
    assert gate.rate_per_s == 0.5


def test_the_rate_recovers_gradually_then_stops_pacing() -> None:
    gate = SendGate(min_rate_per_s=1.0, free_rate_per_s=64.0, doubling_s=2.0)
    gate.throttled(0.0)
    assert gate.rate_per_s == 1.0
    gate.succeeded(2.0)
    assert gate.rate_per_s == pytest.approx(2.0)
    gate.succeeded(6.0)
    assert gate.rate_per_s == pytest.approx(8.0)
    gate.succeeded(12.0)
    assert gate.rate_per_s is None
    assert gate.reserve(12.0) == 0.0


def test_a_success_long_after_the_last_throttle_stops_pacing_instead_of_overflowing() -> None:
    """Found by the soak: a daemon's gate throttled once, then a success an hour later raised
    OverflowError (2 ** 3600) and failed the pull as a bug."""
    gate = SendGate(min_rate_per_s=1.0, doubling_s=1.0)
    gate.throttled(0.0)

    gate.succeeded(3600.0)

    assert gate.rate_per_s is None
    assert gate.reserve(3600.0) == 0.0


def test_retry_after_holds_every_start_until_it_passed() -> None:
    gate = SendGate()
    gate.throttled(5.0, retry_after_s=3.0)
    assert gate.reserve(5.0) >= 3.0
    gate_capped = SendGate(retry_after_cap_s=10.0)
    gate_capped.throttled(0.0, retry_after_s=1e9)
    assert gate_capped.reserve(0.0) == pytest.approx(10.0)


@given(st.lists(st.tuples(st.sampled_from(["send", "throttle", "ok"]), st.floats(0, 5)), max_size=60))
def test_the_gate_never_schedules_in_the_past_and_keeps_its_rate_in_bounds(
    events: list[tuple[str, float]],
) -> None:
    gate = SendGate(min_rate_per_s=0.5, free_rate_per_s=1000.0)
    now = 0.0
    for what, step in events:
        now += step
        if what == "send":
            assert gate.reserve(now) >= 0.0
        elif what == "throttle":
            gate.throttled(now)
        else:
            gate.succeeded(now)
        assert gate.rate_per_s is None or 0.5 <= gate.rate_per_s < 1000.0


# -- presigned expiry -----------------------------------------------------------------


def test_presigned_expiry_is_read_from_the_url() -> None:
    url = "https://s3.example/b/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Date=20260101T120000Z&X-Amz-Expires=600&X-Amz-Signature=x"
    assert presigned_expiry(url) == calendar.timegm(time.strptime("2026-01-01 12:10:00", "%Y-%m-%d %H:%M:%S"))


@pytest.mark.parametrize(
    "query",
    ["", "X-Amz-Date=20260101T120000Z", "X-Amz-Expires=600", "X-Amz-Date=junk&X-Amz-Expires=600"],
)
def test_a_url_without_a_parseable_expiry_has_none(query: str) -> None:
    assert presigned_expiry(f"https://s3.example/b/k?{query}") is None
