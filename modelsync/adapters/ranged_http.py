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

Errors: every answer is classified once, by ``modelsync.core.retry.classify``
(status and S3 error code, never message text). Permanent conditions raise
``modelsync.errors`` types (403, 404, 412, 416, a redirect, a response that is
not the range asked for). Everything worth retrying raises
``TransientFetchError``, which records how many bytes of the range were written
before it failed, so the caller can resume from there, and whether the store
asked to slow down.

Proxies: the route to an endpoint is the one botocore takes for the control
plane (``HTTPS_PROXY`` / ``HTTP_PROXY`` / ``NO_PROXY``, resolved by botocore's
own functions): a CONNECT tunnel for https, absolute-form requests for http.

Cancellation: ``close`` shuts every socket down before closing it. Closing
alone does not wake a thread blocked in ``recv`` on Linux; ``shutdown`` does, so
a cancelled pull stops at once even when every transfer is stalled.
"""

from __future__ import annotations

import base64
import contextlib
import email.utils
import errno
import os
import re
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import unquote, urlsplit

from modelsync.core.retry import Verdict, classify, presigned_expiry
from modelsync.errors import (
    AccessDeniedError,
    DiskFullError,
    LocalStorageError,
    NotFoundError,
    ObjectChangedError,
    PresignedUrlExpiredError,
    RemoteUnavailableError,
    TransientFetchError,
    UnexpectedResponseError,
    UsageError,
    WrongEndpointError,
)

__all__ = [
    "RangeClient",
    "RangeRequest",
    "RateLimiter",
    "environ_proxy",
    "make_ssl_context",
]

#: The response head (status line and headers) must fit in this many bytes.
MAX_HEAD_BYTES = 64 * 1024
#: Error bodies longer than this are not read; the connection is dropped instead.
MAX_ERROR_BODY_BYTES = 64 * 1024
#: Seconds of clock difference tolerated when deciding that a presigned URL had expired.
EXPIRY_SLACK_S = 5.0
_CONTENT_RANGE = re.compile(rb"bytes (\d+)-(\d+)/(\d+|\*)")
_XML_CODE = re.compile(rb"<Code>([^<]{1,128})</Code>")
_XML_MESSAGE = re.compile(rb"<Message>([^<]{0,512})</Message>")
_XML_ENDPOINT = re.compile(rb"<Endpoint>([^<]{1,256})</Endpoint>")


@dataclass(frozen=True, slots=True)
class RangeRequest:
    """One ranged GET: bytes ``[start, end)`` of the object at ``url``.

    ``etag`` becomes ``If-Match`` so a range of a different object version is
    refused (412) instead of being stitched into the file.
    """

    url: str
    start: int
    end: int
    etag: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)


class RateLimiter(Protocol):
    """A shared bandwidth cap; ``consume`` blocks until ``n_bytes`` may pass."""

    def consume(self, n_bytes: int) -> None: ...


def make_ssl_context(*, ca_bundle: str | None = None, insecure: bool = False) -> ssl.SSLContext:
    """The TLS context for the data plane: system trust, a CA bundle, or (explicitly) none."""
    if insecure:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx
    return ssl.create_default_context(cafile=ca_bundle)


@dataclass(frozen=True, slots=True)
class _Endpoint:
    scheme: str
    host: str
    port: int
    netloc: str


@dataclass(frozen=True, slots=True)
class _Proxy:
    """An http:// forward proxy, and the Proxy-Authorization value its URL carries."""

    host: str
    port: int
    netloc: str
    authorization: str | None


def environ_proxy(url: str) -> str | None:
    """The proxy botocore's control plane uses for ``url``, or None for a direct route.

    Resolved by botocore's own functions from ``HTTPS_PROXY`` / ``HTTP_PROXY`` /
    ``NO_PROXY`` (and their lower-case forms), so both planes always agree.
    """
    from botocore.httpsession import ProxyConfiguration
    from botocore.utils import get_environ_proxies

    proxy: str | None = ProxyConfiguration(proxies=get_environ_proxies(url)).proxy_url_for(url)
    return proxy


@dataclass(slots=True)
class _Head:
    status: int
    headers: dict[str, str]
    keep_alive: bool
    body_start: int  # offset in the thread buffer where body bytes begin
    filled: int  # bytes of the thread buffer holding data


