"""Keep-alive connections of the data plane: one per thread and endpoint, all closable at once.

Each thread keeps its own socket per endpoint, so threads never wait on each
other. Every socket is registered from the moment it exists, so ``close`` can
shut down sockets that other threads are blocked on: in ``recv``, in a proxy's
CONNECT, in a TLS handshake.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import struct
import threading
from collections.abc import Callable

from modelsync.adapters.http.route import Endpoint, Proxy, parse_proxy, tunnel
from modelsync.errors import RemoteUnavailableError, TransientFetchError


class Conn:
    """One socket and whether it has already served a request (may be stale)."""

    __slots__ = ("reused", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.reused = False


class _PerThread(threading.local):
    conns: dict[Endpoint, Conn]

    def __init__(self) -> None:
        self.conns = {}


class Connections:
    """The calling thread's connection to each endpoint, made on first use; see the module docstring.

    ``read_timeout_s`` bounds every wait for bytes; ``wait_all`` leaves plain TCP
    sockets blocking with kernel-side timeouts, for ``recv(MSG_WAITALL)``;
    ``receive_buffer_bytes`` fixes each socket's receive buffer (else the kernel tunes it).
    """

    def __init__(
        self,
        *,
        ssl_context: ssl.SSLContext | None,
        connect_timeout_s: float,
        read_timeout_s: float,
        wait_all: bool,
        proxy_for: Callable[[str], str | None],
        receive_buffer_bytes: int | None = None,
    ) -> None:
        self._ssl = ssl_context
        self._receive_buffer_bytes = receive_buffer_bytes
        self._connect_timeout_s = connect_timeout_s
        self._read_timeout_s = read_timeout_s
        self._wait_all = wait_all
        self._proxy_for = proxy_for
        self._proxies: dict[Endpoint, Proxy | None] = {}
        self._local = _PerThread()
        self._lock = threading.Lock()
        self._all_socks: set[socket.socket] = set()
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def get(self, endpoint: Endpoint) -> Conn:
        """This thread's connection to ``endpoint``; ``proxy`` must have been asked first."""
        conn = self._local.conns.get(endpoint)
        if conn is None:
            conn = Conn(self._connect(endpoint))
            self._local.conns[endpoint] = conn
        return conn

    def proxy(self, endpoint: Endpoint, url: str) -> Proxy | None:
        """The proxy on the route to ``endpoint``, resolved once per endpoint."""
        if endpoint not in self._proxies:  # a race only resolves the same answer twice
            self._proxies[endpoint] = parse_proxy(self._proxy_for(url))
        return self._proxies[endpoint]

    def done(self, endpoint: Endpoint, keep_alive: bool) -> None:
        """An exchange ended cleanly: keep the connection for the next one, or drop it."""
        if keep_alive:
            self._local.conns[endpoint].reused = True
        else:
            self.drop(endpoint)

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

    def _connect(self, endpoint: Endpoint) -> socket.socket:
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
            if self._receive_buffer_bytes is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self._receive_buffer_bytes)
            if proxy is not None and endpoint.tls:
                tunnel(sock, endpoint, proxy)
            if endpoint.tls:
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

    def _tls(self, raw: socket.socket, endpoint: Endpoint) -> ssl.SSLSocket:
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

    def drop(self, endpoint: Endpoint) -> None:
        """Close this thread's connection to ``endpoint``: it broke, or its state is unknown."""
        conn = self._local.conns.pop(endpoint, None)
        if conn is not None:
            with self._lock:
                self._all_socks.discard(conn.sock)
            conn.sock.close()


def _timeval(seconds: float) -> bytes:
    whole = int(seconds)
    return struct.pack("ll", whole, int((seconds - whole) * 1_000_000))
