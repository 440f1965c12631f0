"""Key safety: turn an S3 key suffix into a relative path that cannot escape the cache.

S3 keys are arbitrary strings; a file path is not. A key such as `../x`, `/abs`,
`a/./b` or `a//b` would either escape the model directory or alias another key
once joined onto a path, so such keys are refused instead of normalised: two
distinct keys must never land on one file.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from modelsync.errors import UnsafeKeyError

#: Linux NAME_MAX; the staging suffixes we add must still fit.
MAX_SEGMENT_BYTES = 200
MAX_PATH_BYTES = 3000
_FORBIDDEN_CHARS = {"\\": "backslash", "\x00": "NUL byte"}
_RESERVED_SEGMENTS = {".", ".."}


def safe_relative_path(relative_key: str) -> PurePosixPath:
    """Validate the part of a key below the model prefix and return it as a path.

    Raises UnsafeKeyError naming the key and the rule it breaks.
    """

    def refuse(reason: str) -> UnsafeKeyError:
        return UnsafeKeyError(f"refusing key {relative_key!r}: {reason}; rename the object in the bucket")

    if not relative_key:
        raise refuse("empty file name")
    for char, name in _FORBIDDEN_CHARS.items():
        if char in relative_key:
            raise refuse(f"contains a {name}")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in relative_key):
        raise refuse("contains a control character")
    if relative_key.startswith("/"):
        raise refuse("absolute path")
    if len(relative_key.encode()) > MAX_PATH_BYTES:
        raise refuse(f"{len(relative_key.encode())} bytes long, over the limit of {MAX_PATH_BYTES}")
    segments = relative_key.split("/")
    for segment in segments:
        if segment == "":
            raise refuse("empty path segment ('//' or trailing '/')")
        if segment in _RESERVED_SEGMENTS:
            raise refuse(f"path segment {segment!r}")
        if len(segment.encode()) > MAX_SEGMENT_BYTES:
            raise refuse(
                f"a path segment of {len(segment.encode())} bytes, over the limit of {MAX_SEGMENT_BYTES}"
            )
    return PurePosixPath(*segments)
