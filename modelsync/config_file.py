"""The settings file (TOML) and setting text, read as hostile input before any setting parses them.

Every bound is checked before a parser runs, so no value reaches tomllib or json
in a shape that makes it hang, recurse or fill memory:

- the file is opened without blocking and must be a regular file (a named pipe
  would hang every command; a device would be read forever), of at most
  MAX_CONFIG_BYTES, in UTF-8;
- a value nested deeper than MAX_NESTING (arrays and tables in the file, JSON in
  a variable) is refused before it is parsed. In the file, that value alone is
  set aside as `Unusable`, so it stops only the commands that use its setting;
- a file value has the TOML type its setting reads: a path is a string, never a
  list, a table or a number that would become a directory named after its text.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path
from typing import NamedTuple

from modelsync.core.file_kind import file_kind
from modelsync.errors import ConfigError, FileTooLargeError, NotARegularFileError

__all__ = [
    "MAX_CONFIG_BYTES",
    "MAX_NESTING",
    "Unusable",
    "check_text",
    "file_text",
    "read_config_file",
    "read_regular_file",
]

#: far more than any settings file needs (a few PEM keys inline are a few KiB)
MAX_CONFIG_BYTES = 1024 * 1024
#: arrays or tables inside each other; a signature rule needs 3
MAX_NESTING = 8
_OPEN = {"[": "]", "{": "}"}
_QUOTES = ('"""', "'''", '"', "'")


class Unusable(NamedTuple):
    """A file value set aside before parsing; reading its setting raises ConfigError with `reason`."""

    reason: str


def check_text(text: str) -> None:
    """A setting's text before its parser: no NUL, bounded size and nesting; else ValueError."""
    if "\x00" in text:
        raise ValueError("contains a NUL character")
    if len(text) > MAX_CONFIG_BYTES:
        raise ValueError(f"is longer than {MAX_CONFIG_BYTES} characters")
    for _key, depth, _start, _end in _deep_values(text, top_keys=False):
        raise ValueError(_too_deep(depth))


def read_config_file(path: Path) -> dict[str, object]:
    """The file's top-level keys and values; a value nested too deeply is `Unusable`."""
    import tomllib  # only when there is a file: ~10 ms that most processes need not pay

    text = _read_text(path)
    unusable: dict[str, Unusable] = {}
    for key, depth, start, end in reversed(list(_deep_values(text, top_keys=True))):
        unusable[key] = Unusable(_too_deep(depth))
        # a placeholder of the same lines, so tomllib's line numbers still hold
        text = text[:start] + "0" + "\n" * text.count("\n", start, end) + text[end:]
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} cannot be read: {exc}") from None
    return {**data, **unusable}


def file_text(value: object, annotation: str) -> str:
    """A file value as the text its setting's parser reads, if its TOML type fits `annotation`.

    Booleans read as lowercase words, lists and tables as JSON; a setting typed as a
    tuple takes a list, a number takes a number, and every other setting (paths,
    names, URLs, modes) a string. A bad type is a ValueError.
    """
    if isinstance(value, Unusable):
        raise ValueError(value.reason)
    kind = _toml_type(value)
    if annotation.startswith("tuple["):
        allowed = {"string", "array"}
    elif annotation.split(" |")[0] in {"int", "float", "CacheBudget"}:
        allowed = {"string", "integer", "float"}
    elif annotation == "bool":
        allowed = {"string", "boolean"}
    else:
        allowed = {"string"}
    if kind not in allowed:
        wanted = " or ".join(sorted(allowed))
        raise ValueError(f"{_article(kind)} {kind} where {_article(wanted)} {wanted} belongs")
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list | dict):
        return json.dumps(value)
    return str(value)


def _article(noun: str) -> str:
    return "an" if noun[0] in "aeiou" else "a"


#: TOML's names for the types tomllib returns; bool before int, since a bool is an int
_TOML_TYPES: tuple[tuple[type, str], ...] = (
    (bool, "boolean"), (int, "integer"), (float, "float"), (list, "array"), (dict, "table"), (str, "string")
)


