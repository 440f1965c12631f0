"""The one way a model is made ready: `pull`, `prefetch`, the daemon and `verify --repair` all call it.

It takes the pull's rules (engine/rules.py `pull_rules`: settings, signature
policy, lease) and nothing else that decides what a pull obeys, so no entry can
reach it with rules of its own making.

`ensure_ready` applies one readiness rule (engine/ready.py `readiness`): the
record, one lstat per file, and the signature when the policy requires one. A
ready model returns at once, without the lock; otherwise, under the model's
lock (single-flight between processes), it
1. re-hashes the ready model first when asked (`verify`);
2. moves a damaged model back into staging, keeping its intact files, so only
   the bad ones are fetched (engine/maintain.py `repair_ready`);
3. pulls the revision (engine/pull.py), or, for a refresh, checks the ready one
   against its source and pulls only what changed;
4. records the use and the lease.

The warm path (modelsync/plain_pull.py) answers a ready model before this module is
even imported, with the same rule.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, NamedTuple

from modelsync.adapters.cache import Cache
from modelsync.adapters.cache.foreground import announce
from modelsync.core.refs import ModelRef
from modelsync.engine.events import NoEvents, PullEvents
from modelsync.engine.ports import OpenBackends
from modelsync.engine.pull_job import PullJob
from modelsync.engine.ready import Problem, Readiness, readiness
from modelsync.engine.rules import PullRules

if TYPE_CHECKING:
    from modelsync.engine.pull import Pulled


class PullResult(NamedTuple):
    path: Path
    total_bytes: int
    fetched_bytes: int
    elapsed_s: float
    files: int
    #: models the pull's space reservation evicted to make room, so callers can count them exactly
    evicted: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadyOptions:
    """How `ensure_ready` makes a model ready; every field is optional."""

    #: re-hash a ready model against its record first; bad files are fetched again
    verify: bool = False
    #: record a use even when the model was ready already (a pull does; a prefetch or a
    #: refresh check does not, or every check would move it to the back of the eviction order)
    use: bool = True
    #: check a ready model against its source and pull the new revision when its objects changed
    refresh: bool = False
    #: announce a foreground pull while fetching, so the node's daemon yields its bandwidth
    foreground: bool = False
    #: models that making room must not evict (model id -> reason)
    protected: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    #: set from another thread to stop the pull (PullCancelledError); it resumes from its journal
    cancel: threading.Event | None = None


def ensure_ready(
    rules: PullRules,
    *,
    backends: OpenBackends,
    events: PullEvents | None = None,
    options: ReadyOptions | None = None,
) -> PullResult:
    """Make `rules.source` ready in the cache and return where; waits for another puller of it.

    `rules` is what the pull obeys (engine/rules.py `pull_rules`); `options` how
    the caller waits on it. `backends` opens the object store and the range fetcher for the pull (the
    edge builds it: `modelsync.backends.s3_backends`). A ready model without a
    verified signature, under a policy that now requires one, is checked again:
    its files are reused (hard links), hashed, and compared with the signature
    before it is swapped in.
    """
    events = events or NoEvents()
    options = options or ReadyOptions()
    started = time.monotonic()
    ref, settings = rules.source, rules.settings
    cache = Cache(settings.cache_dir)
    cache.ensure()
    signed_only = rules.signed_only
    state = readiness(cache, ref, signed_only)
    if state.ready and not (options.verify or options.refresh):
        return _done(cache, rules, options, _ready_result(cache, ref, state, started))
    with contextlib.ExitStack() as stack:
        announced = options.foreground and not state.ready
        if announced:
            stack.enter_context(announce(settings.cache_dir, ref))
        lock = cache.lock(ref)
        lock.acquire(on_wait=events.waiting)
        stack.callback(lock.release)
        if options.verify:
            from modelsync.engine.maintain import verify_ready  # here: a cold pull does not verify

            _report(verify_ready(cache, ref, settings.part_size_bytes) or [], events)
        state = readiness(cache, ref, signed_only)
        if state.record is not None and state.damaged:
            # never served while it is repaired; the intact files stay, only the bad ones are fetched
            _report(state.damaged, events)
            from modelsync.engine.maintain import repair_ready  # here, as verify_ready above

            repair_ready(cache, ref, state.record, {p.path for p in state.damaged}, settings.part_size_bytes)
            state = Readiness(None)
        if state.ready and not options.refresh:
            return _done(cache, rules, options, _ready_result(cache, ref, state, started))
        if options.foreground and not announced:
            # found damaged only now (verify): the re-fetch is a foreground pull too
            stack.enter_context(announce(settings.cache_dir, ref))
        from modelsync.engine.pull import pull_revision  # here: only a fetch needs the data plane

        job = PullJob(
            rules=rules,
            cache=cache,
            backends=backends,
            current=state.record,
            recheck=state.unsigned,
            protected=options.protected,
            cancel=options.cancel,
        )
        pulled = pull_revision(job, lock, events)
        result = _pulled(pulled, started)
    # A new copy is a use; a refresh check of a ready model is not.
    return _done(cache, rules, replace(options, use=options.use or state.record is None), result)


def _pulled(pulled: Pulled, started: float) -> PullResult:
    return PullResult(
        path=pulled.path,
        total_bytes=pulled.plan.total_bytes,
        fetched_bytes=pulled.fetched_bytes,
        elapsed_s=time.monotonic() - started,
        files=len(pulled.plan.files),
        evicted=pulled.evicted,
    )


def _ready_result(cache: Cache, ref: ModelRef, state: Readiness, started: float) -> PullResult:
    record = state.record
    assert record is not None
    elapsed_s = time.monotonic() - started
    return PullResult(cache.ready_path(ref), record.total_bytes, 0, elapsed_s, len(record.files))


def _report(problems: Iterable[Problem], events: PullEvents) -> None:
    for p in problems:
        events.damaged(p.path, p.reason)


def _done(cache: Cache, rules: PullRules, options: ReadyOptions, result: PullResult) -> PullResult:
    """Record the use and the lease of a model that is ready now."""
    if options.use:
        cache.touch(rules.source)
    if rules.lease_s is not None:
        cache.lease(rules.source, time.time() + rules.lease_s)
    return result
