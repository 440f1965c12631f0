"""The engine's one flow (`ensure_ready`) against in-memory backends: no server, no sleep.

The fakes (tests/support/fakes.py) stand in for the Protocols the engine is
given (engine/ports.py); the cache, the journal, hashing and publish are real.
What a real store and real sockets do is the integration tier's job
(test_pull_faults.py, test_pull_interrupts.py, test_cache_lifecycle.py).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import xxhash
from support.fakes import FakeFetcher, FakeStore, cut_after, fake_backends, hang_until_closed

from modelsync.adapters.cache import Cache
from modelsync.adapters.cache.foreground import live_foreground
from modelsync.config import Settings
from modelsync.core.manifest import MANIFEST_NAME, FileEntry, render_manifest
from modelsync.core.refs import ModelRef, parse_source
from modelsync.engine.ensure import PullResult, ReadyOptions, ensure_ready
from modelsync.engine.events import NoEvents
from modelsync.engine.ports import Backends
from modelsync.engine.ready import readiness, warm_path
from modelsync.engine.rules import pull_rules
from modelsync.engine.throttle import StoreGate
from modelsync.errors import ChecksumMismatchError, ObjectChangedError, PullCancelledError, SizeMismatchError

pytestmark = pytest.mark.timeout(60)

PART = 4096
REF = parse_source("s3://models/org/llm/r1/")
REV2 = parse_source("s3://models/org/llm/r2/")


def data(size: int, seed: int) -> bytes:
    return bytes((i * 31 + seed) % 251 for i in range(size))


WEIGHTS = data(5 * PART + 100, 1)
CONFIG = b'{"layers": 2}'


class Noted(NoEvents):
    """Keeps what the engine reports about damaged files."""

    def __init__(self) -> None:
        self.damage: list[tuple[str, str]] = []

    def damaged(self, path: str, reason: str) -> None:
        self.damage.append((path, reason))


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(cache_dir=tmp_path / "cache", part_size_bytes=PART, concurrency=2, backoff_floor_s=0.001)


@pytest.fixture
def store() -> FakeStore:
    store = FakeStore()
    store.put_model(REF, {"weights.bin": WEIGHTS, "config.json": CONFIG})
    return store


@pytest.fixture
def fetcher(store: FakeStore) -> FakeFetcher:
    return FakeFetcher(store)


def ensure(
    settings: Settings,
    store: FakeStore,
    fetcher: FakeFetcher,
    ref: ModelRef = REF,
    events: NoEvents | None = None,
    lease_s: float | None = None,
    **options: object,
) -> PullResult:
    return ensure_ready(
        pull_rules(settings, ref, lease_s=lease_s),
        backends=fake_backends(store, fetcher),
        events=events,
        options=ReadyOptions(**options),  # type: ignore[arg-type]
    )


def test_a_pull_fetches_every_part_once_in_order_and_publishes_the_files(
    settings: Settings, store: FakeStore, fetcher: FakeFetcher
) -> None:
    settings = Settings(cache_dir=settings.cache_dir, part_size_bytes=PART, concurrency=1)

    result = ensure(settings, store, fetcher)

    assert result.path == Cache(settings.cache_dir).ready_path(REF)
    assert (result.path / "weights.bin").read_bytes() == WEIGHTS
    assert (result.path / "config.json").read_bytes() == CONFIG
    assert result.fetched_bytes == len(WEIGHTS) + len(CONFIG) and result.files == 2
    weights = [(f.start, f.end) for f in fetcher.fetches if f.key.endswith("weights.bin")]
    assert weights == [(i * PART, min((i + 1) * PART, len(WEIGHTS))) for i in range(6)]
    record = Cache(settings.cache_dir).ready_record(REF)
    assert record is not None and record.verified_by == "manifest"


@pytest.fixture
def ready(settings: Settings, store: FakeStore, fetcher: FakeFetcher) -> Cache:
    """REF pulled, last used long ago, and the fetcher's record cleared."""
    ensure(settings, store, fetcher)
    fetcher.fetches.clear()
    cache = Cache(settings.cache_dir)
    cache.touch(REF, at=1.0)
    return cache


