"""How each setting reads from text: the parsers `config.py`'s table applies to a flag,
an environment variable or a config-file line, and the value types they return.

Each raises ValueError (or a UsageError) with what is wrong; `config.parse_setting`
turns it into one `ConfigError` line that names where the text came from.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import NamedTuple
from urllib.parse import urlsplit

from modelsync.core.units import format_bytes, format_duration, parse_duration, parse_rate, parse_size

__all__ = [
    "DAY_S",
    "MAX_CONCURRENCY",
    "MAX_PART_BYTES",
    "MAX_RATE_BYTES_PER_S",
    "MIN_PART_BYTES",
    "WEEK_S",
    "CacheBudget",
    "KiB",
    "MiB",
    "bounded_count",
    "bounded_duration",
    "bounded_rate",
    "bounded_seconds",
    "bounded_size",
    "check_part_bytes",
    "parse_addressing_style",
    "parse_bool",
    "parse_budget",
    "parse_endpoint_url",
    "parse_positive_float",
    "parse_positive_int",
    "parse_positive_size",
    "parse_ratio",
    "parse_signature_name",
    "parse_string_list",
]

KiB = 1024
MiB = 1024 * 1024
DAY_S = 86400
WEEK_S = 7 * DAY_S
#: ranged GETs in flight: each holds a connection and a receive buffer (config.receive_buffer_bytes)
MAX_CONCURRENCY = 256
#: a download cap above a terabyte per second is no cap a node can reach: a typo
MAX_RATE_BYTES_PER_S = 1024**4
#: every part is one GET: below this a model takes thousands of requests for little data
MIN_PART_BYTES = MiB
#: above this a file gets few parallel GETs, and an interrupted pull loses parts that large
MAX_PART_BYTES = 1024 * MiB


class CacheBudget(NamedTuple):
    """The cache's size budget: a byte count, or a share of the cache filesystem's size."""

    size_bytes: int | None = None
    share: float | None = None

    def resolve(self, filesystem_bytes: int) -> int:
        if self.size_bytes is not None:
            return self.size_bytes
        return int((self.share or 0.0) * filesystem_bytes)

    def __str__(self) -> str:
        return f"{self.share * 100:g}%" if self.share is not None else str(self.size_bytes)


def parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off", ""}:
        return False
    raise ValueError(f"{text!r} is not a boolean (use true or false)")


def parse_positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a whole number") from None
    if value <= 0:
        raise ValueError(f"{value} is not positive")
    return value


def parse_positive_size(text: str) -> int:
    value = parse_size(text)
    if value <= 0:
        raise ValueError(f"{text!r} is not a positive size")
    return value


def check_part_bytes(value: int) -> int:
    bounds = f"use {format_bytes(MIN_PART_BYTES)} to {format_bytes(MAX_PART_BYTES)} (default 16.0 MiB)"
    if value < MIN_PART_BYTES:
        raise ValueError(
            f"part size {_near(value, MIN_PART_BYTES)} is under {format_bytes(MIN_PART_BYTES)}: every "
            f"part is one GET, so a model would take thousands; {bounds}"
        )
    if value > MAX_PART_BYTES:
        raise ValueError(
            f"part size {_near(value, MAX_PART_BYTES)} is over {format_bytes(MAX_PART_BYTES)}: a file "
            f"would get few parallel GETs, and an interrupted pull would lose whole parts; {bounds}"
        )
    return value


def _near(value: int, bound: int) -> str:
    """`value` in the units of `format_bytes`, exact when rounding would make it read as `bound`."""
    if value > 2**100:  # format_bytes divides as a float
        return "far more than 1 EiB"
    shown = format_bytes(value)
    return f"{value} B" if shown == format_bytes(bound) else shown


def parse_positive_float(text: str) -> float:
    value = _finite(text)
    if value <= 0:
        raise ValueError(f"{value} is not positive")
    return value


def _finite(text: str) -> float:
    """A plain decimal number: not NaN, not infinite, not a word."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"{text!r} is not a finite number")
    return value


def _within(value: float, low: float, high: float, show: Callable[[float], str], zero: str = "") -> None:
    """`value` in [low, high] (or 0 when `zero` says what 0 means), else a ValueError with the bounds."""
    if zero and value == 0:
        return
    if not low <= value <= high:
        allowed = f"0 ({zero}) or " if zero else ""
        shown = show(value) if abs(value) < 2**64 else "a number far too large"  # no float overflow
        raise ValueError(f"{shown} is out of range; use {allowed}{show(low)} to {show(high)}")