def _toml_type(value: object) -> str:
    return next((name for kind, name in _TOML_TYPES if isinstance(value, kind)), "date or time")


def read_regular_file(path: str | Path, limit: int) -> bytes:
    """At most `limit` bytes of a regular file (or a link to one, as a mounted ConfigMap's is).

    Every file a command reads as input (settings, CA bundle, schedule) comes through
    here: opened without blocking, so a named pipe no one writes to cannot hang the
    command (or the daemon's loop), and checked before any read, so a device or a huge
    file is refused without being read whole. Another kind is a `NotARegularFileError`, a
    longer file a `FileTooLargeError`; a path that cannot be opened is an OSError.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a socket cannot be opened at all
            raise NotARegularFileError("a socket") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotARegularFileError(file_kind(st.st_mode))
        if st.st_size > limit:
            raise FileTooLargeError(st.st_size, limit)
        with os.fdopen(os.dup(fd), "rb") as fh:
            data = fh.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:  # it grew while it was read
        raise FileTooLargeError(len(data), limit)
    return data


def _read_text(path: Path) -> str:
    try:
        data = read_regular_file(path, MAX_CONFIG_BYTES)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"config file {path} cannot be read: {exc.strerror}") from None
    except ValueError as exc:
        raise ConfigError(f"config file {path} {exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"config file {path} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); "
            "save it as UTF-8"
        ) from None


def _too_deep(depth: int) -> str:
    return f"nested more than {MAX_NESTING} levels deep (at least {depth}); a setting needs at most 3"


def _deep_values(text: str, *, top_keys: bool) -> list[tuple[str, int, int, int]]:
    """The values nested deeper than MAX_NESTING: (setting, depth, start, end) of each outermost one.

    Scans TOML (which JSON also reads as, for brackets, braces and double-quoted strings)
    without parsing it: strings and comments are skipped, `[` and `{` counted. With
    `top_keys`, a `[table]` or `[[table]]` header at the start of a line names the setting
    of the values below it, else a line's `key =` does; headers do not count as nesting.
    """
    found: list[tuple[str, int, int, int]] = []
    depth = deepest = 0
    start = 0
    table = key = ""
    i, n = 0, len(text)
    line_start = True
    while i < n:
        ch = text[i]
        if depth == 0 and top_keys and line_start and not ch.isspace():
            line_start = False
            end = text.find("\n", i)
            line = text[i : n if end < 0 else end]
            if ch == "[":
                table = line.strip("[ \t").split("]")[0].split(".")[0].strip().strip("\"'")
                i += len(line)
                continue
            if ch != "#":
                key = table or line.split("=")[0].split(".")[0].strip().strip("\"'")
        if ch == "\n":
            line_start = True
        elif ch == "#" and top_keys:
            i = n if text.find("\n", i) < 0 else text.find("\n", i)
            continue
        elif ch in "\"'":
            i = _string_end(text, i)
            continue
        elif ch in _OPEN:
            if depth == 0:
                start, deepest = i, 0
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}" and depth:
            depth -= 1
            if depth == 0 and deepest > MAX_NESTING:
                found.append((key, deepest, start, i + 1))
        i += 1
    if depth and deepest > MAX_NESTING:
        found.append((key, deepest, start, n))
    return found


def _string_end(text: str, i: int) -> int:
    """The index after the string that starts at `i` (basic strings honour backslash escapes)."""
    quote = next(q for q in _QUOTES if text.startswith(q, i))
    j = i + len(quote)
    while j < len(text):
        if quote[0] == '"' and text[j] == "\\":
            j += 2
            continue
        if text.startswith(quote, j):
            return j + len(quote)
        if len(quote) == 1 and text[j] == "\n":
            return j  # an unterminated one-line string ends with its line; tomllib reports it
        j += 1
    return len(text)
