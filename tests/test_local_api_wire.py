"""The local API's bytes on the wire, pinned: a daemon and its callers from different releases meet
on a node (a rollout, a tenant image older than the DaemonSet), so neither side may change them."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from modelsync.core.refs import parse_model_name
from modelsync.errors import NotFoundError, SourceNotAllowedError
from modelsync.local_api.client import (
    prefetch_via_daemon,
    pull_name_via_daemon,
    pull_via_daemon,
    scheduled_names,
)
from modelsync.local_api.protocol import Message, socket_path
from modelsync.local_api.server import serve

REF = parse_model_name("s3://models/org/m/v1/")


class _RawDaemon:
    """A listener that records each request's bytes and answers with the bytes it is given."""

    def __init__(self, path: Path, reply: bytes) -> None:
        self.requests: list[bytes] = []
        self._reply = reply
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(path))
        self._listener.listen()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with conn, conn.makefile("rb") as stream:
                self.requests.append(stream.readline())
                conn.sendall(self._reply)

    def close(self) -> None:
        self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self._thread.join(5)


@pytest.fixture
def raw_daemon(tmp_path: Path) -> Iterator[Callable[[bytes], _RawDaemon]]:
    socket_path(tmp_path).parent.mkdir(parents=True)
    started: list[_RawDaemon] = []

    def start(reply: bytes) -> _RawDaemon:
        started.append(_RawDaemon(socket_path(tmp_path), reply))
        return started[-1]

    yield start
    for daemon in started:
        daemon.close()


def test_prefetch_sends_its_models_and_reads_each_outcome(
    tmp_path: Path, raw_daemon: Callable[[bytes], _RawDaemon]
) -> None:
    daemon = raw_daemon(
        b'{"ok": true, "models": [{"model": "models/org/m/v1", "path": "/c/models/org/m/v1"}]}\n'
    )
    entries = prefetch_via_daemon(tmp_path, [REF], wait=False)
    assert daemon.requests == [b'{"op": "prefetch", "models": ["s3://models/org/m/v1/"], "wait": false}\n']
    assert entries == [{"model": "models/org/m/v1", "path": "/c/models/org/m/v1"}]


def test_a_pull_by_source_and_by_name_send_the_same_op(
    tmp_path: Path, raw_daemon: Callable[[bytes], _RawDaemon]
) -> None:
    daemon = raw_daemon(b'{"ok": true, "model": "models/org/m/v1", "path": "/c/models/org/m/v1"}\n')
    assert pull_via_daemon(tmp_path, REF, 28800) == Path("/c/models/org/m/v1")
    assert pull_name_via_daemon(tmp_path, "m", None) == "models/org/m/v1"
    assert daemon.requests == [
        b'{"op": "pull", "model": "s3://models/org/m/v1/", "lease_s": 28800}\n',
        b'{"op": "pull", "name": "m", "lease_s": null}\n',
    ]


def test_a_refusal_comes_back_as_the_daemons_error_class(
    tmp_path: Path, raw_daemon: Callable[[bytes], _RawDaemon]
) -> None:
    raw_daemon(b'{"ok": false, "error": "not in the schedule", "code": "not_allowed", "exit_code": 8}\n')
    with pytest.raises(SourceNotAllowedError, match="not in the schedule") as caught:
        pull_via_daemon(tmp_path, REF, None)
    assert int(caught.value.exit_code) == 8


def test_ls_asks_for_the_status_and_reads_the_names_of_its_plan(
    tmp_path: Path, raw_daemon: Callable[[bytes], _RawDaemon]
) -> None:
    daemon = raw_daemon(
        b'{"ok": true, "pool": "a100", "ready": true, "paused": false, "current": null, "plan": '
        b'{"models": [{"model": "models/org/m/v1", "label": "m", "variant": "fp8"}]}}\n'
    )
    assert scheduled_names(tmp_path) == {"models/org/m/v1": {"name": "m", "variant": "fp8"}}
    assert daemon.requests == [b'{"op": "status"}\n']


async def _answer(request: Message) -> Message:
    if request.get("op") == "pull":
        return {"model": "models/org/m/v1", "path": "/c/models/org/m/v1"}
    raise NotFoundError("no such model")


@pytest.mark.parametrize(
    ("request_line", "reply_line"),
    [
        (
            b'{"op": "pull", "model": "s3://models/org/m/v1/"}\n',
            b'{"ok": true, "model": "models/org/m/v1", "path": "/c/models/org/m/v1"}\n',
        ),
        (
            b'{"op": "prefetch"}\n',
            b'{"ok": false, "error": "no such model", "code": "not_found", "exit_code": 3}\n',
        ),
        (
            b"[1]\n",
            b'{"ok": false, "error": "a request is one JSON object on one line, not a JSON list", '
            b'"code": "usage", "exit_code": 2}\n',
        ),
    ],
)
def test_the_server_answers_one_json_line(tmp_path: Path, request_line: bytes, reply_line: bytes) -> None:
    sock = socket_path(tmp_path)
    sock.parent.mkdir(parents=True)

    def exchange() -> bytes:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(5)
            conn.connect(str(sock))
            conn.sendall(request_line)
            with conn.makefile("rb") as stream:
                return stream.read()

    async def scenario() -> bytes:
        server = await serve(sock, _answer)
        try:
            return await asyncio.to_thread(exchange)
        finally:
            server.close()
            await server.wait_closed()

    assert asyncio.run(scenario()) == reply_line
