"""The progress line: it fits the terminal, rewrites itself only on a terminal, and always ends.

A line one column too long wraps, `\\r` + erase-line then clears only its last row, and the
screen fills with copies. So the fitting is tested as a property, and once on a real
pseudo-terminal of 80 columns through the real CLI.
"""

from __future__ import annotations

import fcntl
import io
import logging
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
from botocore.client import BaseClient
from hypothesis import given
from hypothesis import strategies as st
from support.faultproxy import FaultProxy
from support.s3env import S3Env

from modelsync.engine.background import PROGRESS_LOG_S, PullLog
from modelsync.engine.events import status
from modelsync.metrics import DaemonMetrics
from modelsync.progress import StderrProgress, bar_line, shorten_middle

MiB = 1024 * 1024
#: a real model id is about this long; with the status it made a 111-column line
LONG_LABEL = "models/deepseek-ai/DeepSeek-V3-0324-FP8-Dynamic/2025-03-24-a1b2c3d4e5f6a7b8c9d0"
_ERASE = "\r\x1b[K"


class FakeTerminal(io.StringIO):
    """A stream that says it is a terminal of unknown width (the renderer then assumes 80)."""

    def isatty(self) -> bool:
        return True


def visible_rows(output: str) -> list[str]:
    """What a terminal shows: each rewrite starts a row again, each newline ends one."""
    return [row for chunk in output.split("\n") for row in chunk.split(_ERASE) if row]


# ---- the width logic ----------------------------------------------------------------------


def test_shorten_middle_keeps_both_ends() -> None:
    assert shorten_middle("abcdefghij", 10) == "abcdefghij"
    assert shorten_middle("abcdefghij", 7) == "ab...ij"
    assert shorten_middle("abcdefghij", 8) == "abc...ij"
    assert shorten_middle("abcdefghij", 2) == "ab"


def test_at_80_columns_a_long_model_name_loses_its_middle_and_the_bar_stays() -> None:
    text = status(3 * 1024**3, 642 * 1024**3, 12.0)
    line = bar_line(LONG_LABEL, 0.5, text, 80)

    assert len(line) <= 79
    assert line.endswith(text)
    assert line.startswith("models/deepse")
    assert "..." in line and "c9d0 [" in line  # the revision's tail survives
    assert re.search(r"\[#+-+\]", line)


def test_a_short_name_keeps_the_whole_bar() -> None:
    line = bar_line("org/m", 1.0, "1.0 MiB/1.0 MiB 100.0% 1.0 MiB/s", 80)
    assert line == "org/m [" + "#" * 30 + "] 1.0 MiB/1.0 MiB 100.0% 1.0 MiB/s"


@given(
    label=st.text(st.characters(min_codepoint=33, max_codepoint=126), max_size=200),
    fraction=st.floats(0, 1),
    done=st.integers(0, 2**50),
    width=st.integers(2, 300),
)
def test_the_line_never_reaches_the_last_column(label: str, fraction: float, done: int, width: int) -> None:
    line = bar_line(label, fraction, status(done, 2**50, 3.0), width)
    assert len(line) <= max(width - 1, 1)


# ---- the renderer ------------------------------------------------------------------------


def test_without_a_terminal_there_are_plain_lines_and_a_final_one() -> None:
    out = io.StringIO()
    progress = StderrProgress("org/m", stream=out, interval_s=0.02)
    progress.planned(files=3, total_bytes=4 * MiB, missing_bytes=3 * MiB)
    progress.fetched(MiB)
    deadline = time.monotonic() + 30
    while out.getvalue().count("\n") < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    progress.fetched(2 * MiB)
    progress.close()

    lines = out.getvalue().splitlines()
    assert lines[0] == "org/m: 3 files, 3.0 MiB to fetch, 1.0 MiB already staged"
    assert len(lines) >= 3  # a periodic line, then the final one
    assert "\r" not in out.getvalue() and "\x1b" not in out.getvalue()
    assert re.fullmatch(r"org/m: 3\.0 MiB/3\.0 MiB 100\.0% \S+ \S+/s in \d+\.\ds", lines[-1]), lines[-1]