def bounded_count(low: int, high: int) -> Callable[[str], int]:
    """A whole number in [low, high] (concurrency, attempts)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            quoted = repr(text) if len(text) <= 40 else f"{text[:40]!r}..."
            raise ValueError(f"{quoted} is not a whole number") from None
        _within(value, low, high, lambda v: str(int(v)))
        return value

    return parse


def bounded_seconds(low: float, high: float) -> Callable[[str], float]:
    """A finite number of seconds in [low, high] (timeouts, backoff): below `low` every
    request would time out, and the store would look down while it is healthy."""

    def parse(text: str) -> float:
        value = _finite(text)
        _within(value, low, high, lambda v: f"{v:g} s")
        return value

    return parse


def bounded_duration(low: float, high: float) -> Callable[[str], float]:
    """A duration (`30s`, `10m`, `1h`) in [low, high]."""

    def parse(text: str) -> float:
        value = parse_duration(text)
        _within(value, low, high, format_duration)
        return value

    return parse


def bounded_size(low: int, high: int) -> Callable[[str], int]:
    """A size (`1Mi`) in [low, high]."""

    def parse(text: str) -> int:
        value = parse_size(text)
        _within(value, low, high, lambda v: format_bytes(int(v)))
        return value

    return parse


def bounded_rate(low: int, high: int) -> Callable[[str], int]:
    """A rate (`500Mi/s`): 0 for no cap, else in [low, high]."""

    def parse(text: str) -> int:
        value = parse_rate(text)
        _within(value, low, high, lambda v: f"{format_bytes(int(v))}/s", zero="no cap")
        return value

    return parse


def parse_addressing_style(text: str) -> str:
    if text not in {"path", "virtual", "auto"}:
        raise ValueError(f"{text!r} is not one of path, virtual, auto")
    return text


def parse_budget(text: str) -> CacheBudget | None:
    """`500Gi`, `2T`, or `90%` of the filesystem; empty or 0 means no budget."""
    text = text.strip()
    if text.endswith("%"):
        share = _finite(text[:-1]) / 100
        if not 0 < share <= 1:
            raise ValueError(f"{text!r} is not a share between 0% and 100%")
        return CacheBudget(share=share)
    size = parse_size(text) if text else 0
    return CacheBudget(size_bytes=size) if size else None


def parse_ratio(text: str) -> float:
    value = _finite(text)
    if not 0 < value <= 1:
        raise ValueError(f"{value} is not a ratio in (0, 1]")
    return value


def parse_endpoint_url(text: str) -> str | None:
    """An http(s) URL with a host; checked here so a missing scheme is one line, not an SDK traceback."""
    text = text.strip()
    if not text:
        return None
    if "://" not in text:
        raise ValueError(f"{text!r} has no scheme; write http://{text} or https://{text}")
    parts = urlsplit(text)
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise ValueError(f"{text!r} is not an http:// or https:// URL with a host")
    parts.port  # noqa: B018 - raises ValueError on a port that is not a number in range
    # The SDK puts the bucket after the host: a path here shifts every request, and the
    # store answers "no such bucket" for a bucket that exists.
    origin = f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"
    if parts.username is not None or parts.password is not None:
        raise ValueError(f"an endpoint URL carries no credentials: write {origin} and use the AWS chain")
    if parts.path not in {"", "/"} or parts.query or parts.fragment or "#" in text or "?" in text:
        raise ValueError(
            f"{text!r} has a path; an endpoint is a scheme, a host and a port: write {origin} "
            "(the bucket and the model go in the s3:// source)"
        )
    return text


def parse_string_list(text: str) -> tuple[str, ...]:
    """A JSON list (from the config file) or comma-separated text (from the environment)."""
    if text.lstrip().startswith("["):
        values = json.loads(text)
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise ValueError("expected a list of strings")
        return tuple(values)
    return tuple(part.strip() for part in text.split(",") if part.strip())


def parse_signature_name(text: str) -> str:
    if not text or "/" in text:
        raise ValueError(f"{text!r} is not a file name")
    return text
