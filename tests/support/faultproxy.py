"""A reverse proxy over real sockets that forwards S3 traffic and injects faults on demand.

The kernel here has no netem and there is no toxiproxy, so network faults are made
at the HTTP layer: answer 503/500/403, cut the body with a RST or a clean FIN, flip a
bit, stall mid-body, or delay the headers. Requests are forwarded byte for byte
(method, raw path and query, every end-to-end header including Host and
Authorization, body), so SigV4 signatures computed for the proxy's address still
validate upstream.

Besides one-off faults the proxy can play a store's request budget (`set_throttle`):
beyond K requests in any one second it answers 503 SlowDown with Retry-After, as
AIStor and S3 do when a pool of nodes starts at once.

The proxy runs its own event loop in a background thread, so sync tests, async tests
and child processes can all point at it. Faults are queued from the test thread;
each one is consumed by the next request it matches. Every request is logged, so
tests can count GETs and body bytes (resume must refetch only what is missing).
"""

from __future__ import annotations

import asyncio
import calendar
import contextlib
import fcntl
import io
import socket
import struct
import termios
import threading
import time
from collections.abc import AsyncIterable
from dataclasses import asdict, dataclass, field
from typing import Literal, Self, get_args
from urllib.parse import parse_qs, unquote

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from support.service import Service

FaultAction = Literal[
    "status503",
    "status500",
    "status403",
    "expired_token",
    "redirect",
    "reset",
    "truncate",
    "bitflip",
    "stall",
    "delay",
]
FAULT_ACTIONS: frozenset[str] = frozenset(get_args(FaultAction))

CONTROL_PATH = "/__fault__"
CHUNK_BYTES = 64 * 1024
# A stall ends when the client hangs up or the proxy stops; this only bounds a
# client that never gives up, well past any test's timeout.
STALL_MAX_S = 600.0
# How long a `reset` waits for the bytes it already wrote to be acknowledged, so the
# client really receives exactly `arg` bytes before the RST discards the rest.
FLUSH_WAIT_S = 2.0

_ERROR_BODIES: dict[str, tuple[int, str, str]] = {
    "status503": (503, "SlowDown", "Please reduce your request rate."),
    "status500": (500, "InternalError", "We encountered an internal error. Please try again."),
    "status403": (403, "AccessDenied", "Access Denied"),
    "expired_token": (400, "ExpiredToken", "The provided token has expired."),
    # What S3 answers when the bucket lives in another region than the endpoint's.
    "redirect": (
        301,
        "PermanentRedirect",
        "The bucket you are attempting to access must be addressed using the specified endpoint.",
    ),
}
REDIRECT_ENDPOINT = "s3.eu-west-1.example.internal"
REDIRECT_REGION = "eu-west-1"

# Connection-scoped headers (RFC 9110 section 7.6.1) describe one hop, not the message.
# Expect is dropped too: the proxy has already read the body, and SigV4 never signs it.
_HOP_BY_HOP = frozenset(
    h.lower()
    for h in (
        "Connection",
        "Keep-Alive",
        "Proxy-Authenticate",
        "Proxy-Authorization",
        "Proxy-Connection",
        "TE",
        "Trailer",
        "Transfer-Encoding",
        "Upgrade",
        "Expect",
    )
)
# Without this aiohttp's client would add headers the original request did not have.
_NO_AUTO_HEADERS = ("Accept", "Accept-Encoding", "User-Agent", "Content-Type")


@dataclass(frozen=True, slots=True)
class Fault:
    """One queued misbehaviour.

    `match` is a substring of the request's raw path-and-query or of its decoded path;
    empty matches everything. `method=None` matches any method. What `arg` means
    depends on the action: body bytes to send before `reset` / `truncate` / `stall`
    (`reset` with a negative arg resets before the status line), the body offset
    whose lowest bit `bitflip` inverts, the seconds `delay` waits before headers, or
    the seconds of `Retry-After` an error answer carries (none when 0).
    """

    action: FaultAction
    match: str = ""
    arg: float = 0
    method: str | None = "GET"

    def applies_to(self, method: str, raw_path: str) -> bool:
        if self.method is not None and self.method.upper() != method.upper():
            return False
        return _path_matches(self.match, raw_path)


