"""The daemon's loop (engine/reconcile.py) wired to a fake `ensure_ready`: no server, no sleep.

The loop's choices are core/queue.py's (tested as tables in test_daemon_queue.py);
these tests check the sequencing around them: a waiting pod's request preempts a
background prefetch that then resumes, an announced foreground pull pauses the
loop, and an error reaches the waiter with its own class. The fake pulls run in
the loop's real daemon threads and hand-shake through events, never timers.
test_daemon.py runs the real daemon end to end.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from modelsync.config import Settings
from modelsync.core.eviction import CacheEntry
from modelsync.core.plan import NodePlan
from modelsync.core.refs import parse_source
from modelsync.core.schedule import load_schedule
from modelsync.engine.ensure import PullResult, ReadyOptions
from modelsync.engine.events import PullEvents
from modelsync.engine.inventory import RemoteSizes
from modelsync.engine.reconcile import LoopConfig, Reconciler
from modelsync.engine.rules import PullRules
from modelsync.errors import NotFoundError, PullCancelledError

pytestmark = pytest.mark.timeout(60)

POOL = "gpu"
BACKGROUND = parse_source("s3://models/org/bg/r1/")
WANTED = parse_source("s3://models/org/wanted/r1/")
SCHEDULE = f"""\
version: 1
models:
  - name: bg
    source: {BACKGROUND.uri}
    pools: [{POOL}]
    windows: [always]
"""


class Observer:
    """A LoopObserver that keeps what it was told."""

    def __init__(self) -> None:
        self.paused: list[bool] = []
        self.failures: list[str] = []
        self.succeeded: list[str] = []

    def fetched(self, n_bytes: int) -> None:
        pass

    def observe_plan(self, plan: NodePlan, reconciled_at: float) -> None:
        pass

    def pull_succeeded(self, label: str, seconds: float, margin_s: float | None) -> None:
        self.succeeded.append(label)

    def pull_failed(self, code: str, integrity: bool) -> None:
        self.failures.append(code)

    def evicted(self, models: int) -> None:
        pass

    def set_paused(self, paused: bool) -> None:
        self.paused.append(paused)


class FakeEnsureReady:
    """Stands in for `ensure_ready`: each model's pulls play a script of outcomes, in order.

    "block" waits until the loop cancels the pull, then raises PullCancelledError
    (so does every pull past the end of the script); an exception is raised; an
    event is waited for, then the pull ends ready; anything else returns a ready
    result. Every start is an event a test can wait for.
    """

    def __init__(self, cache_dir: Path, script: dict[str, list[object]]) -> None:
        self.cache_dir = cache_dir
        self.script = script
        self.calls: list[tuple[str, ReadyOptions]] = []
        self.started = {model: [threading.Event() for _ in range(8)] for model in script}

    def __call__(self, rules: PullRules, *, events: PullEvents, options: ReadyOptions) -> PullResult:
        ref = rules.source
        attempt = sum(1 for model, _ in self.calls if model == ref.model_id)
        self.calls.append((ref.model_id, options))
        self.started[ref.model_id][attempt].set()
        outcomes = self.script[ref.model_id]
        outcome = outcomes[attempt] if attempt < len(outcomes) else "block"
        if outcome == "block":
            assert options.cancel is not None
            options.cancel.wait(30)
            raise PullCancelledError("cancelled")
        if isinstance(outcome, Exception):
            raise outcome
        if isinstance(outcome, threading.Event):
            assert outcome.wait(30)
        return PullResult(self.cache_dir / ref.cache_path, 1, 1, 0.0, 1)

    async def wait_started(self, model_id: str, attempt: int) -> None:
        assert await asyncio.to_thread(self.started[model_id][attempt].wait, 30)


def loop(
    tmp_path: Path,
    ensure: FakeEnsureReady,
    announced: Callable[[], frozenset[str]] = frozenset,
    scheduled: bool = True,
    cached: tuple[CacheEntry, ...] = (),
    refresh_s: float = 0.0,
) -> tuple[Reconciler, Observer]:
    """A loop over a cache that the fake never fills: a scheduled model is still to fetch unless `cached`."""
    observer = Observer()
    reconciler = Reconciler(
        Settings(cache_dir=tmp_path / "cache"),
        LoopConfig(pool=POOL, node="node-a", jitter_max_s=0.0, refresh_s=refresh_s, poll_s=0.05),
        observer,
        ensure,
        inventory=lambda cache: list(cached),
        foreground=lambda cache_dir: announced(),
        sizer=lambda refs: RemoteSizes({}, {}),
    )
    reconciler.cache.ensure()
    if scheduled:
        reconciler.set_schedule(load_schedule(SCHEDULE, "schedule.yaml"))
    return reconciler, observer


async def running(reconciler: Reconciler, body: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run the loop around `body`, then stop it."""
    stop = asyncio.Event()
    task = asyncio.create_task(reconciler.run(stop))
    try:
        await body()
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


