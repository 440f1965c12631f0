"""The daemon's allow-list (core/allow.py): pure, no daemon."""

from __future__ import annotations

import pytest

from modelsync.core.allow import allow_list, parse_prefix
from modelsync.core.refs import parse_source
from modelsync.errors import ExitCode, SourceNotAllowedError, UsageError


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("s3://models/", "models/"),
        ("s3://models", "models/"),
        ("s3://models/Qwen", "models/Qwen/"),
        ("s3://models/Qwen/Qwen3-32B/", "models/Qwen/Qwen3-32B/"),
    ],
)
def test_parse_prefix_normalises_to_whole_segments(text: str, expected: str) -> None:
    assert parse_prefix(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "models/Qwen/", "s3://", "s3://*", "s3://UPPER/", "s3://models/../other/", "s3://a/",
        "s3://models/org/*", "s3://models/org/m/config.json",
    ],
)
def test_parse_prefix_refuses_what_is_not_an_s3_prefix(text: str) -> None:
    with pytest.raises(UsageError, match="allowed prefix"):
        parse_prefix(text)


def test_allow_list_serves_scheduled_sources_and_prefixes_on_segment_boundaries_only() -> None:
    allowed = allow_list(
        [parse_source("s3://models/deepseek-ai/DeepSeek-V3/2025-03-24/")],
        [parse_prefix("s3://models/Qwen/"), parse_prefix("s3://datasets/")],
    )
    for ok in (
        "s3://models/deepseek-ai/DeepSeek-V3/2025-03-24/",
        "s3://models/Qwen/Qwen3-32B/2025-05-01/",
        "s3://datasets/any/thing/",
    ):
        assert allowed.allows(parse_source(ok)), ok
    for refused in (
        "s3://models/deepseek-ai/DeepSeek-V3/2025-03-25/",  # another revision of a scheduled model
        "s3://models/deepseek-ai/DeepSeek-V3/2025-03-24/sub/",  # below a scheduled model, not it
        "s3://models/Qwen2/m/r1/",  # shares characters, not the segment
        "s3://checkpoints/Qwen/m/r1/",
    ):
        assert not allowed.allows(parse_source(refused)), refused
        with pytest.raises(SourceNotAllowedError) as raised:
            allowed.check(parse_source(refused))
        assert raised.value.exit_code == ExitCode.NOT_ALLOWED == 8
        assert raised.value.code == "not_allowed"


def test_an_empty_allow_list_serves_nothing() -> None:
    assert not allow_list([], []).allows(parse_source("s3://models/a/b/"))