def test_on_a_terminal_the_line_is_rewritten_in_place_and_ends_with_a_newline() -> None:
    out = FakeTerminal()
    progress = StderrProgress(LONG_LABEL, stream=out, interval_s=0.02)
    progress.planned(files=1, total_bytes=MiB, missing_bytes=MiB)
    progress.fetched(MiB // 2)
    time.sleep(0.1)
    progress.fetched(MiB // 2)
    progress.close()

    output = out.getvalue()
    assert output.count(_ERASE) >= 2
    assert output.endswith("\n")
    assert all(len(row) <= 79 for row in visible_rows(output))
    assert "100.0%" in visible_rows(output)[-1]


def test_quiet_prints_nothing() -> None:
    out = io.StringIO()
    progress = StderrProgress("org/m", stream=out, quiet=True, interval_s=0.01)
    progress.planned(files=1, total_bytes=10, missing_bytes=10)
    progress.fetched(10)
    progress.close()
    assert out.getvalue() == ""


def test_the_daemon_logs_how_far_a_long_pull_is(caplog: pytest.LogCaptureFixture) -> None:
    now = [1000.0]
    events = PullLog(DaemonMetrics(), "models/org/m", clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="modelsync.daemon"):
        events.planned(files=2, total_bytes=10 * MiB, missing_bytes=10 * MiB)
        events.fetched(MiB)
        now[0] += PROGRESS_LOG_S / 2
        events.fetched(MiB)
        now[0] += PROGRESS_LOG_S / 2
        events.fetched(MiB)
        now[0] += 1
        events.fetched(MiB)
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0] == "pulling models/org/m: 2 files, 10.0 MiB to fetch"
    assert messages[1:] == ["pulling models/org/m: 3.0 MiB/10.0 MiB  30.0% 102.4 KiB/s"]


# ---- a real terminal -----------------------------------------------------------------------


def test_a_pull_on_an_80_column_terminal_never_wraps_the_progress_line(
    tmp_path: Path, s3_env: S3Env, s3_client: BaseClient, bucket: str
) -> None:
    prefix = "deepseek-ai/DeepSeek-V3-0324-FP8-Dynamic-with-a-name-longer-than-a-terminal/2025-03-24/"
    s3_client.put_object(Bucket=bucket, Key=prefix + "weights.bin", Body=os.urandom(6 * MiB))
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    argv = [
        sys.executable,
        "-m",
        "modelsync",
        "pull",
        f"s3://{bucket}/{prefix}",
        "--cache-dir",
        str(tmp_path / "cache"),
        "--part-size",
        "1Mi",
        "--max-bandwidth",
        "1Mi/s",
        "--concurrency",
        "2",
    ]
    child = subprocess.Popen(argv, env=s3_env.subprocess_env(), stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    captured = b""
    while True:
        ready, _, _ = select.select([master], [], [], 60)
        if not ready:
            break
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        captured += chunk
    os.close(master)
    stdout, _ = child.communicate(timeout=60)
    assert child.returncode == 0
    assert stdout.decode().strip().endswith(prefix.rstrip("/"))
    output = captured.decode().replace("\r\n", "\n")  # the terminal's own newline translation

    bars = [row for row in visible_rows(output) if "[" in row and "%" in row]
    assert len(bars) >= 3, output  # redrawn in place while the transfer ran
    assert all(len(row) <= 79 for row in visible_rows(output)), output
    assert "..." in bars[-1] and "100.0%" in bars[-1]
    print(f"last progress row at 80 columns: {bars[-1]!r}")


# ---- bytes fetched again ------------------------------------------------------------------


def test_bytes_fetched_again_are_shown_apart_and_the_line_never_passes_100_percent() -> None:
    out = io.StringIO()
    progress = StderrProgress("org/m", stream=out, interval_s=60)
    progress.planned(files=1, total_bytes=32 * MiB, missing_bytes=32 * MiB)
    progress.fetched(32 * MiB)
    progress.refetching(32 * MiB)  # the file failed its check: all of it comes again
    progress.fetched(32 * MiB)
    progress.close()

    last = out.getvalue().splitlines()[-1]
    pattern = r"org/m: 32\.0 MiB/32\.0 MiB 100\.0% \(\+32\.0 MiB again\) \S+ \S+/s in \S+"
    assert re.fullmatch(pattern, last), last
    assert status(61 * MiB, 32 * MiB, 1.0).startswith("32.0 MiB/32.0 MiB 100.0% (+29.0 MiB again)")


def test_a_cli_pull_whose_file_is_fetched_again_ends_at_100_percent_saying_what_came_again(
    tmp_path: Path, proxied_s3_env: S3Env, fault_proxy: FaultProxy, s3_client: BaseClient, bucket: str
) -> None:
    s3_client.put_object(Bucket=bucket, Key="org/m/weights.bin", Body=os.urandom(2 * MiB))
    fault_proxy.add_fault("bitflip", match="weights.bin", arg=100)

    result = subprocess.run(
        [sys.executable, "-m", "modelsync", "pull", f"s3://{bucket}/org/m/", "--part-size", "1Mi",
         "--cache-dir", str(tmp_path / "cache")],
        env=proxied_s3_env.subprocess_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip

    assert result.returncode == 0, result.stderr
    last = result.stderr.splitlines()[-1]
    assert "2.0 MiB/2.0 MiB 100.0% (+2.0 MiB again)" in last, result.stderr
    over_100 = re.search(r"\b(1[0-9][0-9]|[2-9][0-9][0-9])\.\d%", result.stderr.replace("100.0%", ""))
    assert over_100 is None, result.stderr
