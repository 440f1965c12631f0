"""Debian's Prometheus and promtool, as the alert and dashboard tests use them.

`rendered_rules` takes the rule groups out of the PrometheusRule the datacenter
cluster folder renders (`kubectl kustomize`), as the Prometheus Operator hands them
to Prometheus. `Prometheus` is a real server on loopback with its data in a
temporary directory and a free port: it scrapes the given targets every second,
evaluates the rules every second and answers queries over its HTTP API.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Self

import yaml

from support.kube import Obj, cluster
from support.service import Service

LOOPBACK = "127.0.0.1"
START_TIMEOUT_S = 20.0
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def promtool_binary() -> str | None:
    return shutil.which("promtool")


def prometheus_binary() -> str | None:
    return shutil.which("prometheus")


def prometheus_rule() -> Obj:
    (rule,) = [o for o in cluster("datacenter") if o["kind"] == "PrometheusRule"]
    return rule


def rendered_rules() -> dict[str, Any]:
    """The PrometheusRule's groups as a Prometheus rule file."""
    return {"groups": prometheus_rule()["spec"]["groups"]}


def alert_rules() -> list[Obj]:
    return [r for g in rendered_rules()["groups"] for r in g["rules"] if "alert" in r]


def dashboard() -> Obj:
    (config_map,) = [
        o for o in cluster("datacenter")
        if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "modelsync-dashboard"
    ]
    loaded: Obj = json.loads(config_map["data"]["modelsync.json"])
    return loaded


def write_rules(directory: Path) -> Path:
    path = directory / "modelsync-rules.yaml"
    path.write_text(yaml.safe_dump(rendered_rules(), sort_keys=False))
    return path


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    binary = promtool_binary()
    assert binary, "promtool is not installed (scripts/setup installs Debian's prometheus as root)"
    return subprocess.run([binary, *args], capture_output=True, text=True, timeout=60, cwd=cwd, check=False)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        return int(probe.getsockname()[1])


class Prometheus(Service):
    """`prometheus` scraping `targets` (URL, labels) every second, with `rules` loaded."""

    def __init__(self, workdir: Path, targets: list[tuple[str, dict[str, str]]], rules: Path) -> None:
        self._dir = workdir
        self._targets = targets
        self._rules = rules
        self._proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.log_path = workdir / "prometheus.log"

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def start(self) -> Self:
        binary = prometheus_binary()
        if binary is None:
            raise RuntimeError("prometheus is not installed (scripts/setup installs it as root)")
        self._dir.mkdir(parents=True, exist_ok=True)
        scrape_configs = []
        for index, (url, labels) in enumerate(self._targets):
            parts = urllib.parse.urlsplit(url)
            scrape_configs.append(
                {
                    "job_name": f"modelsync-{index}",
                    "scrape_interval": "1s",
                    "scrape_timeout": "1s",
                    "metrics_path": "/metrics",
                    "static_configs": [{"targets": [parts.netloc], "labels": labels}],
                }
            )
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(self._rules)],
            "scrape_configs": scrape_configs,
        }
        config_path = self._dir / "prometheus.yml"
        config_path.write_text(yaml.safe_dump(config))
        for _attempt in range(3):
            self.port = _free_port()
            with self.log_path.open("wb") as log:
                self._proc = subprocess.Popen(
                    [binary, f"--config.file={config_path}", f"--storage.tsdb.path={self._dir / 'data'}",
                     f"--web.listen-address={LOOPBACK}:{self.port}", "--log.level=warn"],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                )
            if self._wait_ready():
                return self
        self.stop()
        raise RuntimeError(f"prometheus did not start: {self.log_path.read_text()[-2000:]}")

    def _wait_ready(self) -> bool:
        assert self._proc is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                return False  # most likely the port was taken meanwhile: try another
            try:
                with _DIRECT.open(self.url + "/-/ready", timeout=2) as response:
                    if response.status == 200:
                        return True
            except (urllib.error.URLError, ConnectionError):
                pass
            time.sleep(0.1)
        return False

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(10)
            self._proc = None

    def api(self, path: str, **params: str) -> Any:
        """GET /api/v1/<path>; the `data` of a successful answer (an error answer fails the test)."""
        query = urllib.parse.urlencode(params)
        try:
            with _DIRECT.open(f"{self.url}/api/v1/{path}?{query}", timeout=10) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            body = json.loads(exc.read() or b"{}")
        assert body.get("status") == "success", f"{path} {params}: {body}"
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's series: [{"metric": {labels}, "value": [t, "v"]}, ...]."""
        data = self.api("query", query=expr)
        assert data["resultType"] in ("vector", "scalar"), f"{expr}: {data['resultType']}"
        result: list[dict[str, Any]] = data["result"] if data["resultType"] == "vector" else []
        return result

    def label_values(self, label: str, match: str) -> list[str]:
        values: list[str] = self.api(f"label/{label}/values", **{"match[]": match})
        return values
