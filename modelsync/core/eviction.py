"""Which cached models to evict, decided as a pure plan before anything is deleted.

Eviction is *plan, then execute*: these functions only choose. The engine
takes what a plan names out of the ready set and deletes it, `--dry-run` prints
`describe()`, and tests compare plans without a disk. Nothing here reads the
clock; `now` is a parameter.

The contract is least-recently-used order, not the smallest set of victims:
operators can predict LRU, and a greedy walk in that order is O(n log n) on a
cache of any size. Quarantined entries go first, since they are no longer served.

An entry is *protected* (never chosen to make room) when it is

- pinned: the operator asked to keep it;
- pulling: its staging belongs to a running pull, and it has no ready path to remove;
- leased: a running consumer declared it in use until `in_use_until`;
- in use: pulled or touched less than `grace_s` ago, so a consumer that is about
  to open it is not surprised (the daemon's default grace is 10 minutes);
- protected by the caller, typically because the schedule wants it soon.

Files shared across revisions are hard links, so bytes are counted per physical
file (`Blob`, keyed by device and inode): a blob frees its size only when the
last entry holding it is evicted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from types import MappingProxyType
from typing import NamedTuple

from modelsync.core.lifecycle import CacheState
from modelsync.core.units import format_bytes, format_duration
from modelsync.errors import NotFoundError, UsageError

_NOTHING_PROTECTED: Mapping[str, str] = MappingProxyType({})
#: how many protected models a one-line summary names before saying "and N more"
_SUMMARY_NAMES = 5


class Blob(NamedTuple):
    """One physical file: `key` is (device, inode), shared by every hard link to it.

    For a PULLING entry the caller may also describe reserved, not yet written
    space as blobs with keys of its own choosing, so concurrent pulls see it as used.
    """

    key: tuple[int, int]
    size_bytes: int


class CacheEntry(NamedTuple):
    """What eviction needs to know about one cached model (an index row)."""

    model: str
    #: epoch seconds of the last pull or touch
    last_used_at: float
    pinned: bool = False
    state: CacheState = CacheState.READY
    #: epoch seconds until which a running consumer holds a lease; None when none does
    in_use_until: float | None = None
    blobs: frozenset[Blob] = frozenset()

    @property
    def size_bytes(self) -> int:
        """The model's own bytes, counting files it shares with other entries in full."""
        return sum(blob.size_bytes for blob in self.blobs)


class Protection(NamedTuple):
    """Why a model was not eligible, so "it can never fit" can say what is in the way."""

    model: str
    reason: str


class EvictionPlan(NamedTuple):
    """Models to evict, in order, and what that achieves.

    `satisfied` is always `freed_bytes >= needed_bytes`. When it is False,
    `victims` is what the plan *would* evict; callers usually refuse to act on it.
    """

    victims: tuple[str, ...]
    freed_bytes: int
    needed_bytes: int
    satisfied: bool
    protected: tuple[Protection, ...] = ()

    def describe(self) -> list[str]:
        """Human lines for `--dry-run`: a one-line summary first, then each model.

        The summary alone is the message of a "can never fit" error: it names the
        bytes still missing and what is pinned or protected.
        """
        lines = [self._summary()]
        lines += [f"  evict {model}" for model in self.victims]
        lines += [f"  keep {p.model}: {p.reason}" for p in self.protected]
        return lines

    def _summary(self) -> str:
        freed = format_bytes(self.freed_bytes)
        if not self.satisfied:
            blockers = [f"{p.model} ({p.reason})" for p in self.protected[:_SUMMARY_NAMES]]
            if len(self.protected) > _SUMMARY_NAMES:
                blockers.append(f"and {len(self.protected) - _SUMMARY_NAMES} more")
            in_the_way = "; protected: " + ", ".join(blockers) if blockers else ""
            return (
                f"cannot free {format_bytes(self.needed_bytes)}: evicting every eligible "
                f"model frees only {freed}{in_the_way}"
            )
        if not self.victims:
            return "nothing to evict"
        count = f"{len(self.victims)} model{'s' if len(self.victims) != 1 else ''}"
        needed = f" (needed {format_bytes(self.needed_bytes)})" if self.needed_bytes else ""
        return f"evict {count}, freeing {freed}{needed}"


class BudgetUse(NamedTuple):
    """Where the cache stands against its budget, as `ls`, `plan`, the daemon and eviction all see it."""

    #: bytes on disk: each physical file once, plus space claimed by running pulls
    used_bytes: int
    #: bytes about to arrive (a pull, the plan's fetches)
    incoming_bytes: int
    #: None when no budget is set (only the disk's free space limits)
    budget_bytes: int | None

    @property
    def over_bytes(self) -> int:
        """Bytes that must go for used + incoming to fit the budget; 0 when they fit or without one."""
        if self.budget_bytes is None:
            return 0
        return max(0, self.used_bytes + self.incoming_bytes - self.budget_bytes)


