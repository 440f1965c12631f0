"""Every way into a pull obeys the same rules: one unsigned source, every entry, each policy, one outcome.

The entries are the real command in a child process (and the real daemon beside
it): `pull` by the init container's fast path and by the full command line,
`prefetch` with no daemon (as the prefetch Job runs it), through a daemon, and
when the daemon stops before answering; the daemon's own schedule; a tenant's pull
through a read-only mount; `verify --repair`. Each policy expects one outcome of
all of them: the exit code (for the daemon's own pull, that of the error it logs)
and whether the model became ready.

A schedule's rule concerns the entries that read a schedule (`prefetch --schedule`
and the daemon); the settings' rules concern every entry. The demo runs its own
embedded server and model, so it is not a row here: it goes through the same
`pull_rules` (modelsync/demo.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from support.cli import run_cli
from support.daemon import Daemon, schedule_text
from support.objects import payload, upload
from support.s3env import S3Env
from support.waiting import wait_for
from test_tenant_pull import needs_mount_namespace, tenant

from modelsync.adapters.cache import Cache
from modelsync.core.refs import parse_source
from modelsync.errors import ERRORS_BY_CODE, ExitCode
from modelsync.local_api.protocol import Message, socket_path
from modelsync.local_api.server import serve

MiB = 1024 * 1024
NAME = "unsigned"
SOURCE = "s3://models/org/unsigned/v1/"
REF = parse_source(SOURCE)
FILES = {"config.json": b"{}", "weights.bin": payload(MiB, 7)}
JOBS = Path(__file__).parent.parent / "jobs"


@dataclass(frozen=True)
class Outcome:
    exit_code: int
    ready: bool


@dataclass(frozen=True)
class Case:
    """One source under one policy, with what each entry needs to run it."""

    tmp_path: Path
    env: dict[str, str]
    #: the schedule's entry for the source ends with this (its signature rule, or nothing)
    signature_line: str
    start_daemon: Callable[..., Daemon]

    @property
    def cache(self) -> Path:
        return self.tmp_path / "cache"  # where start_daemon puts the daemon's cache

    def outcome(self, done: subprocess.CompletedProcess[str]) -> Outcome:
        assert "Traceback" not in done.stderr, done.stderr
        return Outcome(done.returncode, Cache(self.cache).ready_record(REF) is not None)

    def cli(self, *args: str) -> Outcome:
        return self.outcome(run_cli(self.env, *args))

    def schedule(self, window: str = "later") -> Path:
        """The schedule naming the source; `later`: a window the daemon does not prefetch for yet."""
        path = self.tmp_path / f"schedule-{window}.yaml"
        path.write_text(schedule_text([(NAME, SOURCE, window)]) + self.signature_line)
        return path

    def daemon(self, window: str = "later") -> Daemon:
        return self.start_daemon(self.schedule(window), self.env)


# ---- the entries ---------------------------------------------------------------------------


def plain_pull(case: Case) -> Outcome:
    """The init container's `modelsync pull SOURCE`: the fast path, without typer."""
    return case.cli("pull", SOURCE, "--quiet")


def full_pull(case: Case) -> Outcome:
    """`pull` with an option only the full command line reads."""
    return case.cli("pull", SOURCE, "--quiet", "--concurrency", "2")


def prefetch_job(case: Case) -> Outcome:
    """The prefetch Job's own arguments, on a node where no daemon runs."""
    (container,) = yaml.safe_load((JOBS / "prefetch-job.yaml").read_text())["spec"]["template"]["spec"][
        "containers"
    ]
    schedule = str(case.schedule())
    args = [
        schedule if a == "/etc/modelsync/schedule.yaml" else NAME if a == "MODEL_TO_STAGE" else a
        for a in container["args"]
    ]
    assert args == ["prefetch", "--schedule", schedule, NAME]
    return case.cli(*args)


def prefetch_through_the_daemon(case: Case) -> Outcome:
    case.daemon()
    return case.cli("prefetch", "--schedule", str(case.schedule()), NAME)


def prefetch_when_the_daemon_stops_before_answering(case: Case) -> Outcome:
    with hanging_up_daemon(case.cache):
        done = run_cli(case.env, "prefetch", "--schedule", str(case.schedule()), NAME)
    assert "warning: the daemon stopped before answering; pulling here" in done.stderr
    return case.outcome(done)


def the_daemons_schedule(case: Case) -> Outcome:
    daemon = case.daemon("always")
    ready = case.cache / REF.cache_path

    def ended() -> dict[str, object] | None:
        return next((e for e in daemon.logs() if e.get("code") and e.get("model") == NAME), None)

    wait_for(lambda: ready.exists() or ended() is not None, timeout_s=30, what="the daemon's pull ends")
    failure = ended()
    if failure is None:
        return Outcome(0, Cache(case.cache).ready_record(REF) is not None)
    return Outcome(int(ERRORS_BY_CODE[str(failure["code"])].exit_code), ready.exists())


