"""Schedule commands: `plan` (the daemon's dry run) and `daemon`; `prefetch` is cli/prefetch.py.

`plan` and `daemon` read the schedule through the same loader and plan with the
same step (engine/node_plan.py), so the dry run shows what the daemon does.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from modelsync.cli.options import (
    CacheDir,
    Concurrency,
    ConfigFile,
    EndpointUrl,
    Insecure,
    Json,
    MaxBandwidth,
    PartSize,
    Region,
    SettingFlags,
    build_settings,
    node_pool,
)
from modelsync.config import CACHE_SETTINGS, S3_SETTINGS, parse_setting
from modelsync.errors import UsageError

if TYPE_CHECKING:
    pass

ScheduleFile = Annotated[
    Path,
    typer.Option("--schedule", metavar="FILE", help="The model schedule (YAML; see docs/schedule.md)."),
]
Pool = Annotated[
    str | None,
    typer.Option(
        "--pool",
        metavar="POOL",
        help="The node's pool (its accelerator.pool label). [env var: MODELSYNC_POOL; default: none]",
    ),
]


def plan(
    schedule: ScheduleFile,
    pool: Pool = None,
    at: Annotated[
        str | None,
        typer.Option(
            "--at",
            metavar="TIME",
            help="ISO 8601 instant; without an offset it is in the schedule's time zone. [default: now]",
        ),
    ] = None,
    json_output: Json = False,
    bandwidth: Annotated[
        str | None,
        typer.Option(
            "--bandwidth",
            metavar="RATE",
            help="Assumed download rate, e.g. 500Mi/s. [default: --max-bandwidth]",
        ),
    ] = None,
    budget: Annotated[
        str | None,
        typer.Option(
            "--budget",
            metavar="SIZE",
            help=(
                "Budget to plan with, e.g. 6T or 90%; 0 = none. "
                "[env var: MODELSYNC_CACHE_MAX_BYTES; default: none]"
            ),
        ),
    ] = None,
    offline: Annotated[
        bool, typer.Option("--offline", help="Do not ask S3 for the sizes of models not cached.")
    ] = False,
    nodes: Annotated[
        int | None,
        typer.Option(
            "--nodes",
            metavar="N",
            help="Nodes of the pool pulling at once; needs --store-bandwidth. [default: none]",
        ),
    ] = None,
    store_bandwidth: Annotated[
        str | None,
        typer.Option(
            "--store-bandwidth",
            metavar="RATE",
            help="The store's egress the pool shares, e.g. 50G/s; needs --nodes. [default: none]",
        ),
    ] = None,
    cache_dir: CacheDir = None,
    endpoint_url: EndpointUrl = None,
    region: Region = None,
    config: ConfigFile = None,
    max_bandwidth: MaxBandwidth = None,
    insecure: Insecure = False,
) -> None:
    """Show what the daemon would fetch, keep and evict on a pool at an instant (a dry run)."""
    import json
    from datetime import datetime
    from zoneinfo import ZoneInfo

    from modelsync.adapters.cache import Cache
    from modelsync.adapters.schedule_file import read_schedule
    from modelsync.backends import s3_backends
    from modelsync.core.lifecycle import CacheState
    from modelsync.core.plan import NodePlan, parse_instant
    from modelsync.core.plan_view import plan_json, render_plan
    from modelsync.core.pool import plan_pool, pool_json, render_pool
    from modelsync.core.units import parse_rate
    from modelsync.engine.inventory import RemoteSizes, cache_entries, remote_sizes
    from modelsync.engine.node_plan import node_plan

    if (nodes is None) != (store_bandwidth is None):
        raise UsageError("--nodes and --store-bandwidth go together: the pool shares the store's egress")
    settings = build_settings(
        SettingFlags(
            cache_dir=cache_dir,
            endpoint_url=endpoint_url,
            region=region,
            config=config,
            max_bandwidth=max_bandwidth,
            insecure=insecure,
            pool=pool,
        ),
        # a dry run reads the cache and asks S3 for sizes: a bad signature policy must not stop it
        needed=CACHE_SETTINGS | S3_SETTINGS | {"max_bandwidth_bytes_per_s", "pool"},
    )
    loaded = read_schedule(schedule)
    pool_name = node_pool(settings)
    if not loaded.for_pool(pool_name):
        known = sorted({p for m in loaded.models for p in m.pools})
        raise UsageError(
            f"unknown pool {pool_name!r}: no model of {schedule} serves on it; its pools are "
            f"{', '.join(known) if known else 'none'}"
        )
    now = parse_instant(at, loaded.timezone) if at else datetime.now(ZoneInfo(loaded.timezone))
    entries = cache_entries(Cache(settings.cache_dir))
    ready = {e.model for e in entries if e.state is CacheState.READY}
    missing = [m.source for m in loaded.for_pool(pool_name) if m.source.model_id not in ready]
    sizes = RemoteSizes({}, {}) if offline else remote_sizes(s3_backends(settings), missing)
    for model_id, reason in sizes.unknown.items():
        typer.echo(f"warning: size of {model_id} unknown: {reason}", err=True)
    if budget is not None:  # read as the variable is: `6T`, `90%` of the cache's filesystem, 0 for none
        settings = replace(settings, cache_budget=parse_setting("cache_budget", budget, "--budget"))

    def replan(rate: float | None) -> NodePlan:
        return node_plan(settings, loaded, pool_name, now, entries, sizes.known, rate_bytes_per_s=rate)

    here = replan(float(parse_rate(bandwidth or "0")))
    pool_plan = None
    if nodes is not None and store_bandwidth is not None:
        pool_plan = plan_pool(here, replan, nodes, float(parse_rate(store_bandwidth)))
    if json_output:
        document = plan_json(here)
        if pool_plan is not None:
            document["pool_wide"] = pool_json(pool_plan)
        typer.echo(json.dumps(document, indent=2))
    else:
        lines = render_plan(here)
        if pool_plan is not None:
            lines += ["", *render_pool(pool_plan)]
        typer.echo("\n".join(lines))


def daemon(
    schedule: ScheduleFile,
    pool: Pool = None,
    listen: Annotated[
        str,
        typer.Option(
            "--listen",
            metavar="HOST:PORT",
            help="Address for /metrics, /healthz and /readyz.",
            show_default=True,
        ),
    ] = "127.0.0.1:9477",
    tick: Annotated[
        str,
        typer.Option("--tick", metavar="DURATION", help="Time between reconciles.", show_default=True),
    ] = "30s",
    jitter: Annotated[
        str,
        typer.Option(
            "--jitter",
            metavar="DURATION",
            help="Largest per-node delay before a scheduled prefetch starts; 0 = none.",
            show_default=True,
        ),
    ] = "30s",
    refresh: Annotated[
        str,
        typer.Option(
            "--refresh",
            metavar="DURATION",
            help="How often to check staged models for a changed source; 0 = never.",
            show_default=True,
        ),
    ] = "15m",
    json_logs: Annotated[bool, typer.Option("--json-logs", help="Log one JSON object per line.")] = False,
    allow: Annotated[
        list[str] | None,
        typer.Option(
            "--allow",
            metavar="PREFIX",
            help="Also serve pulls and prefetches of sources under this s3:// prefix (repeatable). "
            "[env var: MODELSYNC_ALLOWED_PREFIXES, comma-separated; default: the schedule's sources only]",
        ),
    ] = None,
    cache_dir: CacheDir = None,
    endpoint_url: EndpointUrl = None,
    region: Region = None,
    config: ConfigFile = None,
    concurrency: Concurrency = None,
    part_size: PartSize = None,
    max_bandwidth: MaxBandwidth = None,
    insecure: Insecure = False,
) -> None:
    """Keep the node's cache in step with the schedule: prefetch before windows open, serve metrics."""
    import socket

    from modelsync.core.units import parse_duration
    from modelsync.daemon import DaemonOptions, parse_listen, run_daemon
    from modelsync.engine.reconcile import LoopConfig

    tick_s = parse_duration(tick)
    if tick_s <= 0:
        raise UsageError(f"invalid --tick {tick!r}; it must be longer than 0s")
    host, port = parse_listen(listen)
    settings = build_settings(
        SettingFlags(
            cache_dir=cache_dir,
            endpoint_url=endpoint_url,
            region=region,
            config=config,
            concurrency=concurrency,
            part_size=part_size,
            max_bandwidth=max_bandwidth,
            insecure=insecure,
            pool=pool,
            allow=tuple(allow or ()),
        )
    )
    loop = LoopConfig(
        pool=node_pool(settings),
        node=settings.node_name or socket.gethostname(),
        tick_s=tick_s,
        jitter_max_s=parse_duration(jitter),
        refresh_s=parse_duration(refresh),
    )
    from modelsync.core.allow import parse_prefix

    allowed = tuple(parse_prefix(p) for p in settings.allowed_prefixes)
    run_daemon(settings, DaemonOptions(schedule, loop, host, port, json_logs, allowed))
