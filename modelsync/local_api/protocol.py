"""The local API's wire: one JSON line each way over a Unix socket in the cache's state folder.

A Unix socket, not the HTTP listener: only processes that share the cache
(the node's init containers and operators) can reach it, and its mode (0660,
the cache's group) says which. The HTTP listener serves metrics and probes
only. The socket lives at `<cache>/.modelsync/daemon.sock`.

One request per connection, each message one JSON object and a newline:

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
(local_api/guard.py). Beyond a cap the daemon answers one refusal (code
"daemon_busy", exit code 6) and hangs up.

A request the daemon cannot serve gets {"ok": false, "error": "...", "code": "...", "exit_code": 2};
one for a source it does not serve (not in the schedule, not under an allowed
prefix) gets code "not_allowed" and exit code 8. The caller rebuilds the error
as its own class from the code (`errors.error_from_code`), so `except
NotFoundError` catches the daemon's "not found" as it catches its own.

Versions: the wire carries no version number. The daemon and its callers ship
in one image, and a change stays compatible by adding: a new op or a new
optional field. A daemon refuses an op it does not know (a usage error, exit
code 2) and ignores fields it does not know, so an older daemon answers a newer
caller plainly; a field's meaning never changes, and a test pins the bytes.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from modelsync.adapters.cache import STATE_DIR
from modelsync.errors import ModelsyncError, error_from_code

SOCKET_NAME = "daemon.sock"
SOCKET_MODE = 0o660
#: the longest reply a caller reads: a status with its plan can be long
MAX_LINE_BYTES = 1024 * 1024

Message = dict[str, Any]

# sun_path holds 108 bytes with its NUL; a cache deep in a host path can need more.
_SUN_PATH_BYTES = 107


def socket_path(cache_root: Path) -> Path:
    return cache_root / STATE_DIR / SOCKET_NAME


def encode(message: Message) -> bytes:
    """One message as it goes on the wire, either way: its JSON and a newline."""
    return json.dumps(message).encode() + b"\n"


def error_reply(exc: ModelsyncError) -> Message:
    """The fields of a reply (or of one model's entry in it) that carry an error."""
    return {"error": str(exc), "code": exc.code, "exit_code": int(exc.exit_code)}


def error_from_reply(reply: Message) -> ModelsyncError:
    """The daemon's error as the CLI raises it: its own class again, same message and exit code."""
    message = str(reply.get("error", "the daemon refused the request"))
    exit_code = reply.get("exit_code")
    return error_from_code(
        str(reply.get("code", "internal")), message, exit_code if isinstance(exit_code, int) else None
    )


@contextlib.contextmanager
def address(path: Path) -> Iterator[str]:
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


def connect(path: Path, timeout_s: float | None) -> socket.socket | None:
    """A connection to the socket at `path`; None when there is no socket (or directory) or nobody listens."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout_s)
    try:
        with address(path) as where:
            sock.connect(where)
    except OSError:
        sock.close()
        return None
    return sock
