"""The command line, as a package: `app` (the typer application and `run`), `options` (what every
command shares), and one module per group of commands: `pull`, `cache`, `verify`, `node`, `prefetch`.

`modelsync.__main__` imports it only when the plain-pull fast path (`modelsync/plain_pull.py`)
cannot answer, so a warm pull never pays for typer's import.
"""

from __future__ import annotations

from modelsync.cli.app import app, run

__all__ = ["app", "run"]
