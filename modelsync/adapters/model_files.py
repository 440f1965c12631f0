"""A model's files where they lie: what each path holds (one lstat), their digests, and reads.

For a cached model and for a local directory being uploaded. Reads never go
through a symlink: files are opened with O_NOFOLLOW, a cached model's below its
directory by directory fds. The checks that judge what is found (missing, wrong
size, wrong digest, a symlink in an upload) are the engine's; this module only looks.
"""

from __future__ import annotations

import enum
import errno
import os
import stat
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, NamedTuple

from modelsync.adapters import fs
from modelsync.errors import UnreadableFileError

if TYPE_CHECKING:
    from modelsync.adapters.digest import FileDigest


class Kind(enum.Enum):
    MISSING = "missing"
    SYMLINK = "symlink"
    FILE = "file"
    #: a directory, a device, a socket...
    OTHER = "other"


class Entry(NamedTuple):
    kind: Kind
    #: the apparent size of a regular file
    size_bytes: int = 0
    #: its permission bits
    mode: int = 0


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
    return Entry(Kind.FILE, st.st_size, stat.S_IMODE(st.st_mode))


class ModelDir:
    """A model's directory held open: its files are read beneath it, never through a symlink."""

    def __init__(self, root: Path) -> None:
        self.root = root
        with fs.storage_errors(root):
            self._fd = fs.open_dir(root)

    def read(self, relative: str, offset: int, n_bytes: int) -> bytes:
        """Up to `n_bytes` of the file at `offset` (fewer at its end); UnreadableFileError if it cannot."""
        fd = self._open_regular(relative)
        try:
            return os.pread(fd, n_bytes, offset)
        except OSError as exc:
            raise UnreadableFileError(f"unreadable ({exc.strerror})") from None
        finally:
            os.close(fd)

    def digest(self, relative: str, size_bytes: int, *, sha256: bool = False) -> FileDigest:
        """The file's digests, read front to back; UnreadableFileError if it is not a file to read."""
        from modelsync.adapters.digest import hash_fd  # here, not at the top: the warm path never hashes

        fd = self._open_regular(relative)
        try:
            return hash_fd(fd, size_bytes, sha256=sha256)
        except OSError as exc:
            raise UnreadableFileError(f"unreadable ({exc.strerror})") from None
        finally:
            os.close(fd)

    def _open_regular(self, relative: str) -> int:
        """Open a regular file beneath the model for reading, never blocking and never through a link.

        O_NONBLOCK: a named pipe planted at the path would otherwise block the open
        until a writer came. The descriptor is checked (fstat) before any read, so a
        directory, pipe or device swapped in after an lstat is refused, not read.
        """
        try:
            fd = fs.open_file_beneath(self._fd, PurePosixPath(relative), os.O_RDONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                raise UnreadableFileError("missing") from None
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise UnreadableFileError("reachable only through a symlink") from None
            raise UnreadableFileError(f"unreadable ({exc.strerror})") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise UnreadableFileError("not a regular file")
        return fd

    def close(self) -> None:
        os.close(self._fd)

    def __enter__(self) -> ModelDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def is_dir(path: Path) -> bool:
    """Whether `path` is a directory (a symlink to one counts: the user named it)."""
    return path.is_dir()


def tree_files(directory: Path) -> tuple[list[tuple[str, int]], list[str]]:
    """The regular files below `directory` as (relative path, size), and the symlinks met there.

    Symlinks are listed, never followed; other kinds of entry (sockets, devices) are left out.
    """
    files, links = [], []
    with fs.storage_errors(directory):
        for dirpath, dirnames, filenames in os.walk(directory, followlinks=False):
            for name in dirnames + filenames:
                path = Path(dirpath, name)
                st = os.lstat(path)
                relative = path.relative_to(directory).as_posix()
                if stat.S_ISLNK(st.st_mode):
                    links.append(relative)
                elif stat.S_ISREG(st.st_mode):
                    files.append((relative, st.st_size))
    return sorted(files), sorted(links)


class ReadOnlyFile:
    """A local file opened for reading at offsets; its size is taken once, when it is opened."""

    def __init__(self, path: Path) -> None:
        with fs.storage_errors(path):
            self.fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            self.size_bytes = os.fstat(self.fd).st_size
        self.path = path

    def read(self, start: int, length: int) -> bytes:
        with fs.storage_errors(self.path):
            return os.pread(self.fd, length, start)

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> ReadOnlyFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
