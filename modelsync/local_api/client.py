"""The one client of the daemon's local API: `prefetch`, a tenant's `pull` (by source or by name), `ls`.

Every call is one request and one reply on a fresh connection (protocol.py).
None stands for "no daemon listens": each caller decides what to do alone.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from modelsync.core.refs import ModelRef
from modelsync.errors import LocalStorageError
from modelsync.local_api.protocol import (
    MAX_LINE_BYTES,
    Message,
    connect,
    encode,
    error_from_reply,
    socket_path,
)


def call(path: Path, request: Message, timeout_s: float | None = None) -> Message | None:
    """Send one request and wait for its reply; None when no daemon listens on `path`.

    Raises ConnectionError when the daemon hangs up before answering (it was
    stopped), so the caller can fall back to working alone.
    """
    sock = connect(path, timeout_s)
    if sock is None:
        return None
    with sock:
        sock.sendall(encode(request))
        with sock.makefile("rb") as stream:
            line = stream.readline(MAX_LINE_BYTES)
    if not line:
        raise ConnectionError("the daemon closed the connection without answering")
    reply: Message = json.loads(line)
    return reply


def prefetch_via_daemon(cache_root: Path, refs: list[ModelRef], wait: bool) -> list[Message] | None:
    """Ask the daemon to stage `refs` now: one entry per model (its path, its error, or queued).

    None when no daemon answers; ConnectionError when it stops before answering.
    A refusal of the whole request is raised with its exit code.
    """
    request = {"op": "prefetch", "models": [r.uri for r in refs], "wait": wait}
    reply = call(socket_path(cache_root), request)
    if reply is None:
        return None
    if not reply.get("ok"):
        raise error_from_reply(reply)
    models: list[Message] = reply["models"]
    return models


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