def test_a_waiting_pods_request_preempts_a_background_prefetch_which_then_resumes(tmp_path: Path) -> None:
    script: dict[str, list[object]] = {BACKGROUND.model_id: ["block", "ok"], WANTED.model_id: ["ok"]}
    ensure = FakeEnsureReady(tmp_path / "cache", script)
    reconciler, observer = loop(tmp_path, ensure)

    async def body() -> None:
        await ensure.wait_started(BACKGROUND.model_id, 0)
        (future,) = reconciler.request([WANTED], preempt=True)
        assert await asyncio.wait_for(future, 30) == tmp_path / "cache" / WANTED.cache_path
        await ensure.wait_started(BACKGROUND.model_id, 1)

    asyncio.run(running(reconciler, body))

    order = [model for model, _ in ensure.calls[:3]]
    assert order == [BACKGROUND.model_id, WANTED.model_id, BACKGROUND.model_id]
    prefetch, request = (options for _, options in ensure.calls[:2])
    assert not prefetch.refresh and prefetch.use, "a fetch the schedule asked for is a use"
    assert request.cancel is not None and not request.cancel.is_set()
    assert observer.failures == [], "yielding is not a failure"


def test_an_announced_foreground_pull_pauses_the_loop_and_the_prefetch_resumes_after(tmp_path: Path) -> None:
    announced: list[frozenset[str]] = [frozenset()]
    ensure = FakeEnsureReady(tmp_path / "cache", {BACKGROUND.model_id: ["block", "ok"]})
    reconciler, observer = loop(tmp_path, ensure, lambda: announced[0])

    async def body() -> None:
        await ensure.wait_started(BACKGROUND.model_id, 0)
        announced[0] = frozenset({"models/org/other/r1"})
        first = ensure.calls[0][1].cancel
        assert first is not None and await asyncio.to_thread(first.wait, 30), "the prefetch yields"
        assert not ensure.started[BACKGROUND.model_id][1].is_set()
        announced[0] = frozenset()
        await ensure.wait_started(BACKGROUND.model_id, 1)

    asyncio.run(running(reconciler, body))

    assert observer.paused == [True, False]
    assert observer.succeeded == ["bg"]


def test_a_failed_pull_reaches_its_waiter_with_its_own_error_class(tmp_path: Path) -> None:
    missing = NotFoundError("no objects under s3://models/org/wanted/r1/; check the prefix")
    ensure = FakeEnsureReady(tmp_path / "cache", {WANTED.model_id: [missing]})
    reconciler, observer = loop(tmp_path, ensure, scheduled=False)

    async def body() -> None:
        (future,) = reconciler.request([WANTED])
        with pytest.raises(NotFoundError, match="check the prefix"):
            await asyncio.wait_for(future, 30)

    asyncio.run(running(reconciler, body))

    assert observer.failures == ["not_found"]
    assert WANTED.model_id in reconciler.queue.retries, "the failed model backs off"


def test_a_request_made_during_a_refresh_check_is_answered_when_the_check_ends(tmp_path: Path) -> None:
    """The check's end is the request's: its waiter gets the path, not a wait until the daemon stops."""
    release = threading.Event()
    ensure = FakeEnsureReady(tmp_path / "cache", {BACKGROUND.model_id: [release]})
    staged = CacheEntry(BACKGROUND.model_id, last_used_at=0.0)
    reconciler, _ = loop(tmp_path, ensure, cached=(staged,), refresh_s=900.0)

    async def body() -> None:
        await ensure.wait_started(BACKGROUND.model_id, 0)
        assert ensure.calls[0][1].refresh, "a staged model is checked, not fetched"
        (future,) = reconciler.request([BACKGROUND], preempt=True)
        release.set()
        assert await asyncio.wait_for(future, 10) == tmp_path / "cache" / BACKGROUND.cache_path

    asyncio.run(running(reconciler, body))

    assert len(ensure.calls) == 1, "the request needed no second pull"
