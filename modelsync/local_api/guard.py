"""What the daemon's socket admits before it parses anything: how many connections, from whom, how big.

Every tenant pod of a node shares one daemon socket, so one tenant must not be
able to starve the others. A connection is counted against its peer's uid
(SO_PEERCRED, which the kernel fills in: a client cannot lie about it) and
against a total; beyond either cap the daemon answers one refusal line and
hangs up. A request must arrive whole within REQUEST_TIMEOUT_S, and is bounded
in bytes and in nesting before `json.loads` sees it: a deep enough nest would
otherwise end in a RecursionError instead of an answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
import struct
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from modelsync.errors import DaemonBusyError

log = logging.getLogger("modelsync.api")

#: the longest request line; a request names a handful of models
MAX_REQUEST_BYTES = 64 * 1024
#: the deepest nesting of arrays and objects in a request; `{"models": [...]}` is 2
MAX_REQUEST_DEPTH = 8
#: seconds a client has, from connecting, to send its whole request line
REQUEST_TIMEOUT_S = 5.0
#: connections open at once from one uid: a node's pods pulling at the same time, with room to spare
MAX_CONNECTIONS_PER_UID = 32
#: connections open at once in all; each holds a file descriptor of the daemon
MAX_CONNECTIONS = 256

_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
#: accept() failures that a lack of file descriptors or memory causes; asyncio retries them after 1 s
_ACCEPT_EXHAUSTED = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


def peer_uid(sock: socket.socket | None) -> int | None:
    """The uid of the process at the other end of a Unix socket; None when the kernel cannot tell."""
    if sock is None:
        return None
    try:
        _, uid, _ = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
    except OSError:
        return None
    return int(uid)


@dataclass(slots=True)
class Admission:
    """Open connections per uid and in all; a new one is admitted while both are under their caps."""

    max_total: int = MAX_CONNECTIONS
    max_per_uid: int = MAX_CONNECTIONS_PER_UID
    _open: Counter[int | None] = field(default_factory=Counter)

    def admit(self, uid: int | None) -> str | None:
        """Count the connection in and return None, or say why it is refused (and count nothing)."""
        total = sum(self._open.values())
        if total >= self.max_total:
            return f"the node daemon already serves {total} connections, its limit; retry in a few seconds"
        if self._open[uid] >= self.max_per_uid:
            return (
                f"uid {uid} already holds {self._open[uid]} connections to the node daemon, the limit "
                f"per uid; retry in a few seconds"
            )
        self._open[uid] += 1
        return None

    def release(self, uid: int | None) -> None:
        self._open[uid] -= 1
        if self._open[uid] <= 0:
            del self._open[uid]


@dataclass(slots=True)
class LogThrottle:
    """When to log a repeated event: the first of a kind at once, then one line per `every_s` with a count.

    A client that connects in a loop, or an accept() that fails for want of
    descriptors, would otherwise write the log as fast as it happens.
    """

    every_s: float = 10.0
    _next_at: dict[object, float] = field(default_factory=dict)
    _unlogged: Counter[object] = field(default_factory=Counter)

    def due(self, kind: object, now: float) -> int:
        """Count one event of `kind`; how many to report now (this one included), or 0 to stay quiet.

        Quiet events are reported by the first call due later, or by `flush` once `quiet_s` has passed.
        """
        self._unlogged[kind] += 1
        return self.flush(kind, now)

    def flush(self, kind: object, now: float) -> int:
        """The events of `kind` not reported yet, when a line is due; else 0."""
        if not self._unlogged[kind] or now < self._next_at.get(kind, now):
            return 0
        self._next_at[kind] = now + self.every_s
        return self._unlogged.pop(kind)

    def quiet_s(self, kind: object, now: float) -> float:
        """Seconds until a line about `kind` is due again."""
        return max(0.0, self._next_at.get(kind, now) - now)


def shape_error(line: bytes) -> str | None:
    """Why `line` is no request, judged without parsing it: too deep a nesting; else None.

    Brackets inside strings do not count. The walk stops at the first level past
    the bound, so a hostile line costs at most one pass over its bytes.
    """
    depth = 0
    in_string = escaped = False
    for byte in line:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # closing quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > MAX_REQUEST_DEPTH:
                return f"a request nests more than {MAX_REQUEST_DEPTH} levels of arrays and objects"
        elif byte in (0x5D, 0x7D):  # ] }
            depth -= 1
    return None


@dataclass(frozen=True, slots=True)
class Refusals:
    """The admission caps and the throttled log lines of the connections they refuse."""

    admission: Admission
    refusals: LogThrottle
    #: uids whose quiet refusals a timer will report
    flushing: set[int | None]

    def refused(self, uid: int | None, refusal: str) -> None:
        """Log a refusal now, or count it for a line that a timer writes once one is due."""
        now = time.monotonic()
        refused = self.refusals.due(uid, now)
        self._log(uid, refusal, refused)
        if not refused and uid not in self.flushing:
            self.flushing.add(uid)
            delay_s = self.refusals.quiet_s(uid, now)
            asyncio.get_running_loop().call_later(delay_s, self._flush, uid, refusal)

    def _flush(self, uid: int | None, refusal: str) -> None:
        self.flushing.discard(uid)
        self._log(uid, refusal, self.refusals.flush(uid, time.monotonic()))

    @staticmethod
    def _log(uid: int | None, refusal: str, refused: int) -> None:
        if refused:
            extra = {"code": DaemonBusyError.code, "uid": uid, "refused": refused}
            log.warning("refused %d connection(s): %s", refused, refusal, extra=extra)


@dataclass(frozen=True, slots=True)
class AcceptFailures:
    """The event loop's exception handler: an accept() that fails for want of descriptors is a log
    line a second at most, with a count, not a traceback per attempt.

    asyncio stops accepting for a second after such a failure, but first tries the
    rest of its backlog, each attempt reported. Anything else goes to asyncio's own handler.
    """

    throttle: LogThrottle

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if "socket" in context and isinstance(exc, OSError) and exc.errno in _ACCEPT_EXHAUSTED:
            failed = self.throttle.due(exc.errno, time.monotonic())
            if failed:
                log.warning(
                    "cannot accept %d connection(s) on %s: %s; retrying in 1 s",
                    failed,
                    _local_name(context["socket"]),
                    exc.strerror,
                    extra={"code": "accept_failed"},
                )
            return
        loop.default_exception_handler(context)


def _local_name(sock: Any) -> str:
    with contextlib.suppress(OSError):
        name = sock.getsockname()
        return name if isinstance(name, str) else ":".join(str(part) for part in name[:2])
    return "a listening socket"
