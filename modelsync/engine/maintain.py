"""Operator maintenance: verify ready models, quarantine damaged ones, repair them, collect garbage.

Nothing here follows a symlink: a link planted inside a model directory is
reported, never read through, and removed only by unlinking the link itself.
Every step works while other processes pull: a model whose lock is held is
left alone and reported as busy.
"""

from __future__ import annotations

import contextlib
import enum
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from modelsync.adapters import fs
from modelsync.adapters.cache import Cache, Journal
from modelsync.adapters.foreground import remove_if_stale, stale_markers
from modelsync.core.lifecycle import CacheState
from modelsync.core.parts import layout_bytes, plan_parts
from modelsync.core.record import CompletionRecord, parse_record, render_record
from modelsync.core.refs import ModelRef, parse_model_name
from modelsync.core.signature import DEFAULT_SIGNATURE_NAME, Mode, SignatureRule
from modelsync.engine.catalog import Catalog
from modelsync.engine.ready import Problem, full_check, quick_check
from modelsync.engine.trust import full_recheck
from modelsync.errors import ModelsyncError, NotFoundError


@dataclass(frozen=True, slots=True)
class ModelCheck:
    model: str
    problems: tuple[Problem, ...]
    #: the model was moved to quarantine by this check
    quarantined: bool = False
    busy: bool = False


class Removal(enum.Enum):
    """How `gc` removes a leftover safely."""

    #: a file, or a tree that no process uses any more
    DELETE = "delete"
    #: an empty directory of the model tree: only while still empty (a `make_ready` may fill it)
    RMDIR = "rmdir"
    #: a foreground marker: only under its lock (a pull may announce itself again)
    UNLOCKED = "unlocked"


@dataclass(frozen=True, slots=True)
class Leftover:
    path: Path
    reason: str
    how: Removal = Removal.DELETE


@dataclass(slots=True)
class VerifyReport:
    checks: list[ModelCheck] = field(default_factory=list)
    leftovers: list[Leftover] = field(default_factory=list)

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
    views = catalog.views()
    if model is not None:
        views = [catalog.require(parse_model_name(model).model_id)]
    report = VerifyReport()
    for view in views:
        if view.state is not CacheState.READY:
            continue
        ref = parse_model_name(view.model)
        rule = signatures(ref) if signatures is not None and full else SignatureRule("", Mode.OFF)
        report.checks.append(_check_model(cache, catalog, ref, full, rule, signature_name))
    report.leftovers = leftovers(cache)
    return report


def _check_model(
    cache: Cache,
    catalog: Catalog,
    ref: ModelRef,
    full: bool,
    rule: SignatureRule,
    signature_name: str,
) -> ModelCheck:
    lock = cache.lock(ref)
    if not lock.try_acquire():
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
        if not problems:
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
    expected = {f.path for f in record.files}
    problems = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            relative = path.relative_to(root).as_posix()
            mode = os.lstat(path).st_mode
            if stat.S_ISLNK(mode):
                problems.append(Problem(relative, "is a symlink (not followed)"))
            elif not stat.S_ISDIR(mode) and relative not in expected:
                problems.append(Problem(relative, "not in the completion record"))
    return problems


def _quarantine(cache: Cache, catalog: Catalog, ref: ModelRef, record: CompletionRecord) -> None:
    """Take a model out of the ready set in one rename, data kept for --repair; the caller holds its lock."""
    target = cache.quarantine_dir / ref.slug
    fs.remove_tree(target)
    with fs.storage_errors(target):
        fs.write_atomic(cache.quarantine_dir / f"{ref.slug}.json", render_record(record))
        os.rename(cache.ready_path(ref), target)
        cache.record_path(ref).unlink(missing_ok=True)
    cache.prune_parents(ref)
    catalog.register(ref, record, CacheState.QUARANTINED)


def prepare_repair(cache: Cache, catalog: Catalog, model: str, part_size_bytes: int) -> ModelRef:
    """Turn a quarantined model back into a resumable staging area that keeps its good files."""
    ref = parse_model_name(model)
    record_path = cache.quarantine_dir / f"{ref.slug}.json"
    if catalog.require(ref.model_id).state is not CacheState.QUARANTINED or not record_path.exists():
        raise NotFoundError(
            f"{ref.model_id!r} is not quarantined; `modelsync verify` quarantines damaged models"
        )
    with cache.locked(ref):
        record = parse_record(record_path.read_bytes(), str(record_path))
        data = cache.quarantine_dir / ref.slug
        bad = {p.path for p in full_check(data, record)}
        stage_good_files(cache, ref, data, record, bad, part_size_bytes)
        with fs.storage_errors(record_path):
            record_path.unlink()
        catalog.index.remove([ref.model_id])
    return ref


def stage_good_files(
    cache: Cache, ref: ModelRef, data: Path, record: CompletionRecord, bad: set[str], part_size_bytes: int
) -> None:
    """Move a damaged model's directory to its staging area, so the next pull fetches only `bad`.

    Good files are journaled as verified with their recorded digest and ETag, so
    the pull skips them — if the source still holds the same objects; changed
    objects are fetched whole. The journal is written after the move: a crash in
    between leaves staging without a journal, which a pull starts over. The
    caller holds the model's lock.
    """
    staging = cache.staging(ref)
    fs.remove_tree(staging.dir)
    with fs.storage_errors(staging.dir):
        os.rename(data, staging.dir)
        for problem in _strays(staging.dir, record):
            _unlink_quietly(staging.dir / problem.path)
        for path in bad:
            _unlink_quietly(staging.dir / path)
        journal = Journal(staging.journal.path, ref.uri)
        journal.start(keep=False)
        for f in record.files:
            if f.path in bad or f.etag is None:
                continue
            layout = layout_bytes(plan_parts(f.size_bytes, part_size_bytes))
            journal.begin_file(f.path, f.etag, f.size_bytes, layout)
            journal.file_verified(f.path, f.xxh3_128, record.verified_by)
        journal.close()


