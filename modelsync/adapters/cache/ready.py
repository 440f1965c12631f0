"""Ready models: made ready by rename, removed, quarantined and restored, all through directory fds.

Correctness never rests on the lock: staging names are unique per model, the
record is written before the ready rename, and the ready rename is atomic, so a
crash or an ineffective lock (some network filesystems) leaves either the old
state or the new one. The lock only spares duplicate downloads.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from modelsync.adapters import fs
from modelsync.adapters.cache.damaged import read_records
from modelsync.adapters.cache.markers import Markers
from modelsync.adapters.cache.staging import Staging
from modelsync.core.record import CompletionRecord, parse_record, render_record
from modelsync.core.refs import ModelRef
from modelsync.errors import ManifestError


class ReadyModels(Markers):
    """Ready models and their records: make ready, remove, quarantine, restore."""

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

    def make_ready(self, ref: ModelRef, staging: Staging, record: CompletionRecord) -> Path:
        """Make the staged model ready in one rename, after its record is durable.

        A revision already at the ready path (a refresh) is swapped out in the same
        step where the kernel can exchange two paths; readers holding its files keep them.
        """
        ready = self.ready_path(ref)
        with fs.storage_errors(ready):
            staging.journal.close()
            _seal_tree(staging.dir)
            fs.write_atomic(self.record_path(ref), render_record(record))
            for attempt in range(1, _MAKE_READY_ATTEMPTS + 1):
                try:
                    self._rename_into_place(ref, staging)
                    break
                except _ParentRemovedError:
                    # an eviction of a sibling pruned the (then empty) parent: make it again
                    if attempt == _MAKE_READY_ATTEMPTS:
                        raise FileNotFoundError(f"{ready.parent} kept disappearing") from None
            with contextlib.suppress(FileNotFoundError):
                staging.journal.path.unlink()
            self.drop_quarantine(ref)
        return ready

    def _rename_into_place(self, ref: ModelRef, staging: Staging) -> None:
        try:
            parent = self._open_parent(ref, create=True)
        except FileNotFoundError:
            raise _ParentRemovedError from None
        staging_fd = fs.open_dir(staging.dir.parent)
        try:
            name = ref.cache_path.name
            if _exists(parent, name) and fs.exchange(staging_fd, staging.dir.name, parent, name):
                fs.remove_tree(staging.dir)  # the old revision, now at the staging path
            else:
                self._move_aside(parent, name, ref.slug)
                try:
                    os.rename(staging.dir.name, name, src_dir_fd=staging_fd, dst_dir_fd=parent)
                except FileNotFoundError:
                    if os.fstat(parent).st_nlink == 0:
                        raise _ParentRemovedError from None
                    raise
            os.fsync(parent)
        finally:
            os.close(staging_fd)
            os.close(parent)

    def prune_parents(self, ref: ModelRef) -> None:
        """Remove the directories above a model's ready path that its removal left empty.

        Stops at the first one that is not empty, and never goes above the cache root
        or through a symlink. A `make_ready` that loses its parent to this race makes it again.
        """
        parts = ref.cache_path.parts[:-1]
        root = fs.open_dir(self.root)
        try:
            for depth in range(len(parts), 0, -1):
                try:
                    parent = fs.open_dir_beneath(root, PurePosixPath(*parts[: depth - 1]), create=False)
                except OSError:
                    return
                try:
                    os.rmdir(parts[depth - 1], dir_fd=parent)
                except OSError:
                    return  # not empty (another model, a concurrent `make_ready`), or gone
                finally:
                    os.close(parent)
        finally:
            os.close(root)

    def drop_quarantine(self, ref: ModelRef) -> None:
        """Delete a quarantined copy (stale once the model is ready again, or evicted): record, then data."""
        with contextlib.suppress(FileNotFoundError):
            self.quarantined_record_path(ref).unlink()
        fs.remove_tree(self.quarantine_dir / ref.slug)

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

    def remove_ready(self, ref: ModelRef) -> None:
        """Make a model not ready: the ready path disappears in one rename, its record goes, then its data.

        The data goes last, as the slowest step: a command stopped while it deletes
        leaves the model no longer cached, its files in the trash under the model's
        slug, which `finish_removal` (or gc) deletes.
        """
        with fs.storage_errors(self.ready_path(ref)):
            try:
                parent = self._open_parent(ref, create=False)
            except (FileNotFoundError, NotADirectoryError):
                parent = None
            doomed = None
            if parent is not None:
                try:
                    doomed = self._move_aside(parent, ref.cache_path.name, ref.slug, delete=False)
                finally:
                    os.close(parent)
            with contextlib.suppress(FileNotFoundError):
                self.record_path(ref).unlink()
            if doomed is not None:
                fs.remove_tree(doomed)

    def unfinished_removals(self, ref: ModelRef) -> list[Path]:
        """The model's files left in the trash by a removal that was stopped before it ended."""
        with fs.storage_errors(self.trash_dir):
            try:
                names = os.listdir(self.trash_dir)
            except FileNotFoundError:
                return []
        return [self.trash_dir / n for n in sorted(names) if n.startswith(f"{ref.slug}-")]

    def finish_removal(self, ref: ModelRef) -> None:
        """Delete what `unfinished_removals` lists."""
        for doomed in self.unfinished_removals(ref):
            with fs.storage_errors(doomed):
                fs.remove_tree(doomed)

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
                moved = fs.open_dir(target)
                try:
                    source = fs.open_dir_beneath(moved, relative.parent, create=False)
                finally:
                    os.close(moved)
                try:
                    back = self._open_parent(inner, create=True)
                    try:
                        os.rename(relative.name, inner.cache_path.name, src_dir_fd=source, dst_dir_fd=back)
                        os.fsync(back)
                    finally:
                        os.close(back)
                finally:
                    os.close(source)

    def _open_parent(self, ref: ModelRef, create: bool) -> int:
        """The ready path's parent directory, reached without following any symlink."""
        root = fs.open_dir(self.root)
        try:
            return fs.open_dir_beneath(root, PurePosixPath(*ref.cache_path.parts[:-1]), create=create)
        finally:
            os.close(root)

    def _move_aside(self, parent_fd: int, name: str, slug: str, delete: bool = True) -> Path | None:
        """Whatever is at the ready path goes to trash (named for the model) in one rename, then is deleted.

        With `delete=False` the caller deletes it: the trash path, or None when nothing was there.
        """
        if not _exists(parent_fd, name):
            return None
        doomed = self.trash_dir / f"{slug}-{os.getpid()}-{os.urandom(4).hex()}"
        os.rename(name, doomed, src_dir_fd=parent_fd)
        if delete:
            fs.remove_tree(doomed)
        return doomed


