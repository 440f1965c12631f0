"""The init container's hot path: `modelsync pull SOURCE` for a model that is already ready.

An init container in front of vLLM runs `modelsync pull` on every pod start; on
a warm node it should cost about as much as starting Python. The full command
line (typer, and through it pydantic) takes several times that to import, so
`main()` first tries this path: it understands only the plain forms of `pull`
(the source plus --cache-dir, --endpoint-url, --region, --config, --quiet) and
answers only when the model is ready in a cache this process can write. Where it
cannot (a tenant pod's read-only mount), the node daemon must record the use, so
the full command line asks it. Anything else — another option, help, a
cold model, bad input — falls through to the full command line, which parses
and reports it properly. Settings still come from `config.load_settings`, so
precedence is the same on both paths.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from modelsync.adapters.cache import Cache
from modelsync.config import config_file_from, load_settings
from modelsync.core.refs import parse_source
from modelsync.engine.ready import warm_path
from modelsync.errors import ModelsyncError

_VALUED = {
    "--cache-dir": "cache_dir",
    "--endpoint-url": "endpoint_url",
    "--region": "region",
    "--config": "config",
}
_FLAGS = {"--quiet", "-q"}


def try_warm_pull(argv: Sequence[str], env: Mapping[str, str]) -> str | None:
    """The ready path when `argv` is a plain `pull` of a ready model; None means "use the full CLI"."""
    if len(argv) < 2 or argv[0] != "pull":
        return None
    options: dict[str, str] = {}
    source = None
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
            continue
        elif arg.startswith("-") or source is not None:
            return None
        else:
            source = arg
    if source is None:
        return None
    try:
        ref = parse_source(source)
        config = options.pop("config", None)
        flags = {k: Path(v).expanduser().absolute() if k == "cache_dir" else v for k, v in options.items()}
        settings = load_settings(flags, env, config_file_from(Path(config) if config else None, env))
        if not os.access(settings.cache_dir, os.W_OK):
            return None
        path = warm_path(settings.cache_dir, ref, settings.requires_signature(ref))
    except (ModelsyncError, OSError):
        return None
    if path is not None:
        Cache(settings.cache_dir).touch(ref)
    return str(path) if path is not None else None