@pytest.mark.parametrize(
    ("options", "a_use"),
    [
        ({}, True),
        ({"lease_s": 3600.0}, True),
        ({"use": False}, False),  # a prefetch
        ({"refresh": True, "use": False}, False),  # the daemon's check against the source
    ],
)
def test_a_ready_model_is_answered_without_a_fetch_and_a_use_recorded_only_when_asked(
    ready: Cache,
    settings: Settings,
    store: FakeStore,
    fetcher: FakeFetcher,
    options: dict[str, object],
    a_use: bool,
) -> None:
    again = ensure(settings, store, fetcher, **options)

    assert again.fetched_bytes == 0 and fetcher.fetches == []
    assert ((ready.last_used(REF) or 0) > 1.0) is a_use
    assert (ready.lease_until(REF) is not None) is ("lease_s" in options)


def test_a_new_revision_links_the_files_it_shares_and_fetches_only_the_rest(
    settings: Settings, store: FakeStore, fetcher: FakeFetcher
) -> None:
    store.put_model(REV2, {"weights.bin": WEIGHTS, "config.json": b'{"layers": 3}'})
    first = ensure(settings, store, fetcher)
    fetcher.fetches.clear()

    second = ensure(settings, store, fetcher, ref=REV2)

    assert fetcher.fetched_keys() == [REV2.prefix + "config.json"]
    assert second.fetched_bytes == len(b'{"layers": 3}')
    assert os.stat(second.path / "weights.bin").st_ino == os.stat(first.path / "weights.bin").st_ino


def test_a_file_that_fails_its_check_twice_publishes_nothing(
    settings: Settings, store: FakeStore, fetcher: FakeFetcher
) -> None:
    fetcher.corrupt.add(REF.prefix + "config.json")

    with pytest.raises(ChecksumMismatchError, match=r"config\.json"):
        ensure(settings, store, fetcher)

    cache = Cache(settings.cache_dir)
    assert cache.ready_record(REF) is None and not cache.ready_path(REF).exists()
    assert fetcher.fetched_keys().count(REF.prefix + "config.json") == 2, "one re-fetch, then give up"


def test_a_file_corrupted_once_is_fetched_again_and_the_model_published(
    settings: Settings, store: FakeStore, fetcher: FakeFetcher
) -> None:
    key = REF.prefix + "config.json"
    fetcher.corrupt.add(key)
    fetcher.faults[key] = [lambda *_: None, lambda *_: fetcher.corrupt.discard(key)]  # the 2nd GET is good
    result = ensure(settings, store, fetcher)

    assert (result.path / "config.json").read_bytes() == CONFIG
    assert fetcher.fetched_keys().count(key) == 2


def test_a_cut_transfer_resumes_from_the_last_byte_written(
    settings: Settings, store: FakeStore, fetcher: FakeFetcher
) -> None:
    key = REF.prefix + "weights.bin"
    fetcher.faults[key] = [cut_after(1000)]

    result = ensure(settings, store, fetcher)

    assert (result.path / "weights.bin").read_bytes() == WEIGHTS
    first = [f for f in fetcher.fetches if f.key == key and f.end == PART]
    assert [(f.start, f.end) for f in first] == [(1000, PART)], "the retry asks only for the rest"


def test_a_cut_small_file_resumes_from_the_last_byte_written_in_the_file_it_created(
    settings: Settings, store: FakeStore, fetcher: FakeFetcher
) -> None:
    small = data(PART - 1000, 3)  # one part: created, fetched and hashed in one transfer thread
    store.put_model(REF, {"weights.bin": WEIGHTS, "config.json": CONFIG, "small.bin": small})
    key = REF.prefix + "small.bin"
    fetcher.faults[key] = [cut_after(1000)]

    result = ensure(settings, store, fetcher)

    assert (result.path / "small.bin").read_bytes() == small
    assert [(f.start, f.end) for f in fetcher.fetches if f.key == key] == [(1000, len(small))]


