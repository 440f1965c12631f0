"""Byte sizes and durations as operators type them, and back again for tables.

Sizes follow the Kubernetes quantity convention, because the people writing
`--to-size` also write pod resource limits: a plain `k`, `M`, `G`, `T`, `P`, `E`
is a power of 1000 (`500G` = 500 * 10**9) and an `i` makes it a power of 1024
(`512Mi` = 512 * 2**20). A trailing `B` is accepted and changes nothing, so
`500GB` = `500G` and `1.5TiB` = `1.5Ti`; `K` is read as `k`. A plain integer is
bytes. Fractions of a byte are rounded down. A rate is a size per second and may
say so: `500Mi/s` = `500Mi`.

Durations are one or more `<number><unit>` parts with units `d`, `h`, `m`, `s`,
largest first, each at most once: `30s`, `10m`, `1h30m`, `1.5h`, `7d`. A bare `0`
is zero; any other bare number is refused because it is unclear whether it
means seconds or minutes.

Every problem raises `UsageError` with one line that quotes the input and shows
what a valid value looks like.
"""

from __future__ import annotations

import math
import re

from modelsync.errors import UsageError

__all__ = [
    "MIN_RATE_CAP_BYTES_PER_S",
    "format_bytes",
    "format_duration",
    "parse_duration",
    "parse_rate",
    "parse_size",
]

#: the smallest download cap (`--max-bandwidth`) a setting takes: 0 means no cap, and a lower
#: cap reads as a typo; advice that suggests a cap never goes below it
MIN_RATE_CAP_BYTES_PER_S = 1024

_SIZE = re.compile(r"^([0-9]+(?:\.[0-9]+)?)\s*([kKMGTPE]i?)?B?$")
_SIZE_FACTORS: dict[str, int] = {
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}
_BINARY_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")

_NUMBER = r"[0-9]+(?:\.[0-9]+)?"
_DURATION = re.compile(
    rf"^(?=[0-9])(?:(?P<d>{_NUMBER})d)?(?:(?P<h>{_NUMBER})h)?"
    rf"(?:(?P<m>{_NUMBER})m)?(?:(?P<s>{_NUMBER})s)?$"
)
_SECONDS_PER: dict[str, int] = {"d": 86400, "h": 3600, "m": 60, "s": 1}
#: longer than any schedule or retention needs, short enough for datetime arithmetic
_MAX_DURATION_S = 100 * 365 * 86400


def parse_size(text: str) -> int:
    """`500G`, `500GB`, `1.5TiB`, `512Mi`, `4096` -> bytes (see the module docstring)."""
    match = _SIZE.match(text.strip())
    if match is None:
        raise UsageError(
            f"invalid size {text!r}; use bytes or a number with a unit, e.g. 500G, 500GB, 1.5TiB, 512Mi"
        )
    number, unit = match.group(1), match.group(2) or ""
    if unit[:1] == "K":
        unit = "k" + unit[1:]
    from decimal import Decimal  # here: settings are mostly defaults, and decimal costs every command ~1 ms

    return int(Decimal(number) * _SIZE_FACTORS[unit])


def parse_rate(text: str) -> int:
    """A rate in bytes per second: a size, optionally written per second (`500Mi/s` = `500Mi`)."""
    try:
        return parse_size(text.strip().removesuffix("/s"))
    except UsageError:
        raise UsageError(f"invalid rate {text!r}; use a size per second, e.g. 500Mi/s, 1G/s or 0") from None


def parse_duration(text: str) -> float:
    """`30s`, `10m`, `1h30m`, `1.5h`, `7d`, `0` -> seconds (see the module docstring)."""
    stripped = text.strip()
    if stripped == "0":
        return 0.0
    match = _DURATION.match(stripped)
    if match is None:
        raise UsageError(
            f"invalid duration {text!r}; use parts with units d, h, m, s, largest first, "
            "e.g. 30s, 10m, 1h30m, 7d"
        )
    from decimal import Decimal, InvalidOperation  # here, as in parse_size

    try:
        total = sum(
            (Decimal(value) * _SECONDS_PER[unit] for unit, value in match.groupdict().items() if value),
            Decimal(0),
        )
    except InvalidOperation:  # pragma: no cover - the pattern only admits plain decimals
        raise UsageError(f"invalid duration {text!r}") from None
    if total > _MAX_DURATION_S:
        raise UsageError(f"duration {text!r} is longer than 100 years")
    return float(total)


def format_bytes(size_bytes: int) -> str:
    """Binary units with one decimal (`1.5 GiB`), because cache budgets are set in Gi/Ti.

    The result is accepted by `parse_size`, up to the rounding of that decimal.
    """
    magnitude = abs(size_bytes)
    sign = "-" if size_bytes < 0 else ""
    if magnitude < 1024:
        return f"{sign}{magnitude} B"
    exponent = min(int(math.log(magnitude, 1024)), len(_BINARY_UNITS) - 1)
    value = magnitude / 1024**exponent
    if value >= 1023.95 and exponent < len(_BINARY_UNITS) - 1:
        exponent, value = exponent + 1, value / 1024
    return f"{sign}{value:.1f} {_BINARY_UNITS[exponent]}"


def format_duration(seconds: float) -> str:
    """The largest unit and the one below it, whole seconds (`1h30m`, `2d3h`, `45s`, `-4m`).

    A table needs to be read at a glance, so `1d0h5m` shows as `1d`.

    Negative durations keep their sign so a table can say a model is late.
    A non-negative result is accepted by `parse_duration`.
    """
    total = round(abs(seconds))
    sign = "-" if seconds < 0 and total else ""
    if total == 0:
        return "0s"
    parts: list[str] = []
    for unit, size in _SECONDS_PER.items():
        count, total = divmod(total, size)
        if count or parts:
            parts.append(f"{count}{unit}" if count else "")
    shown = [p for p in parts[:2] if p]
    return sign + "".join(shown)
