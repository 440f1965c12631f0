"""The heads of a ranged GET: render the request head, parse and check the response head.

Pure: bytes in, values or ``UnexpectedResponseError`` out, no socket, no clock.
The socket loop of ``adapters/http/client.py`` feeds it what it has received so
far; everything a hostile or broken server can get wrong in a head is decided
here and tested with tables (tests/test_http_head.py).

What is refused, and why:
- a malformed status line or header line (no colon, whitespace before the
  colon, a name that is not a token, obsolete line folding, a control byte in a
  value): framing can no longer be trusted;
- a repeated ``Content-Length`` or ``Content-Range``, even with equal values:
  the body's length and its offset in the file rest on them (RFC 9112 6.3
  leaves accepting identical copies to the recipient; a store never sends them);
- ``101 Switching Protocols``: no upgrade was asked for.

Interim ``1xx`` answers (``100 Continue``, ``103 Early Hints``) carry no body
and are skipped: the final answer follows them on the same connection.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from modelsync.errors import SizeMismatchError, UnexpectedResponseError

#: The response head (status line and headers, interim answers included) must fit in this many bytes.
MAX_HEAD_BYTES = 64 * 1024

_END = b"\r\n\r\n"
_STATUS_LINE = re.compile(rb"HTTP/1\.([01]) ([1-5][0-9][0-9])(?: [\t -~\x80-\xff]*)?")
#: the bytes of a field name (RFC 9110 token)
_TOKEN_BYTES = b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
#: a control byte in a line (HTAB is allowed; CR and LF are only in the line ends)
_CONTROL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
#: fields that frame the body or place it in the file: one copy, or the answer is refused
_SINGLETONS = frozenset({"content-length", "content-range"})
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")
#: the object's size in a Content-Range, of a range sent (206) or refused (416: ``bytes */SIZE``)
_RANGE_TOTAL = re.compile(r"bytes (?:\d+-\d+|\*)/(\d+)")


@dataclass(slots=True)
class ResponseHead:
    """A final response head; ``body_start`` is where its body begins in the bytes parsed."""

    status: int
    headers: dict[str, str]
    keep_alive: bool
    body_start: int


def render_request(
    netloc: str,
    target: str,
    byte_range: tuple[int, int] | None,
    etag: str | None,
    headers: Mapping[str, str],
) -> bytes:
    """The head of a GET of ``target`` at ``netloc``: bytes ``[first, last]`` of it, or all of it.

    ``etag`` becomes a quoted ``If-Match`` (RFC 9110 entity tag; nginx refuses the
    bare form with 412). A line break in a header would split the request: refused.
    """
    lines = [f"GET {target} HTTP/1.1", f"Host: {netloc}"]
    if byte_range is not None:
        lines.append(f"Range: bytes={byte_range[0]}-{byte_range[1]}")
    lines += ["Accept-Encoding: identity", "User-Agent: modelsync"]
    if etag is not None:
        lines.append(f'If-Match: "{etag.strip(chr(34))}"')
    for name, value in headers.items():
        if "\r" in name or "\n" in name or "\r" in value or "\n" in value:
            raise ValueError(f"header {name!r} contains a line break")
        lines.append(f"{name}: {value}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def parse_response(data: bytes | bytearray, filled: int) -> ResponseHead | None:
    """The final response head in ``data[:filled]``, past any interim 1xx; None until it is whole.

    Raises UnexpectedResponseError for a malformed head, and once ``filled``
    reaches MAX_HEAD_BYTES without a final head. Bytes past MAX_HEAD_BYTES (a small
    body received with its head) never count as head.
    """
    start = 0
    while True:
        end = data.find(_END, start, min(filled, MAX_HEAD_BYTES))
        if end < 0:
            if filled >= MAX_HEAD_BYTES:
                raise UnexpectedResponseError(f"response head longer than {MAX_HEAD_BYTES} bytes")
            return None
        status, headers, keep_alive = parse_head(bytes(data[start:end]))
        if status >= 200:
            return ResponseHead(status, headers, keep_alive, end + len(_END))
        if status == 101:
            raise UnexpectedResponseError("the server switched protocols (101), which was not asked for")
        start = end + len(_END)  # an interim answer: the final one follows


def parse_head(raw: bytes) -> tuple[int, dict[str, str], bool]:
    """Status, headers (lower-case names) and keep-alive of one head, without its blank line.

    Repeated fields other than the singletons are combined with ", " (RFC 9110 5.3).
    """
    status_line, *lines = raw.split(b"\r\n")
    match = _STATUS_LINE.fullmatch(status_line)
    if match is None:
        raise UnexpectedResponseError(f"not an HTTP/1.x status line: {status_line[:80]!r}")
    if _CONTROL.search(raw.replace(b"\r\n", b"\t")):  # one pass over the head, not one per line
        line = next(line for line in lines if _CONTROL.search(line))
        raise UnexpectedResponseError(f"control character in header line {line[:80]!r}")
    headers: dict[str, str] = {}
    for line in lines:
        name, value = _field(line)
        if name in headers:
            if name in _SINGLETONS:
                raise UnexpectedResponseError(
                    f"{name} sent twice ({headers[name]!r} and {value!r}); the body's framing is ambiguous"
                )
            headers[name] += ", " + value
        else:
            headers[name] = value
    length = headers.get("content-length")
    if length is not None and not length.isdigit():
        raise UnexpectedResponseError(f"content-length {length!r} is not a number of bytes")
    tokens = {t.strip() for t in headers.get("connection", "").lower().split(",")}
    keep_alive = match.group(1) == b"1" and "close" not in tokens
    return int(match.group(2)), headers, keep_alive


def _field(line: bytes) -> tuple[str, str]:
    """One field line as (lower-case name, value without its surrounding whitespace)."""
    if line[:1] in (b" ", b"\t"):
        raise UnexpectedResponseError(f"obsolete line folding in the response head: {line[:80]!r}")
    name, sep, value = line.partition(b":")
    if not sep or not _is_token(name):
        raise UnexpectedResponseError(f"malformed header line {line[:80]!r}")
    return name.lower().decode("ascii"), value.strip(b" \t").decode("latin-1")


def _is_token(name: bytes) -> bool:
    # isalnum is ASCII-only on bytes: the common names pass there, the rest by the full set
    return name.replace(b"-", b"").isalnum() or (bool(name) and not name.translate(None, _TOKEN_BYTES))


def object_size_bytes(head: ResponseHead) -> int | None:
    """The object's size as the store states it: a Content-Range's total, or a whole 200's length."""
    if head.status == 200:
        length = head.headers.get("content-length")
        return int(length) if length is not None else None
    match = _RANGE_TOTAL.fullmatch(head.headers.get("content-range", ""))
    return int(match.group(1)) if match else None


