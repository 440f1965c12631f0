"""A store's egress on loopback: a TCP proxy that caps the bytes per second a store serves in total.

A pool's nodes share the store's egress: when a window opens on N nodes, each gets
at most a share. `EgressCap` plays that store in front of a real S3 server: every
node has a listener of its own (so the bytes and refusals of each node are counted
apart), and the bytes of all answers, on all listeners, pass one token bucket of
`bytes_per_s`. Requests go upstream byte for byte (a SigV4 signature made for the
listener's address still validates).

Like AIStor or S3 behind a saturated link, it sheds load: while the egress is
saturated (the last `window_s` seconds delivered at least `SATURATED` of it), a new
GET is answered 503 SlowDown with Retry-After instead of joining the queue. Nodes
capped below their share (`--max-bandwidth`) leave it room, and draw none.

A byte counts as egress when it has left for the node, as on a link: when the
node's socket took it, not when the proxy queued it in a send buffer of its own.
So that buffer is as small as the kernel allows; with 128 KiB each, the 128
connections of 16 nodes could hold half a second of the store's egress counted
as sent that was not, and 16 nodes capped at 95% of their share drew 35-38 503s
(4 with this change).

Plain threads and sockets, no HTTP library on the data path: the answers are relayed
in 64 KiB chunks, so the proxy costs little CPU beside the pulls it serves.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Self
from urllib.parse import urlsplit

from support.service import Service

LOOPBACK = "127.0.0.1"
CHUNK_BYTES = 64 * 1024
#: the proxy's send buffer per connection (the kernel doubles it, and keeps at least ~4.6 KiB)
SEND_BUFFER_BYTES = 4 * 1024
#: the share of the egress in use from which the store refuses new GETs
SATURATED = 0.98
#: the bucket holds this much time of egress: a short burst, never a second's worth
BURST_S = 0.05
_HEAD_LIMIT = 64 * 1024
_SLOWDOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message><RequestId>egress</RequestId></Error>"
)


@dataclass(slots=True)
class NodeTraffic:
    """What one node's listener saw."""

    requests: int = 0
    gets: int = 0
    throttled: int = 0
    #: bytes of answers relayed from the store (headers included)
    bytes_served: int = 0
    #: time.monotonic() of its first GET and of each 503 it was sent
    first_get_at: float | None = None
    throttled_at: list[float] = field(default_factory=list)


class _Egress:
    """One token bucket for every answer's bytes, and how much of it the last seconds used."""

    def __init__(self, bytes_per_s: float) -> None:
        self.rate = float(bytes_per_s)
        self.capacity = self.rate * BURST_S
        self.tokens = self.capacity
        self.stamp = time.monotonic()
        self.sent: deque[tuple[float, int]] = deque()
        self.lock = threading.Lock()

    def take(self, n_bytes: int) -> None:
        """Wait until `n_bytes` may leave; debt is paid by sleeping, so the total never exceeds the rate."""
        with self.lock:
            now = time.monotonic()
            self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now
            self.tokens -= n_bytes
            wait_s = -self.tokens / self.rate if self.tokens < 0 else 0.0
        if wait_s > 0:
            time.sleep(wait_s)

    def delivered(self, n_bytes: int) -> None:
        """`n_bytes` have left for a node."""
        with self.lock:
            self.sent.append((time.monotonic(), n_bytes))

    def busy(self, window_s: float) -> float:
        """The share of the egress the last `window_s` seconds delivered."""
        with self.lock:
            now = time.monotonic()
            while self.sent and self.sent[0][0] < now - window_s:
                self.sent.popleft()
            return sum(n for _, n in self.sent) / (self.rate * window_s)