@dataclass(frozen=True, slots=True)
class Throttle:
    """A store's request budget: beyond `requests_per_s` matching requests in any one
    second, answer 503 SlowDown with `Retry-After: retry_after_s`. Refused requests do
    not count against the budget; `match` and `method` select requests as for a Fault."""

    requests_per_s: int
    retry_after_s: float = 1.0
    match: str = ""
    method: str | None = None

    @property
    def answer(self) -> Fault:
        return Fault("status503", self.match, self.retry_after_s, self.method)


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """What the proxy saw and did for one request.

    `status` is what the proxy answered (upstream's status, or the fault's); None while
    a `delay` still sleeps or after a `reset` before headers. A client that hung up
    early may never have seen it. `body_bytes_sent` counts body bytes handed to the
    socket, not headers. `done` turns true when the proxy finished with the request,
    however it ended. `arrived_s` is `time.monotonic()` when its head arrived.
    """

    method: str
    path: str
    range: str | None
    status: int | None
    body_bytes_sent: int
    fault: FaultAction | None
    done: bool
    arrived_s: float = 0.0


@dataclass(slots=True)
class _Entry:
    method: str
    path: str
    range: str | None
    status: int | None = None
    body_bytes_sent: int = 0
    fault: FaultAction | None = None
    done: bool = False
    arrived_s: float = field(default_factory=time.monotonic)

    def snapshot(self) -> RequestRecord:
        return RequestRecord(
            self.method,
            self.path,
            self.range,
            self.status,
            self.body_bytes_sent,
            self.fault,
            self.done,
            self.arrived_s,
        )


@dataclass(slots=True)
class _Queued:
    fault: Fault
    remaining: int


def _path_matches(match: str, raw_path: str) -> bool:
    return match in raw_path or match in unquote(raw_path.partition("?")[0])


def _unacked_bytes(sock: socket.socket) -> int:
    """Bytes written but not yet acknowledged by the peer (Linux SIOCOUTQ)."""
    try:
        raw = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, struct.pack("i", 0))
    except OSError:
        return 0
    return int(struct.unpack("i", raw)[0])


def _presign_expired(raw_path: str) -> bool:
    """Whether a presigned URL's expiry (SigV4 X-Amz-Date + X-Amz-Expires, SigV2 Expires) has passed."""
    query = parse_qs(raw_path.partition("?")[2])
    if "X-Amz-Date" in query and "X-Amz-Expires" in query:
        signed = calendar.timegm(time.strptime(query["X-Amz-Date"][0], "%Y%m%dT%H%M%SZ"))
        return time.time() > signed + int(query["X-Amz-Expires"][0])
    if "Expires" in query:
        return time.time() > int(query["Expires"][0])
    return False


def _error_body(action: str) -> tuple[int, bytes]:
    status, code, message = _ERROR_BODIES[action]
    endpoint = f"<Endpoint>{REDIRECT_ENDPOINT}</Endpoint>" if action == "redirect" else ""
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{message}</Message>{endpoint}"
        "<RequestId>faultproxy</RequestId></Error>"
    )
    return status, body.encode()


