"""The pool-wide plan: N nodes sharing the store's egress, as arithmetic tables and through the CLI."""

from __future__ import annotations

import json
import os
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from botocore.client import BaseClient
from hypothesis import given, settings
from hypothesis import strategies as st
from support.cli import run_cli

from modelsync.core.manifest import FileEntry, render_manifest
from modelsync.core.plan import NodePlan, plan_node
from modelsync.core.pool import STORE_GOODPUT, PoolPlan, PoolShare, plan_pool, rate_flag, render_pool
from modelsync.core.refs import parse_source
from modelsync.core.schedule import Schedule, ScheduledModel
from modelsync.core.windows import CronWindow
from modelsync.errors import UsageError

GB = 10**9
MiB = 2**20
AT_0730 = datetime(2026, 5, 4, 7, 30, tzinfo=UTC)


@pytest.mark.parametrize(
    ("nodes", "store", "node", "per_node", "store_bound"),
    [
        (100, 50 * GB, 2 * GB, 0.45 * GB, True),  # the store's share is below what a node can do
        (10, 50 * GB, 2 * GB, 2 * GB, False),  # 10 × 2 GB/s fits in 45 GB/s: the node limits
        (22, 50 * GB, 2 * GB, 2 * GB, False),  # 44 GB/s: just inside what a saturated store delivers
        (25, 50 * GB, 2 * GB, 1.8 * GB, True),  # exactly the store's egress: it delivers nine tenths
        (1, 50 * GB, None, 45 * GB, True),  # no node limit: one node takes what the store delivers
        (8, 1 * GB, None, 0.1125 * GB, True),
    ],
)
def test_each_node_gets_the_smaller_of_its_own_rate_and_its_share_of_the_store(
    nodes: int, store: float, node: float | None, per_node: float, store_bound: bool
) -> None:
    share = PoolShare(nodes, store, node)
    assert share.per_node_bytes_per_s == pytest.approx(per_node)
    assert share.store_bound is store_bound


@pytest.mark.parametrize(("nodes", "store"), [(0, GB), (-3, GB), (10, 0), (10, -1)])
def test_a_pool_needs_a_node_and_a_store_that_moves_bytes(nodes: int, store: float) -> None:
    with pytest.raises(UsageError):
        PoolShare(nodes, store)


@pytest.mark.parametrize(
    ("rate", "flag"),
    [
        (0.5 * GB, "476Mi/s"),
        (50 * GB, "46Gi/s"),
        (2**40, "1024Gi/s"),
        (3.6 * 2**20, "3686ki/s"),
        (3000, "3000/s"),
        (512, "512/s"),
    ],
)
def test_the_suggested_max_bandwidth_is_rounded_down_by_at_most_a_tenth_so_the_pool_never_exceeds_the_store(
    rate: float, flag: str
) -> None:
    assert rate_flag(rate) == flag


@settings(max_examples=200, deadline=None)
@given(nodes=st.integers(1, 10_000), share=st.floats(min_value=1e5, max_value=1e11))
def test_nodes_at_the_suggested_cap_ask_for_what_a_saturated_store_delivers_and_lose_at_most_its_rounding(
    nodes: int, share: float
) -> None:
    """Capped at exactly the share, N nodes ask for all of the store's egress together, and a store
    that sheds load near saturation answers 503 (docs/schedule.md, the measured pool); at what it
    delivers when saturated, the pool is as fast as uncapped."""
    store = nodes * share
    plan = pool_plan({"big": 700 * GB}, None, nodes, store, model("big", 7, 45, 1800))

    cap = plan.suggested_max_bandwidth_bytes_per_s
    assert cap is not None
    assert 0.9 * STORE_GOODPUT * store <= nodes * cap <= STORE_GOODPUT * store
    suggested_fill_s = plan.suggested_fill_s
    assert suggested_fill_s == pytest.approx(700 * GB / cap)
    assert suggested_fill_s is not None and plan.fill_s <= suggested_fill_s <= plan.fill_s / 0.9