class _Conn:
    """One socket and whether it has already served a request (may be stale)."""

    __slots__ = ("reused", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.reused = False


class _ThreadState(threading.local):
    conns: dict[_Endpoint, _Conn]
    buf: bytearray | None

    def __init__(self) -> None:
        self.conns = {}
        self.buf = None


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
        self._ssl = ssl_context
        self._connect_timeout_s = connect_timeout_s
        self._read_timeout_s = read_timeout_s
        self._buffer_bytes = buffer_bytes
        self._limiter = rate_limiter
        # MSG_WAITALL lets the kernel fill a whole buffer per call: fewer syscalls
        # and GIL hand-offs. Only for plain TCP (SSL sockets take no flags).
        self._wait_all = wait_all
        self._proxy_for = proxy_for
        self._proxies: dict[_Endpoint, _Proxy | None] = {}
        self._local = _ThreadState()
        self._lock = threading.Lock()
        self._all_socks: set[socket.socket] = set()
        self._closed = False

    # -- public ---------------------------------------------------------------

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
        if self._closed:
            raise RuntimeError("RangeClient is closed")
        endpoint, target = _parse_url(req.url)
        proxy = self._proxy(endpoint, req.url)
        extra: dict[str, str] = {}
        if proxy is not None and endpoint.scheme == "http":
            # Through a forward proxy, plain http asks for the absolute URL (RFC 9112 3.2.2).
            target = f"http://{endpoint.netloc}{target}"
            if proxy.authorization:
                extra["Proxy-Authorization"] = proxy.authorization
        request = _render_request(endpoint, target, req, extra)
        for attempt in (1, 2):
            conn = self._connection(endpoint)
            try:
                head = self._send_and_read_head(conn, request)
            except _StaleConnection:
                self._drop(endpoint)
                if attempt == 2:
                    raise TransientFetchError(
                        f"connection to {endpoint.netloc} closed before a response",
                        bytes_written=0,
                        reason="reset",
                    ) from None
                continue
            except BaseException:
                self._drop(endpoint)
                raise
            if head.status not in (200, 206):
                # An error answer whose small body was read leaves the connection usable.
                try:
                    error = self._error_for_status(conn, head, req)
                except BaseException:
                    self._drop(endpoint)
                    raise
                if head.keep_alive:
                    conn.reused = True
                else:
                    self._drop(endpoint)
                raise error
            try:
                written = self._handle(conn, head, req, fd, file_offset, on_progress)
            except BaseException:
                self._drop(endpoint)
                raise
            if head.keep_alive:
                conn.reused = True
            else:
                self._drop(endpoint)
            return written
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Shut down and close every connection of every thread, waking any blocked in ``recv``.

        ``shutdown`` comes first: on Linux, ``close`` alone leaves a thread blocked
        in ``recv`` waiting until its read timeout; after ``shutdown`` its ``recv``
        returns at once. The base-class ``shutdown`` is called on TLS sockets too,
        so no TLS state is touched while their owner thread may still use it.
        """
        with self._lock:
            self._closed = True
            socks, self._all_socks = self._all_socks, set()
        for sock in socks:
            with contextlib.suppress(OSError):
                socket.socket.shutdown(sock, socket.SHUT_RDWR)
            sock.close()

    def __enter__(self) -> RangeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- connections ----------------------------------------------------------

    def _buffer(self) -> memoryview:
        state = self._local
        if state.buf is None:
            state.buf = bytearray(self._buffer_bytes)
        return memoryview(state.buf)

    def _connection(self, endpoint: _Endpoint) -> _Conn:
        conn = self._local.conns.get(endpoint)
        if conn is None:
            conn = _Conn(self._connect(endpoint))
            self._local.conns[endpoint] = conn
        return conn

    def _proxy(self, endpoint: _Endpoint, url: str) -> _Proxy | None:
        """The proxy on the route to ``endpoint``, resolved once per endpoint."""
        if endpoint not in self._proxies:  # a race only resolves the same answer twice
            self._proxies[endpoint] = _parse_proxy(self._proxy_for(url))
        return self._proxies[endpoint]

    def _connect(self, endpoint: _Endpoint) -> socket.socket:
        """A connection ready for requests: TCP, the proxy's tunnel, TLS, timeouts.

        The socket is registered for ``close`` as soon as it exists, so a client
        closed while a tunnel or a TLS handshake hangs wakes those too.
        """
        proxy = self._proxies.get(endpoint)
        host, port = (proxy.host, proxy.port) if proxy else (endpoint.host, endpoint.port)
        via = f" via proxy {proxy.netloc}" if proxy else ""
        try:
            sock = socket.create_connection((host, port), timeout=self._connect_timeout_s)
        except OSError as exc:
            raise TransientFetchError(
                f"cannot connect to {endpoint.netloc}{via}: {exc}", bytes_written=0, reason="connect"
            ) from exc
        try:
            self._track(sock)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if proxy is not None and endpoint.scheme == "https":
                _tunnel(sock, endpoint, proxy)
            if endpoint.scheme == "https":
                sock = self._tls(sock, endpoint)
                sock.settimeout(self._read_timeout_s)
            elif self._wait_all:
                # Blocking socket with kernel-side timeouts: recv(MSG_WAITALL) then waits
                # in one syscall, and a stall surfaces as EAGAIN after read_timeout_s.
                sock.settimeout(None)
                tv = _timeval(self._read_timeout_s)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)
            else:
                sock.settimeout(self._read_timeout_s)
        except BaseException:
            with self._lock:
                self._all_socks.discard(sock)
            sock.close()
            raise
        return sock

    def _tls(self, raw: socket.socket, endpoint: _Endpoint) -> ssl.SSLSocket:
        """Wrap ``raw`` in TLS; the wrapped socket is registered before its handshake starts.

        Wrapping takes over ``raw``'s descriptor, so from then on only the wrapped
        socket can be shut down or closed, including when the handshake fails.
        """
        ctx = self._ssl or ssl.create_default_context()
        sock = ctx.wrap_socket(raw, server_hostname=endpoint.host, do_handshake_on_connect=False)
        try:
            self._track(sock, replaces=raw)
            sock.do_handshake()
        except BaseException as exc:
            with self._lock:
                self._all_socks.discard(sock)
            sock.close()
            if isinstance(exc, ssl.SSLCertVerificationError):
                raise RemoteUnavailableError(
                    f"TLS certificate of {endpoint.netloc} not trusted ({exc.verify_message}); "
                    "pass the CA bundle (AWS_CA_BUNDLE) or use --insecure"
                ) from exc
            if isinstance(exc, OSError):  # ssl.SSLError is one
                raise TransientFetchError(
                    f"TLS handshake with {endpoint.netloc} failed: {exc}", bytes_written=0, reason="connect"
                ) from exc
            raise
        return sock

    def _track(self, sock: socket.socket, replaces: socket.socket | None = None) -> None:
        """Register ``sock`` for ``close`` (in place of ``replaces``); refused once closed."""
        with self._lock:
            if replaces is not None:
                self._all_socks.discard(replaces)
            if self._closed:
                raise RuntimeError("RangeClient is closed")
            self._all_socks.add(sock)

    def _drop(self, endpoint: _Endpoint) -> None:
        conn = self._local.conns.pop(endpoint, None)
        if conn is not None:
            with self._lock:
                self._all_socks.discard(conn.sock)
            conn.sock.close()

    # -- one exchange ---------------------------------------------------------

    def _send_and_read_head(self, conn: _Conn, request: bytes) -> _Head:
        buf = self._buffer()
        raw = self._local.buf
        assert raw is not None
        try:
            conn.sock.sendall(request)
        except (BrokenPipeError, ConnectionResetError) as exc:
            if conn.reused:
                raise _StaleConnection from exc
            raise _transient(exc, 0) from exc
        except OSError as exc:
            raise _transient(exc, 0) from exc
        filled = 0
        while True:
            try:
                n = conn.sock.recv_into(buf[filled:MAX_HEAD_BYTES])
            except ConnectionResetError as exc:
                if conn.reused and filled == 0:
                    raise _StaleConnection from exc
                raise _transient(exc, 0) from exc
            except OSError as exc:
                raise _transient(exc, 0) from exc
            if n == 0:
                if conn.reused and filled == 0:
                    raise _StaleConnection
                raise TransientFetchError(
                    "connection closed inside the response head", bytes_written=0, reason="reset"
                )
            filled += n
            end = raw.find(b"\r\n\r\n", max(0, filled - n - 3), filled)
            if end >= 0:
                return _parse_head(bytes(buf[:end]), end + 4, filled)
            if filled >= MAX_HEAD_BYTES:
                raise UnexpectedResponseError(f"response head longer than {MAX_HEAD_BYTES} bytes")

    def _handle(
        self,
        conn: _Conn,
        head: _Head,
        req: RangeRequest,
        fd: int,
        file_offset: int,
        on_progress: Callable[[int], None] | None,
    ) -> int:
        want = req.end - req.start
        if head.status == 206:
            _check_content_range(head.headers, req)
        elif req.start != 0 or head.headers.get("content-length") != str(want):
            # A 200: the server ignored Range and sent the whole object, which is
            # only our range if the range is the whole object.
            raise UnexpectedResponseError(
                f"asked for bytes {req.start}-{req.end - 1} and got the whole object "
                f"(status 200, content-length {head.headers.get('content-length')})"
            )
        if "chunked" in head.headers.get("transfer-encoding", "").lower():
            raise UnexpectedResponseError("chunked body for a range; expected Content-Length")
        length = head.headers.get("content-length")
        if length is not None and length != str(want):
            raise UnexpectedResponseError(f"content-length {length} for a range of {want} bytes")
        return self._receive_body(conn, head, want, fd, file_offset, on_progress)

    def _receive_body(
        self,
        conn: _Conn,
        head: _Head,
        want: int,
        fd: int,
        file_offset: int,
        on_progress: Callable[[int], None] | None,
    ) -> int:
        """Receive ``want`` body bytes into the thread buffer, pwrite each full buffer."""
        buf = self._buffer()
        cap = len(buf)
        early = head.filled - head.body_start
        if early > want:
            raise UnexpectedResponseError("server sent more bytes than the range")
        # Body bytes that arrived with the head move to the front of the buffer.
        buf[:early] = bytes(buf[head.body_start : head.filled])
        fill = early
        remaining = want - early
        written = 0
        sock = conn.sock
        flags = socket.MSG_WAITALL if self._wait_all and not isinstance(sock, ssl.SSLSocket) else 0
        limiter = self._limiter
        while remaining > 0:
            ask = min(cap - fill, remaining)
            try:
                n = sock.recv_into(buf[fill : fill + ask], ask, flags)
            except OSError as exc:
                written += _pwrite_all(fd, buf[:fill], file_offset + written)
                raise _transient(exc, written) from exc
            if n == 0:
                written += _pwrite_all(fd, buf[:fill], file_offset + written)
                raise TransientFetchError(
                    f"body ended after {written} of {want} bytes",
                    bytes_written=written,
                    reason="truncated",
                )
            if limiter is not None:
                limiter.consume(n)
            fill += n
            remaining -= n
            if fill == cap:
                written += self._flush(fd, buf[:fill], file_offset + written, on_progress)
                fill = 0
        if fill:  # the tail, or a body that arrived whole with the head
            written += self._flush(fd, buf[:fill], file_offset + written, on_progress)
        return written

    @staticmethod
    def _flush(fd: int, data: memoryview, offset: int, on_progress: Callable[[int], None] | None) -> int:
        n = _pwrite_all(fd, data, offset)
        if on_progress is not None:
            on_progress(n)
        return n

    def _error_for_status(self, conn: _Conn, head: _Head, req: RangeRequest) -> Exception:
        status = head.status
        code, message, body = self._read_error_body(conn, head)
        where = f"{req.url.split('?', 1)[0]} bytes {req.start}-{req.end - 1}"
        detail = f"{status} {code or ''} {message or ''}".strip()
        verdict = classify(status, code, url_expired=_url_expired(req.url, head.headers.get("date")))
        if verdict in (Verdict.THROTTLED, Verdict.RETRY):
            return TransientFetchError(
                f"{where}: {detail}",
                bytes_written=0,
                reason=code or f"http-{status}",
                status=status,
                retry_after_s=_retry_after(head.headers.get("retry-after")),
                throttled=verdict is Verdict.THROTTLED,
            )
        if verdict is Verdict.EXPIRED:
            return PresignedUrlExpiredError(
                f"{where}: {detail}; presign the URL again",
                token_expired=classify(status, code) is Verdict.EXPIRED,
            )
        proxy = self._proxies.get(_parse_url(req.url)[0])
        if verdict is Verdict.DENIED and proxy is not None and status in (401, 407):
            return AccessDeniedError(
                f"{where}: proxy {proxy.netloc} refused the request ({status}); put the proxy's "
                "user and password in the proxy URL (HTTP_PROXY / HTTPS_PROXY)"
            )
        if verdict is Verdict.DENIED:
            return AccessDeniedError(
                f"{where}: {detail}; check the credentials and the bucket policy for this identity"
            )
        if verdict is Verdict.NOT_FOUND:
            return NotFoundError(f"{where}: {detail}")
        if verdict is Verdict.CHANGED:
            return ObjectChangedError(
                f"{where}: {detail}; the object changed since it was listed, pull again"
            )
        if verdict is Verdict.REDIRECT:
            return WrongEndpointError(f"{where}: {_redirect_detail(status, code, head.headers, body)}")
        return UnexpectedResponseError(f"{where}: unexpected status {detail}")

    def _read_error_body(self, conn: _Conn, head: _Head) -> tuple[str | None, str | None, bytes]:
        """Read a small error body (to keep the connection) and pull out S3's Code and Message."""
        length_text = head.headers.get("content-length")
        if length_text is None or not length_text.isdigit():
            head.keep_alive = False
            return None, None, b""
        length = int(length_text)
        if length > MAX_ERROR_BODY_BYTES:
            head.keep_alive = False
            return None, None, b""
        buf = self._buffer()
        have = head.filled - head.body_start
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
        code = _XML_CODE.search(body)
        msg = _XML_MESSAGE.search(body)
        return (
            code.group(1).decode("ascii", "replace") if code else None,
            msg.group(1).decode("utf-8", "replace") if msg else None,
            bytes(body),
        )


# -- helpers -------------------------------------------------------------------


def _parse_url(url: str) -> tuple[_Endpoint, str]:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url.split('?', 1)[0]}")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    netloc = parts.netloc.rsplit("@", 1)[-1]
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    return _Endpoint(parts.scheme, parts.hostname, port, netloc), target


