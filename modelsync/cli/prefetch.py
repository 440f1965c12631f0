"""`modelsync prefetch`: ask the running node daemon to stage models now; without one, pull them here.

Here means under the same rules as the daemon's pull of each model (engine/rules.py):
the settings, and the --schedule entry's (its signature policy) when it names the
model. A name with `variants` resolves to this node's pool's source.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from modelsync.cli.options import (
    CacheDir,
    Concurrency,
    ConfigFile,
    EndpointUrl,
    Insecure,
    MaxBandwidth,
    Quiet,
    Region,
    SettingFlags,
    build_settings,
    node_pool,
)
from modelsync.config import Settings
from modelsync.core.refs import ModelRef, parse_model_name
from modelsync.errors import UsageError

if TYPE_CHECKING:
    from modelsync.core.schedule import Schedule


def prefetch(
    models: Annotated[
        list[str],
        typer.Argument(
            metavar="MODEL", help="s3://bucket/prefix/, bucket/prefix, or a model name of --schedule."
        ),
    ],
    schedule: Annotated[
        Path | None,
        typer.Option(
            "--schedule", metavar="FILE", help="Resolve model names in this schedule. [default: none]"
        ),
    ] = None,
    no_wait: Annotated[
        bool, typer.Option("--no-wait", help="Return once the daemon has queued them.")
    ] = False,
    cache_dir: CacheDir = None,
    endpoint_url: EndpointUrl = None,
    region: Region = None,
    config: ConfigFile = None,
    concurrency: Concurrency = None,
    max_bandwidth: MaxBandwidth = None,
    insecure: Insecure = False,
    quiet: Quiet = False,
) -> None:
    """Ask the running daemon to stage models now and print their paths; without one, pull them here.

    Here, each model obeys the same rules as the daemon's pull of it: the settings,
    and the --schedule entry's (its signature policy) when it names the model.
    """
    from modelsync.local_api.client import prefetch_via_daemon
    from modelsync.local_api.protocol import error_from_reply

    loaded = None
    if schedule is not None:
        from modelsync.adapters.schedule_file import read_schedule

        loaded = read_schedule(schedule)
    settings = build_settings(
        SettingFlags(
            cache_dir=cache_dir,
            endpoint_url=endpoint_url,
            region=region,
            config=config,
            concurrency=concurrency,
            max_bandwidth=max_bandwidth,
            insecure=insecure,
        )
    )
    refs = _resolve_models(models, schedule, loaded, settings)
    try:
        entries = prefetch_via_daemon(settings.cache_dir, refs, wait=not no_wait)
    except ConnectionError:
        typer.echo("warning: the daemon stopped before answering; pulling here", err=True)
        entries = None
    if entries is None:
        _prefetch_here(settings, refs, loaded, quiet)
        return
    failed = None
    for entry in entries:
        if "path" in entry:
            typer.echo(entry["path"])
        elif entry.get("queued"):
            typer.echo(f"{entry['model']}: queued by the daemon", err=True)
        else:
            typer.echo(f"error: {entry['model']}: {entry['error']}", err=True)
            failed = failed or entry
    if failed is not None:
        raise typer.Exit(int(error_from_reply(failed).exit_code))


def _prefetch_here(settings: Settings, refs: list[ModelRef], schedule: Schedule | None, quiet: bool) -> None:
    """No daemon answers: pull each model in this process, under the rules the daemon would apply."""
    from modelsync.engine.ensure import ReadyOptions
    from modelsync.engine.rules import pull_rules
    from modelsync.foreground_pull import foreground_pull

    rules = [pull_rules(settings, ref, schedule) for ref in refs]  # a bad policy stops before any pull
    for each in rules:
        typer.echo(str(foreground_pull(each, quiet, ReadyOptions(use=False)).path))


def _resolve_models(
    models: list[str], path: Path | None, schedule: Schedule | None, settings: Settings
) -> list[ModelRef]:
    """Each MODEL is a schedule name (with --schedule), an s3:// URI or `bucket/prefix`."""
    if path is None or schedule is None:
        return [parse_model_name(m) for m in models]
    names = {m.name: m.source for m in schedule.models if m.name is not None}
    return [
        _variant(schedule, m, settings) if m in names else _uri_or_unknown_name(m, path, names)
        for m in models
    ]


def _variant(schedule: Schedule, name: str, settings: Settings) -> ModelRef:
    """A name's source; with `variants`, the one for this node's pool (MODELSYNC_POOL)."""
    from modelsync.core.schedule_variants import variant_for

    (first, *others) = schedule.named(name)
    if not others:
        return first.source
    return variant_for(schedule, name, node_pool(settings)).source


def _uri_or_unknown_name(text: str, schedule: Path, names: dict[str, ModelRef]) -> ModelRef:
    """With --schedule, a word without a slash is a model name; one the schedule lacks is a typo."""
    if text.startswith("s3://") or "/" in text:
        return parse_model_name(text)
    known = ", ".join(sorted(names)) or "none (give its models a name: field)"
    raise UsageError(f"{schedule} has no model named {text!r}; its model names are {known}")
