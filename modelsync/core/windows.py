"""Serving windows: when a model must be on the node, as half-open UTC intervals.

A window is either `always` (open forever) or a cron expression for its start
plus a duration. `now` is always a parameter, so a daemon that was down across
a window start simply asks again with a later `now` and finds the window that
already started and has not ended; a wall clock that jumps backwards is just an
earlier `now`.

Cron expressions have the five standard fields (minute, hour, day of month,
month, day of week) with the usual Vixie semantics: when both day fields are
restricted, a day matching either one fires. Names (`mon-fri`, `jan`), `L`, `#`
and the `@hourly`, `@daily`, `@midnight`, `@weekly`, `@monthly`, `@yearly` and
`@annually` shorthands are accepted. Seconds fields and croniter's hashed (`H`)
and random (`R`) extensions are refused: every node must compute the same
windows from the same file.

Daylight saving time. Cron fields are matched against wall-clock time in the
window's time zone, then each matching wall-clock time becomes one instant:

* a start whose wall-clock time does not exist (the skipped hour in spring)
  fires at the first valid instant after it, which is the moment the clocks
  jump: `30 2 * * *` in Europe/Berlin on 2026-03-29 fires at 03:00 CEST
  (01:00 UTC). Several starts inside the same skipped hour collapse into one.
* a start whose wall-clock time happens twice (the repeated hour in autumn)
  fires once, at its first occurrence: `30 2 * * *` in Europe/Berlin on
  2026-10-25 fires at 02:30 CEST (00:30 UTC), not again at 02:30 CET. An hourly
  window therefore has no start during the second pass of the repeated hour.
* a duration is elapsed time, so a window of `12h` lasts twelve real hours even
  across a change, and its closing wall-clock time moves by the shift.

This is the cron(8) reading of DST, done here rather than left to croniter,
whose handling of aware datetimes differs between its versions: croniter only
ever sees naive wall-clock times.
"""

from __future__ import annotations

import contextlib
import heapq
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import islice
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, CroniterError, croniter

from modelsync.errors import ScheduleError

__all__ = [
    "ALWAYS",
    "AlwaysWindow",
    "CronWindow",
    "Occurrence",
    "Window",
    "current_or_next",
    "last_start",
    "load_zone",
    "next_start",
    "previous",
    "validate_cron",
]

_SHORTHANDS: dict[str, str] = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_FIELDS: tuple[tuple[str, int, int], ...] = (
    ("minute", 0, 59),
    ("hour", 0, 23),
    ("day of month", 1, 31),
    ("month", 1, 12),
    ("day of week", 0, 7),
)
_HASHED_OR_RANDOM = re.compile(r"(?<![A-Za-z])[HhRr](?![A-Za-z])")
_ZONE_KEY = re.compile(r"^[A-Za-z][A-Za-z0-9_+-]*(?:/[A-Za-z0-9_+-]+)*$")
#: zone files whose meaning depends on the host, not on the name
_HOST_DEPENDENT_ZONES = frozenset({"localtime", "posixrules", "Factory"})
#: a fixed instant to check that an expression fires at all (leap days fire by 2028)
_PROBE = datetime(2000, 1, 1)
#: more matches than fit into any repeated hour, even for a start every minute
_MAX_SKIPPED_MATCHES = 10_000


@dataclass(frozen=True, slots=True)
class AlwaysWindow:
    """A window that is open at every instant."""


ALWAYS = AlwaysWindow()


@dataclass(frozen=True, slots=True)
class CronWindow:
    """Opens at each match of `cron` in `timezone` and stays open for `duration_s`."""

    cron: str
    duration_s: float
    #: an IANA zone name, already checked by `load_zone`
    timezone: str


Window = AlwaysWindow | CronWindow


@dataclass(frozen=True, slots=True)
class Occurrence:
    """One opening of a window, `[start, end)` in UTC; `None` means unbounded on that side."""

    start: datetime | None
    end: datetime | None

    def is_open(self, now: datetime) -> bool:
        """True when `now` lies in `[start, end)`."""
        return (self.start is None or self.start <= now) and (self.end is None or now < self.end)


def load_zone(name: str) -> ZoneInfo:
    """The zone for an IANA name, or `ScheduleError` naming the bad value (zones come from schedules)."""
    if not _ZONE_KEY.match(name) or name in _HOST_DEPENDENT_ZONES:
        raise ScheduleError(f"unknown time zone {name!r}; use an IANA name such as Europe/Berlin")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ScheduleError(f"unknown time zone {name!r}; use an IANA name such as Europe/Berlin") from None


def validate_cron(expression: str) -> None:
    """Refuse at load time what would otherwise fail, or differ between nodes, at fire time."""

    def bad(reason: str) -> ScheduleError:
        return ScheduleError(f"invalid cron expression {expression!r} ({reason})")

    fields = _expand(expression).split()
    if len(fields) != len(_FIELDS):
        raise bad("need 5 fields: minute hour day-of-month month day-of-week")
    for text, (name, low, high) in zip(fields, _FIELDS, strict=True):
        if _HASHED_OR_RANDOM.search(text):
            raise bad(f"{name} uses H or R, which differ between nodes")
        for number in _plain_numbers(text):
            if not low <= number <= high:
                raise bad(f"{name} must be {low}-{high}")
    try:
        if next(_walls_after(" ".join(fields), _PROBE), None) is None:
            raise bad("it never fires")
    except (CroniterError, ValueError, KeyError) as exc:
        reason = str(exc).replace(f"[{' '.join(fields)}]", "").strip() or type(exc).__name__
        raise bad(reason) from None


