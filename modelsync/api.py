"""The daemon's local API: one JSON line each way over a Unix socket in the cache's state folder.

A Unix socket, not the HTTP listener: only processes that share the cache
(the node's init containers and operators) can reach it, and its mode (0660,
the cache's group) says which. The HTTP listener serves metrics and probes
only. The socket lives at `<cache>/.modelsync/daemon.sock`.

One request per connection:

    -> {"op": "prefetch", "models": ["s3://b/p/", "b/q"], "wait": true}
    <- {"ok": true, "models": [{"model": "b/p", "path": "/model-cache/b/p"},
                               {"model": "b/q", "error": "...", "code": "not_found", "exit_code": 3}]}
       with "wait": false, a model not ready yet is {"model": "b/q", "queued": true}
    -> {"op": "pull", "model": "s3://b/p/", "lease_s": 28800}      (a tenant pod's pull; lease_s optional)
    <- {"ok": true, "model": "b/p", "path": "/model-cache/b/p"}
    -> {"op": "pull", "name": "qwen3-32b", "lease_s": 28800}       (by name: this node's pool's variant)
    <- {"ok": true, "model": "b/q", "path": "/model-cache/b/q"}
    -> {"op": "status"}
    <- {"ok": true, "pool": "...", "ready": true, "paused": false, "current": "b/p", "plan": {...}}

A request must arrive whole within a few seconds, and is bounded in bytes and
nesting before it is parsed; connections are capped per peer uid and in all
(socket_guard.py). Beyond a cap the daemon answers one refusal (code
"daemon_busy", exit code 6) and hangs up.

A request the daemon cannot serve gets {"ok": false, "error": "...", "code": "...", "exit_code": 2};
one for a source it does not serve (not in the schedule, not under an allowed
prefix) gets code "not_allowed" and exit code 8. The caller rebuilds the error
as its own class from the code (`errors.error_from_code`), so `except
NotFoundError` catches the daemon's "not found" as it catches its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import socket
import stat
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelsync.adapters.cache import STATE_DIR
from modelsync.core.file_kind import file_kind
from modelsync.core.refs import ModelRef
from modelsync.core.units import format_bytes
from modelsync.errors import (
    DaemonBusyError,
    LocalStorageError,
    ModelsyncError,
    UsageError,
    error_from_code,
)
from modelsync.socket_guard import (
    MAX_REQUEST_BYTES,
    REQUEST_TIMEOUT_S,
    Admission,
    LogThrottle,
    peer_uid,
    shape_error,
)

log = logging.getLogger("modelsync.api")

SOCKET_NAME = "daemon.sock"
SOCKET_MODE = 0o660
#: the longest reply a caller reads: a status with its plan can be long
MAX_LINE_BYTES = 1024 * 1024
#: accept() failures that a lack of file descriptors or memory causes; asyncio retries them after 1 s
_ACCEPT_EXHAUSTED = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})

Message = dict[str, Any]
Handler = Callable[[Message], Awaitable[Message]]


def socket_path(cache_root: Path) -> Path:
    return cache_root / STATE_DIR / SOCKET_NAME


# sun_path holds 108 bytes with its NUL; a cache deep in a host path can need more.
_SUN_PATH_BYTES = 107


@contextlib.contextmanager
def _address(path: Path) -> Iterator[str]:
    """`path` as a Unix-socket address, through /proc/self/fd/N/ when it is too long for sun_path.

    The kernel resolves the short form to the same directory, so a daemon on a deep
    cache and the tenants that call it meet at the same socket.
    """
    if len(os.fsencode(path)) <= _SUN_PATH_BYTES:
        yield str(path)
        return
    directory = os.open(path.parent, os.O_PATH | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{directory}/{path.name}"
    finally:
        os.close(directory)


def error_reply(exc: ModelsyncError) -> Message:
    return {"error": str(exc), "code": exc.code, "exit_code": int(exc.exit_code)}


def error_from_reply(reply: Message) -> ModelsyncError:
    """The daemon's error as the CLI raises it: its own class again, same message and exit code."""
    message = str(reply.get("error", "the daemon refused the request"))
    exit_code = reply.get("exit_code")
    return error_from_code(
        str(reply.get("code", "internal")), message, exit_code if isinstance(exit_code, int) else None
    )


async def serve(path: Path, handler: Handler) -> asyncio.Server:
    """Listen on `path`, replacing a socket left by a dead daemon but never a live one.

    Anything else found there (a directory, a file, a FIFO, a symlink) is refused,
    never removed or followed: the daemon deletes only what it made.
    """
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None:
        if not stat.S_ISSOCK(mode):
            raise UsageError(
                f"{path} is {file_kind(mode)}, not the daemon's socket; remove it and start the daemon again"
            )
        if _answers(path):
            raise UsageError(f"a daemon already serves {path}; stop it first")
        path.unlink()
    guard = _Guard(Admission(), LogThrottle(), set())
    asyncio.get_running_loop().set_exception_handler(_AcceptFailures(LogThrottle(every_s=1.0)))
    try:
        with _address(path) as address:
            server = await asyncio.start_unix_server(
                lambda r, w: _connection(handler, guard, r, w), path=address, limit=MAX_REQUEST_BYTES
            )
    except OSError as exc:
        raise UsageError(f"cannot listen on {path}: {exc.strerror or exc}") from None
    os.chmod(path, SOCKET_MODE)
    return server