class EgressCap(Service):
    """Forward to `upstream_url` from `nodes` listeners, all answers sharing `bytes_per_s`."""

    def __init__(
        self,
        upstream_url: str,
        bytes_per_s: float,
        nodes: int,
        window_s: float = 2.0,
        retry_after_s: int = 1,
    ) -> None:
        parts = urlsplit(upstream_url)
        self._upstream = (parts.hostname or LOOPBACK, parts.port or 80)
        self._egress = _Egress(bytes_per_s)
        self._nodes = nodes
        self._window_s = window_s
        self._retry_after_s = retry_after_s
        self._listeners: list[socket.socket] = []
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self.traffic = [NodeTraffic() for _ in range(nodes)]
        self.first_get_s: float | None = None
        #: time.monotonic(), size and node of every chunk relayed
        self.served: list[tuple[float, int, int]] = []

    def endpoint_url(self, node: int) -> str:
        return f"http://{LOOPBACK}:{self._listeners[node].getsockname()[1]}"

    def start(self) -> Self:
        for node in range(self._nodes):
            listener = socket.socket()
            listener.bind((LOOPBACK, 0))
            listener.listen(256)
            self._listeners.append(listener)
            threading.Thread(target=self._accept, args=(listener, node), daemon=True).start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        with self._lock:
            everything = [*self._listeners, *self._sockets]
        for sock in everything:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def reset(self) -> None:
        """Forget the counts (between runs)."""
        with self._lock:
            self.traffic = [NodeTraffic() for _ in range(self._nodes)]
            self.first_get_s = None
            self.served = []

    # ---- the data path (threads) ----

    def _accept(self, listener: socket.socket, node: int) -> None:
        while not self._stopping.is_set():
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self._upstream, timeout=10)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            # Loopback would buffer megabytes per connection: a whole part would leave the
            # store at once, whatever pace the node reads at. The least buffer keeps the
            # store's egress, and what it counts as delivered, following the nodes' reads.
            client.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
            with self._lock:
                self._sockets |= {client, upstream}
            lock = threading.Lock()  # one writer on the client socket at a time
            for pump in (self._requests, self._answers):
                threading.Thread(target=pump, args=(client, upstream, node, lock), daemon=True).start()

    def _requests(
        self, client: socket.socket, upstream: socket.socket, node: int, write_lock: threading.Lock
    ) -> None:
        """Client to store: one request head at a time; a GET while the egress is saturated gets 503."""
        buffered = b""
        try:
            while True:
                while b"\r\n\r\n" not in buffered:
                    data = client.recv(CHUNK_BYTES)
                    if not data or len(buffered) > _HEAD_LIMIT:
                        return
                    buffered += data
                head, _, buffered = buffered.partition(b"\r\n\r\n")
                method = head.split(b" ", 1)[0]
                length = _content_length(head)
                body, buffered = buffered[:length], buffered[length:]
                while len(body) < length:
                    data = client.recv(min(CHUNK_BYTES, length - len(body)))
                    if not data:
                        return
                    body += data
                refuse = method == b"GET" and self._egress.busy(self._window_s) >= SATURATED
                with self._lock:
                    traffic = self.traffic[node]
                    traffic.requests += 1
                    traffic.gets += method == b"GET"
                    traffic.throttled += refuse
                    now = time.monotonic()
                    if refuse:
                        traffic.throttled_at.append(now)
                    if method == b"GET" and traffic.first_get_at is None:
                        traffic.first_get_at = now
                    if method == b"GET" and self.first_get_s is None:
                        self.first_get_s = now
                if refuse:
                    with write_lock:
                        client.sendall(self._slowdown())
                    continue
                upstream.sendall(head + b"\r\n\r\n" + body)
        except OSError:
            return
        finally:
            _shutdown(upstream)

    def _answers(
        self, client: socket.socket, upstream: socket.socket, node: int, write_lock: threading.Lock
    ) -> None:
        """Store to client: every chunk waits for the shared egress."""
        buffer = bytearray(CHUNK_BYTES)
        view = memoryview(buffer)
        try:
            while True:
                n = upstream.recv_into(buffer)
                if n == 0:
                    return
                self._egress.take(n)
                with write_lock:
                    client.sendall(view[:n])
                self._egress.delivered(n)
                with self._lock:
                    self.traffic[node].bytes_served += n
                    self.served.append((time.monotonic(), n, node))
        except OSError:
            return
        finally:
            _shutdown(client)
            with self._lock:
                self._sockets -= {client, upstream}
            client.close()
            upstream.close()

    def _slowdown(self) -> bytes:
        head = (
            "HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\n"
            f"Content-Length: {len(_SLOWDOWN)}\r\nRetry-After: {self._retry_after_s}\r\n"
            "x-amz-request-id: egress\r\n\r\n"
        )
        return head.encode() + _SLOWDOWN


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value.strip() or 0)
    return 0


def _shutdown(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