def tenant_pull(case: Case) -> Outcome:
    case.daemon()
    home = case.tmp_path / "tenant-home"
    home.mkdir()
    return case.outcome(tenant(case.cache, home, "pull", SOURCE))


def verify_repair(case: Case) -> Outcome:
    """A copy pulled with no policy, damaged and quarantined, then repaired under the policy."""
    free = {k: v for k, v in case.env.items() if not k.startswith("MODELSYNC_SIGNATURE")}
    assert run_cli(free, "pull", SOURCE, "--quiet").returncode == 0
    damaged = case.cache / REF.cache_path / "weights.bin"
    os.chmod(damaged, 0o644)
    os.truncate(damaged, 3)
    assert run_cli(free, "verify").returncode == int(ExitCode.INTEGRITY)
    return case.cli("verify", "--repair", "--quiet")


Entry = tuple[Callable[[Case], Outcome], tuple[pytest.MarkDecorator, ...]]


def entry(fn: Callable[[Case], Outcome], *marks: pytest.MarkDecorator) -> Entry:
    return fn, marks


#: every entry that reads a schedule: the prefetch command (and its Job) and the daemon
SCHEDULED_ENTRIES = [
    entry(prefetch_job),
    entry(prefetch_through_the_daemon),
    entry(prefetch_when_the_daemon_stops_before_answering),
    entry(the_daemons_schedule),
    entry(tenant_pull, needs_mount_namespace, pytest.mark.root),
]
EVERY_ENTRY = [entry(plain_pull), entry(full_pull), entry(verify_repair), *SCHEDULED_ENTRIES]

REFUSED = Outcome(int(ExitCode.INTEGRITY), ready=False)
READY = Outcome(0, ready=True)

#: (policy, where it is written, the entries it concerns, the outcome every one of them must reach)
POLICIES: list[tuple[str, str, list[Entry], Outcome]] = [
    ("the schedule requires a signature", "schedule", SCHEDULED_ENTRIES, REFUSED),
    ("the settings require a signature", "settings", EVERY_ENTRY, REFUSED),
    ("a settings rule for the prefix requires a signature", "rule", EVERY_ENTRY, REFUSED),
    ("the schedule accepts an unsigned model", "if-present", SCHEDULED_ENTRIES, READY),
    ("no policy", "none", EVERY_ENTRY, READY),
]


def _cases() -> Iterator[object]:
    for policy, where, entries, expected in POLICIES:
        for fn, marks in entries:
            yield pytest.param(where, fn, expected, marks=marks, id=f"{policy}: {fn.__name__}")


@pytest.mark.parametrize(("where", "entry", "expected"), list(_cases()))
def test_every_entry_reaches_the_same_outcome_for_the_same_source_under_each_policy(
    tmp_path: Path,
    moto_subprocess_s3_env: S3Env,
    start_daemon: Callable[..., Daemon],
    where: str,
    entry: Callable[[Case], Outcome],
    expected: Outcome,
) -> None:
    upload(moto_subprocess_s3_env, REF.bucket, REF.prefix, FILES)  # published unsigned
    key = tmp_path / "release.pub.pem"
    key.write_bytes(
        ec.generate_private_key(ec.SECP256R1())
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    env = {**moto_subprocess_s3_env.subprocess_env(), "MODELSYNC_CACHE_DIR": str(tmp_path / "cache")}
    signature_line = ""
    if where in ("schedule", "if-present"):
        mode = "required" if where == "schedule" else "if-present"
        signature_line = f"    signature: {{mode: {mode}, public_keys: [{key}]}}\n"
    elif where == "settings":
        env |= {"MODELSYNC_SIGNATURE": "required", "MODELSYNC_SIGNATURE_PUBLIC_KEYS": str(key)}
    elif where == "rule":
        rules = f'[{{"scope": "s3://{REF.bucket}/org/", "mode": "required", "public_keys": ["{key}"]}}]'
        env |= {"MODELSYNC_SIGNATURE_RULES": rules}

    outcome = entry(Case(tmp_path, env, signature_line, start_daemon))

    assert outcome == expected
    if not expected.ready:
        assert not (tmp_path / "cache" / REF.cache_path).exists()


@contextlib.contextmanager
def hanging_up_daemon(cache: Path) -> Iterator[None]:
    """A daemon that takes each request and hangs up without answering, as one being stopped does:
    the real local API server (serve) with a handler that loses its connection."""
    sock = socket_path(cache)
    sock.parent.mkdir(parents=True, exist_ok=True)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        server = asyncio.run_coroutine_threadsafe(serve(sock, _hang_up), loop).result(10)
        try:
            yield
        finally:
            loop.call_soon_threadsafe(server.close)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


async def _hang_up(_request: Message) -> Message:
    raise ConnectionResetError("stopped before answering")