def last_start(window: Window, now: datetime) -> datetime | None:
    """The latest start at or before `now`; `None` for `always` or when there is none."""
    _require_aware(now)
    if isinstance(window, AlwaysWindow):
        return None
    zone = ZoneInfo(window.timezone)
    expression = _expand(window.cron)
    local_now = now.astimezone(zone)
    minute = local_now.replace(tzinfo=None, second=0, microsecond=0)
    wall = _wall_before(expression, minute + timedelta(minutes=1))
    if wall is None:
        return None
    best = _to_utc(wall, zone)
    if local_now.fold:
        # In the second pass of a repeated hour, later wall-clock times of the
        # first pass are already behind us.
        for later in islice(_walls_after(expression, minute), _MAX_SKIPPED_MATCHES):
            instant = _to_utc(later, zone)
            if instant > now:
                break
            best = instant
    return best


def next_start(window: Window, now: datetime) -> datetime | None:
    """The earliest start strictly after `now`; `None` for `always` or when there is none."""
    _require_aware(now)
    if isinstance(window, AlwaysWindow):
        return None
    zone = ZoneInfo(window.timezone)
    minute = now.astimezone(zone).replace(tzinfo=None, second=0, microsecond=0)
    count = 0
    for wall in islice(_walls_after(_expand(window.cron), minute), _MAX_SKIPPED_MATCHES):
        count += 1
        instant = _to_utc(wall, zone)
        if instant > now:
            return instant
    if count < _MAX_SKIPPED_MATCHES:
        return None  # it never fires again
    raise AssertionError(f"no start after {now} in {_MAX_SKIPPED_MATCHES} matches of {window}")


def current_or_next(window: Window, now: datetime) -> Occurrence | None:
    """The occurrence open at `now`, else the next one; `None` if the window never opens again.

    With overlapping occurrences (a duration longer than the gap between starts)
    the most recent start is reported: it closes last.
    """
    if isinstance(window, AlwaysWindow):
        return Occurrence(start=None, end=None)
    started = last_start(window, now)
    if started is not None and now < started + timedelta(seconds=window.duration_s):
        return Occurrence(started, started + timedelta(seconds=window.duration_s))
    upcoming = next_start(window, now)
    if upcoming is None:
        return None
    return Occurrence(upcoming, upcoming + timedelta(seconds=window.duration_s))


def previous(window: Window, now: datetime) -> Occurrence | None:
    """The latest occurrence that closed at or before `now` (what a keep time counts from)."""
    if isinstance(window, AlwaysWindow):
        return None
    duration = timedelta(seconds=window.duration_s)
    # An occurrence has closed by `now` exactly when it started by `now - duration`.
    started = last_start(window, now - duration)
    if started is None:
        return None
    return Occurrence(started, started + duration)


def _expand(expression: str) -> str:
    text = expression.strip()
    return _SHORTHANDS.get(text.lower(), text)


def _day_alternatives(expression: str) -> list[str]:
    """The expression as croniter must see it for cron(8)'s day rule: a day matching either
    restricted day field fires.

    croniter applies that rule itself, but not when the day of week uses `#`
    (`0 6 15 * fri#2` never fired). Split into one expression per day field,
    each with the other unrestricted, the rule holds for every form.
    """
    fields = expression.split()
    if len(fields) != len(_FIELDS) or fields[2] in ("*", "?") or fields[4] in ("*", "?"):
        return [expression]
    minute, hour, day, month, weekday = fields
    return [f"{minute} {hour} {day} {month} *", f"{minute} {hour} * {month} {weekday}"]


def _walls_after(expression: str, start: datetime) -> Iterator[datetime]:
    """The matching wall-clock times strictly after the naive `start`, ascending, each once."""
    streams = [_matches(croniter(e, start)) for e in _day_alternatives(expression)]
    last = None
    for wall in heapq.merge(*streams):
        if wall != last:
            yield wall
            last = wall


def _matches(matcher: croniter) -> Iterator[datetime]:
    while True:
        try:
            yield matcher.get_next(datetime)
        except CroniterBadDateError:  # no further match
            return


def _wall_before(expression: str, start: datetime) -> datetime | None:
    """The latest matching wall-clock time strictly before the naive `start`; None when there is none."""
    found = []
    for alternative in _day_alternatives(expression):
        with contextlib.suppress(CroniterBadDateError):
            found.append(croniter(alternative, start).get_prev(datetime))
    return max(found, default=None)


def _plain_numbers(field: str) -> list[int]:
    """The bare numbers of a cron field (range ends and values, not steps or `#n`)."""
    numbers: list[int] = []
    for item in field.split(","):
        values = item.split("/", 1)[0].split("#", 1)[0]
        numbers.extend(int(part) for part in values.split("-") if part.isdigit())
    return numbers


def _to_utc(wall: datetime, zone: ZoneInfo) -> datetime:
    """The instant of a naive wall-clock time, by the DST rules in the module docstring."""
    first = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
    if first.astimezone(zone).replace(tzinfo=None) == wall:
        return first
    # `wall` was skipped. fold=1 reads it with the offset after the jump, which
    # lands before the jump; fold=0 lands after it. Bisect for the jump itself.
    before = int(wall.replace(tzinfo=zone, fold=1).timestamp())
    after = int(first.timestamp())
    while after - before > 1:
        middle = (before + after) // 2
        if datetime.fromtimestamp(middle, zone).replace(tzinfo=None) > wall:
            after = middle
        else:
            before = middle
    return datetime.fromtimestamp(after, UTC)


def _require_aware(now: datetime) -> None:
    if now.tzinfo is None or now.utcoffset() is None:
        raise ValueError(f"now must be an aware datetime, got {now!r}")
