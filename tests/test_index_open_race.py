"""Several processes opening a fresh index at the same moment (pulls starting together) all succeed.

Switching SQLite to WAL needs the file to itself and fails at once with "database is
locked", without waiting out the busy timeout; before the index retried it, about one
opener in thirty failed here, and its pull died with a traceback.
"""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

from modelsync.adapters.index import Index

OPENERS = 6
TRIALS = 20


def _open(path: str, barrier: Any) -> None:
    barrier.wait()
    Index(Path(path)).close()


def test_concurrent_first_opens_of_the_index_all_succeed(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    failures = 0
    for trial in range(TRIALS):
        path = tmp_path / f"index-{trial}.sqlite"
        barrier = ctx.Barrier(OPENERS)
        procs = [ctx.Process(target=_open, args=(str(path), barrier)) for _ in range(OPENERS)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        failures += sum(p.exitcode != 0 for p in procs)
    assert failures == 0
