"""Waiting for something a test caused to become true, with a deadline and a reason."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import Any


def wait_for(
    condition: Callable[[], object],
    what: str,
    timeout_s: float = 30.0,
    proc: subprocess.Popen[Any] | None = None,
) -> None:
    """Poll `condition` until it holds; fail naming `what`, or at once if `proc` ends first."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process ended ({proc.returncode}) while waiting for {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.02)