@pytest.mark.parametrize(
    ("linked", "started"), [("config.json", "weights.bin"), ("weights.bin", "config.json")]
)
def test_a_file_left_in_staging_as_a_hard_link_is_replaced_not_written_into(
    settings: Settings, store: FakeStore, fetcher: FakeFetcher, tmp_path: Path, linked: str, started: str
) -> None:
    """A kill -9 may lose the journal lines of a file dedup linked from a ready model: the next
    pull finds the link but no line for it, and must write a new file, never into that inode."""
    elsewhere = tmp_path / "a-ready-models-file"
    elsewhere.write_bytes(b"ready bytes")
    cache = Cache(settings.cache_dir)
    cache.ensure()
    staging = cache.staging(REF)
    staging.dir.mkdir(parents=True)
    os.link(elsewhere, staging.dir / linked)
    staging.journal.start(keep=False)  # the journal knows another file, so the pull resumes
    sizes = {"weights.bin": len(WEIGHTS), "config.json": len(CONFIG)}
    staging.journal.begin_file(started, store.etag(REF.bucket, REF.prefix + started), sizes[started], PART)
    staging.journal.close()

    result = ensure(settings, store, fetcher)

    assert elsewhere.read_bytes() == b"ready bytes"
    assert (result.path / "weights.bin").read_bytes() == WEIGHTS
    assert (result.path / "config.json").read_bytes() == CONFIG


def test_a_cancelled_pull_publishes_nothing_and_the_next_one_fetches_only_what_is_missing(
    settings: Settings, store: FakeStore, fetcher: FakeFetcher
) -> None:
    settings = Settings(cache_dir=settings.cache_dir, part_size_bytes=PART, concurrency=1)
    key = REF.prefix + "weights.bin"
    stalled, cancel = threading.Event(), threading.Event()
    fetcher.faults[key] = [lambda *_: None, lambda *_: None, hang_until_closed(fetcher, stalled)]
    threading.Thread(target=lambda: stalled.wait(30) and cancel.set(), daemon=True).start()

    with pytest.raises(PullCancelledError):
        ensure(settings, store, fetcher, cancel=cancel)

    assert fetcher.closed.is_set(), "cancelling aborts the transfers"
    assert Cache(settings.cache_dir).ready_record(REF) is None
    before = {(f.start, f.end) for f in fetcher.fetches if f.key == key}
    assert len(before) == 2
    fetcher.fetches.clear()

    result = ensure(settings, store, fetcher)

    assert (result.path / "weights.bin").read_bytes() == WEIGHTS
    after = {(f.start, f.end) for f in fetcher.fetches if f.key == key}
    assert not before & after and len(after) == 4, "the journal's parts are not fetched again"


def test_a_damaged_ready_model_fetches_only_its_bad_file_and_says_which(
    settings: Settings, store: FakeStore, fetcher: FakeFetcher
) -> None:
    ready = ensure(settings, store, fetcher).path
    os.chmod(ready / "config.json", 0o644)
    os.truncate(ready / "config.json", 3)
    fetcher.fetches.clear()
    events = Noted()

    result = ensure(settings, store, fetcher, events=events)

    assert fetcher.fetched_keys() == [REF.prefix + "config.json"]
    assert (result.path / "config.json").read_bytes() == CONFIG
    assert [path for path, _reason in events.damage] == ["config.json"]


def test_verify_rehashes_a_ready_model_and_fetches_a_file_whose_bytes_changed(
    settings: Settings, store: FakeStore, fetcher: FakeFetcher
) -> None:
    ready = ensure(settings, store, fetcher).path
    os.chmod(ready / "weights.bin", 0o644)
    with open(ready / "weights.bin", "r+b") as f:
        f.write(b"rot")  # same size: only a re-hash finds it
    fetcher.fetches.clear()

    unverified = ensure(settings, store, fetcher)
    assert unverified.fetched_bytes == 0, "the readiness rule does not hash"
    events = Noted()
    result = ensure(settings, store, fetcher, events=events, verify=True)

    assert {f.key for f in fetcher.fetches} == {REF.prefix + "weights.bin"}
    assert (result.path / "weights.bin").read_bytes() == WEIGHTS
    assert events.damage and events.damage[0][0] == "weights.bin"


def test_a_refresh_pulls_a_changed_file_and_keeps_the_rest(
    settings: Settings, store: FakeStore, fetcher: FakeFetcher
) -> None:
    ensure(settings, store, fetcher)
    store.put_model(REF, {"weights.bin": WEIGHTS, "config.json": b'{"layers": 4}'})
    fetcher.fetches.clear()

    result = ensure(settings, store, fetcher, refresh=True, use=False)

    assert fetcher.fetched_keys() == [REF.prefix + "config.json"]
    assert (result.path / "config.json").read_bytes() == b'{"layers": 4}'


