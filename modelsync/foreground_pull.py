"""A pull that someone waits on, run in this process: `pull`, `prefetch` with no daemon, `verify --repair`.

Such a pull is announced as a foreground pull (adapters/cache/foreground.py), which
makes a running daemon pause its background prefetch, so a pod's init container
or an operator gets the node's bandwidth; its progress goes to stderr. What it
obeys comes from the caller's `PullRules` (engine/rules.py), like every pull.

Where the cache is mounted read-only (a tenant pod), no pull runs here: the
node daemon stages the model (`read_only` is the one test of that).
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from modelsync.adapters.cache import Cache
from modelsync.config import Settings
from modelsync.errors import LocalStorageError

if TYPE_CHECKING:
    from modelsync.engine.ensure import PullResult, ReadyOptions
    from modelsync.engine.rules import PullRules


def read_only(cache_dir: Path) -> bool:
    """The cache exists and this process may not write to it: a tenant's read-only mount."""
    return os.path.isdir(cache_dir) and not os.access(cache_dir, os.W_OK)


def usable_cache(settings: Settings) -> Cache:
    """The cache at the configured root, which may not exist yet but must not be, or lie in, a file."""
    root = settings.cache_dir
    nearest = next((p for p in (root, *root.parents) if p.exists()), root)
    if not nearest.is_dir():
        where = "is not a directory" if nearest == root else f"lies in {nearest}, which is not a directory"
        raise LocalStorageError(f"cache root {root} {where}; check --cache-dir or MODELSYNC_CACHE_DIR")
    return Cache(root)


def foreground_pull(rules: PullRules, quiet: bool, options: ReadyOptions | None = None) -> PullResult:
    """Make `rules.source` ready in this process (`engine.ensure.ensure_ready`) with progress on stderr.

    The engine is imported here, not at the top, so commands that never pull (a
    warm pull, ls) stay fast.
    """
    from modelsync.backends import s3_backends
    from modelsync.engine.ensure import ReadyOptions, ensure_ready
    from modelsync.progress import StderrProgress

    _loaded()
    usable_cache(rules.settings)
    progress = StderrProgress(rules.source.model_id, quiet=quiet)
    try:
        # The S3 SDK is imported inside, only when the model must be fetched.
        with _without_pyopenssl():
            return ensure_ready(
                rules,
                backends=s3_backends(rules.settings),
                events=progress,
                options=replace(options or ReadyOptions(), foreground=True),
            )
    finally:
        progress.close()


def _loaded() -> None:
    """The pull's code is in: collect garbage again (`__main__` held the collector off), past it.

    What start-up loaded lives as long as the process; frozen (`gc.freeze`), the collector never
    visits it again, at exit neither. Held off and frozen, a cold 64 MiB pull runs ~7% fewer
    instructions (callgrind).
    """
    gc.freeze()
    gc.enable()


_PYOPENSSL = "urllib3.contrib.pyopenssl"


@contextlib.contextmanager
def _without_pyopenssl() -> Iterator[None]:
    """While the S3 SDK is imported, let botocore find urllib3's pyOpenSSL shim absent.

    botocore imports the shim (pyOpenSSL, cryptography's x509: ~40 ms of CPU, where the
    signing extra installs them) only to take the standard library's SSLContext back out
    of it; without it, it takes the same class from urllib3.util.ssl_. Afterwards the shim
    is importable again for whoever really wants it.
    """
    if _PYOPENSSL in sys.modules:
        yield
        return
    sys.modules[_PYOPENSSL] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        if sys.modules.get(_PYOPENSSL, 0) is None:
            del sys.modules[_PYOPENSSL]