def _parse_proxy(url: str | None) -> _Proxy | None:
    if not url:
        return None
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise UsageError(
            f"proxy {parts.scheme}://{parts.hostname}: the data plane speaks to http:// proxies only "
            "(https through one still goes in an end-to-end TLS tunnel); set HTTPS_PROXY=http://..."
        )
    authorization = None
    if parts.username is not None:
        user_pass = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        authorization = "Basic " + base64.b64encode(user_pass.encode()).decode("ascii")
    port = parts.port or 80
    return _Proxy(parts.hostname, port, f"{parts.hostname}:{port}", authorization)


def _tunnel(sock: socket.socket, endpoint: _Endpoint, proxy: _Proxy) -> None:
    """Ask the proxy for a CONNECT tunnel to ``endpoint``; TLS then runs end to end inside it."""
    authority = f"{endpoint.host}:{endpoint.port}"
    lines = [f"CONNECT {authority} HTTP/1.1", f"Host: {authority}", "User-Agent: modelsync"]
    if proxy.authorization:
        lines.append(f"Proxy-Authorization: {proxy.authorization}")
    head = b""
    try:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        while b"\r\n\r\n" not in head:
            # One byte at a time: nothing after the proxy's head may be consumed here.
            chunk = sock.recv(1)
            if not chunk:
                raise ConnectionResetError("the proxy closed the connection")
            head += chunk
            if len(head) > MAX_HEAD_BYTES:
                raise UnexpectedResponseError(f"proxy {proxy.netloc}: response head too long")
    except OSError as exc:
        raise TransientFetchError(
            f"CONNECT {authority} via proxy {proxy.netloc} failed: {exc}", bytes_written=0, reason="connect"
        ) from exc
    status_line = head.split(b"\r\n", 1)[0].decode("latin-1", "replace")
    fields = status_line.split(" ", 2)
    status = int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else 0
    if 200 <= status < 300:
        return
    what = f"proxy {proxy.netloc} refused CONNECT {authority}: {status_line}"
    if status in (401, 407):
        raise AccessDeniedError(f"{what}; put the proxy's user and password in the proxy URL")
    if status in (502, 503, 504):
        raise TransientFetchError(what, bytes_written=0, reason="connect", status=status)
    raise RemoteUnavailableError(f"{what}; check HTTPS_PROXY and NO_PROXY")


