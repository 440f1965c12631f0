"""Part planning: parts tile each file exactly, and a resume fetches only what is missing."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from modelsync.core.parts import RemoteFile, check_paths, plan_parts, plan_pull
from modelsync.errors import UnsafeKeyError


@settings(deadline=None)
@given(size=st.integers(0, 10**12), part=st.integers(1, 2**34))
def test_parts_tile_the_whole_file_without_gaps_or_overlaps(size: int, part: int) -> None:
    part = max(part, size // 2000 + 1)  # at most ~2000 parts keeps each example cheap
    parts = plan_parts(size, part)
    assert sum(p.size_bytes for p in parts) == size
    position = 0
    for i, p in enumerate(parts):
        assert p.index == i
        assert p.start == position
        assert 0 < p.size_bytes <= part
        position = p.end
    assert position == size


def test_an_empty_file_has_no_parts() -> None:
    assert plan_parts(0, 8) == ()


def test_a_non_positive_part_size_is_a_programming_error() -> None:
    with pytest.raises(ValueError):
        plan_parts(10, 0)


def _file(path: str, size: int, etag: str = "e1") -> RemoteFile:
    return RemoteFile(key=f"p/{path}", path=path, size_bytes=size, etag=etag)


def test_a_resume_keeps_parts_written_for_the_same_etag() -> None:
    plan = plan_pull([_file("a.bin", 10)], part_size_bytes=4, done_parts={("a.bin", "e1"): frozenset({0, 2})})
    (work,) = plan.files
    assert [p.index for p in work.missing] == [1]
    assert plan.missing_bytes == 4
    assert plan.total_bytes == 10


def test_a_changed_etag_refetches_the_whole_file() -> None:
    plan = plan_pull([_file("a.bin", 10, etag="e2")], 4, {("a.bin", "e1"): frozenset({0, 1, 2})})
    assert plan.missing_bytes == 10


def test_a_resume_keeps_the_part_size_the_journal_was_written_with() -> None:
    plan = plan_pull([_file("a.bin", 10)], 4, {("a.bin", "e1"): frozenset({0})}, part_sizes={"a.bin": 5})
    (work,) = plan.files
    assert [(p.start, p.end) for p in work.parts] == [(0, 5), (5, 10)]
    assert plan.missing_bytes == 5


def test_journal_indexes_beyond_the_file_are_ignored() -> None:
    plan = plan_pull([_file("a.bin", 4)], 4, {("a.bin", "e1"): frozenset({0, 7})})
    assert plan.files[0].done == frozenset({0})


def test_a_file_that_is_also_a_directory_is_refused() -> None:
    with pytest.raises(UnsafeKeyError, match="both a file and a directory"):
        check_paths([_file("a", 1), _file("a/b/c", 1)])


def test_sibling_names_sharing_a_prefix_are_fine() -> None:
    check_paths([_file("a", 1), _file("ab/c", 1), _file("a.b", 1)])
