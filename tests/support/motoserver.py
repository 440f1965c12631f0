"""Real moto S3 servers on loopback: one in a thread, one in a child process.

In-process `mock_aws` patches botocore and does not work with aiobotocore, so every
test talks HTTP to a moto server. The threaded server is cheap and shared by a whole
session; the subprocess server exists for tests whose client competes with pytest
for the GIL (several puller processes, SIGKILL of the CLI mid-transfer).

Both bind port 0 so parallel sessions never collide, and both expose the same
small surface: `endpoint_url`, `reset()`, `stop()`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Protocol, Self

from moto.server import ThreadedMotoServer

from support.service import Service

LOOPBACK = "127.0.0.1"
RESET_PATH = "/moto-api/reset"

# werkzeug prints this once the listening socket is bound; with port 0 it is the
# only place the chosen port is visible from outside the child.
_RUNNING_ON = re.compile(rb"Running on http://[^\s:]+:(\d+)")

# A direct opener: an exported http_proxy must never reroute loopback test traffic.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class MotoServer(Protocol):
    """What fixtures need from either kind of server."""

    @property
    def endpoint_url(self) -> str: ...

    def reset(self) -> None: ...

    def stop(self) -> None: ...


def reset_moto(endpoint_url: str, timeout_s: float = 10.0) -> None:
    """Drop every bucket and object on the server, so one test cannot see another's data.

    Moto keeps its state in module globals; the reset endpoint clears them for the
    process that serves `endpoint_url` (for the threaded server, that is pytest itself).
    """
    request = urllib.request.Request(endpoint_url + RESET_PATH, data=b"", method="POST")
    with _DIRECT.open(request, timeout=timeout_s) as response:
        response.read()
        if response.status != 200:
            raise RuntimeError(f"moto reset answered {response.status}")


def wait_until_serving(endpoint_url: str, timeout_s: float = 30.0) -> None:
    """Poll until the server answers HTTP, because a bound socket is not yet a served one."""
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            with _DIRECT.open(endpoint_url + "/moto-api/", timeout=2.0) as response:
                response.read()
                return
        except OSError as error:
            last_error = error
            time.sleep(0.05)
    raise TimeoutError(f"moto at {endpoint_url} did not answer: {last_error!r}")


class ThreadedMoto(Service):
    """moto's werkzeug server in a daemon thread of this process, on a free loopback port."""

    def __init__(self, host: str = LOOPBACK) -> None:
        self._server = ThreadedMotoServer(ip_address=host, port=0, verbose=False)
        self._endpoint_url: str | None = None

    @property
    def endpoint_url(self) -> str:
        if self._endpoint_url is None:
            raise RuntimeError("start() the server first")
        return self._endpoint_url

    def start(self) -> Self:
        self._server.start()
        # With port 0 the real port is only known after bind; get_host_and_port reads it
        # back from the socket.
        host, port = self._server.get_host_and_port()
        self._endpoint_url = f"http://{host}:{port}"
        wait_until_serving(self._endpoint_url)
        return self

    def reset(self) -> None:
        reset_moto(self.endpoint_url)

    def stop(self) -> None:
        if self._endpoint_url is None:
            return
        self._server.stop()
        # ThreadedMotoServer.stop() shuts the loop down but leaves the listening socket
        # open; under `filterwarnings = error` its ResourceWarning would fail a test at
        # garbage collection, so close it here.
        werkzeug_server = getattr(self._server, "_server", None)
        if werkzeug_server is not None:
            werkzeug_server.server_close()
        self._endpoint_url = None


class SubprocessMoto(Service):
    """`python -m moto.server` in a child process, so it has its own GIL and can be killed.

    Output (startup banner and one access-log line per request) goes to a log file,
    never a pipe: an undrained pipe would block the server after about 64 KiB.
    """

    def __init__(
        self,
        host: str = LOOPBACK,
        extra_env: Mapping[str, str] | None = None,
        log_dir: Path | None = None,
    ) -> None:
        self._host = host
        self._extra_env = dict(extra_env or {})
        self._log_dir = log_dir
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._endpoint_url: str | None = None
        self.log_path: Path | None = None

    @property
    def endpoint_url(self) -> str:
        if self._endpoint_url is None:
            raise RuntimeError("start() the server first")
        return self._endpoint_url

    @property
    def pid(self) -> int:
        if self._process is None:
            raise RuntimeError("start() the server first")
        return self._process.pid

    def start(self, timeout_s: float = 30.0) -> Self:
        """Start the child on port 0 and read the bound port from its banner."""
        fd, name = tempfile.mkstemp(prefix="moto-", suffix=".log", dir=self._log_dir)
        self.log_path = Path(name)
        self._log = os.fdopen(fd, "wb")
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self._extra_env}
        # moto.server sets MOTO_PORT from -p when it is absent; a value inherited from
        # the caller would be misleading, so let the child decide.
        env.pop("MOTO_PORT", None)
        self._process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", self._host, "-p", "0"],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        try:
            port = self._wait_for_port(timeout_s)
            self._endpoint_url = f"http://{self._host}:{port}"
            wait_until_serving(self._endpoint_url, timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_for_port(self, timeout_s: float) -> int:
        assert self._process is not None and self.log_path is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = _RUNNING_ON.search(self.log_path.read_bytes())
            if found:
                return int(found.group(1))
            if self._process.poll() is not None:
                raise RuntimeError(
                    f"moto server exited with {self._process.returncode}: "
                    f"{self.log_path.read_text(errors='replace')}"
                )
            time.sleep(0.05)
        raise TimeoutError(f"moto server printed no port within {timeout_s} s")

    def reset(self) -> None:
        reset_moto(self.endpoint_url)

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM (moto exits cleanly on it), SIGKILL if it hangs; always reap the child."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
            # A log in the caller's directory is kept for post-mortems; one in the
            # system temp dir would only pile up.
            if self._log_dir is None and self.log_path is not None:
                self.log_path.unlink(missing_ok=True)
        self._endpoint_url = None