def repair_ready(
    cache: Cache, ref: ModelRef, record: CompletionRecord, bad: set[str], part_size_bytes: int
) -> None:
    """Move a damaged ready model back into staging, keeping its good files for the next pull.

    The ready path disappears in one rename before the record goes, so the model
    is never served while it is repaired. The caller holds the model's lock.
    """
    stage_good_files(cache, ref, cache.ready_path(ref), record, bad, part_size_bytes)
    with fs.storage_errors(cache.record_path(ref)):
        cache.record_path(ref).unlink(missing_ok=True)


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


def _unlink_quietly(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError, IsADirectoryError):
        os.unlink(path)
    if path.is_dir() and not path.is_symlink():
        fs.remove_tree(path)


def leftovers(cache: Cache, older_than_s: float = 0.0) -> list[Leftover]:
    """Crash debris: staging, journals, orphan locks and markers, trash, empty directories."""
    now = time.time()
    found = []
    staging_names = _names(cache.staging_dir)
    for name in staging_names:
        path = cache.staging_dir / name
        slug = name.removesuffix(".journal")
        if cache.lock_is_held(slug) or now - _mtime(path) < older_than_s:
            continue
        if name.endswith(".journal"):
            reason = "journal of an interrupted pull" if slug in staging_names else "journal without data"
        else:
            reason = "interrupted pull" if f"{slug}.journal" in staging_names else "staging without a journal"
        found.append(Leftover(path, reason))
    live = {p.stem for p in cache.records_dir.glob("*.json")} | {
        n.removesuffix(".journal") for n in staging_names
    }
    for name in _names(cache.locks_dir):
        slug = name.removesuffix(".lock").removesuffix(".holder")
        if slug in live or slug == "space" or cache.lock_is_held(slug):
            continue
        if now - _mtime(cache.locks_dir / name) >= older_than_s:
            found.append(Leftover(cache.locks_dir / name, "orphan lock"))
    # A young trash entry may be one an evict is deleting right now: it too waits out the age,
    # counted from its move to trash (the rename sets ctime; mtime is the model's own).
    found += [
        Leftover(cache.trash_dir / n, "unfinished delete")
        for n in _names(cache.trash_dir)
        if now - _ctime(cache.trash_dir / n) >= older_than_s
    ]
    found += [
        Leftover(path, "foreground marker of a pull that has ended", Removal.UNLOCKED)
        for path in stale_markers(cache.root)
        if now - _mtime(path) >= older_than_s
    ]
    quarantined = {p.stem for p in cache.quarantine_dir.glob("*.json")}
    for directory in (cache.used_dir, cache.verified_dir, cache.leases_dir):
        found += [
            Leftover(directory / name, "marker of a model no longer cached")
            for name in _names(directory)
            if name not in live and name not in quarantined and not name.startswith(".")
            and not cache.lock_is_held(name) and now - _mtime(directory / name) >= older_than_s
        ]
    found += [
        Leftover(path, "empty directory", Removal.RMDIR)
        for path in _empty_dirs(cache, now - older_than_s)
    ]
    return found


def _empty_dirs(cache: Cache, older_than: float) -> list[Path]:
    """Directories of the model tree that hold nothing (an eviction by an older version, a crash).

    Children come before their parents, so removing them in order empties the parents.
    Ready models are not descended into; the state directory is skipped.
    """
    ready: set[Path] = set()
    for path in cache.records_dir.glob("*.json"):
        with contextlib.suppress(OSError, ModelsyncError):
            source = parse_record(path.read_bytes(), str(path)).source
            ready.add(cache.root / parse_model_name(source).cache_path)
    # the filesystem's own directory (ext4) is not ours to remove
    not_ours = {cache.state_dir, cache.root / "lost+found"}
    found: list[Path] = []

    def visit(directory: Path) -> bool:
        """Whether `directory` holds only empty directories old enough to go."""
        try:
            entries = list(os.scandir(directory))
        except OSError:
            return False
        empty = True
        for entry in entries:
            child = Path(entry.path)
            if entry.is_dir(follow_symlinks=False) and child not in ready and child not in not_ours:
                empty = visit(child) and empty
            else:
                empty = False
        if empty and directory != cache.root and _mtime(directory) <= older_than:
            found.append(directory)
            return True
        return False

    visit(cache.root)
    return found


def collect_garbage(cache: Cache, catalog: Catalog, older_than_s: float) -> list[Leftover]:
    """Remove leftovers older than `older_than_s`; stale index rows were already dropped by the catalog."""
    removed = []
    for item in leftovers(cache, older_than_s):
        if item.how is Removal.RMDIR:
            try:
                os.rmdir(item.path)
            except OSError:
                continue  # no longer empty: a `make_ready` is using it
        elif item.how is Removal.UNLOCKED:
            if not remove_if_stale(item.path):
                continue
        elif item.path.is_dir() and not item.path.is_symlink():
            fs.remove_tree(item.path)
        else:
            item.path.unlink(missing_ok=True)
        removed.append(item)
    return removed


def _names(directory: Path) -> list[str]:
    try:
        return sorted(os.listdir(directory))
    except FileNotFoundError:
        return []


def _ctime(path: Path) -> float:
    try:
        return os.lstat(path).st_ctime
    except FileNotFoundError:
        return time.time()


def _mtime(path: Path) -> float:
    try:
        return os.lstat(path).st_mtime
    except FileNotFoundError:
        return time.time()
