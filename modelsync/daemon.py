"""The node daemon, at the edge: it builds the daemon's parts and connects them on one event loop.

The parts, each in its own module:

- the reconcile loop (engine/reconcile.py), which plans and pulls;
- the schedule watcher (schedule_watch.py), which loads the schedule file when it changes;
- the local API on `<cache>/.modelsync/daemon.sock` (api.py, its handlers here), for `prefetch`
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
import time
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web
from prometheus_client import disable_created_metrics

from modelsync import api
from modelsync.adapters.cache.foreground import live_foreground
from modelsync.backends import s3_backends
from modelsync.config import Settings
from modelsync.core.allow import allow_list
from modelsync.core.plan_view import plan_json
from modelsync.core.refs import ModelRef, parse_model_name
from modelsync.core.schedule_variants import variant_for
from modelsync.engine.ensure import PullResult, ReadyOptions, ensure_ready
from modelsync.engine.events import PullEvents
from modelsync.engine.inventory import cache_entries, remote_sizes
from modelsync.engine.reconcile import EnsureReady, LoopConfig, Reconciler
from modelsync.engine.rules import PullRules
from modelsync.errors import ModelsyncError, UsageError
from modelsync.logs import configure_logging
from modelsync.metrics import DaemonMetrics
from modelsync.probes import start_probes
from modelsync.schedule_watch import ScheduleWatcher

log = logging.getLogger("modelsync.daemon")

#: the longest lease a tenant's pull may ask for; a longer one would pin the model in all but name
MAX_LEASE_S = 30 * 24 * 3600.0


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
    sock = api.socket_path(settings.cache_dir)
    api_server = await api.serve(
        sock, lambda request: _handle(reconciler, options.allowed_prefixes, request)
    )
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


async def _handle(reconciler: Reconciler, prefixes: tuple[str, ...], request: api.Message) -> api.Message:
    op = request.get("op")
    if op == "status":
        plan = reconciler.plan
        current = reconciler.current
        return {
            "pool": reconciler.config.pool,
            "ready": reconciler.ready,
            "paused": reconciler.paused,
            "current": None if current is None else current.ref.model_id,
            "plan": None if plan is None else plan_json(plan),
        }
    if op == "prefetch":
        models = request.get("models")
        if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
            raise UsageError("prefetch needs 'models': a list of s3://bucket/prefix/ or bucket/prefix")
        refs = _allowed(reconciler, prefixes, models)
        futures = reconciler.request(refs)
        if request.get("wait", True):
            await asyncio.wait(futures)
        return {"models": [_outcome(ref.model_id, f) for ref, f in zip(refs, futures, strict=True)]}
    if op == "pull":
        return await _tenant_pull(reconciler, prefixes, request)
    raise UsageError(f"unknown op {op!r}; expected prefetch, pull or status")


def _allowed(reconciler: Reconciler, prefixes: tuple[str, ...], models: list[str]) -> list[ModelRef]:
    """Parse every model and refuse the whole request if one of them is not allowed."""
    refs = [parse_model_name(m) for m in models]
    schedule = reconciler.schedule
    allowed = allow_list((m.source for m in schedule.models) if schedule else (), prefixes)
    for ref in refs:
        if not allowed.allows(ref):
            extra = {"code": "not_allowed", "model": ref.model_id}
            log.warning("refused a request for %s", ref.uri, extra=extra)
        allowed.check(ref)
    return refs


async def _tenant_pull(
    reconciler: Reconciler, prefixes: tuple[str, ...], request: api.Message
) -> api.Message:
    """`modelsync pull` from a pod that mounts the cache read-only: stage, then record the use and lease."""
    model, name, lease_s = request.get("model"), request.get("name"), request.get("lease_s")
    if not isinstance(model, str) and not isinstance(name, str):
        raise UsageError("pull needs 'model': s3://bucket/prefix/, or 'name': a model name of the schedule")
    if lease_s is not None and (
        not isinstance(lease_s, int | float) or isinstance(lease_s, bool) or not 0 < lease_s <= MAX_LEASE_S
    ):
        raise UsageError(f"pull: 'lease_s' must be a number of seconds in (0, {MAX_LEASE_S:.0f}]")
    if isinstance(name, str):
        if reconciler.schedule is None:
            raise UsageError("the node daemon has no schedule loaded yet; a model name needs one")
        ref = variant_for(reconciler.schedule, name, reconciler.config.pool).source
    else:
        (ref,) = _allowed(reconciler, prefixes, [str(model)])
    rules = reconciler.rules_for(ref, None if lease_s is None else float(lease_s))
    (future,) = reconciler.request([ref], preempt=True)
    path = await future
    await asyncio.to_thread(reconciler.cache.touch, ref)
    if rules.lease_s is not None:
        await asyncio.to_thread(reconciler.cache.lease, ref, time.time() + rules.lease_s)
    log.info("served %s to a tenant pull", ref.model_id, extra={"model": ref.model_id, "lease_s": lease_s})
    return {"model": ref.model_id, "path": str(path)}


def _outcome(model_id: str, future: asyncio.Future[Path]) -> api.Message:
    if not future.done():
        return {"model": model_id, "queued": True}
    exc = future.exception()
    if exc is None:
        return {"model": model_id, "path": str(future.result())}
    error = exc if isinstance(exc, ModelsyncError) else ModelsyncError(str(exc))
    return {"model": model_id, **api.error_reply(error)}
