"""`verify --remote`: each ready model compared with its source, and replaced where it changed.

A model made ready before its source was republished (an interrupted publish
pulled by an older modelsync, say) passes every local check: its files match its
own record. Only the source can tell, as the daemon's refresh checks ask it.
"""

from __future__ import annotations

import typer

from modelsync.adapters.cache import Cache
from modelsync.config import Settings
from modelsync.core.refs import parse_model_name
from modelsync.core.units import format_bytes
from modelsync.engine.rules import pull_rules


def compare_with_sources(settings: Settings, models: list[str], quiet: bool) -> None:
    """Check each (intact) model against its source, as the daemon's refresh does; replace the
    ones whose source changed since they were pulled (a republish), fetching only what changed."""
    from modelsync.backends import s3_backends
    from modelsync.engine.ensure import ReadyOptions, ensure_ready
    from modelsync.progress import StderrProgress

    cache = Cache(settings.cache_dir)
    for model in models:
        ref = parse_model_name(model)
        before = cache.load_record(ref)
        progress = StderrProgress(ref.model_id, quiet=quiet)
        try:
            result = ensure_ready(
                pull_rules(settings, ref),
                backends=s3_backends(settings),
                events=progress,
                options=ReadyOptions(refresh=True, use=False),
            )
        finally:
            progress.close()
        after = cache.load_record(ref)
        if before is not None and after is not None and after.completed_at != before.completed_at:
            fetched = format_bytes(result.fetched_bytes)
            typer.echo(f"stale {model}: its source changed; replaced, fetched {fetched}")
        else:
            typer.echo(f"ok    {model}: same as its source")
