"""Read a schedule file from disk: bounded, decoded, and loaded, every failure one located line.

The daemon and `modelsync plan` share this, so a file the plan accepts is one
the daemon accepts. Reading stops just past the size limit, so a huge file
(or a device) is refused without being read whole.
"""

from __future__ import annotations

from pathlib import Path

from modelsync.core.schedule import MAX_SCHEDULE_BYTES, Schedule, load_schedule
from modelsync.errors import ScheduleError


def read_schedule_bytes(path: Path) -> bytes:
    """At most one byte more than the limit, so the loader can refuse an oversized file."""
    try:
        with path.open("rb") as fh:
            return fh.read(MAX_SCHEDULE_BYTES + 1)
    except OSError as exc:
        raise ScheduleError(f"{path}: cannot read the schedule: {exc.strerror or exc}") from None


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
