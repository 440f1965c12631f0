"""A real forward proxy (Debian's tinyproxy) on loopback, started by the tests that need one.

It logs one `Request (file descriptor N): GET http://host/path HTTP/1.1` line per
proxied plain-http request and one `CONNECT host:port` line per https tunnel, so a
test can prove which requests went through it.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Self

from support.service import Service

LOOPBACK = "127.0.0.1"
START_TIMEOUT_S = 10.0


def tinyproxy_binary() -> str | None:
    return shutil.which("tinyproxy") or (
        "/usr/bin/tinyproxy" if Path("/usr/bin/tinyproxy").exists() else None
    )


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        return int(probe.getsockname()[1])


class TinyProxy(Service):
    """tinyproxy in the foreground with its config and log in `workdir`."""

    def __init__(self, workdir: Path, basic_auth: tuple[str, str] | None = None) -> None:
        self._dir = workdir
        self._auth = basic_auth
        self._proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.log_path = workdir / "tinyproxy.log"

    @property
    def url(self) -> str:
        auth = f"{self._auth[0]}:{self._auth[1]}@" if self._auth else ""
        return f"http://{auth}{LOOPBACK}:{self.port}"

    def start(self) -> Self:
        binary = tinyproxy_binary()
        if binary is None:
            raise RuntimeError("tinyproxy is not installed (scripts/setup installs it as root)")
        self._dir.mkdir(parents=True, exist_ok=True)
        self.port = _free_port()
        lines = [
            f"Port {self.port}",
            f"Listen {LOOPBACK}",
            "Timeout 120",
            f"Allow {LOOPBACK}",
            "LogLevel Connect",
            f'LogFile "{self.log_path}"',
            "MaxClients 200",
            "DisableViaHeader Yes",
        ]
        if self._auth:
            lines.append(f"BasicAuth {self._auth[0]} {self._auth[1]}")
        config = self._dir / "tinyproxy.conf"
        config.write_text("\n".join(lines) + "\n")
        with (self._dir / "tinyproxy.stderr").open("wb") as stderr:
            self._proc = subprocess.Popen(
                [binary, "-d", "-c", str(config)], stdout=subprocess.DEVNULL, stderr=stderr
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"tinyproxy exited: {(self._dir / 'tinyproxy.stderr').read_text()}")
            with socket.socket() as probe:
                if probe.connect_ex((LOOPBACK, self.port)) == 0:
                    return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError("tinyproxy did not start listening")

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None

    def requests(self, contains: str = "") -> list[str]:
        """The request lines tinyproxy logged (`GET http://...`, `CONNECT host:port`)."""
        if not self.log_path.exists():
            return []
        found = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            _, marker, request = line.partition("): ")
            if marker and "Request (file descriptor" in line and contains in request:
                found.append(request)
        return found
