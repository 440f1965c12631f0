"""The init container's path: a plain `modelsync pull SOURCE`, without the full command line.

An init container in front of vLLM runs `modelsync pull` on every pod start; on
a warm node it should cost about as much as starting Python, and on a cold one
the first ranged GET should leave as soon as possible. The full command line
(typer, and through it click) takes several times Python's start-up to import, so
`main()` first tries this path: it understands only the plain forms of `pull`
(the source plus PLAIN_OPTIONS and PLAIN_FLAGS, each an option of the full
`pull` too) in a cache this process can write. `try_warm_pull` answers a ready
model; `try_cold_pull` pulls one (modelsync/foreground_pull.py), with the same
progress, errors and exit codes as the full command. Where this path cannot act
(a tenant pod's read-only mount, where the node daemon must record the use), the
full command line does. Anything else (another option, help, bad input) falls
through to the full command line, which parses and reports it properly.
Settings come from `config.load_settings` and the rules from
`engine.rules.pull_rules`, as on the full command's path, so both reach the same
verdict.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from modelsync import interrupt
from modelsync.adapters.cache import Cache
from modelsync.config import config_file_from, load_settings, parse_setting
from modelsync.core.refs import parse_source
from modelsync.engine.ready import warm_path
from modelsync.engine.rules import PullRules, pull_rules
from modelsync.errors import ModelsyncError
from modelsync.foreground_pull import read_only

#: the options this path reads (each names its setting); any other falls through to the full command
PLAIN_OPTIONS = {
    "--cache-dir": "cache_dir",
    "--endpoint-url": "endpoint_url",
    "--region": "region",
    "--config": "config",
}
#: the flags this path reads
PLAIN_FLAGS = {"--quiet", "-q"}


def plain_pull(argv: Sequence[str], env: Mapping[str, str]) -> tuple[PullRules, bool] | None:
    """The rules and --quiet of a plain `pull` into a writable cache; None otherwise."""
    if len(argv) < 2 or argv[0] != "pull":
        return None
    options: dict[str, str] = {}
    source = None
    quiet = False
    args = iter(argv[1:])
    for arg in args:
        name, eq, value = arg.partition("=")
        if name in PLAIN_OPTIONS:
            if not eq:
                value = next(args, "")
            if not value or PLAIN_OPTIONS[name] in options:
                return None
            options[PLAIN_OPTIONS[name]] = value
        elif arg in PLAIN_FLAGS:
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
        if read_only(settings.cache_dir):
            return None  # a tenant's read-only mount: the full command asks the node daemon
        rules = pull_rules(settings, ref)
    except (ModelsyncError, OSError):
        return None
    return rules, quiet


def try_warm_pull(argv: Sequence[str], env: Mapping[str, str]) -> str | None:
    """The ready path when `argv` is a plain `pull` of a ready model; None means "use the full CLI"."""
    plain = plain_pull(argv, env)
    if plain is None:
        return None
    rules, _quiet = plain
    cache_dir = rules.settings.cache_dir
    try:
        path = warm_path(cache_dir, rules.source, rules.signed_only)
    except (ModelsyncError, OSError):
        return None
    if path is not None:
        Cache(cache_dir).touch(rules.source)
    return str(path) if path is not None else None


def try_cold_pull(argv: Sequence[str], env: Mapping[str, str]) -> int | None:
    """Pull a plain `pull`'s model in this process and print its path; the exit code.

    None means "use the full CLI". Errors end as the full command's do: one
    `error:` line and the error's exit code.
    """
    plain = plain_pull(argv, env)
    if plain is None:
        return None
    rules, quiet = plain
    from modelsync.foreground_pull import foreground_pull

    try:
        path = foreground_pull(rules, quiet).path
    except ModelsyncError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return int(exc.exit_code)
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM through interrupt.install()
        return interrupt.report()
    print(path)
    return 0