#: how often making a model ready makes the ready path's parent again when a concurrent prune removed it
_MAKE_READY_ATTEMPTS = 5


class _ParentRemovedError(Exception):
    """The ready path's parent was removed while a model was being made ready in it."""


def _rename_between(source_fd: int, name: str, target_dir: Path, target_name: str) -> None:
    """Rename `name` in the directory `source_fd` to `target_name` in `target_dir`, never following a link."""
    target_fd = fs.open_dir(target_dir)
    try:
        os.rename(name, target_name, src_dir_fd=source_fd, dst_dir_fd=target_fd)
    finally:
        os.close(target_fd)


def _exists(dir_fd: int, name: str) -> bool:
    try:
        os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    return True


def _seal_tree(directory: Path) -> None:
    """Make files read-only and everything below `directory` durable before it becomes visible.

    One syncfs of the file system where the kernel has it: a model of 2,000 small files
    otherwise pays 2,000 journal commits here (fsync per file), the bulk of its time to
    disk. Where syncfs is missing, every file and directory is fsynced.
    """
    files, dirs = [], [directory]
    for dirpath, dirnames, filenames in os.walk(directory, followlinks=False):
        files += [os.path.join(dirpath, name) for name in filenames]
        dirs += [Path(dirpath, name) for name in dirnames]
    for path in files:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.fchmod(fd, fs.READY_FILE_MODE)
        finally:
            os.close(fd)
    root = fs.open_dir(directory)
    try:
        synced = fs.syncfs(root)
    finally:
        os.close(root)
    if synced:
        return
    for path in files:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    for d in dirs:
        fs.fsync_dir(d)