def test_an_object_replaced_during_the_pull_is_fetched_again_whole_at_its_new_version(
    settings: Settings, fetcher: FakeFetcher
) -> None:
    store = fetcher.store
    store.objects.clear()
    store.put_model(REF, {"weights.bin": WEIGHTS}, manifest=False)  # checked by its ETag
    replaced = data(len(WEIGHTS) + 7, 2)
    key = REF.prefix + "weights.bin"
    fetcher.faults[key] = [lambda *_: store.put(REF, "weights.bin", replaced)]

    result = ensure(settings, store, fetcher)

    assert (result.path / "weights.bin").read_bytes() == replaced
    record = Cache(settings.cache_dir).ready_record(REF)
    assert record is not None and record.files[0].etag == store.etag(REF.bucket, key)


def test_an_answer_that_calls_an_unchanged_object_changed_is_a_misstated_size_when_the_sizes_differ(
    settings: Settings, fetcher: FakeFetcher
) -> None:
    """A store that refuses a range past the end without its size (a 416 with no Content-Range) reads
    as a changed object; the head then shows the same ETag at another size: the manifest is wrong,
    whichever part's answer came first, and nothing is fetched again at the store's size."""
    store = fetcher.store
    store.objects.clear()
    key = REF.prefix + "weights.bin"
    entry = FileEntry("weights.bin", 3 * len(WEIGHTS), xxhash.xxh3_128_hexdigest(WEIGHTS),
                      store.put(REF, "weights.bin", WEIGHTS))
    store.put(REF, MANIFEST_NAME, render_manifest([entry]))

    def range_past_the_end(*_: object) -> None:
        raise ObjectChangedError(f"s3://{REF.bucket}/{key}: 416 Range Not Satisfiable")

    fetcher.faults[key] = [range_past_the_end]

    said = f"the store holds {len(WEIGHTS)} bytes, but the manifest says {3 * len(WEIGHTS)}"
    with pytest.raises(SizeMismatchError, match=said):
        ensure(settings, store, fetcher)
    assert Cache(settings.cache_dir).ready_record(REF) is None


@pytest.mark.parametrize(("signed_only", "ready"), [(False, True), (True, False)])
def test_a_model_published_without_a_verified_signature_is_not_ready_where_one_is_required(
    settings: Settings, store: FakeStore, fetcher: FakeFetcher, signed_only: bool, ready: bool
) -> None:
    path = ensure(settings, store, fetcher).path

    state = readiness(Cache(settings.cache_dir), REF, signed_only)

    assert state.ready is ready and state.unsigned is not ready
    assert warm_path(settings.cache_dir, REF, signed_only) == (path if ready else None)


def test_a_foreground_pull_is_announced_while_it_fetches_and_no_longer_after(
    settings: Settings, store: FakeStore, fetcher: FakeFetcher
) -> None:
    seen: list[frozenset[str]] = []
    fetcher.faults[REF.prefix + "config.json"] = [lambda *_: seen.append(live_foreground(settings.cache_dir))]

    ensure(settings, store, fetcher, foreground=True)

    assert seen == [frozenset({REF.model_id})], "the node's daemon yields while this fetches"
    assert live_foreground(settings.cache_dir) == frozenset()


def test_the_pull_paces_its_requests_through_the_gate_that_comes_in_with_its_backends(
    settings: Settings, store: FakeStore, fetcher: FakeFetcher
) -> None:
    """The engine picks no gate of its own. A gate the store throttled opens again only as
    requests through it succeed; its clock jumps 100 s a call, so no wait is real."""
    ticks = itertools.count(step=100)
    gate = StoreGate(clock=lambda: float(next(ticks)))
    gate.throttled(None)
    assert gate.rate_per_s is not None

    @contextlib.asynccontextmanager
    async def backends() -> AsyncIterator[Backends]:
        yield Backends(store=store, fetcher=fetcher, gate=gate)

    ensure_ready(pull_rules(settings, REF), backends=backends)

    assert fetcher.fetches and gate.rate_per_s is None
