"""The command line: parse input, build Settings once, run the engine, map errors to exit codes.

Every ModelsyncError becomes one `error: ...` line on stderr and its exit code
(modelsync.errors.ExitCode); anything else is a bug and keeps its traceback.
Commands that need no S3 (a warm pull, ls) never import the S3 stack.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, ParamSpec, TypeVar

import typer

from modelsync.config import Settings, config_file_from, environment, load_settings
from modelsync.core.refs import ModelRef, parse_source
from modelsync.core.units import parse_size
from modelsync.errors import ExitCode, ModelsyncError, UsageError

app = typer.Typer(
    name="modelsync",
    help="Keep model weights staged on GPU nodes: verified, atomic, resumable pulls from S3.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

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


def _size(text: str | None) -> int | None:
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
    int | None, typer.Option("--concurrency", min=1, help="Ranged GETs in flight [default 16].")
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
        "part_size_bytes": _size(part_size),
        "max_bandwidth_bytes_per_s": _size(max_bandwidth),
        "insecure": True if insecure else None,
    }
    settings = load_settings(flags, env, config_file_from(config, env))
    if settings.insecure:
        typer.echo("warning: TLS certificate verification is off (--insecure)", err=True)
    return settings


@app.command()
@user_errors
def pull(
    source: Annotated[str, typer.Argument(help="s3://bucket/prefix/ of one model revision.")],
    cache_dir: CacheDir = None,
    endpoint_url: EndpointUrl = None,
    region: Region = None,
    config: ConfigFile = None,
    concurrency: Concurrency = None,
    part_size: PartSize = None,
    max_bandwidth: MaxBandwidth = None,
    insecure: Insecure = False,
    verify: Annotated[
        bool, typer.Option("--verify", help="Re-hash a cached model against its record.")
    ] = False,
    quiet: Quiet = False,
) -> None:
    """Make a model ready in the cache and print its path (last line of stdout)."""
    ref = parse_source(source)
    settings = build_settings(
        cache_dir, endpoint_url, region, config, concurrency, part_size, max_bandwidth, insecure
    )
    from modelsync.engine.ready import warm_path

    path = warm_path(settings.cache_dir, ref)
    if path is not None and verify:
        path = _verify_warm(settings, ref)
    if path is None:
        path = _cold_pull(settings, ref, quiet)
    typer.echo(str(path))


def _verify_warm(settings: Settings, ref: ModelRef) -> Path | None:
    """Re-hash a ready model; a damaged one is unpublished so the pull fetches it again."""
    from modelsync.adapters.cache import Cache
    from modelsync.engine.ready import full_check

    cache = Cache(settings.cache_dir)
    record = cache.ready_record(ref)
    if record is None:
        return None
    problems = full_check(cache.ready_path(ref), record)
    if not problems:
        return cache.ready_path(ref)
    for p in problems:
        typer.echo(f"warning: {ref.model_id}/{p.path}: {p.reason}; fetching the model again", err=True)
    cache.unpublish(ref)
    return None


def _cold_pull(settings: Settings, ref: ModelRef, quiet: bool) -> Path:
    from modelsync.engine.pull import pull as run_pull
    from modelsync.progress import StderrProgress

    progress = StderrProgress(ref.model_id, quiet=quiet)
    try:
        result = run_pull(settings, ref, progress)
    finally:
        progress.close()
    return result.path


@app.command()
@user_errors
def publish(
    directory: Annotated[Path, typer.Argument(help="Local model directory.")],
    source: Annotated[str, typer.Argument(help="Destination s3://bucket/prefix/.")],
    endpoint_url: EndpointUrl = None,
    region: Region = None,
    config: ConfigFile = None,
    concurrency: Concurrency = None,
    part_size: PartSize = None,
    insecure: Insecure = False,
) -> None:
    """Upload a model directory; its modelsync.manifest.json is written last."""
    import asyncio

    from modelsync.engine.publish import publish as run_publish

    ref = parse_source(source)
    settings = build_settings(None, endpoint_url, region, config, concurrency, part_size, None, insecure)
    result = asyncio.run(run_publish(settings, directory, ref))
    typer.echo(f"published {result.files} files ({result.total_bytes} bytes) to {ref.uri}", err=True)
    typer.echo(ref.uri)


@app.command()
@user_errors
def demo(
    keep: Annotated[bool, typer.Option("--keep", help="Keep the demo cache directory.")] = False,
) -> None:
    """Run the whole job on an embedded S3 server: generate, publish, pull cold, pull warm."""
    from modelsync.demo import run_demo

    run_demo(keep=keep)


def main() -> None:
    """Console entry point."""
    try:
        app()
    except UsageError as exc:  # raised outside a command (should not happen, but stay one line)
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(int(ExitCode.USAGE))
