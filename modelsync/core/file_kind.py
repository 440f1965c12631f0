"""What kind of file a mode says, in words, for messages that refuse the wrong kind at a path."""

from __future__ import annotations

import stat

_KINDS = (
    (stat.S_ISREG, "a regular file"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISLNK, "a symlink"),
    (stat.S_ISFIFO, "a named pipe"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def file_kind(mode: int) -> str:
    """`a directory`, `a named pipe`, ... for an `st_mode`."""
    return next((name for test, name in _KINDS if test(mode)), "an unknown kind of file")
