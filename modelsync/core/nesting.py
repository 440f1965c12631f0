"""No model inside another: a model's ready directory must not hold, or lie in, another's.

Ready paths mirror `bucket/prefix`, so a pull of `s3://models/org/m/` while
`s3://models/org/m/v1/` is ready would swap the child's directory out with the
parent's (and delete it), and evicting the parent would delete the child with
it. Prefixes nest by whole path segments: `org/m/` holds `org/m/v1/`, not `org/m2/`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from modelsync.core.refs import ModelRef
from modelsync.errors import NestedModelError


def holds(outer: ModelRef, inner: ModelRef) -> bool:
    """Whether `inner`'s ready directory lies strictly inside `outer`'s."""
    same_bucket = outer.bucket == inner.bucket
    return same_bucket and outer.prefix != inner.prefix and inner.prefix.startswith(outer.prefix)


class Nesting(NamedTuple):
    """A ready model inside another ready model (a cache from before this rule)."""

    outer: ModelRef
    inner: ModelRef

    def describe(self) -> str:
        return f"{self.outer.uri} holds the ready model {self.inner.uri} inside it"


def check_not_nested(ref: ModelRef, ready: Iterable[ModelRef]) -> None:
    """Refuse to make `ref` ready where it would hold a ready model, or lie inside one."""
    for other in sorted(ready, key=lambda r: r.uri):
        if holds(ref, other):
            raise NestedModelError(
                f"{ref.uri} contains the ready model {other.uri}; a model cannot hold another: "
                f"pull each revision's own prefix, or evict {other.model_id} first"
            )
        if holds(other, ref):
            raise NestedModelError(
                f"{ref.uri} lies inside the ready model {other.uri}; a model cannot hold another: "
                f"evict {other.model_id} first, or publish the revisions under their own prefixes"
            )


def nestings(ready: Iterable[ModelRef]) -> list[Nesting]:
    """Every pair of ready models where one lies inside the other, outermost first."""
    refs = sorted(ready, key=lambda r: (r.bucket, r.prefix))
    return [Nesting(outer, inner) for outer in refs for inner in refs if holds(outer, inner)]


def held_by(outer: ModelRef, ready: Iterable[ModelRef]) -> list[ModelRef]:
    """The outermost ready models inside `outer` (those inside them come along when they move)."""
    inside = [r for r in ready if holds(outer, r)]
    return sorted((r for r in inside if not any(holds(o, r) for o in inside)), key=lambda r: r.uri)
