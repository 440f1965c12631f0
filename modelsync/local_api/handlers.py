"""The local API's ops, answered from the daemon's reconcile loop: `status`, `prefetch`, `pull`.

Requests that make the daemon download (`prefetch`, and `pull` from tenant pods
that mount the cache read-only and hold no credentials) are served only for
sources in the schedule or under `--allow` prefixes (core/allow.py); a tenant's
`pull` also has its use and lease recorded here, since the tenant cannot write
to the cache.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from pathlib import Path

from modelsync.core.allow import allow_list
from modelsync.core.plan_view import plan_json
from modelsync.core.refs import ModelRef, parse_model_name
from modelsync.core.schedule_variants import variant_for
from modelsync.engine.reconcile import Reconciler
from modelsync.errors import ModelsyncError, UsageError
from modelsync.local_api.protocol import Message, error_reply
from modelsync.local_api.server import Handler

log = logging.getLogger("modelsync.daemon")

#: the longest lease a tenant's pull may ask for; a longer one would pin the model in all but name
MAX_LEASE_S = 30 * 24 * 3600.0


def handler(reconciler: Reconciler, prefixes: tuple[str, ...]) -> Handler:
    """The daemon's answers to the local API's ops, for `server.serve`."""
    return functools.partial(_handle, reconciler, prefixes)


async def _handle(reconciler: Reconciler, prefixes: tuple[str, ...], request: Message) -> Message:
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
    reconciler: Reconciler, prefixes: tuple[str, ...], request: Message
) -> Message:
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


def _outcome(model_id: str, future: asyncio.Future[Path]) -> Message:
    if not future.done():
        return {"model": model_id, "queued": True}
    exc = future.exception()
    if exc is None:
        return {"model": model_id, "path": str(future.result())}
    error = exc if isinstance(exc, ModelsyncError) else ModelsyncError(str(exc))
    return {"model": model_id, **error_reply(error)}
