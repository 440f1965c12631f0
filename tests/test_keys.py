"""Key safety: a key below the model prefix either maps to one path inside the model or is refused."""

from __future__ import annotations

from pathlib import PurePosixPath

import pytest
from hypothesis import given
from hypothesis import strategies as st

from modelsync.core.keys import safe_relative_path
from modelsync.errors import ExitCode, UnsafeKeyError


@pytest.mark.parametrize(
    ("key", "reason"),
    [
        ("../x", "'..'"),
        ("a/../../x", "'..'"),
        ("/abs/key.bin", "absolute"),
        ("a/./b", "'.'"),
        ("a//b", "empty path segment"),
        ("dir/", "empty path segment"),
        ("a\\..\\b", "backslash"),
        ("a\x00b", "NUL"),
        ("a\nb", "control character"),
        ("x" * 201, "a path segment of 201 bytes, over the limit of 200"),
        ("a/" * 1600 + "b", "3201 bytes long, over the limit of 3000"),
        ("", "empty"),
    ],
)
def test_unsafe_keys_are_refused_with_the_rule_they_break(key: str, reason: str) -> None:
    with pytest.raises(UnsafeKeyError, match=reason) as info:
        safe_relative_path(key)
    assert info.value.exit_code == ExitCode.INTEGRITY


@pytest.mark.parametrize(
    "key",
    [
        "config.json",
        "model-00001-of-00002.safetensors",
        "tokenizer/vocab.json",
        "a..b/.hidden",
        "ünïcode.bin",
    ],
)
def test_ordinary_keys_map_to_the_same_relative_path(key: str) -> None:
    assert safe_relative_path(key) == PurePosixPath(key)
    assert str(safe_relative_path(key)) == key


@given(st.text(alphabet=st.sampled_from(list("ab./\\\x00")), max_size=12))
def test_an_accepted_key_never_escapes_and_never_aliases(key: str) -> None:
    try:
        path = safe_relative_path(key)
    except UnsafeKeyError:
        return
    assert not path.is_absolute()
    assert ".." not in path.parts and "." not in path.parts
    # The path spells the key exactly: two distinct keys can never share one file.
    assert path.as_posix() == key
