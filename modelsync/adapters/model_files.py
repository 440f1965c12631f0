"""A model's files where they lie: what each path holds (one lstat), and their digests.

Reads never go through a symlink: files are opened below the model's directory
by directory fds with O_NOFOLLOW. The checks that judge what is found (missing,
wrong size, wrong digest) are the engine's; this module only looks.
"""

from __future__ import annotations

import enum
import errno
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from modelsync.adapters import fs
from modelsync.adapters.digest import FileDigest, hash_fd


class Kind(enum.Enum):
    MISSING = "missing"
    SYMLINK = "symlink"
    FILE = "file"
    #: a directory, a device, a socket...
    OTHER = "other"


@dataclass(frozen=True, slots=True)
class Entry:
    kind: Kind
    #: the apparent size of a regular file
    size_bytes: int = 0


def entry(root: Path, relative: str) -> Entry:
    """What is at `relative` below `root`, by one lstat (the warm path's only look at each file)."""
    path = root / relative
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return Entry(Kind.MISSING)
    except OSError as exc:
        raise fs.storage_error(exc, path) from None
    if stat.S_ISLNK(st.st_mode):
        return Entry(Kind.SYMLINK)
    if not stat.S_ISREG(st.st_mode):
        return Entry(Kind.OTHER)
    return Entry(Kind.FILE, st.st_size)


def hash_files(
    root: Path, files: list[tuple[str, int]], *, sha256: bool = False
) -> Iterator[tuple[str, FileDigest | None]]:
    """Each (relative path, size) file's digests, read front to back through directory fds.

    None for a file that has gone or can be reached only through a symlink: it is
    not the model's file, whatever it holds.
    """
    with fs.storage_errors(root):
        root_fd = fs.open_dir(root)
    try:
        for relative, size_bytes in files:
            try:
                fd = fs.open_file_beneath(root_fd, PurePosixPath(relative), os.O_RDONLY)
            except OSError as exc:
                if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                    yield relative, None
                    continue
                raise fs.storage_error(exc, root / relative) from None
            try:
                digest = hash_fd(fd, size_bytes, sha256=sha256)
            finally:
                os.close(fd)
            yield relative, digest
    finally:
        os.close(root_fd)
