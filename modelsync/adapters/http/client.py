"""A lean HTTP/1.1 range client: the data plane of a pull.

Why it exists: a single-process asyncio S3 client spends about one CPU core per
0.6 GiB/s on loopback, mostly in per-chunk Python work, and cannot use a second
core. The bytes themselves need only two copies (socket -> buffer, buffer ->
page cache), and both run in the kernel without the GIL. So the data plane here
is plain blocking sockets driven from a small thread pool: each thread owns
one keep-alive connection per endpoint and one preallocated buffer, receives a
body straight into that buffer with ``recv_into`` and writes it at its file
offset with ``os.pwrite``. The control plane (list, head, presign) stays on
botocore; requests here go to presigned GET URLs, with ``Range`` and
``If-Match`` sent as plain (unsigned) headers, which S3 and MinIO accept.

Memory bound: ``threads * buffer_bytes`` of user memory (plus the kernel's socket
buffers), whatever the object or part size.

This module is the socket and buffer loop only. The heads are rendered,
parsed and checked by ``adapters/http/head.py`` (pure); a refusal is turned into
its error by ``adapters/http/answer.py`` (pure); the route (proxy, tunnel)
is ``adapters/http/route.py``, its TLS trust ``adapters/http/tls.py``.

Errors: permanent conditions raise ``modelsync.errors`` types (403, 404, 412,
416, a redirect, a response that is not the range asked for). Everything worth
retrying raises ``TransientFetchError``, which records how many bytes of the
range were written before it failed, so the caller can resume from there, and
whether the store asked to slow down.

Cancellation: ``close`` shuts every socket down before closing it. Closing
alone does not wake a thread blocked in ``recv`` on Linux; ``shutdown`` does, so
a cancelled pull stops at once even when every transfer is stalled.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from modelsync.adapters.http.answer import error_for_answer
from modelsync.adapters.http.body import RateLimiter, receive_into_file, transient_error
from modelsync.adapters.http.conns import Conn, Connections
from modelsync.adapters.http.head import (
    MAX_HEAD_BYTES,
    ResponseHead,
    check_range_head,
    parse_response,
    render_request,
    size_mismatch,
)
from modelsync.adapters.http.route import Proxy, environ_proxy, parse_url
from modelsync.core.ranges import RangeRequest
from modelsync.errors import (
    TransientFetchError,
    UnexpectedResponseError,
)

__all__ = [
    "RangeClient",
    "RateLimiter",
    "SmallAnswer",
    "environ_proxy",
]

#: Error bodies longer than this are not read; the connection is dropped instead.
MAX_ERROR_BODY_BYTES = 64 * 1024
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class SmallAnswer:
    """A whole answer read into memory (``RangeClient.get_small``); header names are lower-case."""

    status: int
    headers: Mapping[str, str]
    body: bytes


class _ThreadBuffer(threading.local):
    buf: bytearray | None = None


class _StaleConnection(Exception):
    """A reused keep-alive socket died before any response byte: reconnect once."""


class RangeClient:
    """Fetch byte ranges over HTTP(S) into files; safe to share between threads.

    Each thread that calls ``fetch_into`` gets its own keep-alive connection per
    endpoint and its own ``buffer_bytes`` buffer, so threads never wait on each
    other except for the GIL, which the socket and file copies release.
    ``read_timeout_s`` bounds every wait for bytes from the server.
    """

    def __init__(
        self,
        *,
        ssl_context: ssl.SSLContext | None = None,
        connect_timeout_s: float = 10.0,
        read_timeout_s: float = 30.0,
        buffer_bytes: int = 1024 * 1024,
        rate_limiter: RateLimiter | None = None,
        wait_all: bool = True,
        proxy_for: Callable[[str], str | None] = environ_proxy,
    ) -> None:
        if buffer_bytes < MAX_HEAD_BYTES:
            raise ValueError(f"buffer_bytes must be at least {MAX_HEAD_BYTES}")
        if connect_timeout_s <= 0 or read_timeout_s <= 0:
            raise ValueError("timeouts must be positive")
        self._buffer_bytes = buffer_bytes
        self._limiter = rate_limiter
        # MSG_WAITALL lets the kernel fill a whole buffer per call: fewer syscalls
        # and GIL hand-offs. Only for plain TCP (SSL sockets take no flags).
        self._wait_all = wait_all
        self._conns = Connections(
            ssl_context=ssl_context,
            connect_timeout_s=connect_timeout_s,
            read_timeout_s=read_timeout_s,
            wait_all=wait_all,
            proxy_for=proxy_for,
        )
        self._local = _ThreadBuffer()

    def fetch_into(
        self,
        req: RangeRequest,
        fd: int,
        file_offset: int,
        on_progress: Callable[[int], None] | None = None,
    ) -> int:
        """GET ``req``'s range and write its body at ``file_offset`` of ``fd``.

        Blocks; returns the number of bytes written (always ``end - start``).
        ``on_progress`` is called with each batch of bytes written.
        """
        if not 0 <= req.start < req.end:
            raise ValueError(f"empty or negative range [{req.start}, {req.end})")

        def answer(conn: Conn, head: ResponseHead, filled: int, proxy: Proxy | None) -> int | Exception:
            if head.status not in (200, 206):
                return self._error_for_status(conn, head, filled, req, proxy)
            check_range_head(head, req.start, req.end, req.size_bytes)
            want = req.end - req.start
            early = filled - head.body_start
            if early > want:
                raise UnexpectedResponseError("server sent more bytes than the range")
            buf = self._buffer()
            buf[:early] = bytes(buf[head.body_start : filled])  # body bytes that came with the head go first
            tcp = self._wait_all and not isinstance(conn.sock, ssl.SSLSocket)
            flags = socket.MSG_WAITALL if tcp else 0
            return receive_into_file(
                conn.sock, buf, early, want, fd, file_offset, flags, self._limiter, on_progress
            )

        return self._exchange(req.url, (req.start, req.end - 1), req.etag, req.headers, answer)

    def get_small(self, url: str, limit_bytes: int, headers: Mapping[str, str] | None = None) -> SmallAnswer:
        """GET a whole small object (a manifest) into memory; every status is returned, not raised.

        The control plane's reads need the answer itself: a missing key is not an
        error there. A 200 must carry all its body, framed by Content-Length and
        at most ``limit_bytes``, else UnexpectedResponseError; an error's body is
        read up to MAX_ERROR_BODY_BYTES. A failed connection raises
        TransientFetchError, as for a range.
        """

        def answer(conn: Conn, head: ResponseHead, filled: int, _: Proxy | None) -> SmallAnswer | Exception:
            limit = limit_bytes if head.status == 200 else MAX_ERROR_BODY_BYTES
            body = self._read_small_body(conn, head, filled, limit)
            if head.status == 200 and (body is None or len(body) != int(head.headers["content-length"])):
                length = head.headers.get("content-length")
                return UnexpectedResponseError(
                    f"{url.split('?', 1)[0]}: a body of {length or 'unframed'} bytes, not a whole "
                    f"object of at most {limit_bytes}"
                )
            return SmallAnswer(head.status, head.headers, body or b"")

        return self._exchange(url, None, None, headers or {}, answer)

    def _exchange(
        self,
        url: str,
        byte_range: tuple[int, int] | None,
        etag: str | None,
        headers: Mapping[str, str],
        answer: Callable[[Conn, ResponseHead, int, Proxy | None], _T | Exception],
    ) -> _T:
        """One GET on this thread's connection: send, read the head, let ``answer`` read the rest.

        A reused connection found dead before any response byte is replaced
        once. ``answer``'s outcome is raised when it is an exception, after the
        connection was kept or dropped: an error answer whose small body was
        read leaves the connection usable.
        """
        if self._conns.closed:
            raise RuntimeError("RangeClient is closed")
        endpoint, target = parse_url(url)
        proxy = self._conns.proxy(endpoint, url)
        extra: dict[str, str] = {}
        if proxy is not None and not endpoint.tls:
            # Through a forward proxy, plain http asks for the absolute URL (RFC 9112 3.2.2).
            target = f"http://{endpoint.netloc}{target}"
            if proxy.authorization:
                extra["Proxy-Authorization"] = proxy.authorization
        request = render_request(endpoint.netloc, target, byte_range, etag, {**headers, **extra})
        for attempt in (1, 2):
            conn = self._conns.get(endpoint)
            try:
                head, filled = self._send_and_read_head(conn, request)
            except _StaleConnection:
                self._conns.drop(endpoint)
                if attempt == 2:
                    raise TransientFetchError(
                        f"connection to {endpoint.netloc} closed before a response",
                        bytes_written=0,
                        reason="reset",
                    ) from None
                continue
            except BaseException:
                self._conns.drop(endpoint)
                raise
            try:
                outcome = answer(conn, head, filled, proxy)
            except BaseException:
                self._conns.drop(endpoint)
                raise
            self._conns.done(endpoint, head.keep_alive)
            if isinstance(outcome, Exception):
                raise outcome
            return outcome
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Shut down and close every connection of every thread, waking any blocked in ``recv``."""
        self._conns.close()

    def __enter__(self) -> RangeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _buffer(self) -> memoryview:
        state = self._local
        if state.buf is None:
            state.buf = bytearray(self._buffer_bytes)
        return memoryview(state.buf)

    # -- one exchange ---------------------------------------------------------

    def _send_and_read_head(self, conn: Conn, request: bytes) -> tuple[ResponseHead, int]:
        """Send the request and receive its final response head; also how full the buffer is.

        Body bytes that came with the head stay in the thread buffer from ``body_start`` on.
        """
        buf = self._buffer()
        raw = self._local.buf
        assert raw is not None
        try:
            conn.sock.sendall(request)
        except (BrokenPipeError, ConnectionResetError) as exc:
            if conn.reused:
                raise _StaleConnection from exc
            raise transient_error(exc, 0) from exc
        except OSError as exc:
            raise transient_error(exc, 0) from exc
        filled = 0
        while True:
            try:
                n = conn.sock.recv_into(buf[filled:MAX_HEAD_BYTES])
            except ConnectionResetError as exc:
                if conn.reused and filled == 0:
                    raise _StaleConnection from exc
                raise transient_error(exc, 0) from exc
            except OSError as exc:
                raise transient_error(exc, 0) from exc
            if n == 0:
                if conn.reused and filled == 0:
                    raise _StaleConnection
                raise TransientFetchError(
                    "connection closed inside the response head", bytes_written=0, reason="reset"
                )
            filled += n
            # Parse only once these bytes complete a head (the final one, or an interim 1xx).
            if raw.find(b"\r\n\r\n", max(0, filled - n - 3), filled) >= 0 or filled >= MAX_HEAD_BYTES:
                head = parse_response(raw, filled)
                if head is not None:
                    return head, filled

    def _error_for_status(
        self, conn: Conn, head: ResponseHead, filled: int, req: RangeRequest, proxy: Proxy | None
    ) -> Exception:
        body = self._read_small_body(conn, head, filled, MAX_ERROR_BODY_BYTES) or b""
        mismatch = size_mismatch(head, req.size_bytes) if head.status == 416 else None
        if mismatch is not None:  # a range past the end: its Content-Range says how big the object is
            return mismatch
        return error_for_answer(
            head.status,
            head.headers,
            body,
            url=req.url,
            where=f"{req.url.split('?', 1)[0]} bytes {req.start}-{req.end - 1}",
            proxy_netloc=proxy.netloc if proxy is not None else None,
            now=time.time(),
        )

    def _read_small_body(self, conn: Conn, head: ResponseHead, filled: int, limit_bytes: int) -> bytes | None:
        """Read a body of at most ``limit_bytes``, which keeps the connection; None for a larger or
        unframed one, whose connection is dropped. A body cut short is returned as far as it came."""
        length_text = head.headers.get("content-length")
        if length_text is None or int(length_text) > limit_bytes:
            head.keep_alive = False
            return None
        length = int(length_text)
        buf = self._buffer()
        have = filled - head.body_start
        body = bytearray(buf[head.body_start : head.body_start + min(have, length)])
        try:
            while len(body) < length:
                chunk = conn.sock.recv(length - len(body))
                if not chunk:
                    break
                body += chunk
        except OSError:
            head.keep_alive = False
        if len(body) < length or have > length:
            head.keep_alive = False
        return bytes(body)
