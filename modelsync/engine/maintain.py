"""Operator maintenance: verify ready models, quarantine damaged ones, repair them, collect garbage.

Nothing here follows a symlink: a link planted inside a model directory is
reported, never read through, and removed only by unlinking the link itself.
Every step works while other processes pull: a model whose lock is held is
left alone and reported as busy.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from modelsync.adapters import access, fs
from modelsync.adapters.cache import Cache, Journal
from modelsync.adapters.cache.damaged import DamagedRecord
from modelsync.adapters.cache.leftovers import Leftover, leftovers, remove_leftover
from modelsync.core.lifecycle import CacheState
from modelsync.core.nesting import Nesting, held_by, nestings
from modelsync.core.parts import layout_bytes, plan_parts
from modelsync.core.record import CompletionRecord
from modelsync.core.refs import ModelRef, parse_model_name
from modelsync.core.signature import DEFAULT_SIGNATURE_NAME, Mode, SignatureRule
from modelsync.engine.catalog import Catalog
from modelsync.engine.evict import try_lock_all
from modelsync.engine.ready import Problem, full_check, quick_check
from modelsync.engine.trust import full_recheck
from modelsync.errors import NotFoundError

__all__ = [
    "Leftover",
    "ModelCheck",
    "VerifyReport",
    "collect_garbage",
    "leftovers",
    "nested_leftovers",
    "prepare_repair",
    "repair_ready",
    "separate_nested",
    "stage_good_files",
    "verify",
    "verify_ready",
]


@dataclass(frozen=True, slots=True)
class ModelCheck:
    model: str
    problems: tuple[Problem, ...]
    #: the model was moved to quarantine by this check
    quarantined: bool = False
    busy: bool = False


@dataclass(slots=True)
class VerifyReport:
    checks: list[ModelCheck] = field(default_factory=list)
    leftovers: list[Leftover] = field(default_factory=list)
    #: the cache could not be written (a read-only mount, a user outside its group): models were
    #: checked, but neither their verification recorded nor a damaged one quarantined
    read_only: bool = False

    @property
    def ok(self) -> bool:
        return all(not c.problems for c in self.checks)


def verify(
    cache: Cache,
    catalog: Catalog,
    model: str | None,
    full: bool,
    signatures: Callable[[ModelRef], SignatureRule] | None = None,
    signature_name: str = DEFAULT_SIGNATURE_NAME,
) -> VerifyReport:
    """Check one model or all ready ones; damaged models are quarantined (no longer served).

    `full` re-hashes every byte and scrubs safetensors headers; with `signatures`
    (the policy for a model) it also re-checks each model's signature.
    """
    report = VerifyReport(read_only=not access.writable(cache.state_dir))
    # nested models first: separating them takes the outer ones out of the ready set
    if report.read_only:
        found, separated = nestings(catalog.ready_refs()), False
    else:
        found, separated = separate_nested(cache, catalog), True
    for nesting in found:
        report.checks.append(ModelCheck(nesting.outer.model_id, (_nested(nesting),), quarantined=separated))
    views = catalog.views()
    if model is not None:
        views = [catalog.require(parse_model_name(model).model_id)]
    for view in views:
        if view.state is not CacheState.READY:
            continue
        ref = parse_model_name(view.model)
        rule = signatures(ref) if signatures is not None and full else SignatureRule("", Mode.OFF)
        report.checks.append(_check_model(cache, catalog, ref, full, rule, signature_name, report.read_only))
    for damaged in catalog.damaged:  # one without files is a leftover, noted below
        if damaged.ref is not None and (model is None or damaged.ref == parse_model_name(model)):
            report.checks.append(_quarantine_damaged(cache, catalog, damaged, report.read_only))
    report.leftovers = leftovers(cache)
    return report


def _quarantine_damaged(
    cache: Cache, catalog: Catalog, damaged: DamagedRecord, read_only: bool
) -> ModelCheck:
    """Report a record that cannot be read; quarantine its model's files under their stand-in record.

    `verify --repair` then fetches every file again (the stand-in vouches for none).
    """
    assert damaged.ref is not None
    problem = Problem("", f"completion record {damaged.path} cannot be read ({damaged.reason})")
    if damaged.stand_in is None or read_only:
        return ModelCheck(damaged.ref.model_id, (problem,))
    lock = cache.lock(damaged.ref)
    if not lock.try_acquire():
        return ModelCheck(damaged.ref.model_id, (), busy=True)
    try:
        _quarantine(cache, catalog, damaged.ref, damaged.stand_in)
    finally:
        lock.release()
    return ModelCheck(damaged.ref.model_id, (problem,), quarantined=True)


def _check_model(
    cache: Cache,
    catalog: Catalog,
    ref: ModelRef,
    full: bool,
    rule: SignatureRule,
    signature_name: str,
    read_only: bool = False,
) -> ModelCheck:
    """Check one ready model under its lock; record the result, or quarantine it when damaged.

    On a cache it cannot write (`read_only`) the check runs without the lock (which it
    cannot create), and only reports.
    """
    lock = cache.lock(ref)
    if not read_only and not lock.try_acquire():
        return ModelCheck(ref.model_id, (), busy=True)
    try:
        record = cache.ready_record(ref)
        if record is None:
            return ModelCheck(ref.model_id, (Problem("", "completion record missing"),))
        root = cache.ready_path(ref)
        problems = (
            full_recheck(ref, root, record, rule, signature_name) if full else quick_check(root, record)
        )
        problems += _strays(root, record)
        if read_only:
            return ModelCheck(ref.model_id, tuple(problems))
        if not problems:
            if full:  # the index follows the record just checked, files and inodes included
                catalog.register(ref, record)
            now = time.time()
            cache.mark_verified(ref, now)
            catalog.index.set_verified(ref.model_id, now)
            return ModelCheck(ref.model_id, ())
        _quarantine(cache, catalog, ref, record)
        return ModelCheck(ref.model_id, tuple(problems), quarantined=True)
    finally:
        lock.release()


def _strays(root: Path, record: CompletionRecord) -> list[Problem]:
    """Symlinks and files the record does not list: planted or left behind, never followed."""
    return [
        Problem(relative, "is a symlink (not followed)" if is_link else "not in the completion record")
        for relative, is_link in fs.unlisted_entries(root, {f.path for f in record.files})
    ]


def _quarantine(cache: Cache, catalog: Catalog, ref: ModelRef, record: CompletionRecord) -> None:
    """Take a model out of the ready set in one rename, data kept for --repair; the caller holds its lock."""
    cache.quarantine(ref, record)
    catalog.register(ref, record, CacheState.QUARANTINED)


def prepare_repair(cache: Cache, catalog: Catalog, model: str, part_size_bytes: int) -> ModelRef:
    """Turn a quarantined model back into a resumable staging area that keeps its good files."""
    ref = parse_model_name(model)
    quarantined = catalog.require(ref.model_id).state is CacheState.QUARANTINED
    if not quarantined or cache.quarantined_record(ref) is None:
        raise NotFoundError(
            f"{ref.model_id!r} is not quarantined; `modelsync verify` quarantines damaged models"
        )
    with cache.locked(ref):
        record = cache.quarantined_record(ref)
        if record is None:
            raise NotFoundError(f"{ref.model_id!r} was repaired or evicted meanwhile")
        bad = {p.path for p in full_check(cache.quarantine_dir / ref.slug, record)}
        stage_good_files(cache, ref, record, bad, part_size_bytes, quarantined=True)
        cache.drop_record(ref, quarantined=True)
        catalog.index.remove([ref.model_id])
    return ref


def stage_good_files(
    cache: Cache,
    ref: ModelRef,
    record: CompletionRecord,
    bad: set[str],
    part_size_bytes: int,
    *,
    quarantined: bool,
) -> None:
    """Move a damaged model's directory to its staging area, so the next pull fetches only `bad`.

    Good files are journaled as verified with their recorded digest and ETag, so
    the pull skips them — if the source still holds the same objects; changed
    objects are fetched whole. The journal is written after the move: a crash in
    between leaves staging without a journal, which a pull starts over. The
    caller holds the model's lock.
    """
    staging = cache.restage(ref, quarantined=quarantined)
    for path in [p.path for p in _strays(staging.dir, record)] + sorted(bad):
        fs.remove_beneath(staging.dir, path)
    with fs.storage_errors(staging.dir):
        journal = Journal(staging.journal.path, ref.uri)
        journal.start(keep=False)
        for f in record.files:
            if f.path in bad or f.etag is None:
                continue
            layout = layout_bytes(plan_parts(f.size_bytes, part_size_bytes))
            journal.begin_file(f.path, f.etag, f.size_bytes, layout)
            journal.file_verified(f.path, f.xxh3_128, record.verified_by, f.size_bytes)
        journal.close()


def repair_ready(
    cache: Cache, ref: ModelRef, record: CompletionRecord, bad: set[str], part_size_bytes: int
) -> None:
    """Move a damaged ready model back into staging, keeping its good files for the next pull.

    The ready path disappears in one rename before the record goes, so the model
    is never served while it is repaired. The caller holds the model's lock.
    """
    stage_good_files(cache, ref, record, bad, part_size_bytes, quarantined=False)
    cache.drop_record(ref, quarantined=False)


def verify_ready(cache: Cache, ref: ModelRef, part_size_bytes: int) -> list[Problem] | None:
    """Re-hash a ready model (`pull --verify`): record the verification, or stage its bad files.

    None when the model is not ready; otherwise its problems, and a damaged model
    is left not ready with its good files staged for the pull that follows.
    The caller holds the model's lock.
    """
    record = cache.ready_record(ref)
    if record is None:
        return None
    root = cache.ready_path(ref)
    problems = full_check(root, record) + _strays(root, record)
    if problems:
        repair_ready(cache, ref, record, {p.path for p in problems}, part_size_bytes)
    else:
        cache.mark_verified(ref, time.time())
    return problems


def collect_garbage(cache: Cache, catalog: Catalog, older_than_s: float) -> list[Leftover]:
    """Remove leftovers older than `older_than_s`, and separate nested models (`separate_nested`);
    stale index rows were already dropped by the catalog."""
    separated = [
        Leftover(cache.ready_path(n.outer), _nested(n).reason) for n in separate_nested(cache, catalog)
    ]
    return separated + [item for item in leftovers(cache, older_than_s) if remove_leftover(item)]


def nested_leftovers(cache: Cache, catalog: Catalog) -> list[Leftover]:
    """What `separate_nested` would do, as `gc --dry-run` shows it."""
    return [Leftover(cache.ready_path(n.outer), _nested(n).reason) for n in nestings(catalog.ready_refs())]


def separate_nested(cache: Cache, catalog: Catalog) -> list[Nesting]:
    """Take each ready model that holds ready models inside it (a cache from before models could
    not nest) out of the ready set, destroying nothing: the models inside stay ready where they
    are, the rest of its files and its record go to quarantine (evict it to free the space).
    A model that is being pulled, or holds one that is, is left for a later run."""
    separated = []
    ready = catalog.ready_refs()
    for outer in sorted({n.outer for n in nestings(ready)}, key=lambda r: (len(r.prefix), r.uri)):
        inside = held_by(outer, ready)
        with contextlib.ExitStack() as locks:
            record = cache.ready_record(outer)
            if record is None or not try_lock_all(cache, (outer, *inside), locks):
                continue
            cache.quarantine_keeping(outer, record, inside)
            catalog.register(outer, record, CacheState.QUARANTINED)
        ready = [r for r in ready if r != outer]
        separated += [Nesting(outer, inner) for inner in inside]
    return separated


def _nested(nesting: Nesting) -> Problem:
    return Problem(
        "",
        f"{nesting.describe()}; kept in quarantine, {nesting.inner.model_id} stays ready "
        f"(evict {nesting.outer.model_id} to free its space)",
    )
