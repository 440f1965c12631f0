"""Completion records on disk: a ready or quarantined model's record, where its data lies, and dropping both.

A record is the half of "ready" that is written first (temp, fsync, rename);
the other half, the ready directory, is ready.py's. A record that cannot be read
belongs to no model that can be served (damaged.py says which they are).
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from modelsync.adapters import fs
from modelsync.adapters.cache.damaged import read_records
from modelsync.adapters.cache.markers import Markers
from modelsync.core.record import CompletionRecord, parse_record
from modelsync.core.refs import ModelRef
from modelsync.errors import ManifestError


class RecordFiles(Markers):
    """Records of ready and quarantined models, and the data directories they vouch for."""

    def load_record(self, ref: ModelRef) -> CompletionRecord | None:
        path = self.record_path(ref)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            record = parse_record(data, str(path))
        except ManifestError:
            return None
        return record if record.source == ref.uri else None

    def ready_record(self, ref: ModelRef) -> CompletionRecord | None:
        """The record of a ready model: its record exists and its directory is a real directory."""
        record = self.load_record(ref)
        if record is None:
            return None
        try:
            st = os.lstat(self.ready_path(ref))
        except FileNotFoundError:
            return None
        return record if stat.S_ISDIR(st.st_mode) else None

    def stored_records(self, *, quarantined: bool) -> list[tuple[str, CompletionRecord]]:
        """Every readable record of ready (or quarantined) models, by the slug in its file name.

        A record that cannot be read or parsed is skipped: it belongs to no model
        that can be served (`damaged_records` says which they are). A records directory
        that cannot be listed is a LocalStorageError.
        """
        return self.scan_records(quarantined=quarantined)[0]

    def scan_records(
        self, *, quarantined: bool
    ) -> tuple[list[tuple[str, CompletionRecord]], list[tuple[Path, str]]]:
        """The readable records by slug, and the damaged ones with why (`damaged.read_records`)."""
        directory = self.quarantine_dir if quarantined else self.records_dir
        with fs.storage_errors(directory):
            return read_records(directory)

    def data_dir(self, ref: ModelRef, *, quarantined: bool) -> Path:
        """Where a ready (or quarantined) model's files are."""
        return self.quarantine_dir / ref.slug if quarantined else self.ready_path(ref)

    def has_data_dir(self, ref: ModelRef, *, quarantined: bool) -> bool:
        """Whether the model's data directory is there, and a real directory (not a symlink)."""
        try:
            return stat.S_ISDIR(os.lstat(self.data_dir(ref, quarantined=quarantined)).st_mode)
        except (FileNotFoundError, NotADirectoryError):
            return False

    def quarantined_record_path(self, ref: ModelRef) -> Path:
        return self.quarantine_dir / f"{ref.slug}.json"

    def quarantined_record(self, ref: ModelRef) -> CompletionRecord | None:
        """The record a quarantined model was made ready with; None when it is not quarantined."""
        path = self.quarantined_record_path(ref)
        with fs.storage_errors(path):
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                return None
        return parse_record(data, str(path))

    def drop_record(self, ref: ModelRef, *, quarantined: bool) -> None:
        """Remove a model's (ready or quarantined) record; its data is elsewhere by then."""
        path = self.quarantined_record_path(ref) if quarantined else self.record_path(ref)
        with fs.storage_errors(path):
            path.unlink(missing_ok=True)

    def drop_quarantine(self, ref: ModelRef) -> None:
        """Delete a quarantined copy (stale once the model is ready again, or evicted): record, then data."""
        with contextlib.suppress(FileNotFoundError):
            self.quarantined_record_path(ref).unlink()
        fs.remove_tree(self.quarantine_dir / ref.slug)
