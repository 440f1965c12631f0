"""Sizes and durations: the Kubernetes size convention, strict durations, readable output."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from modelsync.core.units import format_bytes, format_duration, parse_duration, parse_size
from modelsync.errors import UsageError


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4096", 4096),
        ("0", 0),
        ("500G", 500 * 10**9),
        ("500GB", 500 * 10**9),
        ("500Gi", 500 * 2**30),
        ("500GiB", 500 * 2**30),
        ("1.5TiB", 3 * 2**39),
        ("1.5T", 1_500_000_000_000),
        ("512MiB", 512 * 2**20),
        ("512Mi", 512 * 2**20),
        ("1k", 1000),
        ("1K", 1000),
        ("1Ki", 1024),
        ("2E", 2 * 10**18),
        ("100B", 100),
        ("1.5 GiB", 3 * 2**29),
        ("  10M ", 10**7),
        ("1.1Ki", 1126),
    ],
)
def test_parse_size_reads_kubernetes_quantities(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    "text", ["", "G", "-1G", "1.G", "1e9", "10 gigabytes", "5g", "1Gb", "80%", "1,5G", "1GiGi"]
)
def test_parse_size_rejects_malformed_sizes_with_one_line(text: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_size(text)
    message = str(caught.value)
    assert "\n" not in message
    assert repr(text) in message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30s", 30.0),
        ("10m", 600.0),
        ("2h", 7200.0),
        ("1d", 86400.0),
        ("7d", 604800.0),
        ("1h30m", 5400.0),
        ("1d2h3m4s", 93784.0),
        ("1.5h", 5400.0),
        ("0", 0.0),
        ("0s", 0.0),
        (" 45m ", 2700.0),
    ],
)
def test_parse_duration_reads_unit_parts_largest_first(text: str, expected: float) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize(
    "text",
    ["", "10", "1.5", "m", "-5m", "30m1h", "1h1h", "1 h", "1H", "10ms", "1w", "1h 30m", "1e3s"],
)
def test_parse_duration_rejects_ambiguous_or_malformed_text(text: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_duration(text)
    assert "\n" not in str(caught.value)
    assert repr(text) in str(caught.value)


def test_parse_duration_refuses_durations_beyond_a_century() -> None:
    with pytest.raises(UsageError, match="100 years"):
        parse_duration("40000d")


@pytest.mark.parametrize(
    ("size_bytes", "expected"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (1536, "1.5 KiB"),
        (2**20 - 1, "1.0 MiB"),
        (500 * 10**9, "465.7 GiB"),
        (3 * 2**39, "1.5 TiB"),
        (-2048, "-2.0 KiB"),
    ],
)
def test_format_bytes_uses_binary_units_with_one_decimal(size_bytes: int, expected: str) -> None:
    assert format_bytes(size_bytes) == expected


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [
        (0, "0s"),
        (0.4, "0s"),
        (45, "45s"),
        (59.6, "1m"),
        (600, "10m"),
        (5400, "1h30m"),
        (86400 + 300, "1d"),
        (2 * 86400 + 3 * 3600 + 7, "2d3h"),
        (-240, "-4m"),
        (3661, "1h1m"),
    ],
)
def test_format_duration_shows_the_two_largest_units(seconds: float, expected: str) -> None:
    assert format_duration(seconds) == expected


@given(st.integers(min_value=0, max_value=2**62))
def test_format_bytes_output_parses_back_within_its_rounding(size_bytes: int) -> None:
    # one decimal of a unit that is at most the value itself: within 5 %, plus rounding down
    parsed = parse_size(format_bytes(size_bytes))
    assert abs(parsed - size_bytes) <= size_bytes * 0.05 + 1


@given(st.integers(min_value=0, max_value=10 * 365 * 86400))
def test_format_duration_output_parses_back_without_exceeding_the_input(seconds: int) -> None:
    parsed = parse_duration(format_duration(seconds))
    assert parsed <= seconds
    # what falls below the second unit is under 5 % of the whole (worst case 1d0h59m59s)
    assert seconds - parsed <= seconds * 0.05


@given(
    st.integers(min_value=0, max_value=99),
    st.integers(min_value=0, max_value=23),
    st.integers(min_value=0, max_value=59),
    st.integers(min_value=0, max_value=59),
)
def test_parse_duration_sums_its_parts(days: int, hours: int, minutes: int, secs: int) -> None:
    text = f"{days}d{hours}h{minutes}m{secs}s"
    assert parse_duration(text) == days * 86400 + hours * 3600 + minutes * 60 + secs
