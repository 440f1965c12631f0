"""The transfer threads keep an executor's promises: results, errors, calls that run to their end."""

from __future__ import annotations

import asyncio
import threading

import pytest

from modelsync.engine.transfer_threads import TransferThreads, in_thread

pytestmark = pytest.mark.timeout(30)


def threads(n: int = 2) -> TransferThreads:
    return TransferThreads(asyncio.get_running_loop(), n, "test", lambda: None)


def test_results_and_errors_come_back_to_their_own_callers() -> None:
    def square(x: int) -> int:
        if x == 3:
            raise ValueError("three")
        return x * x

    async def main() -> list[object]:
        pool = threads(3)
        try:
            futures = [pool.submit(square, i) for i in range(20)]
            return await asyncio.gather(*futures, return_exceptions=True)
        finally:
            pool.shutdown()

    got = asyncio.run(main())
    assert [g for i, g in enumerate(got) if i != 3] == [i * i for i in range(20) if i != 3]
    assert isinstance(got[3], ValueError)


def test_a_cancelled_waiter_returns_only_once_its_call_has_ended() -> None:
    """As with an executor: a started call cannot be stopped, and its file must stay open until it ends."""
    started, release = threading.Event(), threading.Event()
    ended: list[bool] = []

    def call() -> None:
        started.set()
        release.wait(10)
        ended.append(True)

    async def main() -> None:
        pool = threads(1)
        try:
            waiter = asyncio.ensure_future(in_thread(pool.submit(call)))
            await asyncio.to_thread(started.wait, 10)
            waiter.cancel()
            await asyncio.sleep(0.05)
            assert not waiter.done(), "the waiter must wait for the running call"
            release.set()
            with pytest.raises(asyncio.CancelledError):
                await waiter
            assert ended == [True]
        finally:
            pool.shutdown()

    asyncio.run(main())


def test_shutdown_cancels_the_calls_no_thread_took_and_joins_the_running_one() -> None:
    started, release = threading.Event(), threading.Event()
    ran: list[int] = []

    def call(i: int) -> None:
        if i == 0:
            started.set()
            release.wait(10)
        ran.append(i)

    async def main() -> None:
        pool = threads(1)
        first = pool.submit(call, 0)
        queued = [pool.submit(call, i) for i in range(1, 5)]
        await asyncio.to_thread(started.wait, 10)
        threading.Timer(0.1, release.set).start()
        pool.shutdown()  # blocks until the running call has ended
        assert ran == [0]
        assert all(f.cancelled() for f in queued)
        await asyncio.sleep(0)  # the running call's result is settled on the loop
        await asyncio.sleep(0)
        assert first.done() and first.result() is None

    asyncio.run(main())