@pytest.mark.parametrize(
    ("node_rate", "nodes", "store", "cap", "suggested_fill_s"),
    [
        # 16 nodes × 96 MiB through 64 MiB/s (the fleet test): the share is 4 MiB/s, the cap 3686ki/s
        (None, 16, 64 * MiB, 3686 * 1024, 96 * MiB / (3686 * 1024)),
        # a node slower than the cap keeps its own rate
        (1 * MiB, 16, 64 * MiB, 3686 * 1024, 96 * MiB / MiB),
        # 100 nodes, 50 GB/s: 476.8 MiB/s each, 90% is 429.2 MiB/s, rounded down to 429Mi/s
        (2 * GB, 100, 50 * GB, 429 * MiB, 96 * MiB / (429 * MiB)),
    ],
)
def test_the_plan_times_the_pool_at_its_suggested_cap(
    node_rate: float | None, nodes: int, store: float, cap: int, suggested_fill_s: float
) -> None:
    plan = pool_plan({"m": 96 * MiB}, node_rate, nodes, store, model("m", 7, 45, 1800))

    assert plan.suggested_max_bandwidth_bytes_per_s == cap
    assert plan.suggested_fill_s == pytest.approx(suggested_fill_s)
    assert plan.suggested_fill_s >= plan.fill_s


def model(name: str, hour: int, minute: int, lead_s: float) -> ScheduledModel:
    return ScheduledModel(
        source=parse_source(f"s3://models/org/{name}/r1/"),
        name=name,
        pools=("p",),
        priority=50,
        lead_s=lead_s,
        keep_s=3600,
        windows=(CronWindow(cron=f"{minute} {hour} * * *", duration_s=7200, timezone="UTC"),),
        line=1,
    )


def pool_plan(
    sizes: dict[str, int], node_rate: float | None, nodes: int, store: float, *models: ScheduledModel
) -> PoolPlan:
    schedule = Schedule(version=1, timezone="UTC", models=models)
    remote = {f"models/org/{name}/r1": size for name, size in sizes.items()}

    def replan(rate: float | None) -> NodePlan:
        return plan_node(schedule, "p", AT_0730, {}, None, rate, remote)

    return plan_pool(replan(node_rate), replan, nodes, store)


@pytest.mark.parametrize(
    ("nodes", "store", "pool_ready_s", "late", "lead_s"),
    [
        # 100 nodes × 700 GB through 50 GB/s, of which a saturated store delivers 45 GB/s: 70 TB take
        # 1555.6 s; the window opens 900 s after 07:30.
        (100, 50 * GB, 7e11 / 0.45e9, True, 41 * 60.0),  # 30m lead + 655.6 s late, rounded up to a minute
        (100, 100 * GB, 7e11 / 0.9e9, False, None),
        (10, 50 * GB, 350, False, None),  # the node's own 2 GB/s is the limit
        (1000, 50 * GB, 7e11 / 0.045e9, True, 275 * 60.0),  # 30m + 14655.6 s
    ],
)
def test_the_last_node_is_ready_when_the_shared_store_has_served_every_node(
    nodes: int, store: float, pool_ready_s: float, late: bool, lead_s: float | None
) -> None:
    plan = pool_plan({"big": 700 * GB}, 2 * GB, nodes, store, model("big", 7, 45, 1800))

    (big,) = plan.models
    assert big.alone.ready_at == AT_0730 + timedelta(seconds=350)
    assert big.last.ready_at is not None
    assert (big.last.ready_at - AT_0730).total_seconds() == pytest.approx(pool_ready_s)
    assert big.store_late is late
    assert big.suggested_lead_s == lead_s
    assert plan.fill_s == pytest.approx(pool_ready_s)
    assert plan.pool_fetch_bytes == nodes * 700 * GB


def test_a_model_the_node_alone_already_misses_is_not_blamed_on_the_store() -> None:
    plan = pool_plan({"big": 700 * GB}, 0.5 * GB, 100, 10 * GB, model("big", 7, 45, 1800))

    (big,) = plan.models
    assert big.alone.late and not big.store_late
    assert big.suggested_lead_s == 145 * 60  # 30m + 6877.8 s late (0.09 GB/s each), rounded up to a minute
    assert plan.store_late == ()


