"""Sources parse strictly; ETags are classified for what they can prove."""

from __future__ import annotations

import hashlib
from pathlib import PurePosixPath

import pytest

from modelsync.core.etag import EtagKind, etag_kind, multipart_count, multipart_etag, part_size_fits
from modelsync.core.refs import parse_model_name, parse_source
from modelsync.errors import UsageError


def test_a_source_names_bucket_prefix_ready_path_and_slug() -> None:
    ref = parse_source("s3://models/Qwen/Qwen3-32B/2025-05-01")
    assert (ref.bucket, ref.prefix) == ("models", "Qwen/Qwen3-32B/2025-05-01/")
    assert ref.uri == "s3://models/Qwen/Qwen3-32B/2025-05-01/"
    assert ref.model_id == "models/Qwen/Qwen3-32B/2025-05-01"
    assert ref.cache_path == PurePosixPath("models/Qwen/Qwen3-32B/2025-05-01")
    assert ref.slug.startswith("models--Qwen--Qwen3-32B--2025-05-01-")


def test_slugs_of_distinct_models_differ_even_when_their_readable_parts_collide() -> None:
    a, b = parse_source("s3://models/a-b/c/"), parse_source("s3://models/a/b-c/")
    assert a.slug != b.slug
    assert len(parse_source("s3://models/" + "x/" * 300).slug) < 100


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("models/Qwen/", "not an s3:// URI"),
        ("s3://models/", "whole bucket"),
        ("s3://models", "whole bucket"),
        ("s3://Bad_Bucket/x/", "not a valid bucket name"),
        ("s3://models/../etc/", "unsafe prefix"),
        ("s3://models/a//b/", "unsafe prefix"),
    ],
)
def test_bad_sources_are_usage_errors(text: str, reason: str) -> None:
    with pytest.raises(UsageError, match=reason):
        parse_source(text)


def test_operators_may_name_a_cached_model_without_the_scheme() -> None:
    assert parse_model_name("models/q/1") == parse_source("s3://models/q/1/")


def test_etags_are_classified_by_what_they_prove() -> None:
    assert etag_kind("d41d8cd98f00b204e9800998ecf8427e") is EtagKind.MD5
    assert etag_kind("d41d8cd98f00b204e9800998ecf8427e-12") is EtagKind.MULTIPART
    assert etag_kind("6553f1a4-100000") is EtagKind.OPAQUE  # nginx
    assert multipart_count("d41d8cd98f00b204e9800998ecf8427e-12") == 12


def test_the_multipart_etag_is_the_md5_of_the_part_md5s() -> None:
    parts = [hashlib.md5(b"a" * 5).digest(), hashlib.md5(b"b").digest()]
    assert multipart_etag(parts) == hashlib.md5(parts[0] + parts[1]).hexdigest() + "-2"


@pytest.mark.parametrize(
    ("size", "part", "count", "fits"),
    [(10, 4, 3, True), (12, 4, 3, True), (13, 4, 3, False), (8, 4, 3, False)],
)
def test_a_part_size_fits_only_when_it_yields_the_etag_part_count(
    size: int, part: int, count: int, fits: bool
) -> None:
    assert part_size_fits(size, part, count) is fits
