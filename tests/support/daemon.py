"""The node daemon in a child process, and the schedules a test gives it.

The daemon's JSON logs go to a file the test reads; metrics are scraped over HTTP and
parsed with prometheus_client's parser, so values are checked, not just names.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

POOL = "test-pool"
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def schedule_text(models: list[tuple[str, str, str]]) -> str:
    """(name, source, window) entries; window is 'soon' (prefetch now), 'later', 'always',
    'closed' (a one-minute window that closed 2-3 minutes ago, so its keep of 1m has passed)
    or 'kept' (the same window with a keep of 1h, so the model is still protected)."""
    soon = (datetime.now(UTC) + timedelta(minutes=3)).replace(second=0, microsecond=0)
    past = soon - timedelta(minutes=6)
    closed = f'[{{cron: "{past.minute} {past.hour} * * *", duration: 1m}}]'
    windows = {
        "soon": f'[{{cron: "{soon.minute} {soon.hour} * * *", duration: 10m}}]',
        "later": f'[{{cron: "{soon.minute} {(soon.hour + 12) % 24} * * *", duration: 10m}}]',
        "always": "[always]",
        "closed": closed,
        "kept": closed,
    }
    lines = ["version: 1", "timezone: UTC", "defaults: {lead: 10m, keep: 1m}"]
    lines.append("models:" if models else "models: []")
    for name, source, window in models:
        lines += [f"  - name: {name}", f"    source: {source}", f"    pools: [{POOL}]"]
        lines.append(f"    windows: {windows[window]}")
        if window == "kept":
            lines.append("    keep: 1h")
    return "\n".join(lines) + "\n"


class ConfigMapDir:
    """Laid out like a mounted ConfigMap: schedule.yaml -> ..data/schedule.yaml, ..data -> ..v<n>."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.version = 0
        root.mkdir()
        (root / "schedule.yaml").symlink_to("..data/schedule.yaml")

    @property
    def path(self) -> Path:
        return self.root / "schedule.yaml"

    def write(self, text: str) -> None:
        """Swap the `..data` symlink atomically to a new version directory, as the kubelet does."""
        self.version += 1
        version_dir = self.root / f"..v{self.version}"
        version_dir.mkdir()
        (version_dir / "schedule.yaml").write_text(text)
        temp = self.root / "..data_tmp"
        temp.symlink_to(version_dir.name)
        os.replace(temp, self.root / "..data")


class Daemon:
    """`modelsync daemon` in a child process; its JSON logs go to a file the test reads."""

    def __init__(self, cache: Path, schedule: Path, env: dict[str, str], *extra: str) -> None:
        self.cache = cache
        self.log_path = cache.parent / "daemon.log"
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "modelsync", "daemon", "--schedule", str(schedule), "--pool", POOL,
             "--listen", "127.0.0.1:0", "--tick", "1s", "--jitter", "0", "--json-logs",
             "--cache-dir", str(cache), *extra],
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT, env=env,
        )
        try:
            entry = self.wait_for_log(lambda e: "url" in e, timeout_s=20)
        except BaseException:
            self.stop()
            raise
        self.url = str(entry["url"])

    def logs(self) -> list[dict[str, object]]:
        entries = []
        for line in self.log_path.read_text().splitlines():
            try:
                entries.append(json.loads(line))
            except ValueError:
                entries.append({"msg": line, "level": "raw"})
        return entries

    def wait_for_log(
        self, match: Callable[[dict[str, object]], bool], timeout_s: float = 15
    ) -> dict[str, object]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for entry in self.logs():
                if match(entry):
                    return entry
            if self.process.poll() is not None:
                raise AssertionError(f"daemon exited {self.process.returncode}: {self.log_path.read_text()}")
            time.sleep(0.1)
        raise AssertionError(f"no matching log line within {timeout_s} s: {self.log_path.read_text()}")

    def get(self, path: str) -> tuple[int, str]:
        try:
            with _DIRECT.open(self.url + path, timeout=5) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        status, text = self.get("/metrics")
        assert status == 200
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    def metric(self, name: str, /, **labels: str) -> float | None:
        return self.metrics().get((name, tuple(sorted(labels.items()))))

    def stop(self) -> tuple[int, float]:
        """SIGTERM; the exit code and how long it took to exit."""
        started = time.monotonic()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                # With a timeout: a wait that a test timeout interrupted can leave Popen's
                # waitpid lock held, and a plain wait() would then block the worker forever.
                self.process.wait(timeout=15)
        if not self._log.closed:
            self._log.close()
        return self.process.returncode, time.monotonic() - started
