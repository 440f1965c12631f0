"""The data plane's request type, shared by the engine's fetcher port and the HTTP adapter.

It lives in core so that the port (engine/ports.py) owns it while the adapter
that implements the port (adapters/http/client.py) can still name it:
dependencies point inward, never from adapters up to the engine.
"""

from __future__ import annotations

from collections.abc import Mapping
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
