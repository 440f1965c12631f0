"""Operator commands on the node cache: ls, evict, pin, unpin, gc (verify is cli/verify.py).

None of them imports the S3 stack. Each works while other processes pull: models being
pulled are shown as such and never evicted or verified under a puller's feet.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Annotated

import typer

from modelsync.adapters import access, volume
from modelsync.adapters.cache import Cache
from modelsync.adapters.cache.damaged import DamagedRecord
from modelsync.cli.options import (
    CacheDir,
    ConfigFile,
    Json,
    cache_settings,
    existing_cache,
    plural,
)
from modelsync.config import Settings
from modelsync.core.eviction import (
    EvictionPlan,
    budget_use,
    evictable_at,
    plan_named,
    plan_to_size,
    plan_unused,
)
from modelsync.core.lifecycle import CacheState
from modelsync.core.refs import parse_model_name
from modelsync.core.units import format_bytes, format_duration, parse_duration, parse_size
from modelsync.engine.catalog import Catalog, ModelView, open_catalog
from modelsync.engine.evict import budget_bytes, evict
from modelsync.errors import UsageError

ModelArg = Annotated[str, typer.Argument(metavar="MODEL", help="Cached model (bucket/prefix or s3:// URI).")]
DryRun = Annotated[bool, typer.Option("--dry-run", help="Print the plan; change nothing.")]


def ls(cache_dir: CacheDir = None, config: ConfigFile = None, as_json: Json = False) -> None:
    """List cached models: size, last use, pin, state, verification, signer, when evictable; totals."""
    settings = cache_settings(cache_dir, config)
    cache = existing_cache(settings)
    budget = budget_bytes(settings)
    with open_catalog(cache) as catalog:
        views = catalog.views()
        entries = catalog.eviction_entries(views)
        use = budget_use(entries, budget)
        damaged = catalog.damaged
    evictable = {e.model: evictable_at(e, settings.in_use_grace_s) for e in entries}
    used = use.used_bytes
    free = volume.free_bytes(settings.cache_dir)
    _warn_damaged(damaged)
    from modelsync.local_api.client import scheduled_names

    names = scheduled_names(settings.cache_dir)
    unnamed: dict[str, str | None] = {"name": None, "variant": None}
    if as_json:
        doc = {
            "models": [
                {**_as_dict(v), "evictable_at": _iso(evictable[v.model]), **names.get(v.model, unnamed)}
                for v in views
            ],
            "totals": {"used_bytes": used, "budget_bytes": budget, "free_bytes": free},
            "damaged_records": [
                {"path": str(d.path), "reason": d.reason, "model": d.ref.model_id if d.ref else None}
                for d in damaged
            ],
        }
        typer.echo(json.dumps(doc, indent=1))
        return
    now = time.time()
    header = ("MODEL", "STATE", "SIZE", "LAST USED", "PINNED", "VERIFIED", "SIGNED BY", "EVICTABLE")
    rows: list[tuple[str, ...]] = [header]
    for v in views:
        rows.append(
            (
                v.model,
                v.state,
                format_bytes(v.size_bytes),
                _ago(v.last_used_at, now),
                "yes" if v.pinned else "",
                "failed" if v.state is CacheState.QUARANTINED else _ago(v.verified_at, now),
                v.signer or "",
                _evictable(evictable[v.model], now),
            )
        )
    if names:  # the node daemon's schedule: each model's name, and its variant for this pool
        shown = {
            m: f"{n['name']} [{n['variant']}]" if n["variant"] else f"{n['name']}" for m, n in names.items()
        }
        rows = [(r[0], "NAME" if i == 0 else shown.get(r[0], ""), *r[1:]) for i, r in enumerate(rows)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        typer.echo("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())
    limit = f" of a {format_bytes(budget)} budget" if budget is not None else ""
    if use.over_bytes:
        limit += f" (over by {format_bytes(use.over_bytes)})"
    typer.echo(
        f"{plural(len(views), 'model')}, {format_bytes(used)} used{limit}, {format_bytes(free)} free on disk"
    )


def _warn_damaged(damaged: list[DamagedRecord]) -> None:
    """Say which completion records cannot be read, what that means and what to do (on stderr)."""
    for d in damaged:
        if d.ref is None:
            what = "no cached model has it; `modelsync gc` removes it"
        else:
            what = (
                f"{d.ref.model_id} is not served and counts as quarantined; `modelsync verify --repair` "
                "fetches it again, `modelsync evict` removes it"
            )
        typer.echo(f"warning: completion record {d.path} cannot be read ({d.reason}); {what}", err=True)


def evict_command(
    models: Annotated[
        list[str] | None,
        typer.Argument(metavar="MODEL", help="Models to evict (bucket/prefix or s3:// URI)."),
    ] = None,
    to_size: Annotated[
        str | None,
        typer.Option(
            "--to-size", metavar="SIZE", help="Evict LRU models until the cache is this size. [default: none]"
        ),
    ] = None,
    unused_for: Annotated[
        str | None,
        typer.Option(
            "--unused-for", metavar="DURATION", help="Evict models unused this long, e.g. 7d. [default: none]"
        ),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Evict named models even when pinned.")] = False,
    dry_run: DryRun = False,
    cache_dir: CacheDir = None,
    config: ConfigFile = None,
    as_json: Json = False,
) -> None:
    """Evict models: by name, down to a size, or unused for a while."""
    chosen = sum(x is not None and x != [] for x in (models, to_size, unused_for))
    if chosen != 1:
        raise UsageError("name models to evict, or give exactly one of --to-size or --unused-for")
    settings = cache_settings(cache_dir, config)
    cache = existing_cache(settings)
    with open_catalog(cache) as catalog:
        unfinished = _unfinished(cache, catalog, models or [])
        named = [m for m in models or [] if parse_model_name(m).model_id not in unfinished]
        plan = _eviction_plan(settings, catalog, named, to_size, unused_for, force)
        if dry_run or (plan.satisfied and not as_json):
            _show_plan(plan, as_json)  # a dry run shows even a plan that falls short, and what blocks it
        if not plan.satisfied:
            raise UsageError(plan.describe()[0])
        if dry_run:
            return
        access.require_writable(cache.root, "evict")
        result = evict(cache, catalog, [*plan.victims, *unfinished])
    for model in result.skipped:
        typer.echo(f"skipped {model}: a pull of it started meanwhile", err=True)
    if as_json:
        typer.echo(json.dumps({"evicted": list(result.evicted), "skipped": list(result.skipped)}, indent=1))
    else:
        typer.echo(f"evicted {plural(len(result.evicted), 'model')}")


def _unfinished(cache: Cache, catalog: Catalog, models: list[str]) -> list[str]:
    """Named models no longer cached whose eviction was stopped while deleting: the rerun finishes it."""
    refs = [parse_model_name(m) for m in models]
    return [r.model_id for r in refs if catalog.view(r.model_id) is None and cache.unfinished_removals(r)]


def _show_plan(plan: EvictionPlan, as_json: bool) -> None:
    if as_json:
        doc = {
            "victims": list(plan.victims),
            "freed_bytes": plan.freed_bytes,
            "needed_bytes": plan.needed_bytes,
            "satisfied": plan.satisfied,
            "protected": [{"model": p.model, "reason": p.reason} for p in plan.protected],
        }
        typer.echo(json.dumps(doc, indent=1))
    else:
        for line in plan.describe():
            typer.echo(line)


def _eviction_plan(
    settings: Settings,
    catalog: Catalog,
    models: list[str],
    to_size: str | None,
    unused_for: str | None,
    force: bool,
) -> EvictionPlan:
    entries = catalog.eviction_entries()
    now = time.time()
    if to_size is not None:
        return plan_to_size(entries, parse_size(to_size), now, settings.in_use_grace_s)
    if unused_for is not None:
        return plan_unused(entries, parse_duration(unused_for), now, settings.in_use_grace_s)
    return plan_named(entries, [parse_model_name(m).model_id for m in models], force)


def pin(
    model: ModelArg,
    cache_dir: CacheDir = None,
    config: ConfigFile = None,
) -> None:
    """Keep a model: it is never evicted to make room (explicit `evict --force` still can)."""
    _set_pin(model, True, cache_dir, config)


def unpin(
    model: ModelArg,
    cache_dir: CacheDir = None,
    config: ConfigFile = None,
) -> None:
    """Let a pinned model be evicted again."""
    _set_pin(model, False, cache_dir, config)


def _set_pin(model: str, pinned: bool, cache_dir: CacheDir, config: ConfigFile) -> None:
    ref = parse_model_name(model)
    cache = existing_cache(cache_settings(cache_dir, config))
    with open_catalog(cache) as catalog:
        catalog.require(ref.model_id)
    access.require_writable(cache.root, "pin" if pinned else "unpin")
    cache.pin(ref, pinned)
    typer.echo(f"{'pinned' if pinned else 'unpinned'} {ref.model_id}")


def gc(
    older_than: Annotated[
        str,
        typer.Option(
            "--older-than", metavar="DURATION", help="Only leftovers older than this.", show_default=True
        ),
    ] = "24h",
    dry_run: DryRun = False,
    cache_dir: CacheDir = None,
    config: ConfigFile = None,
    as_json: Json = False,
) -> None:
    """Remove abandoned staging, orphan locks, unfinished deletes and stale index rows.

    A ready model that holds another inside it (from an older modelsync) goes to
    quarantine; the model inside stays ready.
    """
    from modelsync.engine.maintain import collect_garbage, leftovers, nested_leftovers

    age_s = parse_duration(older_than)
    cache = existing_cache(cache_settings(cache_dir, config))
    if not dry_run:
        access.require_writable(cache.root, "gc")
    with open_catalog(cache) as catalog:
        stale_rows = catalog.stale_rows_dropped
        if dry_run:
            found = nested_leftovers(cache, catalog) + leftovers(cache, age_s)
        else:
            found = collect_garbage(cache, catalog, age_s)
    if as_json:
        doc = {
            "dry_run": dry_run,
            "stale_index_rows": stale_rows,
            "leftovers": [{"path": str(item.path), "reason": item.reason} for item in found],
        }
        typer.echo(json.dumps(doc, indent=1))
        return
    if stale_rows:
        typer.echo(f"removed {plural(stale_rows, 'stale index row')}")
    verb = "would remove" if dry_run else "removed"
    for item in found:
        typer.echo(f"{verb} {item.path} ({item.reason})")
    typer.echo(f"{verb} {plural(len(found), 'leftover')}")


def _ago(at: float | None, now: float) -> str:
    if not at:
        return "never"
    return f"{format_duration(max(0.0, now - at))} ago"


def _evictable(at: float | None, now: float) -> str:
    """When making room may take the model: now, in how long (its lease or in-use grace), or never."""
    if at is None:
        return "no"
    return "now" if at <= now else f"in {format_duration(at - now)}"


def _iso(at: float | None) -> str | None:
    return datetime.fromtimestamp(at, UTC).isoformat() if at else None


def _as_dict(v: ModelView) -> dict[str, object]:
    return {
        "model": v.model,
        "source": v.source,
        "state": v.state,
        "size_bytes": v.size_bytes,
        "last_used": _iso(v.last_used_at),
        "pinned": v.pinned,
        "verified_at": _iso(v.verified_at),
        "verified_by": v.verified_by,
        "lease_until": _iso(v.lease_until),
        "signer": v.signer,
    }
