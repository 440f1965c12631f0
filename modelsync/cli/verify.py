"""`modelsync verify`: check cached models, quarantine the damaged, and on request repair them or
compare them with their sources (cli/remote.py).

A check imports no S3 stack; `--repair` pulls the damaged files again, under the
same rules as `pull`, and `--remote` asks the store.
"""

from __future__ import annotations

import json
from typing import Annotated

import typer

from modelsync.adapters import access
from modelsync.adapters.cache import Cache
from modelsync.cli.options import (
    CacheDir,
    ConfigFile,
    EndpointUrl,
    Json,
    Quiet,
    SettingFlags,
    build_settings,
    existing_cache,
    plural,
)
from modelsync.config import CACHE_SETTINGS, SIGNATURE_SETTINGS, Settings
from modelsync.core.lifecycle import CacheState
from modelsync.core.refs import parse_model_name
from modelsync.core.units import format_bytes
from modelsync.engine.catalog import open_catalog
from modelsync.engine.rules import pull_rules
from modelsync.errors import IntegrityError


def verify(
    model: Annotated[
        str | None, typer.Argument(metavar="MODEL", help="One model; default: every ready model.")
    ] = None,
    full: Annotated[bool, typer.Option("--full", help="Re-hash every byte against the records.")] = False,
    repair: Annotated[
        bool, typer.Option("--repair", help="Fetch only the bad files of quarantined models.")
    ] = False,
    remote: Annotated[
        bool,
        typer.Option("--remote", help="Compare models with their sources; replace ones changed there."),
    ] = False,
    cache_dir: CacheDir = None,
    endpoint_url: EndpointUrl = None,
    config: ConfigFile = None,
    quiet: Quiet = False,
    as_json: Json = False,
) -> None:
    """Check cached models; a damaged one is quarantined (not served); --repair refetches its bad files."""
    from modelsync.engine.maintain import verify as run_verify

    if repair or remote:  # these pull, so they need every setting; a check needs only the cache's
        settings = build_settings(SettingFlags(cache_dir=cache_dir, endpoint_url=endpoint_url, config=config))
    else:
        # --full re-checks signatures: a bad policy must stop it, not silently turn it off
        needed = CACHE_SETTINGS | SIGNATURE_SETTINGS if full else CACHE_SETTINGS
        settings = build_settings(SettingFlags(cache_dir=cache_dir, config=config), needed=needed)
    cache = existing_cache(settings)
    with open_catalog(cache) as catalog:
        report = run_verify(
            cache,
            catalog,
            model,
            full,
            lambda ref: pull_rules(settings, ref).signature,  # the policy a pull of it obeys
            settings.signature_name,
        )
        quarantined = [v.model for v in catalog.views() if v.state is CacheState.QUARANTINED]
    if as_json:
        doc = {
            "models": [
                {
                    "model": c.model,
                    "busy": c.busy,
                    "problems": [{"path": p.path, "reason": p.reason} for p in c.problems],
                }
                for c in report.checks
            ],
            "leftovers": [{"path": str(item.path), "reason": item.reason} for item in report.leftovers],
        }
        typer.echo(json.dumps(doc, indent=1))
    for check in [] if as_json else report.checks:
        if check.busy:
            typer.echo(f"busy  {check.model}: being pulled, not checked")
        elif not check.problems:
            typer.echo(f"ok    {check.model}")
        for problem in check.problems:
            typer.echo(f"bad   {check.model}{'/' if problem.path else ''}{problem.path}: {problem.reason}")
    for item in [] if as_json else report.leftovers:
        typer.echo(f"note  {item.path}: {item.reason} (modelsync gc removes it)")
    if report.read_only and not as_json:
        typer.echo(f"note  {cache.root} is read-only here: nothing was recorded or quarantined")
    if repair:
        access.require_writable(cache.root, "verify --repair")
        targets = [parse_model_name(model).model_id] if model else quarantined
        for target in targets:
            _repair(settings, cache, target, quiet)
        return
    if remote:
        from modelsync.cli.remote import compare_with_sources

        compare_with_sources(settings, [c.model for c in report.checks if not (c.problems or c.busy)], quiet)
    damaged = [c.model for c in report.checks if c.problems]
    if damaged and report.read_only:
        raise IntegrityError(
            f"{plural(len(damaged), 'model')} damaged ({', '.join(damaged)}), and not quarantined: this "
            "cache is read-only here (a read-only mount, or a user outside its group); run "
            "`modelsync verify` where it is writable (on the node, as the daemon's user)"
        )
    if damaged:
        raise IntegrityError(
            f"{plural(len(damaged), 'model')} damaged and quarantined ({', '.join(damaged)}); "
            "run `modelsync verify --repair` to fetch the bad files again"
        )


def _repair(settings: Settings, cache: Cache, model: str, quiet: bool) -> None:
    """Fetch the bad files again: a foreground pull, under the same rules as `pull`."""
    from modelsync.engine.maintain import prepare_repair
    from modelsync.foreground_pull import foreground_pull

    with open_catalog(cache) as catalog:
        ref = prepare_repair(cache, catalog, model, settings.part_size_bytes)
    result = foreground_pull(pull_rules(settings, ref), quiet)
    typer.echo(f"repaired {ref.model_id}: fetched {format_bytes(result.fetched_bytes)}")
