"""The node daemon, at the edge: it builds the daemon's parts and connects them on one event loop.

The parts, each in its own module:

- the reconcile loop (engine/reconcile.py), which plans and pulls;
- the schedule watcher (schedule_watch.py), which loads the schedule file when it changes;
- the local API on `<cache>/.modelsync/daemon.sock` (local_api/), for `prefetch`
  and tenants' `pull`;
- the HTTP listener (probes.py): `/metrics`, `/healthz` and `/readyz`;
- the log lines (logs.py).

SIGTERM or SIGINT stops the loop (the running pull is cancelled, its journal
kept), then the listeners; the whole takes well under 10 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web
from prometheus_client import disable_created_metrics

from modelsync.adapters.cache.foreground import live_foreground
from modelsync.backends import s3_backends
from modelsync.config import Settings
from modelsync.engine.ensure import PullResult, ReadyOptions, ensure_ready
from modelsync.engine.events import PullEvents
from modelsync.engine.inventory import cache_entries, remote_sizes
from modelsync.engine.pull_slot import EnsureReady
from modelsync.engine.reconcile import LoopConfig, Reconciler
from modelsync.engine.rules import PullRules
from modelsync.errors import UsageError
from modelsync.local_api.handlers import handler
from modelsync.local_api.protocol import socket_path
from modelsync.local_api.server import serve
from modelsync.logs import configure_logging
from modelsync.metrics import DaemonMetrics
from modelsync.probes import start_probes
from modelsync.schedule_watch import ScheduleWatcher

log = logging.getLogger("modelsync.daemon")



@dataclass(frozen=True, slots=True)
class DaemonOptions:
    schedule_path: Path
    loop: LoopConfig
    listen_host: str
    listen_port: int
    json_logs: bool = False
    #: `bucket/` or `bucket/prefix/` strings (core.allow.parse_prefix) served besides the schedule's sources
    allowed_prefixes: tuple[str, ...] = ()


def parse_listen(text: str) -> tuple[str, int]:
    """`HOST:PORT` or `[IPv6]:PORT`; port 0 picks a free port (the log says which)."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise UsageError(f"invalid --listen {text!r}; use HOST:PORT, e.g. 127.0.0.1:9477 or [::]:9477")
    return host, int(port)


def run_daemon(settings: Settings, options: DaemonOptions) -> None:
    """Serve until SIGTERM or SIGINT."""
    configure_logging(options.json_logs)
    # Every counter would export a `_created` twin holding its start time: twice the
    # series, and no use for a daemon that restarts only with its process.
    disable_created_metrics()  # type: ignore[no-untyped-call]  # prometheus_client leaves it unannotated
    asyncio.run(_serve(settings, options))


def _ensure_ready_over_s3(node: Settings) -> EnsureReady:
    """`ensure_ready` over the node's S3 backends, for the loop's pulls."""
    backends = s3_backends(node)

    def ensure(rules: PullRules, *, events: PullEvents, options: ReadyOptions) -> PullResult:
        return ensure_ready(rules, backends=backends, events=events, options=options)

    return ensure


async def _serve(settings: Settings, options: DaemonOptions) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    metrics = DaemonMetrics()
    reconciler = Reconciler(
        settings,
        options.loop,
        metrics,
        _ensure_ready_over_s3(settings),
        cache_entries,
        live_foreground,
        functools.partial(remote_sizes, s3_backends(settings)),
    )
    reconciler.cache.ensure()
    watcher = ScheduleWatcher(options.schedule_path, reconciler, metrics)
    watcher.poll()
    sock = socket_path(settings.cache_dir)
    api_server = await serve(sock, handler(reconciler, options.allowed_prefixes))
    # From here on the socket is ours: a start that fails later (the HTTP port is taken)
    # removes it again, so no stale socket is left for tenants to wait on.
    runner: web.AppRunner | None = None
    loop_task = asyncio.create_task(reconciler.run(stop))
    watch_task = asyncio.create_task(watcher.run(stop))
    try:
        runner = await start_probes(options.listen_host, options.listen_port, reconciler, metrics, loop_task)
        log.info("serving the local API on %s", sock, extra={"socket": str(sock)})
        await loop_task
    finally:
        stop.set()
        await watch_task
        if not loop_task.done():
            await asyncio.wait([loop_task])  # its outcome is not this start's failure
        api_server.close()
        with contextlib.suppress(FileNotFoundError):
            sock.unlink()
        if runner is not None:
            await runner.cleanup()
        log.info("stopped")
