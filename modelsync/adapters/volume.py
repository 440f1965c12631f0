"""The volume under a path: its free, total and allocated bytes, and what kind of file system it is."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def free_bytes(path: Path) -> int:
    """Bytes available to this user on the filesystem holding `path` (or its nearest parent)."""
    for candidate in (path, *path.parents):
        try:
            st = os.statvfs(candidate)
        except OSError:
            continue
        return st.f_bavail * st.f_frsize
    return 0


def allocated_bytes(directory: Path) -> int:
    """Disk space the files below `directory` occupy (blocks, not apparent size); 0 if absent."""
    total = 0
    for dirpath, _dirnames, filenames in os.walk(directory, followlinks=False):
        for name in filenames:
            with contextlib.suppress(FileNotFoundError):
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total


_IN_MEMORY = frozenset({"tmpfs", "ramfs"})


def in_memory(path: Path) -> bool:
    """Whether `path` lives on a RAM-backed filesystem, from the mount table."""
    return filesystem_type(path) in _IN_MEMORY


def filesystem_type(path: Path) -> str:
    """The type of the filesystem mounted at the deepest mount point above `path` ("" if unknown)."""
    target = os.path.realpath(path)
    best, fstype = "", ""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return ""
    for line in lines:
        fields = line.split(" ")
        if "-" not in fields:
            continue
        mount_point = fields[4].replace("\\040", " ")
        inside = target == mount_point or target.startswith(mount_point.rstrip("/") + "/")
        if inside and len(mount_point) >= len(best):
            best, fstype = mount_point, fields[fields.index("-") + 1]
    return fstype


def total_bytes(path: Path) -> int:
    """Size of the filesystem holding `path`: what a budget given as a share refers to."""
    st = os.statvfs(path)
    return st.f_blocks * st.f_frsize