class FaultProxy(Service):
    """Forward to `upstream_url`; misbehave as queued. Start with `start()` or `with`."""

    def __init__(
        self, upstream_url: str, host: str = "127.0.0.1", enforce_presign_expiry: bool = False
    ) -> None:
        self._upstream = upstream_url.rstrip("/")
        self._host = host
        # moto never checks a presigned URL's expiry; with this the proxy does, as S3 does.
        self._enforce_expiry = enforce_presign_expiry
        self._lock = threading.Lock()
        self._faults: list[_Queued] = []
        self._sustained: list[tuple[float, Fault]] = []
        self._log: list[_Entry] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._port: int | None = None
        self._throttle: Throttle | None = None
        self._admitted_at: list[float] = []  # monotonic times of requests the throttle let through
        # Created on the proxy's loop in _serve; only touched from that loop.
        self._stopping: asyncio.Event | None = None
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.ServerRunner | None = None

    # ---- the test-facing API (any thread) ----

    @property
    def endpoint_url(self) -> str:
        if self._port is None:
            raise RuntimeError("start() the proxy first")
        return f"http://{self._host}:{self._port}"

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("start() the proxy first")
        return self._port

    def add_fault(
        self,
        action: FaultAction,
        match: str = "",
        arg: float = 0,
        times: int = 1,
        method: str | None = "GET",
    ) -> None:
        """Queue `action` for the next `times` requests matching `match` and `method`."""
        if action not in FAULT_ACTIONS:
            raise ValueError(f"unknown fault action {action!r}; one of {sorted(FAULT_ACTIONS)}")
        if times < 1:
            raise ValueError("times must be at least 1")
        if action in ("truncate", "stall", "bitflip") and arg < 0:
            raise ValueError(f"{action} needs a non-negative byte count or offset")
        if action == "delay" and arg < 0:
            raise ValueError("delay needs a non-negative number of seconds")
        with self._lock:
            self._faults.append(_Queued(Fault(action, match, arg, method), times))

    def sustain(
        self, action: FaultAction, seconds: float, match: str = "", method: str | None = "GET"
    ) -> None:
        """Answer every matching request with `action` (an error status) for the next `seconds`.

        Sustained faults win over queued ones; they model a store that throttles
        (`status503`) or refuses a token (`expired_token`) for a stretch of time.
        """
        if action not in _ERROR_BODIES:
            raise ValueError(f"only error answers can be sustained: {sorted(_ERROR_BODIES)}")
        with self._lock:
            self._sustained.append((time.monotonic() + seconds, Fault(action, match, 0, method)))

    def pending_faults(self) -> list[Fault]:
        """Faults not yet consumed (one entry per remaining use), to assert none was missed."""
        with self._lock:
            return [q.fault for q in self._faults for _ in range(q.remaining)]

    def set_throttle(self, throttle: Throttle | None) -> None:
        """Enforce `throttle` from now on (None lifts it); queued faults still come first."""
        if throttle is not None and throttle.requests_per_s < 1:
            raise ValueError("a throttle admits at least 1 request per second")
        with self._lock:
            self._throttle = throttle
            self._admitted_at.clear()

    def requests(self, match: str = "", method: str | None = None) -> list[RequestRecord]:
        """The request log in arrival order, optionally filtered like a fault."""
        with self._lock:
            entries = [e.snapshot() for e in self._log]
        return [
            r
            for r in entries
            if (method is None or r.method.upper() == method.upper()) and _path_matches(match, r.path)
        ]

    def bytes_sent(self, match: str = "", method: str | None = "GET") -> int:
        """Body bytes the proxy wrote for matching requests: what a resume must not repeat."""
        return sum(r.body_bytes_sent for r in self.requests(match, method))

    def object_gets(self, match: str = "") -> list[RequestRecord]:
        """Presigned ranged GETs: the requests for object bytes.

        A manifest is fetched by a presigned GET too, but of the whole object, with no Range;
        listings and heads are signed in their Authorization header.
        """
        gets = self.requests(match, method="GET")
        return [r for r in gets if r.range is not None and "X-Amz-Signature" in r.path]

    def object_bytes_sent(self, match: str = "") -> int:
        """Object body bytes served by presigned ranged GETs (not manifests or listings)."""
        return sum(r.body_bytes_sent for r in self.object_gets(match))

    def clear(self) -> None:
        """Forget the log and drop every queued fault."""
        with self._lock:
            self._faults.clear()
            self._sustained.clear()
            self._log.clear()

    # ---- lifecycle ----

    def start(self) -> Self:
        if self._loop is not None:
            raise RuntimeError("the proxy is already running")
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="fault-proxy", daemon=True)
        thread.start()
        self._loop, self._thread = loop, thread
        try:
            self._port = asyncio.run_coroutine_threadsafe(self._serve(), loop).result(10)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop serving, end stalls and delays, and close the loop; safe to call twice."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(30)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
            self._loop = self._thread = None
            self._port = None

    async def _serve(self) -> int:
        self._stopping = asyncio.Event()
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            auto_decompress=False,
            cookie_jar=aiohttp.DummyCookieJar(),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=120),
        )
        # The runner waits this long for handlers still running at shutdown; stalls and
        # delays watch _stopping, so they end well within it.
        self._runner = web.ServerRunner(web.Server(self._handle), shutdown_timeout=2.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, 0)
        await site.start()
        return int(self._runner.addresses[0][1])

    async def _shutdown(self) -> None:
        if self._stopping is not None:
            self._stopping.set()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    # ---- request handling (proxy loop) ----

    def _take_fault(self, method: str, raw_path: str) -> Fault | None:
        with self._lock:
            now = time.monotonic()
            for until, fault in self._sustained:
                if now < until and fault.applies_to(method, raw_path):
                    return fault
            for queued in self._faults:
                if queued.fault.applies_to(method, raw_path):
                    queued.remaining -= 1
                    if queued.remaining == 0:
                        self._faults.remove(queued)
                    return queued.fault
        return None

    def _over_budget(self, method: str, raw_path: str) -> Fault | None:
        """The throttle's 503 when this request would exceed the budget of the last second."""
        with self._lock:
            throttle = self._throttle
            if throttle is None or not throttle.answer.applies_to(method, raw_path):
                return None
            now = time.monotonic()
            self._admitted_at = [t for t in self._admitted_at if t > now - 1.0]
            if len(self._admitted_at) < throttle.requests_per_s:
                self._admitted_at.append(now)
                return None
            return throttle.answer

    def _record(self, entry: _Entry, **changes: object) -> None:
        with self._lock:
            for name, value in changes.items():
                setattr(entry, name, value)

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        if request.path == CONTROL_PATH:
            return await self._control(request)
        fault = self._take_fault(request.method, request.raw_path) or self._over_budget(
            request.method, request.raw_path
        )
        entry = _Entry(
            request.method,
            request.raw_path,
            request.headers.get("Range"),
            fault=fault.action if fault else None,
        )
        with self._lock:
            self._log.append(entry)
        try:
            return await self._respond(request, entry, fault)
        finally:
            self._record(entry, done=True)

    async def _respond(
        self, request: web.BaseRequest, entry: _Entry, fault: Fault | None
    ) -> web.StreamResponse:
        if request.headers.get("Expect", "").lower() == "100-continue" and request.writer is not None:
            # the low-level server does not answer it (a routed app would): an SDK upload waits for it
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        body = await request.content.read()
        if fault is None and self._enforce_expiry and _presign_expired(request.raw_path):
            fault = Fault("status403")
            self._record(entry, fault="status403")
        if fault is not None and fault.action in _ERROR_BODIES:
            return await self._answer_error(request, entry, fault)
        if fault is not None and fault.action == "reset" and fault.arg < 0:
            self._reset(request)
            return web.Response(status=499)  # never sent: the connection is gone
        if fault is not None and fault.action == "delay":
            await self._sleep_unless_stopping(fault.arg)
        try:
            upstream = await self._forward(request, body)
        except aiohttp.ClientError as error:
            self._record(entry, status=502)
            return web.Response(status=502, text=f"fault proxy: upstream failed: {error!r}")
        async with upstream:
            # Logged before sending: a client that already hung up never sees the status,
            # but tests still want to know what the server answered.
            self._record(entry, status=upstream.status)
            try:
                return await self._relay(request, entry, fault, upstream)
            except ConnectionError:
                # The client went away mid-answer; that is its business, not a proxy error.
                self._close(request, abort=True)
                return web.Response(status=499)  # never sent: the connection is gone

    async def _relay(
        self,
        request: web.BaseRequest,
        entry: _Entry,
        fault: Fault | None,
        upstream: aiohttp.ClientResponse,
    ) -> web.StreamResponse:
        """Send upstream's answer on, shaped by the body fault if there is one."""
        action = fault.action if fault else None
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        for name, value in upstream.headers.items():
            if name.lower() not in _HOP_BY_HOP:
                response.headers.add(name, value)
        await response.prepare(request)
        budget = int(fault.arg) if fault and action in ("reset", "truncate", "stall") else None
        flip_at = int(fault.arg) if fault and action == "bitflip" else None
        await self._stream_body(upstream.content.iter_chunked(CHUNK_BYTES), response, entry, budget, flip_at)
        if action == "reset":
            await self._wait_flushed(request)
            self._reset(request)
        elif action == "truncate":
            self._close(request)
        elif action == "stall":
            await self._stall(request)
            self._close(request, abort=True)
        else:
            await response.write_eof()
        return response

    async def _forward(self, request: web.BaseRequest, body: bytes) -> aiohttp.ClientResponse:
        assert self._session is not None
        headers: CIMultiDict[str] = CIMultiDict()
        for name, value in request.headers.items():
            if name.lower() not in _HOP_BY_HOP:
                headers.add(name, value)
        if body and "Content-Length" not in headers:
            # The client sent it chunked; the proxy forwards the same bytes with a length.
            headers["Content-Length"] = str(len(body))
        return await self._session.request(
            request.method,
            URL(self._upstream + request.raw_path, encoded=True),
            headers=headers,
            data=io.BytesIO(body) if body else None,  # bytes over 1 MiB would warn: they block the loop
            skip_auto_headers=_NO_AUTO_HEADERS,
            allow_redirects=False,
        )

    async def _stream_body(
        self,
        chunks: AsyncIterable[bytes],
        response: web.StreamResponse,
        entry: _Entry,
        budget: int | None,
        flip_at: int | None,
    ) -> None:
        sent = 0
        async for chunk in chunks:
            if budget is not None:
                chunk = chunk[: max(budget - sent, 0)]
            if flip_at is not None and sent <= flip_at < sent + len(chunk):
                flipped = bytearray(chunk)
                flipped[flip_at - sent] ^= 0x01
                chunk = bytes(flipped)
            if chunk:
                await response.write(chunk)
                sent += len(chunk)
                self._record(entry, body_bytes_sent=sent)
            if budget is not None and sent >= budget:
                return

    async def _answer_error(
        self, request: web.BaseRequest, entry: _Entry, fault: Fault
    ) -> web.StreamResponse:
        status, body = _error_body(fault.action)
        headers = {"x-amz-request-id": "faultproxy"}
        if fault.action == "redirect":
            headers["x-amz-bucket-region"] = REDIRECT_REGION
        if fault.arg > 0:
            headers["Retry-After"] = f"{fault.arg:g}"
        response = web.Response(status=status, body=body, content_type="application/xml", headers=headers)
        sent = 0 if request.method == "HEAD" else len(body)
        self._record(entry, status=status, body_bytes_sent=sent)
        return response

    async def _sleep_unless_stopping(self, seconds: float) -> None:
        assert self._stopping is not None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), timeout=seconds)

    async def _stall(self, request: web.BaseRequest) -> None:
        """Hold the connection open, sending nothing, until the client or the proxy gives up."""
        assert self._stopping is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + STALL_MAX_S
        while not self._stopping.is_set() and loop.time() < deadline:
            transport = request.transport
            if transport is None or transport.is_closing():
                return
            await self._sleep_unless_stopping(0.05)

    async def _wait_flushed(self, request: web.BaseRequest) -> None:
        """Wait until what was written is acknowledged, so the RST cannot discard it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + FLUSH_WAIT_S
        transport = request.transport
        while transport is not None and not transport.is_closing() and loop.time() < deadline:
            sock = transport.get_extra_info("socket")
            unacked = 0 if sock is None else _unacked_bytes(sock)
            if transport.get_write_buffer_size() == 0 and unacked == 0:
                return
            await asyncio.sleep(0.005)

    @staticmethod
    def _reset(request: web.BaseRequest) -> None:
        """Abort with SO_LINGER 0: the kernel answers with RST instead of FIN."""
        transport = request.transport
        if transport is None:
            return
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        transport.abort()

    @staticmethod
    def _close(request: web.BaseRequest, abort: bool = False) -> None:
        """Clean FIN after the buffered bytes (`close`), or drop them (`abort`)."""
        transport = request.transport
        if transport is None:
            return
        if abort:
            transport.abort()
        else:
            transport.close()

    # ---- the HTTP control endpoint ----

    async def _control(self, request: web.BaseRequest) -> web.StreamResponse:
        """`POST` queues a fault (JSON like add_fault's arguments), `GET` returns the
        log, `DELETE` clears both: for child processes that cannot call Python."""
        if request.method == "POST":
            spec = await request.json()
            try:
                self.add_fault(
                    spec["action"],
                    match=spec.get("match", ""),
                    arg=spec.get("arg", 0),
                    times=spec.get("times", 1),
                    method=spec.get("method", "GET"),
                )
            except (KeyError, TypeError, ValueError) as error:
                return web.json_response({"error": str(error)}, status=400)
            return web.json_response({"queued": len(self.pending_faults())}, status=201)
        if request.method == "GET":
            return web.json_response([asdict(r) for r in self.requests()])
        if request.method == "DELETE":
            self.clear()
            return web.Response(status=204)
        return web.Response(status=405)
