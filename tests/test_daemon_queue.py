"""The daemon's queue (core/queue.py) as tables at chosen instants: no daemon, no clock, no sleep.

End-to-end, test_daemon.py keeps a few runs of the real daemon that show the
queue's decisions wired up (backoff between disk_full attempts, a foreground
pull pausing a prefetch that then resumes).
"""

from __future__ import annotations

import pytest

from modelsync.core.plan import start_jitter_s
from modelsync.core.queue import (
    MAX_RETRY_S,
    Job,
    JobQueue,
    retry_delay_s,
    yields_to_foreground,
    yields_to_request,
)

NODE = "node-a"


def queue(jitter_max_s: float = 0.0, refresh_s: float = 0.0) -> JobQueue:
    return JobQueue(NODE, jitter_max_s, refresh_s)


def ids(q: JobQueue, now: float) -> tuple[str, bool, bool] | None:
    job = q.next(now)
    return None if job is None else (job.model_id, job.requested, job.refresh)


def test_requests_come_first_in_arrival_order_then_fetches_in_plan_order() -> None:
    q = queue()
    q.plan(["b", "a"], [], now=0.0)
    assert ids(q, 0.0) == ("b", False, False)
    q.request("z")
    q.request("y")
    q.request("z")  # asked twice: still one job, in its first place
    assert q.requested == ("z", "y")
    assert ids(q, 0.0) == ("z", True, False)
    q.finished(Job("z", requested=True), 1.0, failed=False)
    assert ids(q, 1.0) == ("y", True, False)
    q.finished(Job("y", requested=True), 2.0, failed=False)
    assert ids(q, 2.0) == ("b", False, False)


@pytest.mark.parametrize(
    ("now", "expected"),
    [
        (0.0, None),
        (start_jitter_s(NODE, "a", 30.0) - 0.001, None),
        (start_jitter_s(NODE, "a", 30.0), "a"),
        (100.0, "a"),
    ],
)
def test_a_planned_fetch_waits_its_nodes_jitter_from_when_it_first_appeared(
    now: float, expected: str | None
) -> None:
    assert 0 < start_jitter_s(NODE, "a", 30.0) < 30.0
    q = queue(jitter_max_s=30.0)
    q.plan(["a"], [], now=0.0)
    q.plan(["a"], [], now=20.0)  # seen again later: the clock started at its first appearance
    job = q.next(now)
    assert (job.model_id if job else None) == expected


def test_a_request_skips_the_jitter() -> None:
    q = queue(jitter_max_s=30.0)
    q.plan(["a"], [], now=0.0)
    q.request("a")
    assert ids(q, 0.0) == ("a", True, False)


def test_a_fetch_that_leaves_the_plan_is_forgotten_and_starts_its_jitter_again_on_return() -> None:
    jitter = start_jitter_s(NODE, "a", 30.0)
    q = queue(jitter_max_s=30.0)
    q.plan(["a"], [], now=0.0)
    q.plan([], [], now=50.0)
    assert q.next(50.0) is None
    q.plan(["a"], [], now=100.0)
    assert q.next(100.0 + jitter - 0.001) is None
    assert ids(q, 100.0 + jitter) == ("a", False, False)


@pytest.mark.parametrize(
    ("failures", "rand", "delay_s"),
    [
        (1, 0.0, 0.5),
        (1, 0.999, 0.9995),
        (2, 0.0, 1.0),
        (3, 0.5, 3.0),
        (9, 0.0, 128.0),
        (10, 0.0, 150.0),  # 2^9 capped at MAX_RETRY_S, then halved by the jitter
        (40, 0.999, MAX_RETRY_S * 0.9995),
    ],
)
def test_the_backoff_doubles_per_failure_up_to_its_cap_jittered_down_to_half(
    failures: int, rand: float, delay_s: float
) -> None:
    assert retry_delay_s(failures, rand) == pytest.approx(delay_s)


