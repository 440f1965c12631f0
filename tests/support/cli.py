"""The real `modelsync` command in a child process, and what its failures must look like."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from modelsync.core.refs import ModelRef, parse_source
from support.s3env import S3Env

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


def write_model(root: Path, files: dict[str, bytes]) -> Path:
    """A local model directory holding `files` (relative path -> bytes)."""
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def publish(env: S3Env, work_dir: Path, uri: str, files: dict[str, bytes], *extra: str) -> ModelRef:
    """Publish `files` to `uri` with the real CLI as `env`'s identity; the test fails if that fails.

    The local copy goes to a new directory under `work_dir`.
    """
    local = write_model(work_dir / f"local-{len(list(work_dir.iterdir()))}", files)
    result = run_cli(env.subprocess_env(), "publish", str(local), uri, *extra)
    assert result.returncode == 0, result.stderr
    return parse_source(uri)