@dataclass(frozen=True, slots=True)
class _Guard:
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


async def _connection(
    handler: Handler, guard: _Guard, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    uid = peer_uid(writer.get_extra_info("socket"))
    refusal = guard.admission.admit(uid)
    try:
        if refusal is not None:
            guard.refused(uid, refusal)
            reply: Message | None = {"ok": False, **error_reply(DaemonBusyError(refusal))}
        else:
            reply = await _answer(handler, reader)
        if reply is not None:
            writer.write(json.dumps(reply).encode() + b"\n")
            await writer.drain()
    except ConnectionError:
        pass  # the client went away; whatever it asked for goes on
    finally:
        if refusal is None:
            guard.admission.release(uid)
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def _answer(handler: Handler, reader: asyncio.StreamReader) -> Message | None:
    """The reply to the connection's one request; None when the client left without sending one."""
    try:
        try:
            line = await asyncio.wait_for(reader.readline(), REQUEST_TIMEOUT_S)
        except TimeoutError:
            raise UsageError(
                f"no whole request within {REQUEST_TIMEOUT_S:.0f} s of connecting; "
                "a request is one JSON object on one line"
            ) from None
        except ValueError:  # the line outgrew the reader's limit
            raise UsageError(
                f"a request is at most {format_bytes(MAX_REQUEST_BYTES)}; this one was longer"
            ) from None
        if not line:
            return None
        problem = shape_error(line)
        if problem is not None:
            raise UsageError(problem)
        try:
            request = json.loads(line)
        except ValueError:
            raise UsageError("a request is one JSON object on one line; this one is not JSON") from None
        if not isinstance(request, dict):
            raise UsageError(f"a request is one JSON object on one line, not a JSON {type(request).__name__}")
        return {"ok": True, **(await handler(request))}
    except ModelsyncError as exc:
        return {"ok": False, **error_reply(exc)}


@dataclass(frozen=True, slots=True)
class _AcceptFailures:
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


def call(path: Path, request: Message, timeout_s: float | None = None) -> Message | None:
    """Send one request and wait for its reply; None when no daemon listens on `path`.

    Raises ConnectionError when the daemon hangs up before answering (it was
    stopped), so the caller can fall back to working alone.
    """
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        try:
            with _address(path) as address:
                sock.connect(address)
        except OSError:  # no socket (or no directory), or nobody listening
            return None
        sock.sendall(json.dumps(request).encode() + b"\n")
        with sock.makefile("rb") as stream:
            line = stream.readline(MAX_LINE_BYTES)
    if not line:
        raise ConnectionError("the daemon closed the connection without answering")
    reply: Message = json.loads(line)
    return reply


def pull_via_daemon(cache_root: Path, ref: ModelRef, lease_s: float | None) -> Path | None:
    """A tenant's pull: the node daemon stages `ref` with its own credentials and records the use and lease.

    None when no daemon answers, so the caller can still hand out a model that
    is already ready. The daemon's refusal or failure is raised with its exit code.
    """
    reply = _pull(cache_root, {"op": "pull", "model": ref.uri, "lease_s": lease_s})
    return None if reply is None else Path(str(reply["path"]))


def pull_name_via_daemon(cache_root: Path, name: str, lease_s: float | None) -> str | None:
    """A pull by the schedule's name: the daemon stages its variant for this node's pool.

    The model id (`bucket/prefix`) it chose; None when no daemon answers.
    """
    reply = _pull(cache_root, {"op": "pull", "name": name, "lease_s": lease_s})
    return None if reply is None else str(reply["model"])


def _pull(cache_root: Path, request: Message) -> Message | None:
    sock = socket_path(cache_root)
    if sock.exists() and not os.access(sock, os.R_OK | os.W_OK):
        raise LocalStorageError(
            f"no permission to connect to the node daemon's socket {sock}; run in the cache's group "
            f"(gid {sock.stat().st_gid}: add it to the pod's securityContext.supplementalGroups)"
        )
    try:
        reply = call(sock, request)
    except ConnectionError:
        raise LocalStorageError(
            "the node daemon stopped before answering; run the command again once it is back"
        ) from None
    if reply is not None and not reply.get("ok"):
        raise error_from_reply(reply)
    return reply


def _answers(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        try:
            with _address(path) as address:
                sock.connect(address)
        except OSError:
            return False
    return True


def scheduled_names(cache_root: Path) -> dict[str, dict[str, str | None]]:
    """model id -> its schedule name and variant, from the node daemon's plan; empty without a daemon.

    For `ls`: a daemon that does not answer within 2 s leaves the names out.
    """
    try:
        reply = call(socket_path(cache_root), {"op": "status"}, timeout_s=2.0)
    except (ConnectionError, OSError, ValueError):
        return {}
    plan = reply.get("plan") if reply is not None and reply.get("ok") else None
    if not isinstance(plan, dict):
        return {}
    # an unnamed model's label is its source URI (or, unscheduled, its id)
    return {
        str(m["model"]): {"name": str(m["label"]), "variant": m.get("variant")}
        for m in plan.get("models", [])
        if m.get("label") != m.get("model") and not str(m.get("label")).startswith("s3://")
    }
