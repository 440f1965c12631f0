"""The schedule's `variants`, and the duplicates no schedule may have.

One model name may need a different source on different pools: NVFP4 weights on
B300 and DGX Spark, FP8 on A100, which has no FP4 tensor cores. An entry then
gives `variants` in place of `source` and `pools`:

    - name: qwen3-32b
      variants:
        - {pools: [b300-serving, spark-serving], source: s3://models/qwen3-32b/nvfp4/}
        - {pools: [a100-serving], source: s3://models/qwen3-32b/fp8/, variant: fp8}
      windows: [always]

Each variant becomes a model of its own, with the entry's name and every other
field of the entry, so a pool's daemon sees exactly one source per name. A pool
in two variants of one name is refused at its line. `variant` names the variant
in tables and metrics; without it, the last segment of the source's prefix does
(`nvfp4` above), and two variants that would share a name are refused.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Protocol, TypeVar

from yaml.nodes import Node

from modelsync.errors import ScheduleError, SourceNotAllowedError

if TYPE_CHECKING:
    from modelsync.core.refs import ModelRef
    from modelsync.core.schedule import Schedule, ScheduledModel


_T = TypeVar("_T")


class _Reader(Protocol):
    """The schedule's field reader (core/schedule_fields.py), as variants use it."""

    def fail(self, node: Node, path: str, message: str) -> ScheduleError: ...

    def sequence(self, node: Node, path: str) -> list[Node]: ...

    def mapping(
        self, node: Node, path: str, allowed: tuple[str, ...], required: tuple[str, ...]
    ) -> dict[str, Node]: ...

    def optional(
        self, fields: dict[str, Node], key: str, path: str, read: Callable[[Node, str], _T], default: _T
    ) -> _T: ...

    def source(self, node: Node, path: str) -> ModelRef: ...

    def pools(self, node: Node, path: str) -> tuple[str, ...]: ...

    def label_value(self, node: Node, path: str) -> str: ...

__all__ = ["Located", "read_variants", "refuse_duplicates", "variant_for"]

#: a model with where the file says it: the path and node of its source, the node of its name
Located = tuple["ScheduledModel", str, Node, "Node | None"]

_VARIANT_KEYS = ("pools", "source", "variant")


def read_variants(
    reader: _Reader, node: Node, path: str, base: ScheduledModel
) -> list[tuple[ScheduledModel, str, Node]]:
    """The entry `base` once per variant, each with its source, pools, variant name and line."""
    items = reader.sequence(node, path)
    if not items:
        raise reader.fail(node, path, "empty; list at least one {pools, source}")
    found: list[tuple[ScheduledModel, str, Node]] = []
    pool_owner: dict[str, int] = {}
    variant_owner: dict[str, int] = {}
    for index, item in enumerate(items):
        where = f"{path}[{index}]"
        fields = reader.mapping(item, where, _VARIANT_KEYS, required=("pools", "source"))
        source = reader.source(fields["source"], f"{where}.source")
        pools = reader.pools(fields["pools"], f"{where}.pools")
        for pool, pool_node in zip(pools, reader.sequence(fields["pools"], f"{where}.pools"), strict=True):
            first = pool_owner.setdefault(pool, index)
            if first != index:
                raise reader.fail(
                    pool_node,
                    f"{where}.pools",
                    f"pool {pool!r} is already in {path}[{first}] (line {found[first][0].line}); "
                    f"a pool gets one variant of {base.name!r}",
                )
        variant = reader.optional(fields, "variant", f"{where}.variant", reader.label_value, None)
        variant = variant or _last_segment(source)
        first = variant_owner.setdefault(variant, index)
        if first != index:
            raise reader.fail(
                fields.get("variant", item),
                f"{where}.variant",
                f"variant {variant!r} already names {path}[{first}]; give each variant its own variant:",
            )
        model = replace(base, source=source, pools=pools, variant=variant, line=item.start_mark.line + 1)
        found.append((model, f"{where}.source", fields["source"]))
    return found


def refuse_duplicates(reader: _Reader, models: tuple[Located, ...]) -> None:
    """Two entries for one source (or one name) would fight over the same cache entry.

    Variants of one entry share its name (and its name node); another entry may not.
    """
    seen_sources: dict[ModelRef, int] = {}
    seen_names: dict[str, int] = {}
    for index, (model, where, source_node, name_node) in enumerate(models):
        first = seen_sources.setdefault(model.source, index)
        if first != index:
            raise reader.fail(
                source_node,
                where,
                f"duplicate model {model.source.uri}; already listed as {_entry(models[first][1])} "
                f"(line {models[first][0].line})",
            )
        if model.name is None or name_node is None:
            continue
        first = seen_names.setdefault(model.name, index)
        if first != index and models[first][3] is not name_node:
            entry = _entry(where)
            raise reader.fail(
                name_node,
                f"{entry}.name",
                f"duplicate name {model.name!r}; already used by {_entry(models[first][1])} "
                f"(line {models[first][0].line})",
            )


def _entry(source_path: str) -> str:
    """`models[3]` of `models[3].source` or `models[3].variants[1].source`."""
    return source_path.split(".", 1)[0]


def _last_segment(source: ModelRef) -> str:
    return source.prefix.rstrip("/").rsplit("/", 1)[-1]


def variant_for(schedule: Schedule, name: str, pool: str) -> ScheduledModel:
    """The model `name` gives `pool`: its variant for the pool, or the plain entry serving it.

    A name the schedule lacks, or one with nothing for `pool`, is refused as a source the
    daemon does not serve (exit 8), naming what there is.
    """
    named = schedule.named(name)
    if not named:
        names = sorted({m.name for m in schedule.models if m.name is not None})
        raise SourceNotAllowedError(
            f"the node daemon's schedule has no model named {name!r}; its names are "
            f"{', '.join(names) if names else 'none'}"
        )
    for model in named:
        if pool in model.pools:
            return model
    pools = ", ".join(sorted({p for m in named for p in m.pools}))
    raise SourceNotAllowedError(
        f"{name!r} has no variant for this node's pool {pool}; it serves the pools {pools}"
    )
