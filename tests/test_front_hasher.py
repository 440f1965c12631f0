"""Hashing from the receive buffer: a file's hasher takes each buffer its transfers offer at its
position and reads back only what landed ahead of it, and the digests are those of the file."""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st
from support.fakes import FakeFetcher, FakeStore, cut_after, fake_backends

from modelsync.adapters.digest import PrefixHasher
from modelsync.config import Settings
from modelsync.core.refs import parse_source
from modelsync.engine import hashing
from modelsync.engine.ensure import ReadyOptions, ensure_ready
from modelsync.engine.fetch import Spread
from modelsync.engine.hashing import FrontHasher
from modelsync.engine.rules import pull_rules

REF = parse_source("s3://models/org/llm/r1/")
PART = 4096


def _file(path: Path, data: bytes) -> int:
    path.write_bytes(data)
    return os.open(path, os.O_RDONLY)


@settings(max_examples=60, deadline=None)
@given(
    size=st.integers(0, 40_000),
    part=st.integers(1, 9_000),
    chunk=st.integers(1, 5_000),
    seed=st.integers(0, 2**32 - 1),
)
def test_parts_landing_in_any_order_and_offered_in_chunks_give_the_whole_file_digests(
    tmp_path_factory: pytest.TempPathFactory, size: int, part: int, chunk: int, seed: int
) -> None:
    data = random.Random(seed).randbytes(size)
    fd = _file(tmp_path_factory.mktemp("f") / "f.bin", data)
    try:
        front = FrontHasher(PrefixHasher(size, md5_part_bytes=part, sha256=True), None)
        starts = list(range(0, size, part))
        random.Random(seed + 1).shuffle(starts)
        landed: set[int] = set()
        for start in starts:  # each part's transfer offers its buffers as it writes them
            end = min(start + part, size)
            for at in range(start, end, chunk):
                front.offer(at, memoryview(data)[at : min(at + chunk, end)])
            landed.add(start)
            prefix = 0  # then a hash slot reads back what landed behind the hasher
            while prefix in landed:
                prefix = min(prefix + part, size)
            front.feed(fd, prefix)
        front.feed(fd, size)
        digest = front.hasher.digest()
    finally:
        os.close(fd)
    assert digest.xxh3_128 == xxhash.xxh3_128_hexdigest(data)
    assert digest.sha256 == hashlib.sha256(data).hexdigest()
    pieces = [data[i : i + part] for i in range(0, size, part)] or [b""]
    assert digest.part_md5s == tuple(hashlib.md5(p).digest() for p in pieces)


def test_an_offer_away_from_the_hasher_is_turned_away_and_read_back_later(tmp_path: Path) -> None:
    data = os.urandom(3 * PART)
    fd = _file(tmp_path / "f.bin", data)
    try:
        front = FrontHasher(PrefixHasher(len(data)), None)
        front.offer(PART, memoryview(data)[PART : 2 * PART])  # ahead of the hasher: not taken
        assert front.hasher.position == 0
        front.offer(0, memoryview(data)[:PART])  # at its position: taken from the buffer
        assert front.hasher.position == PART
        front.feed(fd, 2 * PART)  # the part that landed ahead is read back
        front.offer(2 * PART, memoryview(data)[2 * PART :])
        assert front.hasher.digest().xxh3_128 == xxhash.xxh3_128_hexdigest(data)
    finally:
        os.close(fd)


def test_transfers_and_a_hash_slot_feeding_one_hasher_at_once_hash_each_byte_once_in_order(
    tmp_path: Path,
) -> None:
    """Eight threads offer their parts' buffers while a ninth reads back whatever it can: whoever
    feeds, the hasher sees the file's bytes once each, in order."""
    front = FrontHasher(PrefixHasher(8 * 64 * 1024), None)
    data = _race(front, tmp_path)
    assert front.hasher.digest().xxh3_128 == xxhash.xxh3_128_hexdigest(data)


def _race(front: FrontHasher, tmp_path: Path, part: int = 64 * 1024, chunk: int = 4096) -> bytes:
    """Eight transfer threads offer the buffers of their parts of a file to `front` while a ninth,
    a hash slot, reads back each part once it has landed and catches up; the file's bytes."""
    n_parts = front.hasher.size_bytes // part
    data = os.urandom(part * n_parts)
    fd = _file(tmp_path / "f.bin", data)
    landed = [threading.Event() for _ in range(n_parts)]

    def transfer(i: int) -> None:
        for at in range(i * part, (i + 1) * part, chunk):
            front.offer(at, memoryview(data)[at : at + chunk])
        landed[i].set()

    def hash_slot() -> None:
        for i in range(n_parts):
            landed[i].wait()
            front.feed(fd, (i + 1) * part)
            front.catch_up()

    threads = [threading.Thread(target=transfer, args=(i,)) for i in range(n_parts)]
    threads.append(threading.Thread(target=hash_slot))
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
    finally:
        os.close(fd)
    return data