def test_a_failed_model_waits_its_backoff_while_the_others_go_on() -> None:
    q = queue()
    q.plan(["a", "b"], [], now=0.0)
    assert q.finished(Job("a", requested=False), 10.0, failed=True, rand=0.0) == 0.5
    assert ids(q, 10.0) == ("b", False, False)
    assert ids(q, 10.5) == ("a", False, False)
    assert q.finished(Job("a", requested=False), 11.0, failed=True, rand=0.0) == 1.0
    assert q.finished(Job("a", requested=False), 12.0, failed=True, rand=0.0) == 2.0
    assert q.retries["a"].failures == 3 and q.retries["a"].at == 14.0
    q.finished(Job("a", requested=False), 14.0, failed=False)
    assert "a" not in q.retries, "a success resets the backoff"


def test_a_model_the_store_holds_broken_waits_the_longest_backoff_at_once() -> None:
    q = queue()
    q.plan(["a", "b"], [], now=0.0)
    assert q.finished(Job("a", requested=False), 10.0, failed=True, rand=0.0, store_at_fault=True) == 150.0
    assert q.finished(Job("a", requested=False), 160.0, failed=True, rand=1.0, store_at_fault=True) == 300.0
    assert q.finished(Job("b", requested=False), 10.0, failed=True, rand=0.0) == 0.5, "an outage retries soon"


def test_a_request_for_a_failed_model_tries_it_at_once() -> None:
    q = queue()
    q.plan(["a"], [], now=0.0)
    q.finished(Job("a", requested=False), 0.0, failed=True, rand=0.9)
    assert q.next(0.1) is None
    q.request("a")
    assert ids(q, 0.1) == ("a", True, False)


def test_nothing_starts_while_a_foreground_pull_is_announced() -> None:
    q = queue()
    q.plan(["a"], [], now=0.0)
    q.request("r")
    assert q.next(0.0, paused=True) is None
    assert ids(q, 0.0) == ("r", True, False)


def test_refresh_checks_come_after_fetches_and_recur_every_refresh_period() -> None:
    q = queue(refresh_s=900.0)
    q.plan(["new"], ["staged"], now=0.0)
    assert ids(q, 0.0) == ("new", False, False)
    q.finished(Job("new", requested=False), 5.0, failed=False)
    q.plan([], ["staged", "new"], now=5.0)
    assert ids(q, 5.0) == ("staged", False, True)
    assert q.next(5.0 + 899.0) is not None
    q.finished(Job("staged", requested=False, refresh=True), 10.0, failed=False)
    assert q.next(10.0) is None, "a model just fetched is not checked again at once"
    assert ids(q, 905.0) == ("new", False, True)
    assert ids(q, 910.0) == ("staged", False, True), "both due: the plan's order"
    q.finished(Job("staged", requested=False, refresh=True), 910.0, failed=False)
    assert ids(q, 910.0) == ("new", False, True)


def test_without_a_refresh_period_staged_models_are_never_checked() -> None:
    q = queue(refresh_s=0.0)
    q.plan([], ["staged"], now=0.0)
    assert q.next(1e9) is None


@pytest.mark.parametrize(
    ("running", "announced", "yields"),
    [
        (Job("a", requested=False), frozenset(), False),
        (Job("a", requested=False), frozenset({"b"}), True),
        (Job("a", requested=False), frozenset({"a"}), False),  # the foreground pull waits for this one
        (Job("a", requested=True), frozenset({"b"}), True),
        (Job("a", requested=False, refresh=True), frozenset({"a", "b"}), False),
    ],
)
def test_a_running_pull_yields_to_a_foreground_pull_of_another_model(
    running: Job, announced: frozenset[str], yields: bool
) -> None:
    assert yields_to_foreground(running, announced) is yields


@pytest.mark.parametrize(
    ("running", "waiting", "yields"),
    [
        (Job("a", requested=False), {"b"}, True),
        (Job("a", requested=False), {"a"}, False),
        (Job("a", requested=False), set(), False),
        (Job("a", requested=True), {"b"}, False),  # someone waits for this one too
    ],
)
def test_a_background_pull_yields_to_a_pod_waiting_for_another_model(
    running: Job, waiting: set[str], yields: bool
) -> None:
    assert yields_to_request(running, waiting) is yields
