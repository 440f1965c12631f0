"""Crash debris in the cache: what it is, why it is there, and how each piece is removed safely.

Staging areas and journals of interrupted pulls, orphan locks and markers,
unfinished deletes, stale foreground markers, empty directories of the model
tree. A piece whose model lock is held belongs to a live pull and is never
listed; a young one may be in use and waits out the age given.
"""

from __future__ import annotations

import contextlib
import enum
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from modelsync.adapters import fs
from modelsync.adapters.cache.damaged import find_model, read_records
from modelsync.adapters.cache.foreground import remove_if_stale, stale_markers
from modelsync.adapters.cache.markers import Markers
from modelsync.core.record import parse_record
from modelsync.core.refs import parse_model_name
from modelsync.errors import ModelsyncError


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


def leftovers(cache: Markers, older_than_s: float = 0.0) -> list[Leftover]:
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
        if slug in live or slug == "space" or cache.lock_is_held(slug) or _TEMPORARY.fullmatch(name):
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
        Leftover(path, "temporary file of a write that never finished (a crash or a full disk)")
        for path in _temporary_files(cache)
        if now - _mtime(path) >= older_than_s
    ]
    found += [
        Leftover(path, f"completion record of no cached model, and it cannot be read ({reason})")
        for path, reason in read_records(cache.records_dir)[1]
        if find_model(cache.root, path.name.removesuffix(".json")) is None
        and not cache.lock_is_held(path.name.removesuffix(".json"))
        and now - _mtime(path) >= older_than_s
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
            if name not in live
            and name not in quarantined
            and not name.startswith(".")
            and not cache.lock_is_held(name)
            and now - _mtime(directory / name) >= older_than_s
        ]
    found += [
        Leftover(path, "empty directory", Removal.RMDIR) for path in _empty_dirs(cache, now - older_than_s)
    ]
    return found


def _empty_dirs(cache: Markers, older_than: float) -> list[Path]:
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


def remove_leftover(item: Leftover) -> bool:
    """Remove one leftover the way it asks for; False when it is no longer a leftover (left alone)."""
    with fs.storage_errors(item.path):
        if item.how is Removal.RMDIR:
            try:
                os.rmdir(item.path)
            except OSError:
                return False  # no longer empty: a `make_ready` is using it
        elif item.how is Removal.UNLOCKED:
            return remove_if_stale(item.path)
        elif item.path.is_dir() and not item.path.is_symlink():
            fs.remove_tree(item.path)
        else:
            item.path.unlink(missing_ok=True)
    return True


#: how `fs.write_atomic` names the file it writes before renaming it into place
_TEMPORARY = re.compile(r"\..+\.tmp-\d+-[0-9a-f]{8}")


def _temporary_files(cache: Markers) -> list[Path]:
    """Temporary files of atomic writes (records, markers, notes) that a crash or ENOSPC left behind."""
    directories = (
        cache.state_dir,
        cache.records_dir,
        cache.quarantine_dir,
        cache.locks_dir,
        cache.pins_dir,
        cache.used_dir,
        cache.verified_dir,
        cache.leases_dir,
        cache.reservations_dir,
    )
    return [d / name for d in directories for name in _names(d) if _TEMPORARY.fullmatch(name)]


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
