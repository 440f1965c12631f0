"""SIGTERM stops every command the way Ctrl-C does: at once, resumable, with one line and a known code.

A command may run as PID 1 of an init container or a Job, where a signal
without a handler is ignored: without one, `kubectl delete` would wait out the
grace period and then SIGKILL a pull mid-write. So the entry point installs a
SIGTERM handler that takes the Ctrl-C path: it raises SIGINT, which an
`asyncio.run` turns into a cancellation of the running pull (sockets shut down,
threads joined, journal kept), and elsewhere raises `KeyboardInterrupt`. The
command then prints one `error: interrupted ...` line and exits with 128 + the
signal's number: 130 for SIGINT, 143 for SIGTERM. Kept free of heavy imports:
the warm path runs it too.
"""

from __future__ import annotations

import signal
import sys
from types import FrameType

from modelsync.errors import ExitCode

_received: int | None = None


def install() -> None:
    """Route SIGTERM through the Ctrl-C path for the rest of the process."""
    signal.signal(signal.SIGTERM, _on_sigterm)


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    global _received
    _received = signum
    if callable(signal.getsignal(signal.SIGINT)):
        signal.raise_signal(signal.SIGINT)  # asyncio.run cancels its main task on this one
    else:
        raise KeyboardInterrupt


def report() -> int:
    """Say that the command was interrupted and how to resume; return the exit code to use."""
    signum = _received or signal.SIGINT
    name = signal.Signals(signum).name
    print(
        f"error: interrupted by {name}; completed work is kept, run the command again to resume",
        file=sys.stderr,
    )
    return int(ExitCode(128 + signum))
