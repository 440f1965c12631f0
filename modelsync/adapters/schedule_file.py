"""Read a schedule file from disk: bounded, decoded, and loaded, every failure one located line.

The daemon and `modelsync plan` share this, so a file the plan accepts is one
the daemon accepts. Reading stops just past the size limit, so a huge file
(or a device) is refused without being read whole.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from modelsync.core.file_kind import file_kind
from modelsync.core.schedule import MAX_SCHEDULE_BYTES, Schedule, load_schedule, schedule_too_large
from modelsync.errors import ScheduleError


def read_schedule_bytes(path: Path) -> bytes:
    """At most one byte more than the limit, so the loader can refuse an oversized file.

    Only a regular file (or a link to one, as a mounted ConfigMap's is) is read:
    a FIFO would block the reader until someone writes to it (the daemon's whole
    event loop), a device would never end. It is opened without blocking and
    checked before any read.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a socket: it cannot be opened at all
            raise ScheduleError(f"{path}: {_NOT_A_FILE.format(kind='a socket')}") from None
        raise ScheduleError(f"{path}: cannot read the schedule: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ScheduleError(f"{path}: {_NOT_A_FILE.format(kind=file_kind(st.st_mode))}")
        if st.st_size > MAX_SCHEDULE_BYTES:  # its real size: the read below stops past the limit
            raise schedule_too_large(str(path), st.st_size)
        with os.fdopen(os.dup(fd), "rb") as fh:
            return fh.read(MAX_SCHEDULE_BYTES + 1)
    except OSError as exc:
        raise ScheduleError(f"{path}: cannot read the schedule: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


_NOT_A_FILE = "the schedule is {kind}, not a regular file; point --schedule at a YAML file or a ConfigMap key"


def parse_schedule_bytes(data: bytes, path: Path) -> Schedule:
    """Decode (UTF-8) and load; the loader reports an oversized file before anything else."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        if len(data) <= MAX_SCHEDULE_BYTES:
            line = data.count(b"\n", 0, exc.start) + 1
            raise ScheduleError(f"{path}:{line}: the schedule is not UTF-8 text") from None
        text = data.decode("utf-8", errors="replace")  # cut mid-character by the bounded read
    return load_schedule(text, str(path))


def read_schedule(path: Path) -> Schedule:
    return parse_schedule_bytes(read_schedule_bytes(path), path)
