"""Ready models: made ready and removed by rename, through directory fds.

Correctness never rests on the lock: staging names are unique per model, the
record is written before the ready rename, and the ready rename is atomic, so a
crash or an ineffective lock (some network filesystems) leaves either the old
state or the new one. The lock only spares duplicate downloads.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path, PurePosixPath

from modelsync.adapters import fs, writeback
from modelsync.adapters.cache.records import RecordFiles
from modelsync.adapters.cache.staging import Staging
from modelsync.core.record import CompletionRecord, render_record
from modelsync.core.refs import ModelRef


class ReadyModels(RecordFiles):
    """The ready set: make a staged model ready, remove a ready one, finish a removal that was stopped."""

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

    def _open_parent(self, ref: ModelRef, create: bool) -> int:
        """The ready path's parent directory, reached without following any symlink."""
        return fs.open_dir_below(self.root, PurePosixPath(*ref.cache_path.parts[:-1]), create)

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
        synced = writeback.syncfs(root)
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
