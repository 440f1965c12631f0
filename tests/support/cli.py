"""The real `modelsync` command in a child process, and what its failures must look like."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from modelsync.core.refs import ModelRef, parse_source
from support.s3env import S3Env

MODELSYNC = (sys.executable, "-m", "modelsync")

# Runs the CLI with one kind of system work slowed, so a test can signal it in the middle:
# SLOWED_CALL=hash makes every xxh3 update (the hashing of verify --full) take 0.1 s, =unlink
# every unlink below a directory fd (the deletes of evict and gc). Each slowed call first
# touches SLOWED_MARKER, so the test knows the work has begun.
SLOWED = """
import os, pathlib, shutil, time
import xxhash
marker = pathlib.Path(os.environ["SLOWED_MARKER"])
def busy():
    marker.touch()
    time.sleep(0.1)
if os.environ["SLOWED_CALL"] == "hash":
    real_hash = xxhash.xxh3_128
    class SlowHash:
        def __init__(self):
            self._hash = real_hash()
        def update(self, data):
            busy()
            self._hash.update(data)
        def hexdigest(self):
            return self._hash.hexdigest()
    xxhash.xxh3_128 = SlowHash
elif os.environ["SLOWED_CALL"] == "unlink":
    real_unlink = os.unlink
    def slow_unlink(path, *, dir_fd=None):
        if dir_fd is not None:
            busy()
        real_unlink(path, dir_fd=dir_fd)
    os.unlink = slow_unlink
from modelsync.__main__ import main
main()
"""


def run_cli(
    env: dict[str, str],
    *args: str,
    timeout_s: float = 90,
    cache_dir: Path | None = None,
    code: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run `modelsync ARGS...` to completion with `env`, capturing text output.

    `cache_dir` appends `--cache-dir`; `code` runs instead of `-m modelsync` (it must call
    `main()`), for a child whose system calls a test replaces before the command starts.
    """
    start = (sys.executable, "-c", code) if code else MODELSYNC
    tail = ("--cache-dir", str(cache_dir)) if cache_dir is not None else ()
    return subprocess.run(
        [*start, *args, *tail], env=env, capture_output=True, text=True, timeout=timeout_s, check=False
    )


def sigkill_when(
    process: subprocess.Popen[Any], condition: Callable[[], bool], what: str, timeout_s: float = 30
) -> None:
    """SIGKILL `process` as soon as `condition()` holds: a crash at a chosen point of a transfer.

    Fails the test when the process exits first or `what` does not happen within
    `timeout_s`; the process is reaped (and its pipes drained) whatever happens.
    """
    try:
        deadline = time.monotonic() + timeout_s
        while not condition():
            assert process.poll() is None, f"it ended before it could be killed: {process.communicate()}"
            assert time.monotonic() < deadline, f"{what} not within {timeout_s} s"
            time.sleep(0.02)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate()
    assert process.returncode == -signal.SIGKILL


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
