"""Scopes of per-source rules are plain prefixes: what reads as anything else is refused when read."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from modelsync.core.refs import ModelRef, parse_source
from modelsync.core.scope import parse_scope
from modelsync.core.signature import Mode, SignatureRule
from modelsync.errors import UsageError


@pytest.mark.parametrize(
    ("text", "scope"),
    [
        ("*", ""),
        ("", ""),
        ("s3://models/", "models/"),
        ("s3://models/org", "models/org/"),
        ("s3://models/org/m/config.json/", "models/org/m/config.json/"),  # a slash says "a prefix"
        ("s3://models/Qwen/Qwen2.5-7B", "models/Qwen/Qwen2.5-7B/"),  # a dot in a name is no file
    ],
)
def test_a_prefix_scope_is_read_as_bucket_and_prefix(text: str, scope: str) -> None:
    assert parse_scope(text) == scope


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("s3://models/org/*", "is a glob"),
        ("s3://models/org/*/rev1/", "write s3://models/org/,"),
        ("s3://models/org/m?/", "is a glob"),
        ("s3://models/org/[ab]/", "is a glob"),
        ("s3://*", "is a glob"),
        ("s3://models/org/m/config.json", "names a file"),
        ("s3://models/org/m/model-00001-of-00002.safetensors", "write s3://models/org/m/"),
        ("s3://Models/org/", "could never match"),
        ("s3://", "could never match"),
        ("s3://models/a/../b/", "could never match"),
        ("s3://models/a//b/", "could never match"),
        ("s3://models/a/\nb/", "could never match"),
    ],
)
def test_a_scope_that_could_never_match_is_refused_saying_what_to_write(text: str, says: str) -> None:
    with pytest.raises(UsageError, match=r"could never match|is a glob|names a file") as refused:
        parse_scope(text, "signature scope")
    assert says in str(refused.value)
    assert str(refused.value).startswith(f"signature scope {text!r}")


_SEGMENT = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,12}", fullmatch=True).filter(
    lambda s: s not in {".", ".."}
)


@given(
    bucket=st.from_regex(r"[a-z0-9][a-z0-9-]{2,20}[a-z0-9]", fullmatch=True),
    segments=st.lists(_SEGMENT, min_size=1, max_size=4),
    depth=st.integers(min_value=0, max_value=4),
)
def test_a_scope_read_from_a_source_or_any_folder_above_it_covers_that_source(
    bucket: str, segments: list[str], depth: int
) -> None:
    ref: ModelRef = parse_source(f"s3://{bucket}/{'/'.join(segments)}/")
    above = segments[: min(depth, len(segments))]
    scope = parse_scope(f"s3://{bucket}/{''.join(s + '/' for s in above)}")
    assert SignatureRule(scope, Mode.REQUIRED).covers(ref)