class _WrittenBehind:
    """A file's write-behind that records each range, checks it is hashed already and contiguous
    with the one before, and is slow enough (like a disk) for threads to meet at it."""

    def __init__(self, hasher: PrefixHasher) -> None:
        self.hasher = hasher
        self.ranges: list[tuple[int, int]] = []
        self.overlapped = False
        self._busy = threading.Lock()

    def __call__(self, start: int, end: int) -> None:
        if not self._busy.acquire(blocking=False):
            self.overlapped = True  # two threads waiting for the disk at once
            return
        try:
            assert end <= self.hasher.position, "written behind before it was hashed"
            assert start == (self.ranges[-1][1] if self.ranges else 0), (start, self.ranges)
            self.ranges.append((start, end))
            time.sleep(0.001)
        finally:
            self._busy.release()


def test_a_transfer_writes_behind_each_step_it_hashed_before_its_part_lands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hashed front of a part leaves the page cache while the part is still received: the
    transfer that fed the hasher writes behind each `FOLLOW_BEHIND_BYTES`, and the hash slot the rest."""
    monkeypatch.setattr(hashing, "FOLLOW_BEHIND_BYTES", 3 * PART)
    data = os.urandom(8 * PART + 100)
    fd = _file(tmp_path / "f.bin", data)
    hasher = PrefixHasher(len(data))
    written = _WrittenBehind(hasher)
    front = FrontHasher(hasher, written)
    try:
        for at in range(0, len(data), PART):  # one part's buffers, in order
            front.offer(at, memoryview(data)[at : at + PART])
        assert written.ranges == [(0, 3 * PART), (3 * PART, 6 * PART)]
        assert front.lags() and front.behind == 6 * PART
        front.feed(fd, len(data))  # the part landed: its hash slot's turn writes behind the rest
        front.catch_up()
        assert written.ranges[-1] == (6 * PART, len(data)) and not front.lags()
    finally:
        os.close(fd)


def test_without_a_disk_nothing_lags_and_nothing_is_written_behind(tmp_path: Path) -> None:
    data = os.urandom(2 * PART)
    front = FrontHasher(PrefixHasher(len(data)), None)
    front.offer(0, memoryview(data))
    front.catch_up()
    assert front.hasher.position == len(data) and not front.lags() and front.behind == 0


def test_transfers_and_a_hash_slot_write_behind_one_range_at_a_time_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight transfers offer their parts while a hash slot reads back and catches up, all writing
    behind: the ranges are disjoint, in order, never ahead of the hasher, never two at once, and
    together the whole file."""
    monkeypatch.setattr(hashing, "FOLLOW_BEHIND_BYTES", 8192)
    hasher = PrefixHasher(8 * 64 * 1024)
    written = _WrittenBehind(hasher)
    front = FrontHasher(hasher, written)
    data = _race(front, tmp_path)
    assert not written.overlapped
    assert written.ranges[-1][1] == len(data) and front.behind == len(data)
    assert len(written.ranges) > 1, "the transfers wrote behind as they went"
    assert hasher.digest().xxh3_128 == xxhash.xxh3_128_hexdigest(data)


@pytest.mark.parametrize(
    ("concurrency", "files", "per_file"), [(8, 0, 8), (8, 1, 8), (8, 3, 3), (8, 8, 1), (8, 64, 1)]
)
def test_the_window_is_shared_evenly_by_the_files_still_being_admitted(
    concurrency: int, files: int, per_file: int
) -> None:
    spread = Spread(concurrency)
    events = [asyncio.Event() for _ in range(files)]
    for e in events:
        spread.join(e)
    assert spread.per_file() == per_file
    if events:
        spread.leave(events[0])
        assert all(e.is_set() for e in events[1:]), "the others may widen"


