"""Progress on stderr: a bar on a terminal, a plain line every few seconds otherwise.

stdout is reserved for the ready path, so `MODEL_DIR=$(modelsync pull ...)`
captures exactly one line whatever is reported here.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO

from modelsync.core.units import format_bytes

PLAIN_INTERVAL_S = 5.0
BAR_INTERVAL_S = 0.2
_BAR_CELLS = 30


class StderrProgress:
    """Renders PullEvents; a daemon thread redraws so transfer threads never block on output."""

    def __init__(self, label: str, stream: TextIO | None = None, quiet: bool = False) -> None:
        self.label = label
        self.stream = stream or sys.stderr
        self.quiet = quiet
        self.tty = self.stream.isatty()
        self._lock = threading.Lock()
        self._total = 0
        self._missing = 0
        self._done = 0
        self._started = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def waiting(self, holder: str) -> None:
        self._say(f"{self.label}: waiting for {holder}, which is pulling it")

    def planned(self, files: int, total_bytes: int, missing_bytes: int) -> None:
        with self._lock:
            self._total, self._missing = total_bytes, missing_bytes
            self._started = time.monotonic()
        reused = total_bytes - missing_bytes
        note = f", {format_bytes(reused)} already staged" if reused else ""
        self._say(f"{self.label}: {files} files, {format_bytes(missing_bytes)} to fetch{note}")
        if not self.quiet and self._thread is None:
            self._thread = threading.Thread(target=self._render_loop, daemon=True)
            self._thread.start()

    def fetched(self, n_bytes: int) -> None:
        with self._lock:
            self._done += n_bytes

    def verifying(self, path: str) -> None:
        pass

    def note(self, message: str) -> None:
        # shown even with --quiet: it says why a flag the user gave is not in effect
        print(("\r\x1b[K" if self.tty else "") + f"note: {message}", file=self.stream, flush=True)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            if self.tty:
                self._render(final=True)

    def _say(self, line: str) -> None:
        if not self.quiet:
            print(("\r\x1b[K" if self.tty else "") + line, file=self.stream, flush=True)

    def _render_loop(self) -> None:
        interval = BAR_INTERVAL_S if self.tty else PLAIN_INTERVAL_S
        while not self._stop.wait(interval):
            self._render(final=False)

    def _render(self, final: bool) -> None:
        with self._lock:
            done, missing = self._done, self._missing
            elapsed = max(time.monotonic() - self._started, 1e-6)
        rate = done / elapsed
        pct = 100.0 * done / missing if missing else 100.0
        status = f"{format_bytes(done)}/{format_bytes(missing)} {pct:5.1f}% {format_bytes(int(rate))}/s"
        if self.tty:
            filled = int(_BAR_CELLS * min(pct, 100.0) / 100)
            bar = "#" * filled + "-" * (_BAR_CELLS - filled)
            end = "\n" if final else ""
            print(f"\r\x1b[K{self.label} [{bar}] {status}", end=end, file=self.stream, flush=True)
        else:
            print(f"{self.label}: {status}", file=self.stream, flush=True)