def budget_use(entries: Iterable[CacheEntry], budget_bytes: int | None, incoming_bytes: int = 0) -> BudgetUse:
    """The one budget arithmetic: hard-linked files count once, however many models hold them.

    Every figure shown or acted on (ls totals, plan, daemon log and metrics,
    eviction under a budget) comes from here, so they cannot disagree.
    """
    if incoming_bytes < 0 or (budget_bytes is not None and budget_bytes < 0):
        raise ValueError("budget_bytes and incoming_bytes must not be negative")
    return BudgetUse(unique_bytes(entries), incoming_bytes, budget_bytes)


def unique_bytes(entries: Iterable[CacheEntry]) -> int:
    """Bytes on disk, counting each physical file once however many entries link it."""
    return _Ledger(tuple(entries)).total_bytes


def plan_eviction(
    entries: Iterable[CacheEntry],
    needed_bytes: int,
    now: float,
    grace_s: float,
    protected: Mapping[str, str] = _NOTHING_PROTECTED,
) -> EvictionPlan:
    """Free at least `needed_bytes`, taking eligible entries in eviction order.

    Stops at the first victim that makes it enough. `protected` maps a model to
    the reason it must stay (for example the schedule wanting it soon).
    """
    if needed_bytes < 0:
        raise ValueError(f"needed_bytes must not be negative, got {needed_bytes}")
    return _plan_greedy(tuple(entries), needed_bytes, needed_bytes, now, grace_s, protected)


def plan_to_size(
    entries: Iterable[CacheEntry],
    target_bytes: int,
    now: float,
    grace_s: float,
    protected: Mapping[str, str] = _NOTHING_PROTECTED,
) -> EvictionPlan:
    """Evict until the unique bytes on disk are at most `target_bytes` (`evict --to-size`)."""
    if target_bytes < 0:
        raise ValueError(f"target_bytes must not be negative, got {target_bytes}")
    cached = tuple(entries)
    needed = budget_use(cached, target_bytes).over_bytes
    return _plan_greedy(cached, needed, needed, now, grace_s, protected)


def plan_watermarks(
    entries: Iterable[CacheEntry],
    budget_bytes: int,
    high_ratio: float,
    low_ratio: float,
    incoming_bytes: int,
    now: float,
    grace_s: float,
    protected: Mapping[str, str] = _NOTHING_PROTECTED,
) -> EvictionPlan:
    """Keep the cache under its budget with hysteresis, making room for `incoming_bytes`.

    Nothing happens until used + incoming exceeds the high watermark; then
    eviction aims for the low watermark, so the next pulls do not each trigger
    another eviction. The watermark is only an aim: `needed_bytes` is what must
    go for the incoming bytes to fit within the whole budget, and `satisfied`
    means they fit. Otherwise pinned models sitting above the low watermark
    would make every pull that crosses the high one fail.
    """
    if not 0 <= low_ratio <= high_ratio <= 1:
        raise ValueError(f"need 0 <= low <= high <= 1, got low={low_ratio}, high={high_ratio}")
    cached = tuple(entries)
    use = budget_use(cached, budget_bytes, incoming_bytes)
    after_pull = use.used_bytes + incoming_bytes
    over_high = after_pull > high_ratio * budget_bytes
    aim = after_pull - int(low_ratio * budget_bytes) if over_high else 0
    return _plan_greedy(cached, max(0, aim), use.over_bytes, now, grace_s, protected)


def plan_unused(
    entries: Iterable[CacheEntry],
    unused_for_s: float,
    now: float,
    grace_s: float,
    protected: Mapping[str, str] = _NOTHING_PROTECTED,
) -> EvictionPlan:
    """Every eligible entry not used for at least `unused_for_s` (`evict --unused-for`)."""
    cached = tuple(entries)
    eligible, _, protections = _partition(cached, now, grace_s, protected)
    victims = [e for e in eligible if now - e.last_used_at >= unused_for_s]
    ledger = _Ledger(cached)
    freed = sum(ledger.remove(e) for e in victims)
    return EvictionPlan(
        victims=tuple(e.model for e in victims),
        freed_bytes=freed,
        needed_bytes=0,
        satisfied=True,
        protected=protections,
    )


def plan_named(entries: Iterable[CacheEntry], models: Iterable[str], force: bool) -> EvictionPlan:
    """Evict exactly the models an operator named, in the order named.

    An explicit request overrides recency and leases, and `force` overrides a
    pin. A pull in progress is refused even with `force`: its files are still
    being written by another process and it has no ready path to remove.
    """
    cached = tuple(entries)
    by_model = {e.model: e for e in cached}
    victims: list[CacheEntry] = []
    for model in dict.fromkeys(models):
        entry = by_model.get(model)
        if entry is None:
            raise NotFoundError(f"no cached model {model!r}; run `modelsync ls`")
        if entry.state is CacheState.PULLING:
            raise UsageError(
                f"cannot evict {model!r} while it is being pulled (its files are still "
                "being written); retry when the pull has finished or been stopped"
            )
        if entry.pinned and not force:
            raise UsageError(f"{model!r} is pinned; run `modelsync unpin {model}` first, or pass --force")
        victims.append(entry)
    ledger = _Ledger(cached)
    freed = sum(ledger.remove(e) for e in victims)
    return EvictionPlan(
        victims=tuple(e.model for e in victims),
        freed_bytes=freed,
        needed_bytes=0,
        satisfied=True,
    )


