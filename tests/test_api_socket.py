"""The daemon's Unix socket on a cache deep in a host path: longer than sun_path allows."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from modelsync.errors import UsageError
from modelsync.local_api.client import call
from modelsync.local_api.protocol import Message, socket_path
from modelsync.local_api.server import serve


def _deep_cache(tmp_path: Path) -> Path:
    cache = tmp_path / ("node-" + "x" * 60) / ("model-cache-" + "y" * 40)
    socket_path(cache).parent.mkdir(parents=True)
    assert len(str(socket_path(cache))) > 108
    return cache


async def _echo(request: Message) -> Message:
    return {"echo": request["op"]}


def test_a_daemon_on_a_deep_cache_listens_and_answers_at_its_socket_path(tmp_path: Path) -> None:
    sock = socket_path(_deep_cache(tmp_path))

    async def scenario() -> Message | None:
        server = await serve(sock, _echo)
        try:
            return await asyncio.to_thread(call, sock, {"op": "ping"}, 5.0)
        finally:
            server.close()
            await server.wait_closed()

    assert asyncio.run(scenario()) == {"ok": True, "echo": "ping"}
    assert sock.is_socket()


def test_a_second_daemon_on_the_same_deep_cache_is_refused(tmp_path: Path) -> None:
    sock = socket_path(_deep_cache(tmp_path))

    async def scenario() -> None:
        server = await serve(sock, _echo)
        try:
            with pytest.raises(UsageError, match="already serves"):
                await serve(sock, _echo)
        finally:
            server.close()
            await server.wait_closed()

    asyncio.run(scenario())


def test_nobody_listening_on_a_deep_cache_is_no_daemon(tmp_path: Path) -> None:
    assert call(socket_path(_deep_cache(tmp_path)), {"op": "ping"}, 1.0) is None
