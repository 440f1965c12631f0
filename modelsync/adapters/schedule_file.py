"""Read a schedule file from disk: bounded, decoded, and loaded, every failure one located line.

The daemon and `modelsync plan` share this, so a file the plan accepts is one
the daemon accepts. A huge file or a device is refused without being read whole.
"""

from __future__ import annotations

from pathlib import Path

from modelsync.config_file import read_regular_file
from modelsync.core.schedule import MAX_SCHEDULE_BYTES, Schedule, load_schedule, schedule_too_large
from modelsync.errors import FileTooLargeError, NotARegularFileError, ScheduleError


def read_schedule_bytes(path: Path) -> bytes:
    """The schedule file's bytes, through the one reader of input files (config_file.py)."""
    try:
        return read_regular_file(path, MAX_SCHEDULE_BYTES)
    except NotARegularFileError as exc:
        raise ScheduleError(
            f"{path}: the schedule is {exc.kind}, not a regular file; point --schedule at a YAML file "
            "or a ConfigMap key"
        ) from None
    except FileTooLargeError as exc:
        raise schedule_too_large(str(path), exc.size) from None
    except OSError as exc:
        raise ScheduleError(f"{path}: cannot read the schedule: {exc.strerror or exc}") from None


def parse_schedule_bytes(data: bytes, path: Path) -> Schedule:
    """Decode (UTF-8) and load."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ScheduleError(f"{path}:{line}: the schedule is not UTF-8 text") from None
    return load_schedule(text, str(path))


def read_schedule(path: Path) -> Schedule:
    return parse_schedule_bytes(read_schedule_bytes(path), path)
