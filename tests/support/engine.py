"""The engine's one flow (`ensure_ready`) over the real S3 backends: the integration tier's pull."""

from __future__ import annotations

import threading

from modelsync.backends import s3_backends
from modelsync.config import Settings
from modelsync.core.refs import ModelRef
from modelsync.engine.ensure import PullResult, ReadyOptions, ensure_ready
from modelsync.engine.events import PullEvents
from modelsync.engine.rules import pull_rules


def pull(
    settings: Settings, ref: ModelRef, events: PullEvents | None = None, cancel: threading.Event | None = None
) -> PullResult:
    """Make `ref` ready as `modelsync pull` does in-process, over a real S3 server."""
    return ensure_ready(
        pull_rules(settings, ref),
        backends=s3_backends(settings),
        events=events,
        options=ReadyOptions(cancel=cancel),
    )