def _count_hashed_bytes(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Bytes hashed from a receive buffer ("inline") and read back (mapped or copied), counted as the
    pull runs: every byte hashed passes `_update`, and the inline ones come through `update`."""
    counted = {"inline": 0, "read back": 0}
    lock = threading.Lock()
    hash_bytes, update = PrefixHasher._update, PrefixHasher.update

    def counting_hash(self: PrefixHasher, data: memoryview) -> None:
        hash_bytes(self, data)
        with lock:
            counted["read back"] += len(data)

    def counting_update(self: PrefixHasher, data: memoryview) -> None:
        update(self, data)
        with lock:
            counted["inline"] += len(data)
            counted["read back"] -= len(data)

    monkeypatch.setattr(PrefixHasher, "_update", counting_hash)
    monkeypatch.setattr(PrefixHasher, "update", counting_update)
    return counted


def _pull_counting(
    monkeypatch: pytest.MonkeyPatch,
    files: dict[str, bytes],
    config: Settings,
    fetcher_for: Callable[[FakeStore], FakeFetcher],
) -> dict[str, int]:
    """Pull `files` through `fetcher_for`'s fetcher; every file must come whole and every byte be
    hashed once. What was hashed from a receive buffer ("inline") and what was read back."""
    store = FakeStore()
    store.put_model(REF, files)
    counted = _count_hashed_bytes(monkeypatch)
    backends = fake_backends(store, fetcher_for(store))
    result = ensure_ready(pull_rules(config, REF), backends=backends, options=ReadyOptions())
    for name, body in files.items():
        assert (result.path / name).read_bytes() == body
    assert counted["inline"] + counted["read back"] == sum(map(len, files.values()))
    return counted


def test_a_model_of_many_shards_is_hashed_from_the_receive_buffers_not_read_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four files of eight parts through a window of four, from a store whose answers land in any
    order: every byte is hashed once, and most from the receive buffer, not read back."""
    files = {f"shard-{i}.bin": os.urandom(8 * PART) for i in range(4)}
    config = Settings(cache_dir=tmp_path / "cache", part_size_bytes=PART, concurrency=4)

    # each answer takes 0-5 ms, so parts in flight together land in any order
    def jittery(store: FakeStore) -> FakeFetcher:
        return FakeFetcher(store, on_start=lambda _req: time.sleep(random.random() * 0.005))

    counted = _pull_counting(monkeypatch, files, config, jittery)
    assert counted["inline"] >= 0.75 * sum(map(len, files.values())), counted


def test_small_files_are_hashed_from_the_receive_buffer_and_a_broken_body_is_read_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Files of one part are made whole in a transfer thread, a batch a trip: each hashed as it is
    written; a body that breaks off is resumed, and what the broken try wrote is read back."""
    files = {f"f-{i:03d}.bin": os.urandom(3 * PART + i) for i in range(40)}
    config = Settings(cache_dir=tmp_path / "cache", concurrency=4)

    def breaking_one(store: FakeStore) -> FakeFetcher:
        return FakeFetcher(store, faults={f"{REF.prefix}f-007.bin": [cut_after(PART + 100)]})

    counted = _pull_counting(monkeypatch, files, config, breaking_one)
    # the broken try's bytes are read back (the retry's hasher starts afresh), every other file's not
    assert counted["read back"] == len(files["f-007.bin"]), counted


def test_on_disk_a_pull_writes_each_buffer_back_as_it_lands_and_behind_as_it_is_hashed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file of eight parts pulled in order onto a disk, each received a quarter at a time: each
    receive buffer starts on its way to the disk as it is written, and the transfers that fed the
    hasher write it behind, in order, all of it, before the file's last part lands."""
    from modelsync.adapters import writeback

    monkeypatch.setattr(hashing, "FOLLOW_BEHIND_BYTES", PART)
    started: list[tuple[int, int]] = []
    behind: list[tuple[str, int, int]] = []
    start_writeback, write_behind = writeback.start_writeback, writeback.write_behind

    def recording_start(fd: int, start: int, length: int) -> None:
        started.append((start, length))
        start_writeback(fd, start, length)

    def recording_behind(fd: int, start: int, length: int) -> None:
        behind.append((threading.current_thread().name, start, length))
        write_behind(fd, start, length)

    monkeypatch.setattr(writeback, "start_writeback", recording_start)
    monkeypatch.setattr(writeback, "write_behind", recording_behind)
    data = os.urandom(8 * PART)
    config = Settings(cache_dir=tmp_path / "cache", part_size_bytes=PART, concurrency=1)
    _pull_counting(monkeypatch, {"big.bin": data}, config, lambda s: FakeFetcher(s, buffer_bytes=PART // 4))
    assert sorted(started) == [(at, PART // 4) for at in range(0, len(data), PART // 4)]
    ranges = [(start, start + length) for _, start, length in behind]
    assert [end for _, end in ranges[:-1]] == [start for start, _ in ranges[1:]], ranges
    assert ranges[0][0] == 0 and ranges[-1][1] == len(data)
    by_transfers = [name for name, _, _ in behind if name.startswith("modelsync-get")]
    assert len(by_transfers) >= 7, behind
