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

This module reads what a range or a small GET answers; the request cycle on each
thread's connection and buffer is ``adapters/http/exchange.py``, the body's copy
``adapters/http/body.py``. The heads are rendered,
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
import time
from collections.abc import Callable, Mapping
from typing import NamedTuple

from modelsync.adapters.http.answer import error_for_answer
from modelsync.adapters.http.body import RateLimiter, receive_into_file
from modelsync.adapters.http.conns import Conn, Connections
from modelsync.adapters.http.exchange import MAX_ERROR_BODY_BYTES, Exchanges
from modelsync.adapters.http.head import MAX_HEAD_BYTES, ResponseHead, check_range_head, size_mismatch
from modelsync.adapters.http.route import Proxy, environ_proxy
from modelsync.core.ranges import OnWritten, RangeRequest
from modelsync.errors import UnexpectedResponseError

__all__ = [
    "RangeClient",
    "RateLimiter",
    "SmallAnswer",
    "environ_proxy",
]



class SmallAnswer(NamedTuple):
    """A whole answer read into memory (``RangeClient.get_small``); header names are lower-case."""

    status: int
    headers: Mapping[str, str]
    body: bytes


class RangeClient:
    """Fetch byte ranges over HTTP(S) into files; safe to share between threads.

    Each thread that calls ``fetch_into`` gets its own keep-alive connection per
    endpoint and its own ``buffer_bytes`` buffer, so threads never wait on each
    other except for the GIL, which the socket and file copies release.
    ``read_timeout_s`` bounds every wait for bytes from the server. A capped
    client (``rate_limiter``) also takes ``receive_buffer_bytes`` (see
    http/rate_limit.py `capped_read_bytes`).
    """

    def __init__(
        self,
        *,
        ssl_context: ssl.SSLContext | None = None,
        connect_timeout_s: float = 10.0,
        read_timeout_s: float = 30.0,
        buffer_bytes: int = 1024 * 1024,
        rate_limiter: RateLimiter | None = None,
        receive_buffer_bytes: int | None = None,
        wait_all: bool = True,
        proxy_for: Callable[[str], str | None] = environ_proxy,
    ) -> None:
        if buffer_bytes < MAX_HEAD_BYTES:
            raise ValueError(f"buffer_bytes must be at least {MAX_HEAD_BYTES}")
        if connect_timeout_s <= 0 or read_timeout_s <= 0:
            raise ValueError("timeouts must be positive")
        self._limiter = rate_limiter
        # MSG_WAITALL lets the kernel fill a whole buffer per call: fewer syscalls
        # and GIL hand-offs. Only for plain TCP (SSL sockets take no flags).
        self._wait_all = wait_all
        conns = Connections(
            ssl_context=ssl_context,
            connect_timeout_s=connect_timeout_s,
            read_timeout_s=read_timeout_s,
            wait_all=wait_all,
            proxy_for=proxy_for,
            receive_buffer_bytes=receive_buffer_bytes,
        )
        self._exchanges = Exchanges(conns, buffer_bytes)

    def fetch_into(
        self,
        req: RangeRequest,
        fd: int,
        file_offset: int,
        on_progress: Callable[[int], None] | None = None,
        on_written: OnWritten | None = None,
    ) -> int:
        """GET ``req``'s range and write its body at ``file_offset`` of ``fd``.

        Blocks; returns the number of bytes written (always ``end - start``).
        ``on_progress`` is called with each batch of bytes written, ``on_written``
        with each buffer written (its file offset and bytes), before the buffer is reused.
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
            buf = self._exchanges.buffer()
            buf[:early] = bytes(buf[head.body_start : filled])  # body bytes that came with the head go first
            tcp = self._wait_all and not isinstance(conn.sock, ssl.SSLSocket)
            flags = socket.MSG_WAITALL if tcp else 0
            return receive_into_file(
                conn.sock, buf, early, want, fd, file_offset, flags, self._limiter, on_progress, on_written
            )

        return self._exchanges.run(req.url, (req.start, req.end - 1), req.etag, req.headers, answer)

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
            body = self._exchanges.read_small_body(conn, head, filled, limit)
            if head.status == 200 and (body is None or len(body) != int(head.headers["content-length"])):
                length = head.headers.get("content-length")
                return UnexpectedResponseError(
                    f"{url.split('?', 1)[0]}: a body of {length or 'unframed'} bytes, not a whole "
                    f"object of at most {limit_bytes}"
                )
            return SmallAnswer(head.status, head.headers, body or b"")

        return self._exchanges.run(url, None, None, headers or {}, answer)

    def close(self) -> None:
        """Shut down and close every connection of every thread, waking any blocked in ``recv``."""
        self._exchanges.close()

    def __enter__(self) -> RangeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _error_for_status(
        self, conn: Conn, head: ResponseHead, filled: int, req: RangeRequest, proxy: Proxy | None
    ) -> Exception:
        body = self._exchanges.read_small_body(conn, head, filled, MAX_ERROR_BODY_BYTES) or b""
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
