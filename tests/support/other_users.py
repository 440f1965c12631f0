"""Whether a process of another uid can run this checkout's modelsync at all.

The tests that run modelsync as a user outside the cache's group (`setpriv --reuid`) need the
checkout and its .venv to be reachable by other users. A clone into `mktemp -d` is not: that
directory is mode 0700, so every such process stops at `No module named modelsync`, which says
nothing about the cache's permissions the tests are about.
"""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest

import modelsync


def unreachable_by_others() -> str | None:
    """Why another uid cannot reach this checkout's modelsync or its interpreter; None when it can."""
    for place in (Path(modelsync.__file__).resolve().parent, Path(sys.prefix).resolve()):
        for directory in (place, *place.parents):
            mode = directory.stat().st_mode
            if not mode & stat.S_IXOTH:
                return (
                    f"other users cannot enter {directory} (mode {stat.S_IMODE(mode):04o}), so a process of "
                    "another uid cannot import modelsync: clone into a directory others can enter to run this"
                )
    return None


#: for a test that runs modelsync as another uid
needs_a_checkout_others_reach = pytest.mark.skipif(
    unreachable_by_others() is not None, reason=str(unreachable_by_others())
)