def _url_expired(url: str, date_header: str | None) -> bool:
    """Whether the presigned URL was past its own expiry when the store answered.

    The store's ``Date`` is the clock that matters (it is the one that refused);
    without one, this machine's clock stands in.
    """
    expiry = presigned_expiry(url)
    if expiry is None:
        return False
    now = time.time()
    if date_header:
        with contextlib.suppress(TypeError, ValueError, IndexError):
            now = email.utils.parsedate_to_datetime(date_header).timestamp()
    return now + EXPIRY_SLACK_S >= expiry


def _redirect_detail(status: int, code: str | None, headers: Mapping[str, str], body: bytes) -> str:
    """Say where a redirect points, so the user can fix the endpoint or the region."""
    where = headers.get("location")
    endpoint = _XML_ENDPOINT.search(body)
    if where is None and endpoint is not None:
        where = endpoint.group(1).decode("ascii", "replace")
    region = headers.get("x-amz-bucket-region")
    pieces = [f"the store redirects ({status}{' ' + code if code else ''})"]
    if where:
        pieces.append(f"to {where}")
    if region:
        pieces.append(f"(the bucket is in region {region})")
    return (
        " ".join(pieces) + "; the endpoint or region is wrong: set AWS_ENDPOINT_URL (--endpoint-url) "
        "and AWS_REGION (--region) to where the bucket lives"
    )


