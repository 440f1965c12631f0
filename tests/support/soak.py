"""The soak's bookkeeping: how long it runs, the real CLI with a deadline, and what it counts.

The soak judges the cache the way a serving pod would: every model `ls --json` calls
ready must hold exactly the files that were published, byte for byte (compared by
SHA-256 with what the test uploaded). A model that vanishes while it is read was
evicted meanwhile, which is allowed; a ready model with a wrong, missing or stray
file is not. Every command run to completion is checked for a traceback, and one
that outlives its deadline is killed and counted as a hang.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from support.cli import MODELSYNC

#: minutes the whole soak runs (both of its tests together); `MODELSYNC_SOAK_MINUTES=20` for a long one
SOAK_MINUTES_VAR = "MODELSYNC_SOAK_MINUTES"
DEFAULT_SOAK_MINUTES = 4.0
#: what a command run to completion may take before it counts as a hang
COMMAND_DEADLINE_S = 240.0


def soak_seconds(share: float) -> float:
    """This test's `share` of the soak's minutes, in seconds."""
    raw = os.environ.get(SOAK_MINUTES_VAR, "")
    try:
        minutes = float(raw) if raw else DEFAULT_SOAK_MINUTES
    except ValueError:
        raise ValueError(f"{SOAK_MINUTES_VAR} must be a number of minutes, got {raw!r}") from None
    return max(minutes, 0.5) * 60 * share


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_digests(files: Mapping[str, bytes]) -> dict[str, str]:
    return {path: digest(data) for path, data in files.items()}


@dataclass
class Figures:
    """What the soak counts; the totals it prints and asserts on. Thread-safe through `lock`."""

    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    counts: Counter[str] = field(default_factory=Counter)
    bad_models: list[str] = field(default_factory=list)
    tracebacks: list[str] = field(default_factory=list)
    hangs: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    #: the first message seen of each kind, to show what users were told
    samples: dict[str, str] = field(default_factory=dict)

    def count(self, what: str, n: int = 1) -> None:
        with self.lock:
            self.counts[what] += n

    def note(self, kind: str, text: str) -> None:
        with self.lock:
            getattr(self, kind).append(text)

    def sample(self, kind: str, text: str) -> None:
        with self.lock:
            self.samples.setdefault(kind, text)

    def line(self, title: str, keys: list[str]) -> str:
        with self.lock:
            shown = ", ".join(f"{k} {self.counts[k]}" for k in keys)
            return (
                f"{title}: {shown}; bad ready models {len(self.bad_models)}, "
                f"tracebacks {len(self.tracebacks)}, hangs {len(self.hangs)}, "
                f"unexpected failures {len(self.failures)}"
            )

    def problems(self) -> list[str]:
        with self.lock:
            return [
                *(f"bad ready model: {t}" for t in self.bad_models),
                *(f"traceback: {t}" for t in self.tracebacks),
                *(f"hang: {t}" for t in self.hangs),
                *(f"failure: {t}" for t in self.failures),
            ]


def run(
    figures: Figures, env: dict[str, str], *args: str, deadline_s: float = COMMAND_DEADLINE_S
) -> tuple[int, str, str]:
    """Run `modelsync ARGS` to completion; a traceback or a hang is counted. (code, stdout, stderr).

    A hang is killed and reported as code -9.
    """
    process = subprocess.Popen(
        [*MODELSYNC, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        out, err = process.communicate(timeout=deadline_s)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGKILL)
        out, err = process.communicate()
        command = " ".join(args)
        figures.note("hangs", f"modelsync {command} ran past {deadline_s:.0f} s; stderr: {err[-500:]!r}")
        return -signal.SIGKILL, out, err
    if "Traceback" in err:
        figures.note("tracebacks", f"modelsync {' '.join(args)}: {err[-1500:]}")
    return process.returncode, out, err


def kill_at(figures: Figures, env: dict[str, str], after_s: float, *args: str) -> int | None:
    """Start `modelsync ARGS`, SIGKILL it `after_s` later; None when killed, else its exit code.

    A run that ended on its own is checked for a traceback like any other.
    """
    process = subprocess.Popen(
        [*MODELSYNC, *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        process.wait(timeout=after_s)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGKILL)
        process.communicate()
        return None
    _out, err = process.communicate()
    if "Traceback" in err:
        figures.note("tracebacks", f"modelsync {' '.join(args)}: {err[-1500:]}")
    if process.returncode not in (0, 3):
        figures.count(f"{args[0]} ended before its kill with exit {process.returncode}: {err.strip()[-200:]}")
    return process.returncode


def check_ready_models(
    figures: Figures, env: dict[str, str], cache: Path, expected: Mapping[str, Mapping[str, str]]
) -> int:
    """Compare every ready model with what was published; the number of models checked.

    `expected` maps `bucket/prefix` (as `ls` names a model) to {path: SHA-256}. A model
    whose ready path disappears while it is read was evicted meanwhile and is skipped.
    """
    code, out, err = run(figures, env, "ls", "--json", "--cache-dir", str(cache))
    if code != 0:
        figures.note("failures", f"ls --json exited {code}: {err.strip()[-300:]}")
        return 0
    checked = 0
    for model in json.loads(out)["models"]:
        if model["state"] != "ready":
            continue
        name = str(model["model"])
        verdict = _compare(cache / name, expected.get(name))
        if verdict is None:
            continue
        checked += 1
        if verdict:
            figures.note("bad_models", f"{name}: {verdict}")
    figures.count("ready models checked", checked)
    return checked


def _compare(ready: Path, want: Mapping[str, str] | None) -> str | None:
    """'' when `ready` holds exactly `want`, what differs otherwise, None when it changed meanwhile.

    Eviction renames the ready directory away and a new pull renames another one in,
    so a directory whose inode differs after the read was replaced while it was read.
    """
    try:
        before = ready.stat().st_ino
        have = {
            str(path.relative_to(ready)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(ready.rglob("*"))
            if not path.is_dir()
        }
        if ready.stat().st_ino != before:
            return None
    except FileNotFoundError:
        return None
    if want is None:
        return "a model nobody published"
    if have == want:
        return ""
    missing = sorted(set(want) - set(have))
    stray = sorted(set(have) - set(want))
    wrong = sorted(p for p in set(have) & set(want) if have[p] != want[p])
    return f"missing {missing}, stray {stray}, wrong bytes {wrong}"


def wait_quietly(seconds: float, stop: threading.Event) -> bool:
    """Sleep `seconds` unless `stop` is set first; whether to go on."""
    return not stop.wait(seconds)


def elapsed_since(started: float) -> str:
    return f"{(time.monotonic() - started) / 60:.1f} min"
