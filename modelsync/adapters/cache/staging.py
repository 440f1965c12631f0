"""Where one model's files are written before the ready rename, with the journal of that pull."""

from __future__ import annotations

import contextlib
import functools
import os
import stat
from pathlib import Path, PurePosixPath

from modelsync.adapters import fs, volume
from modelsync.adapters.cache.journal import Journal
from modelsync.adapters.cache.layout import Layout
from modelsync.core.refs import ModelRef


class Staging:
    """Where one model's files are written before the ready rename."""

    def __init__(self, cache: Layout, ref: ModelRef) -> None:
        self.dir = cache.staging_dir / ref.slug
        # On disk, each file is allocated whole when opened (contiguous, and a full disk is an
        # early error), its hashed ranges are written behind and it is flushed as it completes.
        # On tmpfs allocating means zero-filling RAM that the download overwrites at once
        # (about 0.25 s per GiB here), and there is nothing to flush, so all that is skipped.
        self.on_disk = not volume.in_memory(cache.root)
        self.journal = Journal(cache.staging_dir / f"{ref.slug}.journal", ref.uri)

    def prepare(self, resume: bool) -> None:
        """Create the staging directory; without resume, start from nothing."""
        if not resume:
            fs.remove_tree(self.dir)
        with fs.storage_errors(self.dir):
            fs.make_dirs(self.dir)
            self.journal.start(keep=resume)

    def discard(self) -> None:
        """Remove the staging directory and its journal (a pull that never started fetching)."""
        self.journal.close()
        fs.remove_tree(self.dir)
        with contextlib.suppress(FileNotFoundError):
            self.journal.path.unlink()

    def open_file(self, relative: str, size_bytes: int, *, fresh: bool, dir_fd: int | None = None) -> int:
        """Open the staging file for writing at offsets; on disk, space is reserved up front.

        `fresh`: none of its parts is kept, so it starts as a new file and whatever was
        at its path is unlinked, never written into (see `fs.create_file_beneath`); its
        writes give it its size, as every byte of it is written before it is hashed.
        `dir_fd`: the staging directory, already open (a pull opens it once, not once a file).

        posix_fallocate alone doubled the time of a 6 GiB pull to XFS and ext4 (unwritten
        extents converted under the inode lock while the page cache filled); with the
        write-behind of engine/pull.py it is as fast as a sparse file or faster
        (docs/perf-lab.md), and it keeps the early ENOSPC.
        """
        root = fs.open_dir(self.dir) if dir_fd is None else dir_fd
        try:
            if fresh:
                fd = fs.create_file_beneath(root, PurePosixPath(relative))
            else:
                fd = fs.open_file_beneath(root, PurePosixPath(relative), os.O_RDWR | os.O_CREAT)
        finally:
            if dir_fd is None:
                os.close(root)
        try:
            if not (fresh and self._created_shared):
                fs.share_with_group(fd)
            if not fresh and os.fstat(fd).st_size != size_bytes:
                os.ftruncate(fd, size_bytes)
            if size_bytes and self.on_disk:
                os.posix_fallocate(fd, 0, size_bytes)
        except BaseException:
            os.close(fd)
            raise
        return fd

    @functools.cached_property
    def _created_shared(self) -> bool:
        """Whether a file this process creates is group-writable already (its umask clears no bit)."""
        return fs.umask_keeps(fs.FILE_MODE)

    def link_from(self, root: Path, source: PurePosixPath, inode: tuple[int, int], relative: str) -> bool:
        """Hard-link `root/source` into staging as `relative` if it is still that inode.

        False when the copy has gone (evicted meanwhile), changed, or is not a plain
        file; the caller then downloads instead. Never follows a symlink.
        """
        try:
            src_dir = fs.open_dir_below(root, source.parent)
            try:
                st = os.stat(source.name, dir_fd=src_dir, follow_symlinks=False)
                if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != inode:
                    return False
                dst_dir = fs.open_dir_below(self.dir, PurePosixPath(relative).parent, create=True)
                try:
                    name = PurePosixPath(relative).name
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(name, dir_fd=dst_dir)
                    os.link(source.name, name, src_dir_fd=src_dir, dst_dir_fd=dst_dir, follow_symlinks=False)
                finally:
                    os.close(dst_dir)
            finally:
                os.close(src_dir)
        except OSError:
            return False
        return True
