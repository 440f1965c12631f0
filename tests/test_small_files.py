"""Many small files: a batch of them goes to a transfer thread in one trip (engine/pull.py
`_small_files`), and every guarantee of the one-file path holds: a failed try counts as the
first attempt and resumes from its last byte, the gate is never passed by, a cancelled pull
stops, and every file is verified before the model is ready.

In-memory backends (tests/support/fakes.py); the cache, the journal and hashing are real.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from support.fakes import FakeFetcher, FakeStore, cut_after, fake_backends, hang_until_closed

from modelsync.adapters.cache import Cache
from modelsync.config import Settings
from modelsync.core.parts import RemoteFile, plan_pull
from modelsync.core.refs import parse_source
from modelsync.core.send_gate import SendGate
from modelsync.engine.ensure import PullResult, ReadyOptions, ensure_ready
from modelsync.engine.file_pull import BATCH_FILES, batch_size, in_batches
from modelsync.engine.ports import Backends, OpenBackends, RangeRequest
from modelsync.engine.rules import pull_rules
from modelsync.engine.throttle import StoreGate
from modelsync.engine.transfer_threads import TransferThreads
from modelsync.errors import PullCancelledError, RemoteUnavailableError

pytestmark = pytest.mark.timeout(60)

REF = parse_source("s3://models/org/many/r1/")
PART = 4096
FILES = 64


def small(i: int) -> bytes:
    return bytes((i * 7 + j) % 251 for j in range(1000 + i))


def name(i: int) -> str:
    return f"shard-{i:03d}.json"


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(cache_dir=tmp_path / "cache", part_size_bytes=PART, concurrency=1, backoff_floor_s=0.001)


@pytest.fixture
def store() -> FakeStore:
    store = FakeStore()
    store.put_model(REF, {name(i): small(i) for i in range(FILES)})
    return store


@pytest.fixture
def fetcher(store: FakeStore) -> FakeFetcher:
    return FakeFetcher(store)


def ensure(settings: Settings, store: FakeStore, fetcher: FakeFetcher, **options: Any) -> PullResult:
    return ensure_ready(
        pull_rules(settings, REF),
        backends=fake_backends(store, fetcher),
        options=ReadyOptions(**options),
    )


def assert_ready(result: PullResult) -> None:
    for i in range(FILES):
        assert (result.path / name(i)).read_bytes() == small(i)


def test_a_batch_of_small_files_is_one_trip_to_a_transfer_thread(
    settings: Settings, store: FakeStore, fetcher: FakeFetcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    trips = []
    submit = TransferThreads.submit

    def counted(self: TransferThreads, fn: Callable[..., Any], *args: Any) -> Any:
        trips.append(fn)
        return submit(self, fn, *args)

    monkeypatch.setattr(TransferThreads, "submit", counted)

    result = ensure(settings, store, fetcher)

    assert_ready(result)
    assert len(trips) == FILES // BATCH_FILES  # one thread: a quarter of the files a trip, 16 at most
    assert sorted(fetcher.fetched_keys()) == sorted(REF.prefix + name(i) for i in range(FILES))
    record = Cache(settings.cache_dir).ready_record(REF)
    assert record is not None and len(record.files) == FILES and record.verified_by == "manifest"


def test_a_file_cut_inside_a_batch_resumes_from_its_last_byte_and_the_others_are_fetched_once(
    settings: Settings, store: FakeStore, fetcher: FakeFetcher
) -> None:
    cut = REF.prefix + name(5)
    fetcher.faults[cut] = [cut_after(100)]

    result = ensure(settings, store, fetcher)

    assert_ready(result)
    assert [(f.start, f.end) for f in fetcher.fetches if f.key == cut] == [(100, len(small(5)))]
    keys = fetcher.fetched_keys()
    assert len(keys) == len(set(keys)) == FILES


def test_a_failed_try_in_a_batch_is_the_first_of_the_files_attempts(
    tmp_path: Path, store: FakeStore, fetcher: FakeFetcher
) -> None:
    settings = Settings(cache_dir=tmp_path / "cache", concurrency=1, part_attempts=3, backoff_floor_s=0.001)
    tries = []

    def failing(req: RangeRequest, fd: int, offset: int, data: bytes) -> None:
        tries.append(req.start)
        cut_after(0)(req, fd, offset, data)

    fetcher.faults[REF.prefix + name(9)] = [failing] * 10

    with pytest.raises(RemoteUnavailableError, match="without progress"):
        ensure(settings, store, fetcher)

    assert tries == [0, 0, 0]
    assert Cache(settings.cache_dir).ready_record(REF) is None


def test_a_batch_sends_nothing_while_the_gate_holds_every_start(
    settings: Settings, store: FakeStore, fetcher: FakeFetcher
) -> None:
    """A store's Retry-After holds every start: a batch's thread, which must not wait, gives its
    files back to the event loop, where they wait for the gate like any other request."""
    gate = StoreGate()
    gate.throttled(0.3)
    held_until = time.monotonic() + 0.3
    sent = []

    def when(req: RangeRequest, fd: int, offset: int, data: bytes) -> None:
        sent.append(time.monotonic())

    for i in range(FILES):
        fetcher.faults[REF.prefix + name(i)] = [when]

    result = ensure_ready(pull_rules(settings, REF), backends=_with_gate(store, fetcher, gate))

    assert_ready(result)
    assert len(sent) == FILES and min(sent) >= held_until - 0.05


def test_a_cancelled_pull_stops_inside_a_batch_and_publishes_nothing(
    settings: Settings, store: FakeStore, fetcher: FakeFetcher
) -> None:
    stalled, cancel = threading.Event(), threading.Event()
    fetcher.faults[REF.prefix + name(2)] = [hang_until_closed(fetcher, stalled)]
    threading.Thread(target=lambda: stalled.wait(30) and cancel.set(), daemon=True).start()

    started = time.monotonic()
    with pytest.raises(PullCancelledError):
        ensure(settings, store, fetcher, cancel=cancel)

    assert time.monotonic() - started < 5
    assert fetcher.fetched_keys() == [REF.prefix + name(i) for i in range(2)], "none after the stalled one"
    assert Cache(settings.cache_dir).ready_record(REF) is None

    result = ensure(settings, store, fetcher)  # and the next pull finishes it

    assert_ready(result)


def test_batches_keep_every_transfer_thread_busy_and_hold_at_most_batch_files() -> None:
    assert batch_size(2000, 8) == BATCH_FILES
    assert batch_size(100, 8) == 3
    assert batch_size(20, 8) == 1
    assert batch_size(0, 8) == 1


def test_in_batches_groups_the_batchable_files_in_order_and_passes_the_others_alone() -> None:
    files = [RemoteFile(f"k{i}", f"f{i}", 10 if i % 3 else 10_000, "e") for i in range(8)]
    works = plan_pull(files, 1000, {}).files

    items = list(in_batches(works, lambda w: w.file.size_bytes == 10, 2))

    assert [[w.file.path for w in i] if isinstance(i, list) else i.file.path for i in items] == [
        "f0",
        ["f1", "f2"],
        "f3",
        ["f4", "f5"],
        "f6",
        ["f7"],
    ]


def test_a_gate_that_would_make_a_start_wait_gives_no_slot() -> None:
    gate = SendGate(window_s=1.0)
    assert all(gate.try_reserve(0.0) for _ in range(10)), "unthrottled, every start is free"
    gate.throttled(1.0)
    rate = gate.rate_per_s
    assert rate is not None
    assert gate.try_reserve(1.0 + 1 / rate)
    assert not gate.try_reserve(1.0 + 1 / rate), "the next slot is later"
    assert gate.reserve(1.0 + 1 / rate) == pytest.approx(1 / rate), "and no slot was taken by the refusal"
    gate.throttled(5.0, retry_after_s=2.0)
    assert not gate.try_reserve(6.9)


def _with_gate(store: FakeStore, fetcher: FakeFetcher, gate: StoreGate) -> OpenBackends:
    @contextlib.asynccontextmanager
    async def backends() -> AsyncIterator[Backends]:
        yield Backends(store=store, fetcher=fetcher, gate=gate)

    return backends
