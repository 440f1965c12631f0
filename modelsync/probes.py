"""The daemon's HTTP listener: `/metrics`, and the probes `/healthz` and `/readyz`.

Neither probe touches S3: an object-store outage must not restart or unready
the daemon, which rides it out with backoff. `/healthz` fails only once the
reconcile loop has stopped; `/readyz` waits for a loaded schedule and a first
reconcile.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from modelsync.engine.reconcile import Reconciler
from modelsync.errors import UsageError
from modelsync.metrics import CONTENT_TYPE, DaemonMetrics

log = logging.getLogger("modelsync.daemon")

#: seconds the HTTP listener gives open requests when stopping
HTTP_SHUTDOWN_S = 1.0


async def start_probes(
    host: str, port: int, reconciler: Reconciler, metrics: DaemonMetrics, loop_task: asyncio.Task[None]
) -> web.AppRunner:
    """Listen on `host:port` (port 0 picks one; the log says which); the caller cleans the runner up."""
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
    site = web.TCPSite(runner, host, port, shutdown_timeout=HTTP_SHUTDOWN_S)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise UsageError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}"
        ) from None
    for address in runner.addresses:
        host, port = address[0], address[1]
        url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
        log.info("serving /metrics, /healthz and /readyz on %s", url, extra={"url": url})
    return runner