def _render_request(endpoint: _Endpoint, target: str, req: RangeRequest, extra: Mapping[str, str]) -> bytes:
    lines = [
        f"GET {target} HTTP/1.1",
        f"Host: {endpoint.netloc}",
        f"Range: bytes={req.start}-{req.end - 1}",
        "Accept-Encoding: identity",
        "User-Agent: modelsync",
    ]
    if req.etag is not None:
        # An entity tag is a quoted string (RFC 9110); nginx refuses the bare form with 412.
        lines.append(f'If-Match: "{req.etag.strip(chr(34))}"')
    for name, value in {**req.headers, **extra}.items():
        if "\r" in name or "\n" in name or "\r" in value or "\n" in value:
            raise ValueError(f"header {name!r} contains a line break")
        lines.append(f"{name}: {value}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _parse_head(raw: bytes, body_start: int, filled: int) -> _Head:
    lines = raw.split(b"\r\n")
    status_line = lines[0].split(b" ", 2)
    if len(status_line) < 2 or not status_line[0].startswith(b"HTTP/1.") or not (status_line[1].isdigit()):
        raise UnexpectedResponseError(f"not an HTTP/1.x response: {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            raise UnexpectedResponseError(f"malformed header line {line[:80]!r}")
        headers[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
    connection = headers.get("connection", "").lower()
    keep_alive = status_line[0] == b"HTTP/1.1" and "close" not in connection
    return _Head(int(status_line[1]), headers, keep_alive, body_start, filled)


def _check_content_range(headers: Mapping[str, str], req: RangeRequest) -> None:
    """A 206 must carry exactly the range asked for, or the bytes land at the wrong offset."""
    value = headers.get("content-range", "")
    match = _CONTENT_RANGE.fullmatch(value.encode("latin-1"))
    if match is None or int(match.group(1)) != req.start or int(match.group(2)) != req.end - 1:
        raise UnexpectedResponseError(
            f"asked for bytes {req.start}-{req.end - 1}, got Content-Range {value!r}"
        )


def _pwrite_all(fd: int, data: memoryview, offset: int) -> int:
    done = 0
    total = len(data)
    while done < total:
        try:
            n = os.pwrite(fd, data[done:], offset + done)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise DiskFullError(f"no space left writing the download: {exc}") from exc
            raise LocalStorageError(f"cannot write the download: {exc}") from exc
        if n == 0:
            raise LocalStorageError("pwrite wrote nothing")
        done += n
    return total


def _transient(exc: OSError, written: int) -> TransientFetchError:
    if isinstance(exc, TimeoutError | BlockingIOError):
        reason = "timeout"
    elif isinstance(exc, ConnectionError):
        reason = "reset"
    else:
        reason = "io"
    return TransientFetchError(f"{reason}: {exc}", bytes_written=written, reason=reason)


def _timeval(seconds: float) -> bytes:
    whole = int(seconds)
    return struct.pack("ll", whole, int((seconds - whole) * 1_000_000))


def _retry_after(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None
