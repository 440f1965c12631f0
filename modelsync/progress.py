"""Progress on stderr: a bar on a terminal, a plain line every few seconds otherwise.

stdout is reserved for the ready path, so `MODEL_DIR=$(modelsync pull ...)`
captures exactly one line whatever is reported here.

On a terminal the bar is redrawn in place (`\\r` + erase line), which only works
while it stays on one row: the line is fitted to the terminal's width (the bar
shrinks, then the model name loses its middle), never wrapped. Elsewhere (an
init container's log) a line every PLAIN_INTERVAL_S and a final line with the
total, the time and the rate, so a log never ends at "84.4%".
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import TextIO

from modelsync.core.units import format_bytes, format_duration
from modelsync.engine.events import status

PLAIN_INTERVAL_S = 5.0
BAR_INTERVAL_S = 0.2
_BAR_CELLS = 30
_MIN_BAR_CELLS = 10
#: the shortest the label is cut to before the bar is dropped
_MIN_LABEL = 16
_ELLIPSIS = "..."


def took(elapsed_s: float) -> str:
    """A duration for a final line: tenths below a minute, else `1h30m`."""
    return f"{elapsed_s:.1f}s" if elapsed_s < 60 else format_duration(elapsed_s)


def shorten_middle(text: str, width: int) -> str:
    """`text` in at most `width` columns, its middle replaced by `...`: both ends of a model id matter."""
    if len(text) <= width:
        return text
    if width <= len(_ELLIPSIS):
        return text[:width]
    keep = width - len(_ELLIPSIS)
    head = (keep + 1) // 2
    return text[:head] + _ELLIPSIS + text[len(text) - (keep - head) :]


def bar_line(label: str, fraction: float, text: str, width: int) -> str:
    """`label [####----] text` in fewer than `width` columns: on some terminals the last one wraps."""
    room = width - 1 - len(text) - 1  # the space before the status
    if room - _MIN_LABEL - 3 >= _MIN_BAR_CELLS:  # " [" and "]" around the bar
        cells = min(_BAR_CELLS, max(_MIN_BAR_CELLS, room - len(label) - 3))
        filled = int(cells * min(max(fraction, 0.0), 1.0))
        label = shorten_middle(label, room - cells - 3)
        return f"{label} [{'#' * filled}{'-' * (cells - filled)}] {text}"
    line = f"{shorten_middle(label, max(room, _MIN_LABEL))} {text}"
    return line[: max(width - 1, 1)]


class StderrProgress:
    """Renders PullEvents; a daemon thread redraws so transfer threads never block on output."""

    def __init__(
        self,
        label: str,
        stream: TextIO | None = None,
        quiet: bool = False,
        verb: str = "fetch",
        interval_s: float | None = None,
    ) -> None:
        self.label = label
        self.verb = verb
        self.stream = stream or sys.stderr
        self.quiet = quiet
        self.tty = self.stream.isatty()
        self.interval_s = interval_s or (BAR_INTERVAL_S if self.tty else PLAIN_INTERVAL_S)
        self._lock = threading.Lock()
        self._total = 0
        self._missing = 0
        self._done = 0
        #: bytes fetched a second time: shown apart, so the bar never passes 100%
        self._again = 0
        self._started = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def waiting(self, holder: str) -> None:
        self._say(f": waiting for {holder}, which is pulling it")

    def planned(self, files: int, total_bytes: int, missing_bytes: int) -> None:
        with self._lock:
            self._total, self._missing = total_bytes, missing_bytes
            self._started = time.monotonic()
        reused = total_bytes - missing_bytes
        note = f", {format_bytes(reused)} already staged" if reused else ""
        noun = "file" if files == 1 else "files"
        self._say(f": {files} {noun}, {format_bytes(missing_bytes)} to {self.verb}{note}")
        if not self.quiet and self._thread is None and missing_bytes:
            self._thread = threading.Thread(target=self._render_loop, daemon=True)
            self._thread.start()

    def fetched(self, n_bytes: int) -> None:
        with self._lock:
            self._done += n_bytes

    def refetching(self, n_bytes: int) -> None:
        with self._lock:
            moved = min(n_bytes, self._done)
            self._done -= moved
            self._again += moved

    def verifying(self, path: str) -> None:
        pass

    def note(self, message: str) -> None:
        # shown even with --quiet: it says why a flag the user gave is not in effect
        print(("\r\x1b[K" if self.tty else "") + f"note: {message}", file=self.stream, flush=True)

    def damaged(self, path: str, reason: str) -> None:
        # shown even with --quiet: the model was not as the cache said, and is fetched again
        line = f"warning: {self.label}/{path}: {reason}; fetching it again"
        print(("\r\x1b[K" if self.tty else "") + line, file=self.stream, flush=True)

    def close(self) -> None:
        """Stop redrawing and leave one final line: the bar at its end, or the totals, time and rate."""
        self._stop.set()
        if self._thread is None:
            return
        self._thread.join()
        self._thread = None
        with self._lock:
            done, missing, again = self._done, self._missing, self._again
            elapsed_s = time.monotonic() - self._started
        if self.tty:
            self._render(final=True)
        else:
            text = status(done, missing, elapsed_s, again)
            print(f"{self.label}: {text} in {took(elapsed_s)}", file=self.stream)

    def _say(self, rest: str) -> None:
        """A one-off line about the model; on a terminal its name is shortened to keep it on one row."""
        if self.quiet:
            return
        if self.tty:
            label = shorten_middle(self.label, max(self._columns() - 1 - len(rest), _MIN_LABEL))
            print(f"\r\x1b[K{label}{rest}", file=self.stream, flush=True)
        else:
            print(f"{self.label}{rest}", file=self.stream, flush=True)

    def _render_loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._render(final=False)

    def _render(self, final: bool) -> None:
        with self._lock:
            done, missing, again = self._done, self._missing, self._again
            elapsed_s = time.monotonic() - self._started
        text = status(done, missing, elapsed_s, again)
        if self.tty:
            fraction = done / missing if missing else 1.0
            line = bar_line(self.label, fraction, text, self._columns())
            print(f"\r\x1b[K{line}", end="\n" if final else "", file=self.stream, flush=True)
        else:
            print(f"{self.label}: {text}", file=self.stream, flush=True)

    def _columns(self) -> int:
        """The terminal's width now (it may have been resized); 80 when it cannot be told."""
        try:
            return os.get_terminal_size(self.stream.fileno()).columns or 80
        except (OSError, ValueError):
            return 80
