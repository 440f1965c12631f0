"""The schedule watcher: the daemon follows its schedule file without a restart.

Every second it stats the schedule path (following symlinks, so a ConfigMap's
`..data` swap shows as a new inode) and re-reads the file when its identity or
mtime changed; a new content hash is loaded. A file that does not load
(`ScheduleError`) is logged with its code, `bad_schedule`, and counted in
`modelsync_schedule_load_errors_total`, and the last good schedule stays.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
from pathlib import Path

from modelsync.adapters.schedule_file import parse_schedule_bytes, read_schedule_bytes
from modelsync.core.schedule import Schedule
from modelsync.engine.reconcile import Reconciler
from modelsync.errors import ScheduleError
from modelsync.metrics import DaemonMetrics

log = logging.getLogger("modelsync.daemon")

#: seconds between checks of the schedule file
WATCH_INTERVAL_S = 1.0


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
