"""Windows as UTC intervals, with DST, downtime and clock jumps handled as `now` values."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from modelsync.core.windows import (
    ALWAYS,
    CronWindow,
    Occurrence,
    current_or_next,
    last_start,
    load_zone,
    next_start,
    previous,
    validate_cron,
)
from modelsync.errors import UsageError

HOUR = 3600.0


def utc(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0
) -> datetime:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC)


def starts(window: CronWindow, after: datetime, count: int) -> list[datetime]:
    found: list[datetime] = []
    for _ in range(count):
        instant = next_start(window, after)
        assert instant is not None
        found.append(instant)
        after = instant
    return found


# --- DST: the skipped hour fires at the jump, the repeated hour fires once ---------------


@pytest.mark.parametrize(
    ("cron", "zone", "after", "expected"),
    [
        # Europe/Berlin jumps 02:00 CET -> 03:00 CEST at 01:00 UTC on 2026-03-29.
        (
            "30 2 * * *",
            "Europe/Berlin",
            utc(2026, 3, 27, 12),
            [utc(2026, 3, 28, 1, 30), utc(2026, 3, 29, 1, 0), utc(2026, 3, 30, 0, 30)],
        ),
        (
            "*/20 2 * * *",
            "Europe/Berlin",
            utc(2026, 3, 28, 12),
            [utc(2026, 3, 29, 1, 0), utc(2026, 3, 30, 0, 0), utc(2026, 3, 30, 0, 20)],
        ),
        (
            "0 * * * *",
            "Europe/Berlin",
            utc(2026, 3, 28, 23, 30),
            [utc(2026, 3, 29, 0, 0), utc(2026, 3, 29, 1, 0), utc(2026, 3, 29, 2, 0)],
        ),
        # America/New_York jumps 02:00 EST -> 03:00 EDT at 07:00 UTC on 2026-03-08.
        (
            "30 2 * * *",
            "America/New_York",
            utc(2026, 3, 7, 12),
            [utc(2026, 3, 8, 7, 0), utc(2026, 3, 9, 6, 30), utc(2026, 3, 10, 6, 30)],
        ),
    ],
)
def test_a_start_in_the_skipped_hour_fires_when_the_clock_jumps(
    cron: str, zone: str, after: datetime, expected: list[datetime]
) -> None:
    assert starts(CronWindow(cron, HOUR, zone), after, len(expected)) == expected


@pytest.mark.parametrize(
    ("cron", "zone", "after", "expected"),
    [
        # Europe/Berlin repeats 02:00-03:00 (CEST, then CET) on 2026-10-25.
        (
            "30 2 * * *",
            "Europe/Berlin",
            utc(2026, 10, 23, 12),
            [utc(2026, 10, 24, 0, 30), utc(2026, 10, 25, 0, 30), utc(2026, 10, 26, 1, 30)],
        ),
        (
            "0 * * * *",
            "Europe/Berlin",
            utc(2026, 10, 24, 22, 30),
            [utc(2026, 10, 24, 23), utc(2026, 10, 25, 0), utc(2026, 10, 25, 2)],
        ),
        # America/New_York repeats 01:00-02:00 (EDT, then EST) on 2026-11-01.
        (
            "30 1 * * *",
            "America/New_York",
            utc(2026, 10, 31, 12),
            [utc(2026, 11, 1, 5, 30), utc(2026, 11, 2, 6, 30)],
        ),
    ],
)
def test_a_start_in_the_repeated_hour_fires_once_at_its_first_occurrence(
    cron: str, zone: str, after: datetime, expected: list[datetime]
) -> None:
    assert starts(CronWindow(cron, HOUR, zone), after, len(expected)) == expected


@pytest.mark.parametrize(
    ("now", "expected"),
    [
        (utc(2026, 10, 25, 0, 15), Occurrence(utc(2026, 10, 25, 0, 30), utc(2026, 10, 25, 1, 30))),
        (utc(2026, 10, 25, 0, 45), Occurrence(utc(2026, 10, 25, 0, 30), utc(2026, 10, 25, 1, 30))),
        # 02:15 CET, the second pass: the window that opened at 02:30 CEST is still open
        (utc(2026, 10, 25, 1, 15), Occurrence(utc(2026, 10, 25, 0, 30), utc(2026, 10, 25, 1, 30))),
        (utc(2026, 10, 25, 1, 45), Occurrence(utc(2026, 10, 26, 1, 30), utc(2026, 10, 26, 2, 30))),
    ],
)
def test_the_repeated_hour_second_pass_sees_the_window_opened_in_the_first_pass(
    now: datetime, expected: Occurrence
) -> None:
    window = CronWindow("30 2 * * *", HOUR, "Europe/Berlin")
    assert current_or_next(window, now) == expected


def test_last_start_in_the_second_pass_includes_first_pass_starts_after_the_wall_clock() -> None:
    window = CronWindow("45 2 * * *", HOUR, "Europe/Berlin")
    # now is 02:15 CET; 02:45 CEST (00:45 UTC) already happened
    assert last_start(window, utc(2026, 10, 25, 1, 15)) == utc(2026, 10, 25, 0, 45)


def test_a_duration_is_elapsed_time_across_a_dst_change() -> None:
    window = CronWindow("0 0 * * *", 24 * HOUR, "Europe/Berlin")
    occurrence = current_or_next(window, utc(2026, 3, 29, 12))
    # midnight CET to 01:00 CEST the next day: 24 real hours
    assert occurrence == Occurrence(utc(2026, 3, 28, 23), utc(2026, 3, 29, 23))


# --- downtime, boundaries, clock jumps ----------------------------------------------------


def test_a_daemon_down_across_a_window_start_finds_the_window_active() -> None:
    window = CronWindow("0 8 * * mon-fri", 12 * HOUR, "Asia/Seoul")
    # Monday 2026-03-02 08:00 KST is 2026-03-01 23:00 UTC; the daemon wakes at 13:00 KST
    occurrence = current_or_next(window, utc(2026, 3, 2, 4))
    assert occurrence == Occurrence(utc(2026, 3, 1, 23), utc(2026, 3, 2, 11))
    assert occurrence.is_open(utc(2026, 3, 2, 4))


@pytest.mark.parametrize(
    ("now", "is_open"),
    [
        (utc(2026, 3, 1, 22, 59, 59), False),
        (utc(2026, 3, 1, 23), True),
        (utc(2026, 3, 2, 10, 59, 59), True),
        (utc(2026, 3, 2, 11), False),
    ],
)
def test_windows_are_half_open(now: datetime, is_open: bool) -> None:
    window = CronWindow("0 8 * * mon-fri", 12 * HOUR, "Asia/Seoul")
    occurrence = current_or_next(window, now)
    assert occurrence is not None
    assert occurrence.is_open(now) is is_open


def test_a_wall_clock_jumping_backwards_is_just_an_earlier_now() -> None:
    window = CronWindow("0 8 * * mon-fri", 12 * HOUR, "Asia/Seoul")
    later = current_or_next(window, utc(2026, 3, 2, 12))
    earlier = current_or_next(window, utc(2026, 3, 2, 4))
    assert later == Occurrence(utc(2026, 3, 2, 23), utc(2026, 3, 3, 11))
    assert earlier == Occurrence(utc(2026, 3, 1, 23), utc(2026, 3, 2, 11))


def test_overlapping_occurrences_report_the_one_that_closes_last() -> None:
    window = CronWindow("0 * * * *", 3 * HOUR, "UTC")
    assert current_or_next(window, utc(2026, 5, 1, 10, 30)) == Occurrence(
        utc(2026, 5, 1, 10), utc(2026, 5, 1, 13)
    )


def test_previous_is_the_latest_occurrence_already_closed() -> None:
    window = CronWindow("0 8 * * *", 2 * HOUR, "UTC")
    assert previous(window, utc(2026, 5, 1, 9)) == Occurrence(
        utc(2026, 4, 30, 8), utc(2026, 4, 30, 10)
    )
    assert previous(window, utc(2026, 5, 1, 10)) == Occurrence(
        utc(2026, 5, 1, 8), utc(2026, 5, 1, 10)
    )


def test_always_is_open_forever_and_has_no_starts() -> None:
    now = utc(2026, 1, 1)
    assert current_or_next(ALWAYS, now) == Occurrence(None, None)
    assert Occurrence(None, None).is_open(now)
    assert next_start(ALWAYS, now) is None
    assert last_start(ALWAYS, now) is None
    assert previous(ALWAYS, now) is None


def test_a_naive_now_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="aware"):
        next_start(CronWindow("0 8 * * *", HOUR, "UTC"), datetime(2026, 1, 1))


# --- validation ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("0 25 * * *", "hour must be 0-23"),
        ("60 * * * *", "minute must be 0-59"),
        ("0 0 0 * *", "day of month must be 1-31"),
        ("0 8 * 1-13 *", "month must be 1-12"),
        ("0 8 * * 8", "day of week must be 0-7"),
        ("0 0 31 2 *", "it never fires"),
        ("H 2 * * *", "minute uses H or R"),
        ("R 2 * * *", "minute uses H or R"),
        ("* * * * * *", "need 5 fields"),
        ("", "need 5 fields"),
        ("@reboot", "need 5 fields"),
        ("*/0 * * * *", "step"),
        ("a b c d e", "not acceptable"),
    ],
)
def test_invalid_cron_expressions_are_refused_with_the_reason(expression: str, reason: str) -> None:
    with pytest.raises(UsageError) as caught:
        validate_cron(expression)
    message = str(caught.value)
    assert message.startswith(f"invalid cron expression {expression!r} (")
    assert reason in message
    assert "\n" not in message


@pytest.mark.parametrize(
    "expression",
    [
        "0 8 * * mon-fri",
        "0 8 * * MON-FRI",
        "*/15 9-17 * * 1-5",
        "@daily",
        "@hourly",
        "0 0 29 2 *",
        "0 8 L * *",
        "0 8 * * 1#2",
        "0 8 * * THU",
        "30 6 1,15 jan,jul *",
    ],
)
def test_valid_cron_expressions_pass(expression: str) -> None:
    validate_cron(expression)


@pytest.mark.parametrize(
    "name",
    [
        "Mars/Olympus",
        "../etc/passwd",
        "/etc/localtime",
        "",
        "localtime",
        "Europe/Berlin ",
        "utc/../UTC",
    ],
)
def test_unknown_time_zones_are_refused(name: str) -> None:
    with pytest.raises(UsageError, match="unknown time zone"):
        load_zone(name)


@pytest.mark.parametrize("name", ["UTC", "Asia/Seoul", "Europe/Berlin", "America/New_York"])
def test_iana_time_zones_load(name: str) -> None:
    assert str(load_zone(name)) == name


# --- properties ---------------------------------------------------------------------------------

instants = st.datetimes(
    min_value=datetime(2020, 1, 1), max_value=datetime(2035, 12, 31), timezones=st.just(UTC)
)
zones = st.sampled_from(
    [
        "UTC",
        "Europe/Berlin",
        "America/New_York",
        "Asia/Seoul",
        "Australia/Lord_Howe",
        "America/St_Johns",
    ]
)
crons = st.sampled_from(
    ["30 2 * * *", "0 * * * *", "*/20 1-3 * * *", "0 8 * * mon-fri", "15 3 1 * *", "0 0 * * 0"]
)
durations = st.sampled_from([60.0, 1800.0, HOUR, 12 * HOUR, 36 * HOUR])


@settings(deadline=None, max_examples=300)
@given(now=instants, cron=crons, zone=zones, duration_s=durations)
def test_current_or_next_is_open_now_or_starts_later(
    now: datetime, cron: str, zone: str, duration_s: float
) -> None:
    window = CronWindow(cron, duration_s, zone)
    occurrence = current_or_next(window, now)
    assert occurrence is not None and occurrence.start is not None and occurrence.end is not None
    assert occurrence.end - occurrence.start == timedelta(seconds=duration_s)
    assert occurrence.is_open(now) or occurrence.start > now
    assert occurrence.start.tzinfo is UTC


@settings(deadline=None, max_examples=300)
@given(now=instants, cron=crons, zone=zones)
def test_no_start_lies_between_the_last_start_and_the_next(
    now: datetime, cron: str, zone: str
) -> None:
    window = CronWindow(cron, HOUR, zone)
    before, after = last_start(window, now), next_start(window, now)
    assert before is not None and after is not None
    assert before <= now < after
    # the start just before `after` is `before` itself: nothing was skipped
    assert last_start(window, after - timedelta(microseconds=1)) == before
    assert next_start(window, before) == after


def _day_rule_examples() -> list[tuple[str, list[str]]]:
    """The rows of the day-rules table in docs/schedule.md: (expression, the five starts it lists)."""
    text = (Path(__file__).parents[1] / "docs" / "schedule.md").read_text()
    rows = re.findall(r"^\| `([^`]+)` \| ((?:\w{3} \d+ \w{3}(?:, )?){5}) \|$", text, re.MULTILINE)
    return [(cron, days.split(", ")) for cron, days in rows]


DAY_RULE_EXAMPLES = _day_rule_examples()


def test_the_docs_give_day_rule_examples_with_and_without_a_numbered_weekday() -> None:
    crons = [cron for cron, _ in DAY_RULE_EXAMPLES]
    assert len(crons) >= 6
    assert any("#" in c and c.split()[2] != "*" for c in crons), "a day of month with a # day of week"


@pytest.mark.parametrize(("cron", "days"), DAY_RULE_EXAMPLES, ids=[c for c, _ in DAY_RULE_EXAMPLES])
def test_cron_day_rules_fire_on_the_days_docs_schedule_md_lists(cron: str, days: list[str]) -> None:
    validate_cron(cron)
    window = CronWindow(cron, HOUR, "UTC")
    starts: list[datetime] = []
    now = utc(2026, 1, 1)
    for _ in days:
        start = next_start(window, now)
        assert start is not None
        starts.append(start)
        now = start
    assert [f"{s:%a} {s.day} {s:%b}" for s in starts] == days
    # and looking back from just after each start finds that start
    assert [last_start(window, s + timedelta(minutes=1)) for s in starts] == starts