class _Ledger:
    """How many entries hold each blob, so a removal frees only blobs it held last."""

    __slots__ = ("_holders", "_sizes")

    def __init__(self, entries: tuple[CacheEntry, ...]) -> None:
        self._holders: dict[tuple[int, int], int] = {}
        self._sizes: dict[tuple[int, int], int] = {}
        models: set[str] = set()
        for entry in entries:
            if entry.model in models:
                raise ValueError(f"model {entry.model!r} appears twice in the cache entries")
            models.add(entry.model)
            for blob in entry.blobs:
                known = self._sizes.setdefault(blob.key, blob.size_bytes)
                if known != blob.size_bytes:
                    raise ValueError(f"blob {blob.key} has two sizes: {known} and {blob.size_bytes}")
                self._holders[blob.key] = self._holders.get(blob.key, 0) + 1

    @property
    def total_bytes(self) -> int:
        return sum(self._sizes.values())

    def remove(self, entry: CacheEntry) -> int:
        """Forget `entry` and return the bytes of the blobs no other entry still holds."""
        freed = 0
        for blob in entry.blobs:
            self._holders[blob.key] -= 1
            if self._holders[blob.key] == 0:
                freed += blob.size_bytes
        return freed


def _plan_greedy(
    cached: tuple[CacheEntry, ...],
    aim_bytes: int,
    needed_bytes: int,
    now: float,
    grace_s: float,
    protected: Mapping[str, str],
) -> EvictionPlan:
    """Walk eligible entries in eviction order until `aim_bytes` are freed.

    An entry whose every blob is also held by a protected entry is passed over:
    evicting it could never free a byte, only lose a usable model.
    """
    eligible, kept, protections = _partition(cached, now, grace_s, protected)
    kept_blobs = {blob.key for entry in kept for blob in entry.blobs}
    ledger = _Ledger(cached)
    victims: list[str] = []
    freed = 0
    for entry in eligible:
        if freed >= aim_bytes:
            break
        if all(blob.key in kept_blobs for blob in entry.blobs):
            continue
        victims.append(entry.model)
        freed += ledger.remove(entry)
    return EvictionPlan(
        victims=tuple(victims),
        freed_bytes=freed,
        needed_bytes=needed_bytes,
        satisfied=freed >= needed_bytes,
        protected=protections,
    )


def _partition(
    cached: tuple[CacheEntry, ...], now: float, grace_s: float, protected: Mapping[str, str]
) -> tuple[list[CacheEntry], list[CacheEntry], tuple[Protection, ...]]:
    """Split entries into the eligible (in eviction order), the kept, and why each is kept."""
    eligible: list[CacheEntry] = []
    kept: list[CacheEntry] = []
    protections: list[Protection] = []
    for entry in cached:
        reason = _protection_reason(entry, now, grace_s, protected)
        if reason is None:
            eligible.append(entry)
        else:
            kept.append(entry)
            protections.append(Protection(entry.model, reason))
    eligible.sort(key=_eviction_order)
    protections.sort(key=lambda p: p.model)
    return eligible, kept, tuple(protections)


def _eviction_order(entry: CacheEntry) -> tuple[bool, float, str]:
    """Quarantined first, then least recently used; the name breaks ties so plans repeat."""
    return (entry.state is not CacheState.QUARANTINED, entry.last_used_at, entry.model)


def _protection_reason(
    entry: CacheEntry, now: float, grace_s: float, protected: Mapping[str, str]
) -> str | None:
    """The first reason `entry` must stay, strongest first, or None if it may go."""
    if entry.pinned:
        return "pinned"
    if entry.state is CacheState.PULLING:
        return "pulling"
    if entry.in_use_until is not None and entry.in_use_until > now:
        until = datetime.fromtimestamp(entry.in_use_until, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return f"leased by a consumer until {until}"
    idle_s = now - entry.last_used_at
    if idle_s < grace_s:
        return f"in use: used {format_duration(max(0.0, idle_s))} ago, grace {format_duration(grace_s)}"
    return protected.get(entry.model)


def evictable_at(entry: CacheEntry, grace_s: float) -> float | None:
    """When making room may first take `entry`: its lease's end or its in-use grace's, whichever is
    later; None while nothing but an operator (pinned) or the end of its pull can free it."""
    if entry.pinned or entry.state is CacheState.PULLING:
        return None
    return max(entry.in_use_until or 0.0, entry.last_used_at + grace_s)
