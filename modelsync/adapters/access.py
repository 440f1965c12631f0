"""Who may use a cache: what to tell a user who cannot write it, or cannot read it at all.

Two setups meet a cache they may not write: a tenant pod, whose mount is read-only,
and a user outside the cache's group (the daemon and init containers share one,
`fs.DIR_MODE` is setgid). Read-only commands still run there (the index is then
built in memory from the records); what cannot run says which of the two it is, and
what to do, in one line.
"""

from __future__ import annotations

import os
from pathlib import Path

from modelsync.errors import LocalStorageError


def writable(directory: Path) -> bool:
    """Whether this process may change what is in `directory` (false on a read-only mount too)."""
    return os.access(directory, os.W_OK | os.X_OK)


def permission_hint(path: Path) -> str:
    """What to do about EACCES at `path`: join the group of the nearest directory that can be looked at."""
    for candidate in (path, *path.parents):
        try:
            gid = os.stat(candidate).st_gid
        except OSError:
            continue
        if gid != os.getegid() and gid not in os.getgroups():
            return (
                f"this user is not in the cache's group (gid {gid}): run in that group (in a pod, "
                "securityContext.supplementalGroups) or fix the cache's mode"
            )
        break
    return "run as a user in the cache's group or fix its mode"


def require_writable(root: Path, command: str) -> None:
    """Refuse, in one line saying why and what to do, a command that must change a cache it cannot."""
    state_dir = root / ".modelsync"
    if writable(state_dir):
        return
    try:
        read_only = bool(os.statvfs(state_dir).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    if read_only:
        raise LocalStorageError(
            f"{root} is on a read-only filesystem here (a tenant's read-only mount); run `modelsync "
            f"{command}` where the cache is mounted read-write (on the node, as the daemon's user)"
        )
    raise LocalStorageError(f"cannot change the cache {root}: {permission_hint(state_dir)}")
