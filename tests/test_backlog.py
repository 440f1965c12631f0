"""The hashing backlog: transfers never run more than its budget ahead of the hashers, and never stall."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest
from support.fakes import FakeFetcher, FakeStore, fake_backends

from modelsync.adapters.digest import PrefixHasher
from modelsync.config import Settings
from modelsync.core.parts import Part
from modelsync.core.refs import parse_source
from modelsync.engine.backlog import BACKLOG_WINDOWS, Backlog, FileBacklog
from modelsync.engine.ensure import ReadyOptions, ensure_ready
from modelsync.engine.ports import RangeRequest
from modelsync.engine.rules import pull_rules

pytestmark = pytest.mark.timeout(60)

PART = 4096
REF = parse_source("s3://models/org/llm/r1/")


def test_parts_within_the_budget_pass_and_the_next_waits_until_bytes_are_released() -> None:
    async def scenario() -> list[str]:
        backlog = Backlog(10)
        await backlog.admit(4)
        await backlog.admit(6)
        order: list[str] = []

        async def admit(name: str, n_bytes: int) -> None:
            await backlog.admit(n_bytes)
            order.append(name)

        first = asyncio.create_task(admit("first", 5))
        second = asyncio.create_task(admit("second", 1))  # would fit after `first`: waits its turn
        await asyncio.sleep(0)
        assert order == [] and backlog.held_bytes == 10
        backlog.release(4)
        await asyncio.sleep(0)
        assert order == [] and backlog.held_bytes == 6  # 6 + 5 > 10: nobody passes `first`
        backlog.release(6)
        await asyncio.gather(first, second)
        assert backlog.held_bytes == 6
        return order

    assert asyncio.run(scenario()) == ["first", "second"]


def test_a_part_larger_than_the_budget_passes_when_nothing_else_is_held() -> None:
    async def scenario() -> int:
        backlog = Backlog(10)
        await backlog.admit(3)
        big = asyncio.create_task(backlog.admit(25))
        await asyncio.sleep(0)
        assert not big.done()
        backlog.release(3)
        await big
        return backlog.held_bytes

    assert asyncio.run(scenario()) == 25


def test_a_part_cancelled_while_waiting_lets_the_ones_behind_it_in() -> None:
    async def scenario() -> int:
        backlog = Backlog(10)
        await backlog.admit(8)
        blocked = asyncio.create_task(backlog.admit(5))
        behind = asyncio.create_task(backlog.admit(2))
        await asyncio.sleep(0)
        blocked.cancel()
        await asyncio.wait_for(behind, 1)
        with pytest.raises(asyncio.CancelledError):
            await blocked
        return backlog.held_bytes

    assert asyncio.run(scenario()) == 10


def test_a_file_frees_its_parts_as_its_hasher_passes_them_and_the_rest_when_it_closes() -> None:
    async def scenario() -> list[int]:
        backlog = Backlog(100)
        file = FileBacklog(backlog)
        for i in range(4):
            await file.admit(Part(i, i * 10, (i + 1) * 10))
        held = [backlog.held_bytes]
        file.hashed(15)  # inside the second part: only the first is behind the hasher
        held.append(backlog.held_bytes)
        file.hashed(20)
        held.append(backlog.held_bytes)
        file.close()
        return [*held, backlog.held_bytes]

    assert asyncio.run(scenario()) == [40, 30, 20, 0]


class Watched:
    """Records, as each GET starts, how many bytes have been fetched ahead of the hashers."""

    def __init__(self) -> None:
        self.hashed = self.started = 0
        self.ahead: list[int] = []
        self.lock = threading.Lock()

    def start(self, req: RangeRequest) -> None:
        with self.lock:
            self.started += req.end - req.start
            self.ahead.append(self.started - self.hashed)


def test_a_pull_whose_hashing_lags_fetches_at_most_the_backlog_ahead_and_completes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slow hashers (a signed pull's SHA-256) pace the transfers instead of the page cache filling."""
    files = {f"shard-{i}.bin": bytes((j * 7 + i) % 251 for j in range(24 * PART + 5)) for i in range(3)}
    store = FakeStore()
    store.put_model(REF, files)
    watched = Watched()
    fetcher = FakeFetcher(store, on_start=watched.start)
    feed, update = PrefixHasher.feed, PrefixHasher.update

    def slow_feed(self: PrefixHasher, fd: int, end: int) -> None:
        time.sleep(0.02)
        before = self.position
        feed(self, fd, end)
        with watched.lock:
            watched.hashed += self.position - before

    def slow_update(self: PrefixHasher, data: memoryview) -> None:  # a transfer hashing its own bytes
        time.sleep(0.02)
        update(self, data)
        with watched.lock:
            watched.hashed += len(data)

    monkeypatch.setattr(PrefixHasher, "feed", slow_feed)
    monkeypatch.setattr(PrefixHasher, "update", slow_update)
    settings = Settings(cache_dir=tmp_path / "cache", part_size_bytes=PART, concurrency=2)
    backends = fake_backends(store, fetcher)

    result = ensure_ready(pull_rules(settings, REF), backends=backends, options=ReadyOptions())

    for name, body in files.items():
        assert (result.path / name).read_bytes() == body
    assert max(watched.ahead) <= BACKLOG_WINDOWS * settings.concurrency * PART
