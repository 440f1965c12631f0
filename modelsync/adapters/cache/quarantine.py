"""Taking a ready model out of the ready set with its data moved, not deleted: quarantine, restage,
and removal or quarantine around the ready models nested inside it; each a rename by directory fds.

The caller holds the model's lock (and those of the models inside it). Each step
leaves the model ready, or out of the ready set with its data where the step put
it, never served from a half-moved directory.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from modelsync.adapters import fs
from modelsync.adapters.cache.ready import ReadyModels
from modelsync.adapters.cache.staging import Staging
from modelsync.core.record import CompletionRecord, render_record
from modelsync.core.refs import ModelRef


class QuarantinedModels(ReadyModels):
    """A damaged model kept aside for `--repair`, a model's data moved back to staging to repair it,
    and both (or a removal) for a model that holds others."""

    def quarantine(self, ref: ModelRef, record: CompletionRecord) -> None:
        """Take a damaged model out of the ready set in one rename by directory fds, keeping data and record.

        The quarantined record is written first and the ready one removed last, so a
        crash in between leaves the model quarantined or still listed, never served
        from a half-moved directory. The caller holds the model's lock.
        """
        target = self.quarantine_dir / ref.slug
        fs.remove_tree(target)
        with fs.storage_errors(self.ready_path(ref)):
            parent = self._open_parent(ref, create=False)
        with fs.storage_errors(target):
            try:
                fs.write_atomic(self.quarantined_record_path(ref), render_record(record))
                _rename_between(parent, ref.cache_path.name, self.quarantine_dir, ref.slug)
            finally:
                os.close(parent)
            self.record_path(ref).unlink(missing_ok=True)
        self.prune_parents(ref)

    def restage(self, ref: ModelRef, *, quarantined: bool) -> Staging:
        """Move a model's data (ready, or quarantined) to its staging area in one rename by directory fds.

        Whatever the staging area held goes first. The ready path, if that is where
        the data was, disappears in the same rename. The caller holds the model's lock.
        """
        staging = Staging(self, ref)
        fs.remove_tree(staging.dir)
        with fs.storage_errors(staging.dir):
            if quarantined:
                source = fs.open_dir(self.quarantine_dir)
                name = ref.slug
            else:
                source = self._open_parent(ref, create=False)
                name = ref.cache_path.name
            try:
                _rename_between(source, name, self.staging_dir, ref.slug)
            finally:
                os.close(source)
        return staging

    def remove_ready_keeping(self, ref: ModelRef, inside: Sequence[ModelRef]) -> None:
        """`remove_ready` for a model that holds ready models `inside` it (a cache from before
        models could not nest): they stay ready where they are, only the rest goes."""
        doomed = self.trash_dir / f"{ref.slug}-{os.getpid()}-{os.urandom(4).hex()}"
        self._take_out(ref, inside, doomed)
        with contextlib.suppress(FileNotFoundError):
            self.record_path(ref).unlink()
        fs.remove_tree(doomed)  # last, as in `remove_ready`: `finish_removal` ends what a stop leaves

    def quarantine_keeping(self, ref: ModelRef, record: CompletionRecord, inside: Sequence[ModelRef]) -> None:
        """`quarantine` for a model that holds ready models `inside` it: they stay ready where
        they are; the rest of its files and its record are kept in quarantine, destroying nothing."""
        target = self.quarantine_dir / ref.slug
        fs.remove_tree(target)
        with fs.storage_errors(target):
            fs.write_atomic(self.quarantined_record_path(ref), render_record(record))
            self._take_out(ref, inside, target)
            self.record_path(ref).unlink(missing_ok=True)

    def _take_out(self, ref: ModelRef, inside: Sequence[ModelRef], target: Path) -> None:
        """Rename the model's directory to `target`, then each model `inside` it (the outermost
        ones: those inside them come along) back to its ready path.

        Each inner model is away from its ready path only between the two renames (its
        readers keep their open files); the caller holds the locks of all of them.
        """
        with fs.storage_errors(self.ready_path(ref)):
            parent = self._open_parent(ref, create=False)
            try:
                _rename_between(parent, ref.cache_path.name, target.parent, target.name)
            finally:
                os.close(parent)
            for inner in inside:
                relative = PurePosixPath(*inner.cache_path.parts[len(ref.cache_path.parts) :])
                source = fs.open_dir_below(target, relative.parent)
                try:
                    back = self._open_parent(inner, create=True)
                    try:
                        os.rename(relative.name, inner.cache_path.name, src_dir_fd=source, dst_dir_fd=back)
                        os.fsync(back)
                    finally:
                        os.close(back)
                finally:
                    os.close(source)


def _rename_between(source_fd: int, name: str, target_dir: Path, target_name: str) -> None:
    """Rename `name` in the directory `source_fd` to `target_name` in `target_dir`, never following a link."""
    target_fd = fs.open_dir(target_dir)
    try:
        os.rename(name, target_name, src_dir_fd=source_fd, dst_dir_fd=target_fd)
    finally:
        os.close(target_fd)
