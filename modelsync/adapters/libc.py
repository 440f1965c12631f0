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
    import ctypes.util

    name = ctypes.util.find_library("c")
    return ctypes.CDLL(name, use_errno=True) if name else None


def last_errno() -> int:
    import ctypes

    return ctypes.get_errno()
