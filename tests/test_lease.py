"""A consumer's lease keeps a model in use: making room passes it over until the lease ends."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from test_warm import SOURCE, make_ready

from modelsync.adapters.cache import Cache
from modelsync.core.eviction import plan_eviction
from modelsync.core.refs import parse_source
from modelsync.engine.catalog import open_catalog


def test_pull_with_a_lease_marks_the_model_in_use_until_it_ends(tmp_path: Path) -> None:
    ready = make_ready(tmp_path)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "modelsync",
            "pull",
            SOURCE,
            "--cache-dir",
            str(tmp_path),
            "--lease",
            "2h",
            "--endpoint-url",
            "http://127.0.0.1:9",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == str(ready)
    until = Cache(tmp_path).lease_until(parse_source(SOURCE))
    assert until is not None and 7000 < until - time.time() <= 7200


def test_making_room_skips_a_leased_model_and_takes_it_once_the_lease_is_over(tmp_path: Path) -> None:
    make_ready(tmp_path)
    cache = Cache(tmp_path)
    ref = parse_source(SOURCE)
    cache.touch(ref, at=time.time() - 3600)  # idle for an hour: only the lease protects it
    cache.lease(ref, time.time() + 600)
    with open_catalog(cache) as catalog:
        entries = catalog.eviction_entries()
    now = time.time()
    plan = plan_eviction(entries, 1, now, grace_s=60)
    assert not plan.satisfied and plan.victims == ()
    assert [p.reason.split(" ")[0] for p in plan.protected] == ["leased"]
    later = plan_eviction(entries, 1, now + 601, grace_s=60)
    assert later.victims == (ref.model_id,)


def test_a_pull_with_a_short_lease_never_cuts_another_tenants_longer_one_and_ls_says_when_it_may_go(
    tmp_path: Path,
) -> None:
    make_ready(tmp_path)

    def pull(lease: str) -> None:
        done = subprocess.run(
            [sys.executable, "-m", "modelsync", "pull", SOURCE, "--cache-dir", str(tmp_path),
             "--lease", lease, "--endpoint-url", "http://127.0.0.1:9"],
            capture_output=True, text=True, timeout=60,
        )
        assert done.returncode == 0, done.stderr

    pull("8h")
    pull("1m")

    until = Cache(tmp_path).lease_until(parse_source(SOURCE))
    assert until is not None and 8 * 3600 - 60 < until - time.time() <= 8 * 3600
    listing = subprocess.run(
        [sys.executable, "-m", "modelsync", "ls", "--cache-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=60,
    )
    header, row = listing.stdout.splitlines()[:2]
    assert header.split()[-1] == "EVICTABLE"
    assert row.endswith(("in 7h59m", "in 8h")), row
