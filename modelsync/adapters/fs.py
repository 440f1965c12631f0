"""Filesystem primitives that never follow a symlink and translate errno into modelsync errors.

The cache may be shared with other containers; a symlink planted inside it must
not redirect a write, a rename or a delete outside it. Every path below the
cache root is therefore walked one segment at a time with directory file
descriptors and O_NOFOLLOW, never built by joining a string.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from modelsync.adapters import volume
from modelsync.adapters.access import permission_hint
from modelsync.adapters.libc import last_errno, load_libc
from modelsync.core.units import format_bytes
from modelsync.errors import DiskFullError, LocalStorageError

if TYPE_CHECKING:
    pass

DIR_MODE = 0o2775  # setgid: files inherit the cache's group, so a daemon and init containers share it
FILE_MODE = 0o664
READY_FILE_MODE = 0o444
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@contextlib.contextmanager
def storage_errors(path: Path | str, needed_bytes: int | None = None) -> Iterator[None]:
    """Turn OSError from local storage into DiskFullError or LocalStorageError."""
    try:
        yield
    except OSError as exc:
        raise storage_error(exc, path, needed_bytes) from None


def storage_error(exc: OSError, path: Path | str, needed_bytes: int | None = None) -> Exception:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return disk_full(path, needed_bytes)
    if exc.errno == errno.EROFS:
        return LocalStorageError(f"{path} is on a read-only filesystem; mount the cache read-write")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return LocalStorageError(f"permission denied on {path}; {permission_hint(Path(path))}")
    if exc.errno == errno.ELOOP:
        return LocalStorageError(f"refusing to follow a symlink at {path}; remove it from the cache")
    if exc.errno == errno.ENOTDIR:
        return LocalStorageError(f"{path}: a path segment is not a directory; remove the stray file")
    return LocalStorageError(f"cannot use {path}: {exc.strerror or exc}")


def disk_full(path: Path | str, needed_bytes: int | None = None) -> DiskFullError:
    need = f"needs {format_bytes(needed_bytes)}, " if needed_bytes is not None else ""
    return DiskFullError(
        f"disk full writing {path}: {need}{format_bytes(volume.free_bytes(Path(path)))} free; "
        "free space (modelsync evict) or raise the volume's size"
    )


def open_dir(path: Path) -> int:
    """Open an existing directory that is not itself a symlink."""
    return os.open(path, _DIR_FLAGS)


def open_dir_beneath(root_fd: int, relative: PurePosixPath, create: bool) -> int:
    """Open (and optionally create) `relative` below `root_fd` without following symlinks."""
    fd = os.dup(root_fd)
    try:
        for segment in relative.parts:
            created = False
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(segment, DIR_MODE, dir_fd=fd)
                    created = True
            child = os.open(segment, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
            if created:
                os.fchmod(fd, DIR_MODE)  # the umask must not keep the group from adding siblings
        return fd
    except BaseException:
        os.close(fd)
        raise


def open_dir_below(root: Path, relative: PurePosixPath, create: bool = False) -> int:
    """`open_dir_beneath` from a root given as a path (itself no symlink), for a caller with no fd."""
    root_fd = open_dir(root)
    try:
        return open_dir_beneath(root_fd, relative, create)
    finally:
        os.close(root_fd)


def open_file_beneath(root_fd: int, relative: PurePosixPath, flags: int, mode: int = FILE_MODE) -> int:
    """Open a file below `root_fd`, creating parent directories, never following a symlink."""
    if not relative.parent.parts:  # directly below: no parent to open (two syscalls a file)
        return os.open(relative.name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=root_fd)
    parent = open_dir_beneath(root_fd, relative.parent, create=bool(flags & os.O_CREAT))
    try:
        return os.open(relative.name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=parent)
    finally:
        os.close(parent)


def create_file_beneath(root_fd: int, relative: PurePosixPath, mode: int = FILE_MODE) -> int:
    """A new empty file below `root_fd`, open for reading and writing; whatever was there is unlinked.

    Never writes into an existing inode: a file left in staging may be a hard link
    to a ready model's file (engine/dedup.py) whose journal line a kill -9 lost.
    """
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL
    try:
        return open_file_beneath(root_fd, relative, flags, mode)
    except FileExistsError:
        remove_beneath_fd(root_fd, relative)
        return open_file_beneath(root_fd, relative, flags, mode)


_RENAME_EXCHANGE = 2


def exchange(dir_fd: int, name: str, other_dir_fd: int, other_name: str) -> bool:
    """Swap two paths atomically (renameat2 RENAME_EXCHANGE); False where the kernel or fs can't.

    A refreshed model replaces the old one in a single step: a reader sees the old
    directory or the new one at the ready path, never neither.
    """
    libc = load_libc()
    renameat2 = getattr(libc, "renameat2", None) if libc is not None else None
    if renameat2 is None:
        return False
    rc = renameat2(dir_fd, name.encode(), other_dir_fd, other_name.encode(), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = last_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), other_name)


def fsync_dir(path: Path) -> None:
    fd = open_dir(path)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes, mode: int = FILE_MODE, fsync: bool = True) -> None:
    """Write a small file so readers see the old or the new content, never a torn one.

    `fsync=False` for advisory files (progress notes) that need atomicity but not durability.
    """
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{os.urandom(4).hex()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:  # a full disk fails the write: the temporary file goes too (`gc` removes a crash's)
        try:
            left = memoryview(data)
            while left:  # a write cut short by a filling disk goes on, to fail, never renamed torn
                left = left[os.write(fd, left) :]
            os.fchmod(fd, mode)
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if fsync:
        fsync_dir(path.parent)


def remove_tree(path: Path) -> None:
    """Delete a directory tree; symlinks inside are removed, never followed."""
    if path.is_symlink() or not path.exists():
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return
    import shutil  # here: only removals need it; it imports bz2 and lzma, which a pull never does

    # shutil.rmtree works through directory fds on Linux (rmtree.avoids_symlink_attacks).
    assert shutil.rmtree.avoids_symlink_attacks
    shutil.rmtree(path)


def unlisted_entries(root: Path, listed: set[str]) -> list[tuple[str, bool]]:
    """Entries below `root` that are symlinks, or files not in `listed`: (relative path, is a symlink).

    Symlinks are reported, never followed; an entry that vanishes meanwhile is not one.
    """
    found = []
    with storage_errors(root):
        for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
            for name in dirnames + filenames:
                path = Path(dirpath, name)
                try:
                    mode = os.lstat(path).st_mode
                except FileNotFoundError:
                    continue
                relative = path.relative_to(root).as_posix()
                if stat.S_ISLNK(mode):
                    found.append((relative, True))
                elif not stat.S_ISDIR(mode) and relative not in listed:
                    found.append((relative, False))
    return found


def file_inodes(root: Path, relatives: list[str]) -> dict[str, tuple[int, int]]:
    """(device, inode) of each regular file among `relatives` below `root`; others are left out."""
    inodes = {}
    for relative in relatives:
        with contextlib.suppress(OSError):
            st = os.lstat(root / relative)
            if stat.S_ISREG(st.st_mode):
                inodes[relative] = (st.st_dev, st.st_ino)
    return inodes


def remove_beneath(root: Path, relative: str) -> None:
    """Remove whatever is at `relative` below `root` (a file, a link, a tree), through directory fds.

    No symlink on the way is followed: a planted link is removed itself, never
    what it points to. Nothing there is not an error.
    """
    with storage_errors(root / relative):
        root_fd = open_dir(root)
        try:
            remove_beneath_fd(root_fd, PurePosixPath(relative))
        finally:
            os.close(root_fd)


def remove_beneath_fd(root_fd: int, relative: PurePosixPath) -> None:
    """`remove_beneath` below an open directory."""
    try:
        parent = open_dir_beneath(root_fd, relative.parent, create=False)
    except (FileNotFoundError, NotADirectoryError):
        return
    try:
        try:
            os.unlink(relative.name, dir_fd=parent)
        except FileNotFoundError:
            pass
        except IsADirectoryError:
            import shutil  # here, as in remove_tree

            shutil.rmtree(relative.name, dir_fd=parent)
    finally:
        os.close(parent)


def make_dirs(path: Path, up_to: Path | None = None) -> None:
    """Create a state directory with the shared-group mode, whatever the umask.

    Directories between `up_to` (exclusive) and `path` get the same mode.
    """
    path.mkdir(parents=True, exist_ok=True)
    chain = [path, *(p for p in path.parents if up_to is not None and up_to in p.parents)]
    for directory in chain:
        if directory.stat().st_mode & 0o7777 != DIR_MODE:
            with contextlib.suppress(PermissionError):
                os.chmod(directory, DIR_MODE)


def umask_keeps(mode: int) -> bool:
    """Whether files this process creates with `mode` get exactly it: its umask clears none of its bits.

    Read from /proc (os.umask can only be read by setting it, which races other threads);
    False when it cannot be read, so callers fall back to setting the mode.
    """
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8) & mode == 0
    return False


def share_with_group(fd: int) -> None:
    """Make a file this process just created writable by the cache's group (best effort: not on a
    read-only mount, where an existing lock file opens but cannot change)."""
    with contextlib.suppress(OSError):
        os.fchmod(fd, FILE_MODE)