def size_mismatch(head: ResponseHead, size_bytes: int | None) -> SizeMismatchError | None:
    """The store is the truth for sizes: an answer that states another size than ``size_bytes`` is refused.

    Checked before the range itself, so a manifest that misstates a size is an
    integrity error, never an unexpected answer or an outage.
    """
    stated = object_size_bytes(head) if size_bytes is not None else None
    if stated is None or stated == size_bytes:
        return None
    return SizeMismatchError(f"the store holds {stated} bytes, not {size_bytes}", store_bytes=stated)


def check_range_head(head: ResponseHead, start: int, end: int, size_bytes: int | None = None) -> None:
    """A 2xx head must carry exactly bytes ``[start, end)``, or they would land at the wrong offset.

    A 206 names its range in Content-Range; a 200 means the server ignored Range
    and sent the whole object, which is our range only if the range is the whole
    object. The body must be framed by Content-Length, never chunked. With
    ``size_bytes`` (the object's size the caller was told), the size the answer
    states must be that one (`size_mismatch`).
    """
    mismatch = size_mismatch(head, size_bytes)
    if mismatch is not None:
        raise mismatch
    want = end - start
    length = head.headers.get("content-length")
    if head.status == 206:
        value = head.headers.get("content-range", "")
        match = _CONTENT_RANGE.fullmatch(value)
        if match is None or int(match.group(1)) != start or int(match.group(2)) != end - 1:
            raise UnexpectedResponseError(f"asked for bytes {start}-{end - 1}, got Content-Range {value!r}")
    elif head.status != 200 or start != 0 or length is None or int(length) != want:
        raise UnexpectedResponseError(
            f"asked for bytes {start}-{end - 1} and got the whole object "
            f"(status {head.status}, content-length {length})"
        )
    if "chunked" in head.headers.get("transfer-encoding", "").lower():
        raise UnexpectedResponseError("chunked body for a range; expected Content-Length")
    if length is not None and int(length) != want:
        raise UnexpectedResponseError(f"content-length {length} for a range of {want} bytes")
