"""What every command shares: the error-to-exit-code mapping, common options, Settings from flags,
and the foreground pull that `pull` and `prefetch` (without a daemon) both run.

Kept apart from the command modules so they can all use it without importing each other.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, ParamSpec, TypeVar

import typer

from modelsync.config import Settings, config_file_from, environment, load_settings
from modelsync.core.refs import ModelRef
from modelsync.core.units import parse_size
from modelsync.errors import ModelsyncError

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
            typer.echo("error: interrupted; run the command again to resume", err=True)
            raise typer.Exit(130) from None

    return wrapper


def optional_size(text: str | None) -> int | None:
    """A size flag's value in bytes; None when the flag was not given."""
    return None if text is None else parse_size(text)


CacheDir = Annotated[
    Path | None,
    typer.Option("--cache-dir", help="Cache root [env MODELSYNC_CACHE_DIR; default /model-cache]."),
]
EndpointUrl = Annotated[
    str | None, typer.Option("--endpoint-url", help="S3 endpoint [env AWS_ENDPOINT_URL].")
]
Region = Annotated[
    str | None, typer.Option("--region", help="S3 region [env AWS_REGION; default us-east-1].")
]
ConfigFile = Annotated[
    Path | None, typer.Option("--config", help="TOML settings file [env MODELSYNC_CONFIG].")
]
Concurrency = Annotated[
    int | None, typer.Option("--concurrency", min=1, help="Ranged GETs in flight [default 8].")
]
PartSize = Annotated[
    str | None, typer.Option("--part-size", help="Bytes per ranged GET, e.g. 16Mi [default 16Mi].")
]
MaxBandwidth = Annotated[
    str | None,
    typer.Option("--max-bandwidth", help="Download cap in bytes/s, e.g. 500Mi; 0 = none."),
]
Insecure = Annotated[bool, typer.Option("--insecure", help="Skip TLS certificate checks (warns).")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No progress on stderr.")]


def build_settings(
    cache_dir: Path | None = None,
    endpoint_url: str | None = None,
    region: str | None = None,
    config: Path | None = None,
    concurrency: int | None = None,
    part_size: str | None = None,
    max_bandwidth: str | None = None,
    insecure: bool = False,
) -> Settings:
    """Flags > environment > config file > defaults, read once here."""
    env = environment()
    flags: dict[str, object | None] = {
        "cache_dir": cache_dir.expanduser().absolute() if cache_dir else None,
        "endpoint_url": endpoint_url,
        "region": region,
        "concurrency": concurrency,
        "part_size_bytes": optional_size(part_size),
        "max_bandwidth_bytes_per_s": optional_size(max_bandwidth),
        "insecure": True if insecure else None,
    }
    settings = load_settings(flags, env, config_file_from(config, env))
    if settings.insecure:
        typer.echo("warning: TLS certificate verification is off (--insecure)", err=True)
    return settings


def cold_pull(settings: Settings, ref: ModelRef, quiet: bool) -> Path:
    """Pull `ref` in this process with progress on stderr, announced as a foreground pull.

    The announcement makes a running daemon pause its background prefetch, so a
    pod's init container gets the node's bandwidth. The engine is imported here,
    not at the top, so commands that never pull (a warm pull, ls) stay fast.
    """
    from modelsync.adapters.foreground import announce
    from modelsync.engine.pull import pull
    from modelsync.progress import StderrProgress

    progress = StderrProgress(ref.model_id, quiet=quiet)
    try:
        with announce(settings.cache_dir, ref):
            result = pull(settings, ref, progress)
    finally:
        progress.close()
    return result.path
