"""The pure rules behind "never half a model, never one inside another", as tables.

What a prefix without a manifest must show before it is pulled
(core/completeness.py), the manifest policy's scopes, where one model's prefix
holds another's (core/nesting.py), when a model becomes evictable, and how two
holders' leases combine on a real cache directory.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from modelsync.adapters.cache import Cache
from modelsync.config import load_settings
from modelsync.core.completeness import (
    PUBLISHING_NAME,
    ManifestMode,
    ManifestRule,
    check_shards_listed,
    check_unmanifested,
    parse_manifest_rules,
    resolve_manifest_rule,
)
from modelsync.core.eviction import CacheEntry, evictable_at
from modelsync.core.lifecycle import CacheState
from modelsync.core.nesting import check_not_nested, held_by, holds, nestings
from modelsync.core.refs import parse_source
from modelsync.engine.rules import pull_rules
from modelsync.errors import ConfigError, IncompleteModelError, NestedModelError, UsageError

REF = parse_source("s3://models/org/m/v1/")


def test_a_listing_with_the_publish_mark_is_refused_whatever_the_policy() -> None:
    for mode in ManifestMode:
        with pytest.raises(IncompleteModelError, match="in progress or was interrupted"):
            check_unmanifested(REF, {"org/m/v1/config.json", "org/m/v1/" + PUBLISHING_NAME}, mode)


def test_a_listing_without_the_mark_is_refused_only_where_a_manifest_is_required() -> None:
    check_unmanifested(REF, {"org/m/v1/config.json"}, ManifestMode.IF_PRESENT)
    with pytest.raises(IncompleteModelError, match="manifest policy requires"):
        check_unmanifested(REF, {"org/m/v1/config.json"}, ManifestMode.REQUIRED)


def test_a_shard_index_must_name_only_listed_shards_and_says_how_many_are_missing() -> None:
    shards = {"a": "s1.safetensors", "b": "s2.safetensors", "c": "s3.safetensors"}
    check_shards_listed(REF, "i.json", shards, {"s1.safetensors", "s2.safetensors", "s3.safetensors"})
    lacks = r"names s2.safetensors, which the prefix lacks \(and 1 more\)"
    with pytest.raises(IncompleteModelError, match=lacks):
        check_shards_listed(REF, "i.json", shards, {"s1.safetensors"})


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("s3://models/org/m/v1/", ManifestMode.REQUIRED),  # the most specific scope wins
        ("s3://models/org/m2/v1/", ManifestMode.IF_PRESENT),  # a scope matches whole segments
        ("s3://models/other/m/", ManifestMode.IF_PRESENT),
        ("s3://models/org/x/", ManifestMode.REQUIRED),
    ],
)
def test_the_manifest_policy_of_a_source_is_its_most_specific_scope(
    source: str, expected: ManifestMode
) -> None:
    rules = parse_manifest_rules(
        '[{"scope": "s3://models/org/", "mode": "required"},'
        ' {"scope": "s3://models/org/m2", "mode": "if-present"}]'
    )
    assert resolve_manifest_rule(rules, parse_source(source)).mode is expected


def test_a_rule_for_every_scope_overrides_the_global_manifest_setting_whose_default_is_if_present() -> None:
    everywhere = load_settings({}, {"MODELSYNC_MANIFEST_RULES": '[{"scope": "*", "mode": "required"}]'})
    assert pull_rules(everywhere, REF).manifest.mode is ManifestMode.REQUIRED
    assert pull_rules(load_settings({}, {}), REF).manifest.mode is ManifestMode.IF_PRESENT
    required = load_settings({}, {"MODELSYNC_MANIFEST": "required"})
    assert pull_rules(required, REF).manifest.mode is ManifestMode.REQUIRED
    assert resolve_manifest_rule((), REF) == ManifestRule("", ManifestMode.IF_PRESENT)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{}", "a list of tables"),
        ('[{"scope": "s3://models/"}]', "scope and mode are required"),
        ('[{"scope": "s3://models/", "mode": "always"}]', "not one of required, if-present"),
        ('[{"scope": "s3://models/", "mode": "required", "keys": []}]', "unknown key"),
        ('[{"scope": "s3://", "mode": "required"}]', "manifest scope"),
        ("[", "not JSON"),
    ],
)
def test_bad_manifest_rules_are_refused_with_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        parse_manifest_rules(text)
    with pytest.raises(ConfigError, match="MODELSYNC_MANIFEST_RULES"):
        load_settings({}, {"MODELSYNC_MANIFEST_RULES": text})


@pytest.mark.parametrize(
    ("outer", "inner", "expected"),
    [
        ("s3://models/org/m/", "s3://models/org/m/v1/", True),
        ("s3://models/org/", "s3://models/org/m/v1/", True),
        ("s3://models/org/m/", "s3://models/org/m2/v1/", False),  # shares characters, not a segment
        ("s3://models/org/m/v1/", "s3://models/org/m/v1/", False),  # the same model
        ("s3://models/org/m/v1/", "s3://models/org/m/", False),
        ("s3://models/org/m/", "s3://other/org/m/v1/", False),
    ],
)
def test_a_model_holds_another_only_on_whole_segments_in_the_same_bucket(
    outer: str, inner: str, expected: bool
) -> None:
    assert holds(parse_source(outer), parse_source(inner)) is expected


def test_a_new_model_may_neither_hold_nor_lie_in_a_ready_one() -> None:
    ready = [parse_source("s3://models/org/m/v1/"), parse_source("s3://models/org/n/v1/")]
    check_not_nested(parse_source("s3://models/org/m/v2/"), ready)
    check_not_nested(parse_source("s3://models/org/m/v1/"), ready)  # itself: a refresh or a repair
    with pytest.raises(NestedModelError, match="s3://models/org/ contains the ready model s3://models/org/m/v1/"):
        check_not_nested(parse_source("s3://models/org/"), ready)
    with pytest.raises(NestedModelError, match="lies inside the ready model s3://models/org/n/v1/"):
        check_not_nested(parse_source("s3://models/org/n/v1/tokenizer/"), ready)


def test_nestings_pair_every_outer_model_with_those_inside_and_held_by_keeps_the_outermost() -> None:
    refs = [parse_source(f"s3://models/{p}") for p in ("a/", "a/b/", "a/b/c/", "z/")]
    pairs = [(n.outer.prefix, n.inner.prefix) for n in nestings(refs)]
    assert pairs == [("a/", "a/b/"), ("a/", "a/b/c/"), ("a/b/", "a/b/c/")]
    assert [r.prefix for r in held_by(refs[0], refs)] == ["a/b/"]


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        (CacheEntry("m", last_used_at=100.0), 700.0),  # the in-use grace
        (CacheEntry("m", last_used_at=100.0, in_use_until=5000.0), 5000.0),  # the lease runs longer
        (CacheEntry("m", last_used_at=100.0, in_use_until=200.0), 700.0),  # the grace runs longer
        (CacheEntry("m", last_used_at=100.0, pinned=True), None),
        (CacheEntry("m", last_used_at=0.0, state=CacheState.PULLING), None),
    ],
)
def test_a_model_becomes_evictable_when_its_lease_and_its_grace_have_both_ended(
    entry: CacheEntry, expected: float | None
) -> None:
    assert evictable_at(entry, grace_s=600.0) == expected


def test_leases_combine_so_a_shorter_one_never_cuts_a_longer_one(tmp_path: Path) -> None:
    cache = Cache(tmp_path)
    cache.ensure()
    now = time.time()
    cache.lease(REF, now + 8 * 3600)
    cache.lease(REF, now + 60)
    assert cache.lease_until(REF) == pytest.approx(now + 8 * 3600)
    cache.lease(REF, now + 9 * 3600)
    assert cache.lease_until(REF) == pytest.approx(now + 9 * 3600)


def test_a_listing_that_holds_a_published_model_below_the_prefix_is_refused_naming_it() -> None:
    parent = parse_source("s3://models/org/m/")
    for mark in ("modelsync.manifest.json", PUBLISHING_NAME):
        with pytest.raises(NestedModelError, match="holds the published model s3://models/org/m/v2/"):
            keys = {"org/m/README.md", f"org/m/v2/{mark}", "org/m/v2/w.bin"}
            check_unmanifested(parent, keys, ManifestMode.IF_PRESENT)
