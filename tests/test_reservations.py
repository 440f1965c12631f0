"""Space reservations are read while other pulls write theirs.

A reservation marker is written atomically: a temporary name, then a rename.
A scan of the reservations (every plan, every `ls`) that took the temporary
file for a dead pull's marker would delete it under the writer, whose rename
then fails and the pull with it: the daemon hit this when it re-planned while
its own pull was reserving space.
"""

from __future__ import annotations

import json
from pathlib import Path

from modelsync.adapters.cache import Cache


def test_a_scan_leaves_a_marker_that_is_still_being_written(tmp_path: Path) -> None:
    cache = Cache(tmp_path / "cache")
    cache.ensure()
    in_flight = cache.reservations_dir / ".models--org--m--r1.tmp-123-abcd"
    in_flight.write_text(json.dumps({"bytes": 5, "source": "s3://models/org/m/r1/"}))
    assert cache.reservations() == {}
    assert in_flight.exists()
