"""A fleet on demand (`pytest -m fleet -s`): N node caches pull one model at once through a store
that throttles above a request budget, and every node must finish with the right bytes.

This is what a pool does when a window opens: N nodes, each with its own cache and
its own `modelsync pull` process, against SeaweedFS behind a proxy that admits K
requests a second and answers the rest 503 SlowDown with Retry-After. No pull may
fail: throttling must slow the pool down, not break it. The figures (completion
spread, 503s, bytes served) are printed for the closing note.

MODELSYNC_FLEET_NODES (default 8) and MODELSYNC_FLEET_RPS (default 10) change the
pool and the budget.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.cli import publish
from support.faultproxy import FaultProxy, Throttle
from support.fleet import fleet_figures, run_fleet
from support.s3env import S3Env
from support.seaweedfs import SeaweedFS

from modelsync.adapters.cache import Cache

pytestmark = [pytest.mark.fleet, pytest.mark.timeout(900)]

MiB = 1024 * 1024
NODES = int(os.environ.get("MODELSYNC_FLEET_NODES", "8"))
REQUESTS_PER_S = int(os.environ.get("MODELSYNC_FLEET_RPS", "10"))


@pytest.fixture
def throttling_store(seaweedfs: SeaweedFS) -> Iterator[FaultProxy]:
    with FaultProxy(seaweedfs.endpoint_url) as proxy:
        yield proxy


def test_a_pool_of_nodes_pulls_one_model_through_a_throttling_store_and_every_node_finishes(
    tmp_path: Path,
    seaweed_admin: S3Env,
    seaweed_reader: S3Env,
    seaweed_bucket: str,
    throttling_store: FaultProxy,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert NODES >= 8, "a fleet is at least 8 nodes"
    files = {
        "weights-1.bin": os.urandom(8 * MiB),
        "weights-2.bin": os.urandom(4 * MiB),
        "config.json": b'{"layers": 2}',
    }
    model_bytes = sum(len(d) for d in files.values())
    ref = publish(seaweed_admin, tmp_path, f"s3://{seaweed_bucket}/org/fleet/rev1/", files)
    throttling_store.set_throttle(Throttle(requests_per_s=REQUESTS_PER_S, retry_after_s=1))
    caches = [tmp_path / "nodes" / f"node-{i:03d}" for i in range(NODES)]

    results = run_fleet(
        seaweed_reader.via(throttling_store.endpoint_url).subprocess_env(),
        ref.uri,
        caches,
        "--part-size",
        "1Mi",
    )
    figures = fleet_figures(results, throttling_store, model_bytes, REQUESTS_PER_S)
    with capsys.disabled():
        print("\n" + "\n".join(figures.lines()))

    failed = {r.node: (r.returncode, r.stderr.strip()[-300:]) for r in results if r.returncode != 0}
    assert failed == {}, f"{len(failed)} of {NODES} pulls failed: {failed}"
    for result in results:
        ready = Cache(result.cache).ready_path(ref)
        assert result.stdout.splitlines()[-1] == str(ready)
        for name, data in files.items():
            assert (ready / name).read_bytes() == data, (result.node, name)
    assert figures.throttled > 0, "the budget never bit: the test proved nothing about throttling"
    assert figures.bytes_served >= NODES * model_bytes
