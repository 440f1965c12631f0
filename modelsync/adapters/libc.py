"""libc through ctypes, for the few calls Python's os module lacks (renameat2, sync_file_range, syncfs).

Loaded on first use: ctypes costs every process ~10 ms to import, and the warm
path (a ready model) never calls into libc.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import ctypes


@functools.cache
def load_libc() -> ctypes.CDLL | None:
    """The C library the interpreter itself runs on: the process's own symbols (dlopen of NULL).

    Not `ctypes.util.find_library("c")`, which on Linux runs `ldconfig -p` in a
    subprocess (and imports tempfile and shutil): a fork and exec in every cold pull,
    for a library that is loaded already.
    """
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def last_errno() -> int:
    import ctypes

    return ctypes.get_errno()
