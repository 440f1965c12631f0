"""What every command shares: the error-to-exit-code mapping, common options, Settings from flags.

Kept apart from the command modules (pull, cache, node) so they can all use it without
importing each other.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Annotated, ParamSpec, TypeVar

import typer

from modelsync import interrupt
from modelsync.adapters.cache import Cache
from modelsync.config import (
    CACHE_SETTINGS,
    Settings,
    config_file_from,
    environment,
    load_settings,
    parse_setting,
)
from modelsync.config_values import MAX_PART_BYTES, MIN_PART_BYTES
from modelsync.core.units import format_bytes
from modelsync.errors import ModelsyncError, NotFoundError, UsageError
from modelsync.foreground_pull import usable_cache

P = ParamSpec("P")
R = TypeVar("R")


def user_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Print a ModelsyncError as one line and exit with its code; let bugs show a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except ModelsyncError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(int(exc.exit_code)) from None
        except KeyboardInterrupt:
            raise typer.Exit(interrupt.report()) from None

    return wrapper


def _setting(name: str, text: str, default: str | None = None) -> str:
    """Help for an option backed by a setting: its variable and default, from Settings itself.

    The bracket is plain text: the app renders help without markup (cli/app.py), so
    nothing in it is taken for a style tag.
    """
    f = _SETTING_FIELDS[name]
    shown = default if default is not None else str(f.default)
    return f"{text} [env var: {f.metadata['env']}; default: {shown}]"


_SETTING_FIELDS = {f.name: f for f in fields(Settings)}



def _cache_dir(text: str) -> Path:
    """An empty --cache-dir is a mistake (an unset variable in a script), not the current directory."""
    if not text.strip():
        raise typer.BadParameter("is empty; give the cache's directory, e.g. --cache-dir /model-cache")
    return Path(text)


CacheDir = Annotated[
    Path | None,
    typer.Option("--cache-dir", metavar="DIR", parser=_cache_dir, help=_setting("cache_dir", "Cache root.")),
]
EndpointUrl = Annotated[
    str | None,
    typer.Option(
        "--endpoint-url",
        metavar="URL",
        help=_setting("endpoint_url", "S3 endpoint, http:// or https://.", "the AWS endpoint"),
    ),
]
Region = Annotated[
    str | None, typer.Option("--region", metavar="REGION", help=_setting("region", "S3 signing region."))
]
ConfigFile = Annotated[
    Path | None,
    typer.Option(
        "--config", metavar="FILE", help="TOML settings file. [env var: MODELSYNC_CONFIG; default: none]"
    ),
]
Concurrency = Annotated[
    str | None,
    typer.Option("--concurrency", metavar="N", help=_setting("concurrency", "Transfers in flight.")),
]
PartSize = Annotated[
    str | None,
    typer.Option(
        "--part-size",
        metavar="SIZE",
        help=_setting(
            "part_size_bytes",
            f"Bytes per ranged GET or upload part, {format_bytes(MIN_PART_BYTES)} to "
            f"{format_bytes(MAX_PART_BYTES)}.",
            "32Mi",
        ),
    ),
]
MaxBandwidth = Annotated[
    str | None,
    typer.Option(
        "--max-bandwidth",
        metavar="RATE",
        help=_setting("max_bandwidth_bytes_per_s", "Download cap, e.g. 500Mi/s; 0 = no cap.", "0"),
    ),
]
Insecure = Annotated[
    bool,
    typer.Option("--insecure", help=_setting("insecure", "Skip TLS certificate checks (warns).", "off")),
]
Quiet = Annotated[
    bool,
    typer.Option(
        "--quiet", "-q", help="No progress on stderr; errors and notes about your flags still show."
    ),
]
Json = Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout.")]
RoomWait = Annotated[
    str | None,
    typer.Option(
        "--room-wait",
        metavar="DURATION",
        help=_setting(
            "room_wait_s",
            "How long a pull that does not fit yet waits for models in use or being pulled "
            "to make room; 0 fails at once, at most 1d.",
            "10m",
        ),
    ),
]


def plural(count: int, noun: str) -> str:
    """`1 model`, `2 models`: counts in messages read as English."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _flag(name: str, flag: str, text: str | None) -> object | None:
    """A flag's text through its setting's parser, so a flag and its variable accept the same values."""
    return None if text is None else parse_setting(name, text, flag)


@dataclass(frozen=True, slots=True, kw_only=True)
class SettingFlags:
    """The setting flags a command was given, as typed: None (or False) when not given,
    so the environment, then the config file, then the default decides."""

    cache_dir: Path | None = None
    endpoint_url: str | None = None
    region: str | None = None
    #: --config: the TOML settings file (else MODELSYNC_CONFIG)
    config: Path | None = None
    concurrency: str | None = None
    part_size: str | None = None
    max_bandwidth: str | None = None
    insecure: bool = False
    pool: str | None = None
    #: --allow: s3:// prefixes the daemon also serves
    allow: tuple[str, ...] = ()
    room_wait: str | None = None


def build_settings(flags: SettingFlags, *, needed: Collection[str] | None = None) -> Settings:
    """Flags > environment > config file > defaults, read once here.

    `needed` names the settings the command uses (default: all); a bad value of
    another one in the environment or config file does not stop it.
    """
    env = environment()
    given: dict[str, object | None] = {
        "cache_dir": flags.cache_dir.expanduser().absolute() if flags.cache_dir else None,
        "endpoint_url": _flag("endpoint_url", "--endpoint-url", flags.endpoint_url),
        "region": flags.region,
        "concurrency": _flag("concurrency", "--concurrency", flags.concurrency),
        "part_size_bytes": _flag("part_size_bytes", "--part-size", flags.part_size),
        "max_bandwidth_bytes_per_s": _flag(
            "max_bandwidth_bytes_per_s", "--max-bandwidth", flags.max_bandwidth
        ),
        "insecure": True if flags.insecure else None,
        "pool": flags.pool,
        "allowed_prefixes": flags.allow or None,
        "room_wait_s": _flag("room_wait_s", "--room-wait", flags.room_wait),
    }
    settings = load_settings(given, env, config_file_from(flags.config, env), needed)
    if settings.insecure:
        typer.echo("warning: TLS certificate verification is off (--insecure)", err=True)
    return settings


def cache_settings(cache_dir: Path | None, config: Path | None) -> Settings:
    """Settings of a command that only reads or manages the cache."""
    return build_settings(SettingFlags(cache_dir=cache_dir, config=config), needed=CACHE_SETTINGS)


def existing_cache(settings: Settings) -> Cache:
    """The cache for a command that must not create one: a typo'd --cache-dir is one line, not a new cache."""
    cache = usable_cache(settings)
    if not cache.state_dir.is_dir():
        raise NotFoundError(
            f"no modelsync cache at {cache.root}; check --cache-dir or MODELSYNC_CACHE_DIR "
            "(a pull or the daemon creates the cache)"
        )
    return cache


def node_pool(settings: Settings) -> str:
    """This node's pool (--pool, MODELSYNC_POOL), which `plan`, `daemon` and a name's variant need."""
    pool = settings.pool
    if not pool:
        raise UsageError(
            "no pool given; pass --pool or set MODELSYNC_POOL to the node's accelerator.pool label"
        )
    return pool