def test_the_pool_walks_models_in_fetch_order_and_a_later_one_waits_for_its_prefetch_time() -> None:
    # "now" is due at 08:00 (lead 45m: fetch now); "later" opens 10:00 with lead 1h (prefetch 09:00).
    plan = pool_plan(
        {"now": 70 * GB, "later": 70 * GB},
        1 * GB,
        100,
        10 * GB,
        model("now", 8, 0, 2700),
        model("later", 10, 0, 3600),
    )

    first, second = plan.models
    each_s = 70 * GB / (0.9 * 10 * GB / 100)  # 70 GB at what the saturated store delivers a node
    assert first.last.ready_at is not None and second.last.ready_at is not None
    assert (first.last.ready_at - AT_0730).total_seconds() == pytest.approx(each_s)
    nine = datetime(2026, 5, 4, 9, 0, tzinfo=UTC)  # "later"'s prefetch time
    assert (second.last.ready_at - nine).total_seconds() == pytest.approx(each_s)
    assert not first.store_late and not second.store_late
    assert plan.fill_s == pytest.approx(each_s)  # only "now" is wanted now


def test_without_a_node_rate_the_store_share_alone_times_the_pool() -> None:
    plan = pool_plan({"big": 700 * GB}, None, 100, 50 * GB, model("big", 7, 45, 1800))

    (big,) = plan.models
    assert big.alone.ready_at is None
    assert big.last.ready_at is not None
    assert (big.last.ready_at - AT_0730).total_seconds() == pytest.approx(7e11 / 0.45e9)
    assert big.store_late
    text = "\n".join(render_pool(plan))
    assert "(the store is the limit; saturated, it delivers 90% of its egress)" in text
    assert "LATE: ready 10m56s after the window opens (lead 41m would fit)" in text


# ---- through the real CLI ------------------------------------------------------------

SCHEDULE = """\
version: 1
timezone: UTC
models:
  - name: deepseek-v3
    source: s3://{bucket}/deepseek-ai/DeepSeek-V3/2025-03-24/
    pools: [b300-serving]
    lead: 30m
    windows: [{{cron: "45 7 * * *", duration: 12h}}]
  - name: qwen-small
    source: s3://{bucket}/Qwen/Qwen3-0.6B/2025-04-29/
    pools: [b300-serving]
    lead: 30m
    windows: [{{cron: "0 9 * * *", duration: 12h}}]
"""


def publish_manifest(client: BaseClient, bucket: str, prefix: str, size_bytes: int) -> None:
    """A manifest alone: `plan` sizes models from it, so a 700 GB model needs no 700 GB upload."""
    entry = FileEntry(path="model.safetensors", size_bytes=size_bytes, xxh3_128="0" * 32, etag=None)
    client.put_object(Bucket=bucket, Key=prefix + "modelsync.manifest.json", Body=render_manifest([entry]))


def plan_cli(
    tmp_path: Path, child_env: dict[str, str], bucket: str, *args: str
) -> subprocess.CompletedProcess[str]:
    schedule = tmp_path / "schedule.yaml"
    schedule.write_text(SCHEDULE.format(bucket=bucket))
    return run_cli(
        child_env, "plan", "--schedule", str(schedule), "--pool", "b300-serving", "--at", "2026-05-04T07:30",
        "--cache-dir", str(tmp_path / "cache"), "--bandwidth", "2G/s", *args,
    )  # fmt: skip


