"""The model lock: one holder at a time, and waiters can tell who holds it and how far it is."""

from __future__ import annotations

from pathlib import Path

from modelsync.adapters.cache import Cache
from modelsync.core.refs import parse_source
from modelsync.engine.events import NoEvents
from modelsync.engine.holder_note import ProgressNote

REF = parse_source("s3://models/org/m/1/")


def test_a_held_lock_refuses_a_second_holder_until_released(tmp_path: Path) -> None:
    cache = Cache(tmp_path)
    cache.ensure()
    first, second = cache.lock(REF), cache.lock(REF)
    assert first.try_acquire()
    assert cache.lock_is_held(REF.slug)
    assert not second.try_acquire()
    first.release()
    assert second.try_acquire()
    second.release()
    assert not cache.lock_is_held(REF.slug)


def test_waiters_read_the_holders_progress(tmp_path: Path) -> None:
    cache = Cache(tmp_path)
    cache.ensure()
    holder = cache.lock(REF)
    assert holder.try_acquire()
    try:
        note = ProgressNote(NoEvents(), holder, interval_s=0.0)
        note.planned(files=3, total_bytes=30 << 20, missing_bytes=20 << 20)
        note.fetched(5 << 20)
        told = cache.lock(REF).describe_holder()
        assert told.startswith("pid ") and "(5.0 MiB of 20.0 MiB)" in told
    finally:
        holder.release()
