"""Which sources the node daemon downloads for whoever asks over its socket.

Tenant pods reach the daemon through a read-only cache mount and hold no S3
credentials; the daemon downloads with its own. So the daemon must not be a
way to fetch anything its key can read: it serves the sources in the schedule
(vetted through GitOps) and the prefixes its operator configured, nothing else.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from modelsync.core.refs import ModelRef
from modelsync.core.scope import parse_scope
from modelsync.errors import SourceNotAllowedError, UsageError


def parse_prefix(text: str) -> str:
    """`s3://bucket/` or `s3://bucket/some/prefix/` as `bucket/` or `bucket/some/prefix/`.

    An allowed prefix is a scope (core/scope.py) that must name a bucket: a glob or a
    file key would allow nothing without a word, and `*` would make the daemon fetch
    anything its key can read for anyone who asks.
    """
    if not text.startswith("s3://") or text.strip() in {"s3://", "s3://*"}:
        raise UsageError(f"allowed prefix {text!r} is not an s3:// URI; use s3://bucket/ or s3://bucket/org/")
    return parse_scope(text, "allowed prefix")


@dataclass(frozen=True, slots=True)
class AllowList:
    """Scheduled model ids plus `bucket/prefix/` strings; a prefix matches whole path segments only."""

    scheduled: frozenset[str]
    prefixes: tuple[str, ...]

    def allows(self, ref: ModelRef) -> bool:
        if ref.model_id in self.scheduled:
            return True
        key = ref.model_id + "/"
        return any(key.startswith(prefix) for prefix in self.prefixes)

    def check(self, ref: ModelRef) -> None:
        if not self.allows(ref):
            raise SourceNotAllowedError(
                f"the node daemon does not serve {ref.uri}: it is not in the schedule and not under "
                "an allowed prefix; add it to the schedule or to MODELSYNC_ALLOWED_PREFIXES"
            )


def allow_list(scheduled: Iterable[ModelRef], prefixes: Iterable[str]) -> AllowList:
    return AllowList(frozenset(r.model_id for r in scheduled), tuple(prefixes))
