"""The local API's listener: one connection, one request, one reply (protocol.py), behind guard.py's caps.

The server knows the wire and the guard; what each op does is the handler's
(handlers.py), given to `serve`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path

from modelsync.core.file_kind import file_kind
from modelsync.core.units import format_bytes
from modelsync.errors import DaemonBusyError, ModelsyncError, UsageError
from modelsync.local_api.guard import (
    MAX_REQUEST_BYTES,
    REQUEST_TIMEOUT_S,
    AcceptFailures,
    Admission,
    LogThrottle,
    Refusals,
    peer_uid,
    shape_error,
)
from modelsync.local_api.protocol import SOCKET_MODE, Message, address, connect, encode, error_reply

Handler = Callable[[Message], Awaitable[Message]]


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
    refusals = Refusals(Admission(), LogThrottle(), set())
    asyncio.get_running_loop().set_exception_handler(AcceptFailures(LogThrottle(every_s=1.0)))
    try:
        with address(path) as where:
            server = await asyncio.start_unix_server(
                lambda r, w: _connection(handler, refusals, r, w), path=where, limit=MAX_REQUEST_BYTES
            )
    except OSError as exc:
        raise UsageError(f"cannot listen on {path}: {exc.strerror or exc}") from None
    os.chmod(path, SOCKET_MODE)
    return server


def _answers(path: Path) -> bool:
    """Whether a live daemon listens on `path`."""
    sock = connect(path, 1.0)
    if sock is None:
        return False
    sock.close()
    return True


async def _connection(
    handler: Handler, refusals: Refusals, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    uid = peer_uid(writer.get_extra_info("socket"))
    refusal = refusals.admission.admit(uid)
    try:
        if refusal is not None:
            refusals.refused(uid, refusal)
            reply: Message | None = {"ok": False, **error_reply(DaemonBusyError(refusal))}
        else:
            reply = await _answer(handler, reader)
        if reply is not None:
            writer.write(encode(reply))
            await writer.drain()
    except ConnectionError:
        pass  # the client went away; whatever it asked for goes on
    finally:
        if refusal is None:
            refusals.admission.release(uid)
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
