"""The data plane's request type and its write callback, shared by the engine's fetcher port and the
HTTP adapter.

It lives in core so that the port (engine/ports.py) owns it while the adapter
that implements the port (adapters/http/client.py) can still name it:
dependencies point inward, never from adapters up to the engine.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class RangeRequest:
    """One ranged GET: bytes ``[start, end)`` of the object at ``url``.

    ``etag`` becomes ``If-Match`` so a range of a different object version is
    refused (412) instead of being stitched into the file. ``size_bytes``, the
    object's size as the manifest or listing gives it, must be the size the
    answer states, or the answer is refused with SizeMismatchError.
    """

    url: str
    start: int
    end: int
    etag: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    size_bytes: int | None = None


#: told of each stretch of a body as it is written, `(file offset, bytes)`, while the receive buffer
#: still holds it: the file's hasher takes it from there instead of reading it back
OnWritten = Callable[[int, memoryview], None]