def test_plan_flags_a_pool_of_100_nodes_the_store_cannot_fill_before_the_window(
    tmp_path: Path, child_env: dict[str, str], s3_client: BaseClient, bucket: str
) -> None:
    publish_manifest(s3_client, bucket, "deepseek-ai/DeepSeek-V3/2025-03-24/", 700 * GB)
    publish_manifest(s3_client, bucket, "Qwen/Qwen3-0.6B/2025-04-29/", 2 * GB)

    table = plan_cli(tmp_path, child_env, bucket, "--nodes", "100", "--store-bandwidth", "50G/s")
    as_json = plan_cli(tmp_path, child_env, bucket, "--nodes", "100", "--store-bandwidth", "50G/s", "--json")

    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    # One node alone is on time: the node table has no LATE.
    node_row = next(line for line in lines if line.startswith("fetch") and "deepseek-v3" in line)
    assert node_row.endswith("  ready 9m10s before the window opens")
    assert "pool: 100 nodes share 46.6 GiB/s of store egress: 429.2 MiB/s per node" in table.stdout
    assert "to fetch now across the pool: 63.7 TiB; the last node is done in 25m56s" in table.stdout
    assert "suggest: --max-bandwidth 429Mi/s per node (90% of the store's share" in table.stdout
    assert "capped so, the last node is done in 25m56s" in table.stdout
    assert "LATE: the store makes 1 model(s) miss the window: deepseek-v3" in lines
    row = [line for line in lines if line.startswith("deepseek-v3") and "LATE" in line]
    assert len(row) == 1, table.stdout
    assert row[0].split()[1:7] == ["ready", "9m10s", "before", "the", "window", "opens"]
    assert row[0].endswith("LATE: ready 10m56s after the window opens (lead 41m would fit)")
    assert [line for line in lines if line.startswith("qwen-small")][-1].count("LATE") == 0

    assert as_json.returncode == 0, as_json.stderr
    pool = json.loads(as_json.stdout)["pool_wide"]
    deepseek = f"{bucket}/deepseek-ai/DeepSeek-V3/2025-03-24"
    assert pool["late"] == [deepseek]
    assert (pool["nodes"], pool["store_bound"]) == (100, True)
    assert pool["fill_s"] == pytest.approx(7e11 / 0.45e9)  # 70 TB at the 45 GB/s a saturated store delivers
    assert (pool["suggested_max_bandwidth"], pool["suggested_fill_s"]) == ("429Mi/s", 7e11 / (429 * MiB))
    (entry,) = [m for m in pool["models"] if m["model"] == deepseek]
    assert (entry["node_ready_before_window_s"], entry["pool_ready_before_window_s"]) == (550.0, -655.555556)
    assert (entry["pool_ready_at"], entry["suggested_lead_s"]) == ("2026-05-04T07:55:55.555556Z", 2460.0)


def test_plan_finds_no_store_lateness_when_the_pool_is_small_enough(
    tmp_path: Path, child_env: dict[str, str], s3_client: BaseClient, bucket: str
) -> None:
    publish_manifest(s3_client, bucket, "deepseek-ai/DeepSeek-V3/2025-03-24/", 700 * GB)
    publish_manifest(s3_client, bucket, "Qwen/Qwen3-0.6B/2025-04-29/", 2 * GB)

    result = plan_cli(tmp_path, child_env, bucket, "--nodes", "10", "--store-bandwidth", "50G/s", "--json")

    assert result.returncode == 0, result.stderr
    pool = json.loads(result.stdout)["pool_wide"]
    assert (pool["late"], pool["store_bound"]) == ([], False)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--nodes", "100"), "--nodes and --store-bandwidth go together"),
        (("--store-bandwidth", "50G/s"), "--nodes and --store-bandwidth go together"),
        (("--nodes", "0", "--store-bandwidth", "50G/s"), "invalid --nodes 0"),
        (("--nodes", "10", "--store-bandwidth", "fast"), "invalid rate 'fast'"),
    ],
)
def test_plan_refuses_a_half_or_bad_pool_with_one_line_and_exit_2(
    tmp_path: Path, args: tuple[str, ...], expected: str
) -> None:
    result = plan_cli(tmp_path, dict(os.environ), "models", "--offline", *args)

    assert result.returncode == 2
    assert expected in result.stderr.strip().splitlines()[0] and len(result.stderr.strip().splitlines()) == 1


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=1, max_value=10**12), min_size=1, max_size=4),
    node_rate=st.floats(min_value=1e6, max_value=1e11),
    nodes=st.integers(min_value=1, max_value=2000),
    store=st.floats(min_value=1e6, max_value=1e12),
)
def test_the_last_node_is_never_ahead_of_one_node_alone_and_one_unbounded_node_is_the_node(
    sizes: list[int], node_rate: float, nodes: int, store: float
) -> None:
    names = [f"m{i}" for i in range(len(sizes))]
    models = [model(name, 8 + i, 0, 3600) for i, name in enumerate(names)]
    plan = pool_plan(dict(zip(names, sizes, strict=True)), node_rate, nodes, store, *models)

    for m in plan.models:
        assert m.alone.ready_at is not None and m.last.ready_at is not None
        assert m.last.ready_at >= m.alone.ready_at
        assert not (m.store_late and m.alone.late)
    # one node that asks for no more than the store delivers is the node
    roomy = max(store, node_rate / STORE_GOODPUT)
    alone = pool_plan(dict(zip(names, sizes, strict=True)), node_rate, 1, roomy, *models)
    assert [m.last.ready_at for m in alone.models] == [m.alone.ready_at for m in alone.models]


