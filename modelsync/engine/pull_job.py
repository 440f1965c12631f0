"""What one pull is, as one value: the pull's classes take it instead of a long list of parameters.

`engine/ensure.py` builds it under the model's lock; `engine/pull.py` and the
fetch window (engine/fetch.py) read what they need from it. It holds no state
of the pull (that lives in the journal, the ledger and the window), so the
same value describes the pull from its start to its end.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from modelsync.adapters.cache import Cache
    from modelsync.config import Settings
    from modelsync.core.record import CompletionRecord
    from modelsync.core.refs import ModelRef
    from modelsync.engine.ports import OpenBackends
    from modelsync.engine.rules import PullRules


@dataclass(frozen=True, slots=True, kw_only=True)
class PullJob:
    """One revision of `rules.source` to fetch into `cache` under `rules`, through `backends`."""

    rules: PullRules
    cache: Cache
    #: opens the pull's backends in its event loop; the engine never builds them (engine/ports.py)
    backends: OpenBackends
    #: the ready revision when this is a refresh check: unchanged objects then return at once
    current: CompletionRecord | None = None
    #: check the ready revision again even when the source did not change (it lacks a signature)
    recheck: bool = False
    #: models that making room must not evict (model id -> reason)
    protected: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    #: set from another thread to stop the pull (PullCancelledError); it resumes from its journal
    cancel: threading.Event | None = None

    @property
    def source(self) -> ModelRef:
        return self.rules.source

    @property
    def settings(self) -> Settings:
        return self.rules.settings
