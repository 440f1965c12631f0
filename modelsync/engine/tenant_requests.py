"""The daemon's requests from tenants: the models asked for ahead of the schedule, and who waits for each.

A request names a model the schedule may not list (a `prefetch` of a source, a
tenant's pull), so its `ModelRef` is kept until a pull of it ends; each asker
holds a future that the end of that pull answers. A cancelled pull (paused,
stopping) answers nobody: the request stays queued and is pulled again.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from modelsync.core.refs import ModelRef
from modelsync.errors import ModelsyncError


class TenantRequests:
    def __init__(self) -> None:
        self._refs: dict[str, ModelRef] = {}
        self._waiters: dict[str, list[asyncio.Future[Path]]] = {}

    def ask(self, ref: ModelRef, ready: Path | None) -> asyncio.Future[Path]:
        """A future for `ref`'s ready path: answered now when it is `ready`, else when its pull ends."""
        future: asyncio.Future[Path] = asyncio.get_running_loop().create_future()
        if ready is not None:
            future.set_result(ready)
            return future
        self._waiters.setdefault(ref.model_id, []).append(future)
        self._refs.setdefault(ref.model_id, ref)
        return future

    def ref(self, model_id: str) -> ModelRef | None:
        """The source a request named for `model_id`, while its pull has not ended."""
        return self._refs.get(model_id)

    def ended(self, model_id: str) -> None:
        """A pull of `model_id` ended (not cancelled): a request of it is served or has failed."""
        self._refs.pop(model_id, None)

    def answer(self, model_id: str, path: Path) -> None:
        for waiter in self._waiters.pop(model_id, []):
            if not waiter.done():
                waiter.set_result(path)

    def fail(self, model_id: str, error: ModelsyncError) -> None:
        for waiter in self._waiters.pop(model_id, []):
            if not waiter.done():
                waiter.set_exception(error)

    def fail_all(self, error: ModelsyncError) -> None:
        """Stopping: every asker is told, since nothing will answer it."""
        for model_id in list(self._waiters):
            self.fail(model_id, error)
