"""Completion records that cannot be read: which model each one was, and what stands in for it.

A record is written atomically (temp, fsync, rename), so one that does not parse
(truncated, the wrong JSON shape, a negative size) or that names another model than
its file name was damaged afterwards. Its model's files may still be at the ready
path: never served (nothing vouches for them), but they hold space, so they must be
counted, reported, and removable. The record's file name is the model's slug; the
model is found again by descending the ready tree only where the slug's readable
part leads (`core.refs.slug_readable`), and its files stand in for the record: their
sizes are counted, and their digests, unknown, make `verify --repair` fetch them all.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import NamedTuple

from modelsync.adapters import model_files
from modelsync.core.manifest import FileEntry
from modelsync.core.record import CompletionRecord, parse_record
from modelsync.core.refs import ModelRef, parse_model_name, slug_readable
from modelsync.errors import ManifestError, ModelsyncError

#: the digest a stand-in record gives every file: it matches no file, so a repair fetches them all
UNKNOWN_DIGEST = "0" * 32


class DamagedRecord(NamedTuple):
    """A record file that cannot be read, and the model whose ready directory its name leads to."""

    path: Path
    reason: str
    #: the model, when its ready directory was found
    ref: ModelRef | None = None
    #: a record made from the files found there (sizes true, digests unknown)
    stand_in: CompletionRecord | None = None


def read_records(directory: Path) -> tuple[list[tuple[str, CompletionRecord]], list[tuple[Path, str]]]:
    """The records in `directory` by slug, and the ones that cannot be read with the reason.

    A record that names another model than its slug is damaged too: serving it would
    serve the wrong files. Temporary files of a write (`.<name>.tmp-*`) are not records.
    """
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        names = []
    records, damaged = [], []
    for name in names:
        if not name.endswith(".json") or name.startswith("."):
            continue
        path = directory / name
        slug = name.removesuffix(".json")
        try:
            record = parse_record(path.read_bytes(), str(path))
            if parse_model_name(record.source).slug != slug:
                raise ManifestError(f"it names {record.source}, not the model of its file name")
        except (OSError, ModelsyncError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else str(exc)
            damaged.append((path, str(reason).removeprefix(f"damaged completion record {path}: ")))
            continue
        records.append((slug, record))
    return records, damaged


def find_model(root: Path, slug: str) -> ModelRef | None:
    """The model whose ready directory below `root` has this slug, or None."""
    readable = slug.rpartition("-")[0]

    def descend(directory: Path, parts: tuple[str, ...]) -> ModelRef | None:
        try:
            entries = sorted(e.name for e in os.scandir(directory) if e.is_dir(follow_symlinks=False))
        except OSError:
            return None
        for name in entries:
            here = (*parts, name)
            if not readable.startswith(slug_readable("/".join(here))):
                continue
            if len(here) > 1:
                try:
                    ref: ModelRef | None = parse_model_name("/".join(here))
                except ModelsyncError:
                    ref = None
                if ref is not None and ref.slug == slug:
                    return ref
            found = descend(directory / name, here)
            if found is not None:
                return found
        return None

    return descend(root, ()) if readable else None


def damaged_record(root: Path, path: Path, reason: str) -> DamagedRecord:
    """What is known of a damaged record: its model and a stand-in, when its ready directory is there."""
    ref = find_model(root, path.name.removesuffix(".json"))
    if ref is None:
        return DamagedRecord(path, reason)
    ready = root / ref.cache_path
    try:
        completed_at = os.lstat(path).st_mtime
        if not stat.S_ISDIR(os.lstat(ready).st_mode):
            return DamagedRecord(path, reason)
    except OSError:
        return DamagedRecord(path, reason)
    files, _links = model_files.tree_files(ready)
    stand_in = CompletionRecord(
        source=ref.uri,
        completed_at=completed_at,
        verified_by="size",
        files=tuple(FileEntry(relative, size, UNKNOWN_DIGEST) for relative, size in files),
    )
    return DamagedRecord(path, reason, ref, stand_in)
