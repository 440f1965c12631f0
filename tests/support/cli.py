"""The real `modelsync` command in a child process, and what its failures must look like."""

from __future__ import annotations

import subprocess
import sys

MODELSYNC = (sys.executable, "-m", "modelsync")


def run_cli(env: dict[str, str], *args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    """Run `modelsync ARGS...` to completion with `env`, capturing text output."""
    return subprocess.run(
        [*MODELSYNC, *args], env=env, capture_output=True, text=True, timeout=timeout_s, check=False
    )


def one_error_line(stderr: str) -> str:
    """The single `error: ...` line a user error must print, with no traceback."""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one error line, got: {stderr!r}"
    assert lines[0].startswith("error: ")
    assert "Traceback" not in stderr
    return lines[0]