def test_plan_with_a_tiny_share_per_node_saturates_and_never_suggests_a_cap_of_0(
    tmp_path: Path, child_env: dict[str, str], s3_client: BaseClient, bucket: str
) -> None:
    """1 B/s for 1,000 nodes is a thousandth of a byte per second each: no traceback, no `0/s`
    (0 would remove the cap), and no lead that "would fit"."""
    publish_manifest(s3_client, bucket, "deepseek-ai/DeepSeek-V3/2025-03-24/", 700 * GB)
    publish_manifest(s3_client, bucket, "Qwen/Qwen3-0.6B/2025-04-29/", 2 * GB)

    table = plan_cli(tmp_path, child_env, bucket, "--nodes", "1000", "--store-bandwidth", "1")
    as_json = plan_cli(tmp_path, child_env, bucket, "--nodes", "1000", "--store-bandwidth", "1", "--json")

    assert table.returncode == 0, table.stderr
    assert "Traceback" not in table.stderr
    assert "pool: 1000 nodes share 1 B/s of store egress: 0.0009 B/s per node" in table.stdout
    assert "the last node is done in over 100 years" in table.stdout
    assert "suggest: --max-bandwidth" not in table.stdout
    assert "suggest: fewer nodes pulling at once, or more store bandwidth" in table.stdout
    row = [line for line in table.stdout.splitlines() if line.startswith("deepseek-v3")]
    assert row[-1].endswith("LATE: not ready within 100 years at this rate"), row
    assert "would fit" not in table.stdout

    assert as_json.returncode == 0, as_json.stderr
    pool = json.loads(as_json.stdout)["pool_wide"]
    assert (pool["suggested_max_bandwidth"], pool["suggested_max_bandwidth_bytes_per_s"]) == (None, None)
    assert pool["fill_s"] == 100 * 365 * 86400.0
    assert all(m["suggested_lead_s"] is None for m in pool["models"])


def test_plan_of_one_node_at_1_byte_per_second_saturates_instead_of_overflowing(
    tmp_path: Path, child_env: dict[str, str], s3_client: BaseClient, bucket: str
) -> None:
    publish_manifest(s3_client, bucket, "deepseek-ai/DeepSeek-V3/2025-03-24/", 700 * GB)
    publish_manifest(s3_client, bucket, "Qwen/Qwen3-0.6B/2025-04-29/", 2 * GB)

    result = plan_cli(tmp_path, child_env, bucket, "--bandwidth", "1")

    assert result.returncode == 0, result.stderr
    row = next(line for line in result.stdout.splitlines() if "deepseek-v3" in line)
    assert row.endswith("not ready within 100 years at this rate")


@pytest.mark.parametrize(
    ("flag", "variable"),
    [("0", "0"), ("50%", "50%"), ("6T", "6T"), ("", "")],
    ids=["zero", "share", "size", "none"],
)
def test_plan_budget_reads_as_the_variable_it_stands_for(tmp_path: Path, flag: str, variable: str) -> None:
    """`--budget 0` is no budget and `--budget 50%` half the cache's filesystem, as the variable reads."""
    env = {k: v for k, v in os.environ.items() if k != "MODELSYNC_CACHE_MAX_BYTES"}
    (tmp_path / "cache").mkdir()
    with_flag = plan_cli(tmp_path, env, "models", "--offline", *(("--budget", flag) if flag else ()))
    with_variable = plan_cli(tmp_path, {**env, "MODELSYNC_CACHE_MAX_BYTES": variable}, "models", "--offline")
    assert with_flag.returncode == with_variable.returncode == 0, with_flag.stderr + with_variable.stderr
    budget_line = with_flag.stdout.splitlines()[1]
    assert budget_line == with_variable.stdout.splitlines()[1]
    expected = {"0": "no budget", "": "no budget", "50%": "budget ", "6T": "budget 5.5 TiB"}[flag]
    assert expected in budget_line
