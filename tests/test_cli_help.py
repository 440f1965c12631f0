"""`--help` of every command, rendered by the real CLI: each option shows its variable and default.

The help once lost them all when the renderer started reading `[...]` as markup,
and boolean flags started showing a `<bool>` as if they took a value. These tests
render the help as a user sees it, so a new typer that changes the output fails here.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import fields

import pytest
import typer

from modelsync.cli import app
from modelsync.config import Settings
from modelsync.core.units import parse_size

COMMANDS = sorted(typer.main.get_command(app).commands)  # type: ignore[attr-defined]

#: option -> (its setting's field, or None for a variable outside Settings; variable; default as shown)
SETTING_OPTIONS: dict[str, tuple[str | None, str, str]] = {
    "--cache-dir": ("cache_dir", "MODELSYNC_CACHE_DIR", "/model-cache"),
    "--endpoint-url": ("endpoint_url", "AWS_ENDPOINT_URL", "the AWS endpoint"),
    "--region": ("region", "AWS_REGION", "us-east-1"),
    "--concurrency": ("concurrency", "MODELSYNC_CONCURRENCY", "8"),
    "--part-size": ("part_size_bytes", "MODELSYNC_PART_SIZE", "32Mi"),
    "--max-bandwidth": ("max_bandwidth_bytes_per_s", "MODELSYNC_MAX_BANDWIDTH", "0"),
    "--insecure": ("insecure", "MODELSYNC_INSECURE", "off"),
    "--budget": ("cache_budget", "MODELSYNC_CACHE_MAX_BYTES", "none"),
    "--config": (None, "MODELSYNC_CONFIG", "none"),
    "--pool": ("pool", "MODELSYNC_POOL", "none"),
    "--allow": (None, "MODELSYNC_ALLOWED_PREFIXES", "the schedule's sources only"),
}
_OPTION_LINE = re.compile(r"^  (?:-\w, )?(--[\w-]+)(?: ([A-Z][A-Z:_.]*))?(?:\s{2,}(.*))?$")


def render_help(command: str, columns: int) -> str:
    env = {**os.environ, "COLUMNS": str(columns), "TERM": "dumb"}
    done = subprocess.run(
        [sys.executable, "-m", "modelsync", command, "--help"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    return done.stdout


def options(help_text: str) -> dict[str, tuple[str | None, str]]:
    """Each option of a rendered help: its metavar (None for a flag) and its help, joined across lines."""
    found: dict[str, tuple[str | None, str]] = {}
    current = None
    for line in help_text.split("Options:", 1)[1].splitlines():
        match = _OPTION_LINE.match(line)
        if match:
            current = match.group(1)
            found[current] = (match.group(2), match.group(3) or "")
        elif current and line.startswith("    "):
            metavar, text = found[current]
            glue = "" if text.endswith("-") else " "  # the wrapper breaks `us-east-1` at its hyphen
            found[current] = (metavar, f"{text}{glue}{line.strip()}")
    return found


@pytest.mark.parametrize("command", COMMANDS)
def test_help_shows_every_options_variable_and_default(command: str) -> None:
    rendered = options(render_help(command, columns=80))

    assert rendered, "no options parsed from the help"
    for option, (metavar, text) in rendered.items():
        if option == "--help":
            continue
        if option in SETTING_OPTIONS:
            _, variable, default = SETTING_OPTIONS[option]
            assert f"env var: {variable}" in text, (command, option, text)
            assert f"default: {default}" in text, (command, option, text)
        elif metavar is not None:  # an option with a value shows its default (or that it is required)
            assert "default: " in text or "required" in text, (command, option, text)


def test_help_defaults_and_variables_are_the_settings_own() -> None:
    """The table above is checked against Settings, so the help cannot drift from what is used."""
    settings = {f.name: f for f in fields(Settings)}
    defaults = Settings()
    for option, (name, variable, shown) in SETTING_OPTIONS.items():
        if name is None:
            continue
        assert settings[name].metadata["env"] == variable, option
        actual = getattr(defaults, name)
        if name == "part_size_bytes":
            assert parse_size(shown) == actual
        elif name == "insecure":
            assert actual is False and shown == "off"
        elif actual is None:
            assert shown in {"none", "the AWS endpoint"}
        elif name == "max_bandwidth_bytes_per_s":
            assert actual == 0 and shown == "0"
        else:
            assert str(actual) == shown, option


@pytest.mark.parametrize("command", COMMANDS)
def test_help_at_80_columns_fits_and_shows_no_type_placeholders(command: str) -> None:
    text = render_help(command, columns=80)

    assert max(len(line) for line in text.splitlines()) <= 80
    assert "<bool>" not in text, "a flag shown as if it took a value"
    assert not re.search(r"<[a-z]+(\[[a-z]+\])?( range)?>", text), "a Python type shown as a placeholder"
    assert "Options:" in text and "--help" in text
    flags = [o for o, (metavar, _) in options(text).items() if metavar is None]
    assert "--help" in flags


def test_pull_help_names_its_source_and_every_setting() -> None:
    text = render_help("pull", columns=400)
    assert "Usage: modelsync pull [OPTIONS] {SOURCE}" in text
    assert re.search(r"^  SOURCE\s{2,}s3://bucket/prefix/", text, re.M)
    for option in ("--cache-dir DIR", "--endpoint-url URL", "--part-size SIZE", "--max-bandwidth RATE"):
        assert option in text
    assert re.search(r"^  --insecure\s{2,}Skip TLS", text, re.M), "a flag shows no value placeholder"
    assert re.search(r"^  -q, --quiet\s{2,}", text, re.M)


def test_a_list_argument_reads_as_a_repeated_name() -> None:
    text = render_help("evict", columns=80)
    assert "Usage: modelsync evict [OPTIONS] [MODEL]..." in text
    assert re.search(r"^  MODEL\.\.\.\s{2,}Models to evict", text, re.M)


def test_version_prints_the_package_version() -> None:
    from importlib.metadata import version

    done = subprocess.run(
        [sys.executable, "-m", "modelsync", "--version"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0
    assert done.stdout == f"modelsync {version('modelsync')}\n"


def test_no_arguments_show_the_help_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    """typer's vendored click raises its no-arguments error under standalone_mode=False; run() shows help."""
    from modelsync.cli import run

    assert run([]) == 2
    out = capsys.readouterr()
    assert "Usage: modelsync" in out.out + out.err and "Traceback" not in out.err
