"""One GET on a thread's keep-alive connection: send, read the head, hand the rest over.

The request/response cycle of ``adapters/http/client.py`` ``RangeClient``, apart
from what the answers mean: each thread owns one connection per endpoint
(``adapters/http/conns.py``) and one preallocated buffer, which receives the head
and the body bytes that came with it. A reused connection found dead before any
response byte is replaced once; small bodies (errors, a manifest) are read here
so that an error answer leaves its connection usable.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import TypeVar

from modelsync.adapters.http.body import transient_error
from modelsync.adapters.http.conns import Conn, Connections
from modelsync.adapters.http.head import MAX_HEAD_BYTES, ResponseHead, parse_response, render_request
from modelsync.adapters.http.route import Proxy, parse_url
from modelsync.errors import TransientFetchError

#: Error bodies longer than this are not read; the connection is dropped instead.
MAX_ERROR_BODY_BYTES = 64 * 1024
_T = TypeVar("_T")


class _ThreadBuffer(threading.local):
    buf: bytearray | None = None


class _StaleConnection(Exception):
    """A reused keep-alive socket died before any response byte: reconnect once."""


class Exchanges:
    """One GET at a time per thread, each on its thread's connection and buffer; closable at once."""

    def __init__(self, conns: Connections, buffer_bytes: int) -> None:
        self._conns = conns
        self._buffer_bytes = buffer_bytes
        self._local = _ThreadBuffer()

    def buffer(self) -> memoryview:
        """This thread's buffer: a response head, then the body bytes that came with it."""
        state = self._local
        if state.buf is None:
            state.buf = bytearray(self._buffer_bytes)
        return memoryview(state.buf)

    def run(
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
        room = MAX_HEAD_BYTES
        if byte_range is not None and byte_range[1] - byte_range[0] < MAX_HEAD_BYTES:
            # a small range comes in the same receive as its head: one syscall (and one hand-off of
            # the interpreter lock) less a file for a model of many small files; bounded, as the
            # body bytes that come with the head are then moved to the front of the buffer
            room = min(self._buffer_bytes, room + byte_range[1] - byte_range[0] + 1)
        for attempt in (1, 2):
            conn = self._conns.get(endpoint)
            try:
                head, filled = self._send_and_read_head(conn, request, room)
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

    def _send_and_read_head(self, conn: Conn, request: bytes, room: int) -> tuple[ResponseHead, int]:
        """Send the request and receive its final response head; also how full the buffer is.

        Receives up to ``room`` bytes (at least MAX_HEAD_BYTES); body bytes that came with the
        head stay in the thread buffer from ``body_start`` on.
        """
        buf = self.buffer()
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
                n = conn.sock.recv_into(buf[filled:room])
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

    def read_small_body(self, conn: Conn, head: ResponseHead, filled: int, limit_bytes: int) -> bytes | None:
        """Read a body of at most ``limit_bytes``, which keeps the connection; None for a larger or
        unframed one, whose connection is dropped. A body cut short is returned as far as it came."""
        length_text = head.headers.get("content-length")
        if length_text is None or int(length_text) > limit_bytes:
            head.keep_alive = False
            return None
        length = int(length_text)
        buf = self.buffer()
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
