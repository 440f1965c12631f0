"""Whether a prefix holds a whole published model, before a byte of it is fetched.

`modelsync publish` writes `modelsync.publishing` under the prefix before its
first object and removes it only after the manifest, which is written last. So a
prefix that has the mark and no manifest is a publish in progress, or one that
was cut short: pulling it would make a ready "model" of whatever had arrived.

Manifest policy, per bucket or prefix (the most specific scope wins), like the
signature policy (core/signature.py):

- `required`   a prefix without `modelsync.manifest.json` is refused (exit 5);
- `if-present` a prefix without one is pulled from its listing (the default),
               unless a publish is in progress there, or its shard index names
               a shard the prefix lacks.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from enum import StrEnum
from typing import NamedTuple

from modelsync.core.manifest import MANIFEST_NAME
from modelsync.core.refs import ModelRef
from modelsync.core.scope import parse_scope
from modelsync.core.signature import rule_tables
from modelsync.errors import IncompleteModelError, NestedModelError, UsageError

#: the object `publish` keeps under the prefix while it uploads
PUBLISHING_NAME = "modelsync.publishing"
#: how a shard index's name ends (`model.safetensors.index.json`, and the like)
SHARD_INDEX_SUFFIX = ".safetensors.index.json"


class ManifestMode(StrEnum):
    REQUIRED = "required"
    IF_PRESENT = "if-present"


def parse_manifest_mode(text: str) -> ManifestMode:
    try:
        return ManifestMode(text.strip())
    except ValueError:
        raise UsageError(f"manifest policy {text!r} is not one of required, if-present") from None


class ManifestRule(NamedTuple):
    #: `bucket/prefix/` (or `bucket/`) the rule covers; "" covers everything
    scope: str
    mode: ManifestMode

    def covers(self, ref: ModelRef) -> bool:
        return f"{ref.bucket}/{ref.prefix}".startswith(self.scope)


def resolve_manifest_rule(rules: tuple[ManifestRule, ...], ref: ModelRef) -> ManifestRule:
    """The most specific rule that covers `ref` (the first of equals); if-present when none does."""
    matching = [r for r in rules if r.covers(ref)]
    return max(matching, key=lambda r: len(r.scope), default=ManifestRule("", ManifestMode.IF_PRESENT))


def parse_manifest_rules(text: str) -> tuple[ManifestRule, ...]:
    """Rules from JSON (the environment, or the config file's `[[manifest_rules]]` tables)."""
    tables = rule_tables(text, "manifest")
    return tuple(_rule_from(raw, f"manifest_rules[{i}]") for i, raw in enumerate(tables))


def _rule_from(raw: object, where: str) -> ManifestRule:
    if not isinstance(raw, Mapping):
        raise UsageError(f"{where}: expected a table with scope and mode")
    unknown = set(raw) - {"scope", "mode"}
    if unknown:
        raise UsageError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    scope, mode = raw.get("scope"), raw.get("mode")
    if not isinstance(scope, str) or not isinstance(mode, str):
        raise UsageError(f"{where}: scope and mode are required strings")
    return ManifestRule(parse_scope(scope, "manifest scope"), parse_manifest_mode(mode))


def check_unmanifested(ref: ModelRef, keys: Collection[str], mode: ManifestMode) -> None:
    """A prefix with no manifest may be pulled from its listing (`keys`) only when no publish is
    under way there, it holds no published model below it (the revisions of a model, say), and
    the policy does not require a manifest."""
    if ref.prefix + PUBLISHING_NAME in keys:
        raise IncompleteModelError(
            f"{ref.uri} is not a whole model: a publish to it is in progress or was interrupted "
            f"({PUBLISHING_NAME} is there, {MANIFEST_NAME} is not); let the publish finish, or run it again"
        )
    inner = sorted(
        key.removesuffix(name)
        for key in keys
        for name in (MANIFEST_NAME, PUBLISHING_NAME)
        if key.endswith("/" + name) and key != ref.prefix + name
    )
    if inner:
        raise NestedModelError(
            f"{ref.uri} holds the published model s3://{ref.bucket}/{inner[0]}; a model cannot hold "
            "another: pull each revision's own prefix"
        )
    if mode is ManifestMode.REQUIRED:
        raise IncompleteModelError(
            f"{ref.uri} has no {MANIFEST_NAME}, which the manifest policy requires for it; "
            "publish it with `modelsync publish`"
        )


def shard_indexes(paths: Collection[str]) -> list[str]:
    """The shard indexes among a model's paths."""
    return sorted(p for p in paths if p.endswith(SHARD_INDEX_SUFFIX))


def check_shards_listed(
    ref: ModelRef, index_path: str, shards: Mapping[str, str], paths: Collection[str]
) -> None:
    """Every shard the index at `index_path` names (tensor -> shard path) is in the listing."""
    missing = sorted({shard for shard in shards.values() if shard not in paths})
    if missing:
        raise IncompleteModelError(
            f"{ref.uri} is not a whole model: {index_path} names {missing[0]}, which the prefix lacks"
            f"{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''}; it has no {MANIFEST_NAME} "
            "to vouch for it: publish it again with `modelsync publish`"
        )
