"""The init container's path: a plain `modelsync pull SOURCE`, without the full command line.

An init container in front of vLLM runs `modelsync pull` on every pod start; on
a warm node it should cost about as much as starting Python, and on a cold one
the first ranged GET should leave as soon as possible. The full command line
(typer, and through it click) takes several times Python's start-up to import, so
`main()` first tries this path: it understands only the plain forms of `pull`
(the source plus --cache-dir, --endpoint-url, --region, --config, --quiet) in a
cache this process can write. `try_warm_pull` answers a ready model; `try_cold_pull`
pulls one, with the same progress, errors and exit codes as the full command. Where
this path cannot act (a tenant pod's read-only mount, where the node daemon must
record the use), the full command line does. Anything else — another option, help,
bad input — falls through to the full command line, which parses and reports it
properly. Settings still come from `config.load_settings`, so precedence is the same
on both paths.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from modelsync import interrupt
from modelsync.adapters.cache import Cache
from modelsync.config import Settings, config_file_from, load_settings, parse_setting
from modelsync.core.refs import ModelRef, parse_source
from modelsync.engine.ready import warm_path
from modelsync.errors import LocalStorageError, ModelsyncError

if TYPE_CHECKING:
    from modelsync.engine.ensure import ReadyOptions

_VALUED = {
    "--cache-dir": "cache_dir",
    "--endpoint-url": "endpoint_url",
    "--region": "region",
    "--config": "config",
}
_FLAGS = {"--quiet", "-q"}


def _plain_pull(argv: Sequence[str], env: Mapping[str, str]) -> tuple[ModelRef, Settings, bool] | None:
    """The model, settings and --quiet of a plain `pull` into a writable cache; None otherwise."""
    if len(argv) < 2 or argv[0] != "pull":
        return None
    options: dict[str, str] = {}
    source = None
    quiet = False
    args = iter(argv[1:])
    for arg in args:
        name, eq, value = arg.partition("=")
        if name in _VALUED:
            if not eq:
                value = next(args, "")
            if not value or _VALUED[name] in options:
                return None
            options[_VALUED[name]] = value
        elif arg in _FLAGS:
            quiet = True
        elif arg.startswith("-") or source is not None:
            return None
        else:
            source = arg
    if source is None:
        return None
    try:
        ref = parse_source(source)
        config = options.pop("config", None)
        flags: dict[str, object] = dict(options)
        if "cache_dir" in options:
            flags["cache_dir"] = Path(options["cache_dir"]).expanduser().absolute()
        if "endpoint_url" in options:  # checked as the full command checks it
            flags["endpoint_url"] = parse_setting("endpoint_url", options["endpoint_url"], "--endpoint-url")
        settings = load_settings(flags, env, config_file_from(Path(config) if config else None, env))
        if os.path.isdir(settings.cache_dir) and not os.access(settings.cache_dir, os.W_OK):
            return None  # a tenant's read-only mount: the full command asks the node daemon
    except (ModelsyncError, OSError):
        return None
    return ref, settings, quiet


def try_warm_pull(argv: Sequence[str], env: Mapping[str, str]) -> str | None:
    """The ready path when `argv` is a plain `pull` of a ready model; None means "use the full CLI"."""
    plain = _plain_pull(argv, env)
    if plain is None:
        return None
    ref, settings, _quiet = plain
    try:
        path = warm_path(settings.cache_dir, ref, settings.requires_signature(ref))
    except (ModelsyncError, OSError):
        return None
    if path is not None:
        Cache(settings.cache_dir).touch(ref)
    return str(path) if path is not None else None


def try_cold_pull(argv: Sequence[str], env: Mapping[str, str]) -> int | None:
    """Pull a plain `pull`'s model in this process and print its path; the exit code.

    None means "use the full CLI". Errors end as the full command's do: one
    `error:` line and the error's exit code.
    """
    plain = _plain_pull(argv, env)
    if plain is None:
        return None
    ref, settings, quiet = plain
    try:
        usable_cache(settings)
        path = cold_pull(settings, ref, quiet)
    except ModelsyncError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return int(exc.exit_code)
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM through interrupt.install()
        return interrupt.report()
    print(path)
    return 0


def usable_cache(settings: Settings) -> Cache:
    """The cache at the configured root, which may not exist yet but must not be, or lie in, a file."""
    root = settings.cache_dir
    nearest = next((p for p in (root, *root.parents) if p.exists()), root)
    if not nearest.is_dir():
        where = "is not a directory" if nearest == root else f"lies in {nearest}, which is not a directory"
        raise LocalStorageError(f"cache root {root} {where}; check --cache-dir or MODELSYNC_CACHE_DIR")
    return Cache(root)


def cold_pull(settings: Settings, ref: ModelRef, quiet: bool, options: ReadyOptions | None = None) -> Path:
    """Make `ref` ready in this process (`engine.ensure_ready`) with progress on stderr.

    A fetch is announced as a foreground pull, which makes a running daemon
    pause its background prefetch, so a pod's init container gets the node's
    bandwidth. The engine is imported here, not at the top, so commands that
    never pull (a warm pull, ls) stay fast.
    """
    from dataclasses import replace

    from modelsync.backends import s3_backends
    from modelsync.engine.ensure import ReadyOptions, ensure_ready
    from modelsync.progress import StderrProgress

    progress = StderrProgress(ref.model_id, quiet=quiet)
    try:
        # The S3 SDK is imported inside, only when the model must be fetched.
        with _without_pyopenssl():
            result = ensure_ready(
                ref,
                settings=settings,
                backends=s3_backends(settings),
                events=progress,
                options=replace(options or ReadyOptions(), foreground=True),
            )
    finally:
        progress.close()
    return result.path


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
