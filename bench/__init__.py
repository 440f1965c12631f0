"""modelsync's benchmarks: one harness, one data generator, and the entry points behind it.

`scripts/bench` is the user's entry point (`scripts/bench --help`); it runs `python -m bench`.

- `harness`: spawn a contender and measure it (wall, CPU of its tree, peak RSS), run points
  in interleaved rounds, verify what they wrote, clean up on every exit path;
- `nginx`, `servers`: the endpoints (a static nginx data plane; SeaweedFS and moto through the
  integration tier's own fixtures in `tests/support`, so each server has one copy);
- `fsinfo`: file-system facts (type, free space, fresh loop-mounted XFS and ext4);
- `data`: the data sets, generated once and reused;
- `contenders`: how modelsync and its peers are invoked;
- `report`: summaries, tables and the JSON record;
- entry points: `compare` (modelsync against its peers), `curves` (one knob at a time),
  `scale` and `cache_scale` (cost against the number of files and of cache entries), `startup`
  (a cold pull's time to its manifest, SDK against data plane),
  `signature_tail` (where a signed pull's extra time goes).
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# The S3 servers are the integration tier's fixtures (tests/support), imported as the test
# suite imports them (`support.*`), so the benchmark never carries a second copy.
if str(REPO / "tests") not in sys.path:
    sys.path.append(str(REPO / "tests"))
