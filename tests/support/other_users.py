"""Whether a process of another uid can run this checkout's modelsync at all.

The tests that run modelsync as a user outside the cache's group (`setpriv --reuid`) need the
checkout and its .venv to be reachable by that user. A clone into `mktemp -d`
is not: that directory is mode 0700, so every such process stops at `No module named
modelsync`, which says nothing about the cache's permissions the tests are about.
"""

from __future__ import annotations

import stat
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import modelsync


def unreachable_by(uid: int, gids: set[int]) -> str | None:
    """Why `uid` in `gids` cannot reach this checkout's modelsync or its .venv; None when it can.

    As the kernel decides: the owner's bits for the owner, else the group's for a member, else
    the others' (a member of the group is not given the others' bits).
    """
    for place in (Path(modelsync.__file__).resolve().parent, Path(sys.prefix).resolve()):
        for directory in (place, *place.parents):
            st = directory.stat()
            if st.st_uid == uid:
                bit = stat.S_IXUSR
            elif st.st_gid in gids:
                bit = stat.S_IXGRP
            else:
                bit = stat.S_IXOTH
            if not st.st_mode & bit:
                return (
                    f"uid {uid} cannot enter {directory} (mode {stat.S_IMODE(st.st_mode):04o}), so it cannot "
                    "run this checkout's modelsync: clone into a directory that user can enter to run this"
                )
    return None


@dataclass(frozen=True, slots=True)
class OtherUser:
    """A user a test runs modelsync as: its uid (also its primary gid) and supplementary groups."""

    uid: int
    groups: tuple[int, ...] = ()

    @property
    def setpriv(self) -> tuple[str, ...]:
        """The command prefix that runs as this user."""
        groups = f"--groups={','.join(map(str, self.groups))}" if self.groups else "--clear-groups"
        return ("setpriv", f"--reuid={self.uid}", f"--regid={self.uid}", groups)

    @property
    def needs_the_checkout(self) -> pytest.MarkDecorator:
        """For a test that runs modelsync as this user: skipped, with the reason, where it cannot."""
        reason = unreachable_by(self.uid, {self.uid, *self.groups})
        return pytest.mark.skipif(reason is not None, reason=str(reason))
