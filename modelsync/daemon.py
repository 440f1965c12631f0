"""The node daemon, at the edge: schedule file, signals, sockets and logs around the reconcile loop.

What runs, all on one event loop:

- the reconcile loop (engine/reconcile.py), which plans and pulls;
- the schedule watcher: every second it stats the schedule path (following
  symlinks, so a ConfigMap's `..data` swap shows as a new inode) and re-reads
  the file when its identity or mtime changed; a new content hash is loaded.
  A file that does not load (`ScheduleError`) is logged with its code,
  `bad_schedule`, and counted in `modelsync_schedule_load_errors_total`, and
  the last good schedule stays;
- the local API on `<cache>/.modelsync/daemon.sock` (api.py). Requests that
  make the daemon download (`prefetch`, and `pull` from tenant pods that
  mount the cache read-only and hold no credentials) are served only for
  sources in the schedule or under `--allow` prefixes (core/allow.py); a
  tenant's `pull` also has its use and lease recorded here, since the tenant
  cannot write to the cache;
- the HTTP listener with only `/metrics`, `/healthz` and `/readyz`. Neither
  probe touches S3: an object-store outage must not restart or unready the
  daemon, which rides it out with backoff.

SIGTERM or SIGINT stops the loop (the running pull is cancelled, its journal
kept), then the listeners; the whole takes well under 10 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import disable_created_metrics

from modelsync import api
from modelsync.adapters.cache.foreground import live_foreground
from modelsync.adapters.schedule_file import parse_schedule_bytes, read_schedule_bytes
from modelsync.backends import s3_backends
from modelsync.config import Settings
from modelsync.core.allow import allow_list
from modelsync.core.plan_view import plan_json
from modelsync.core.refs import ModelRef, parse_model_name
from modelsync.core.schedule import Schedule
from modelsync.core.schedule_variants import variant_for
from modelsync.engine.ensure import PullResult, ReadyOptions, ensure_ready
from modelsync.engine.events import PullEvents
from modelsync.engine.inventory import cache_entries, remote_sizes
from modelsync.engine.reconcile import EnsureReady, LoopConfig, Reconciler
from modelsync.engine.rules import PullRules
from modelsync.errors import ModelsyncError, ScheduleError, UsageError
from modelsync.metrics import CONTENT_TYPE, DaemonMetrics

log = logging.getLogger("modelsync.daemon")

#: seconds between checks of the schedule file
WATCH_INTERVAL_S = 1.0
#: seconds the HTTP listener gives open requests when stopping
HTTP_SHUTDOWN_S = 1.0
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


class ScheduleWatcher:
    """Loads the schedule when the file's identity or content changes; keeps the last good one."""

    def __init__(self, path: Path, reconciler: Reconciler, metrics: DaemonMetrics) -> None:
        self.path = path
        self._reconciler = reconciler
        self._metrics = metrics
        self._identity: tuple[object, ...] | None = None
        self._digest: str | None = None

    def poll(self) -> None:
        try:
            st = os.stat(self.path)
            identity: tuple[object, ...] = (
                os.path.realpath(self.path),
                st.st_dev,
                st.st_ino,
                st.st_mtime_ns,
                st.st_size,
            )
        except OSError as exc:
            identity = ("unreadable", exc.errno)
        if identity == self._identity:
            return
        self._identity = identity
        try:
            data = read_schedule_bytes(self.path)
            digest = hashlib.sha256(data).hexdigest()
            if digest == self._digest:
                return
            self._digest = digest
            schedule = parse_schedule_bytes(data, self.path)
        except ScheduleError as exc:
            self._digest = None
            self._metrics.schedule_refused(exc.code)
            kept = "keeping the last good one" if self._reconciler.schedule else "no schedule loaded yet"
            log.error("schedule refused (%s): %s", kept, exc, extra={"code": exc.code})
            return
        self._load(schedule)

    def _load(self, schedule: Schedule) -> None:
        self._reconciler.set_schedule(schedule)
        pool = self._reconciler.config.pool
        pool_models = len(schedule.for_pool(pool))
        self._metrics.schedule_loaded(pool_models)
        log.info(
            "schedule loaded: %d models, %d for pool %s",
            len(schedule.models),
            pool_models,
            pool,
            extra={"schedule": str(self.path), "digest": self._digest},
        )
        if not pool_models:
            known = sorted({p for m in schedule.models for p in m.pools})
            log.warning(
                "no model of the schedule names pool %s, so this node stages nothing; its pools are %s "
                "(check --pool / MODELSYNC_POOL against the node's accelerator.pool label)",
                pool,
                ", ".join(known) or "none",
                extra={"code": "pool_not_in_schedule", "schedule": str(self.path)},
            )

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.poll()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), WATCH_INTERVAL_S)


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
        runner = await _start_http(options, reconciler, metrics, loop_task)
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


async def _start_http(
    options: DaemonOptions, reconciler: Reconciler, metrics: DaemonMetrics, loop_task: asyncio.Task[None]
) -> web.AppRunner:
    async def metrics_page(_: web.Request) -> web.Response:
        return web.Response(body=metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    async def healthz(_: web.Request) -> web.Response:
        if loop_task.done():
            return web.Response(status=500, text="the reconcile loop has stopped\n")
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        if reconciler.schedule is None:
            return web.Response(status=503, text="no schedule loaded\n")
        if not reconciler.ready or loop_task.done():
            return web.Response(status=503, text="not reconciled yet\n")
        return web.Response(text="ready\n")

    app = web.Application()
    app.router.add_get("/metrics", metrics_page)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, options.listen_host, options.listen_port, shutdown_timeout=HTTP_SHUTDOWN_S)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise UsageError(
            f"cannot listen on {options.listen_host}:{options.listen_port}: {exc.strerror or exc}"
        ) from None
    for address in runner.addresses:
        host, port = address[0], address[1]
        url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
        log.info("serving /metrics, /healthz and /readyz on %s", url, extra={"url": url})
    return runner


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


# -- logs --------------------------------------------------------------------------------

#: attributes every LogRecord has; anything else was passed in `extra` and is logged as a field
_STANDARD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and every `extra` field (e.g. `code`)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update({k: v for k, v in vars(record).items() if k not in _STANDARD_ATTRS})
        if record.levelno >= logging.ERROR:
            entry.setdefault("code", "internal")
        if record.exc_info:
            entry["traceback"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    """`time level message [code=...]`: the code of an error stays visible without JSON."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        code = getattr(record, "code", None)
        if code is None and record.levelno >= logging.ERROR:
            code = "internal"
        return text if code is None else f"{text} [code={code}]"


def configure_logging(json_logs: bool) -> None:
    """Logs go to stderr (the container log); the root logger gets one handler, set here only."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if json_logs else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    for noisy in ("aiobotocore", "botocore", "aiohttp.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
