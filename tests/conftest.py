"""Shared pytest fixtures. Every S3 test talks real HTTP to a moto server.

Servers and proxies live in `tests/support`; this file only wires them into fixtures.

S3 (in-thread moto, shared by the session, emptied before each test that asks for it)
    moto_server      -> ThreadedMoto          session; `.endpoint_url`, `.reset()`
    s3_env           -> S3Env                 endpoint + test credentials; server reset first
    s3_client        -> botocore BaseClient   sync boto3 S3 client on s3_env, closed after
    bucket           -> str                   a fresh, uniquely named, empty bucket
    child_env        -> dict[str, str]        environment for a child process (the CLI) on s3_env

Faults
    fault_proxy      -> FaultProxy            a fault-injecting proxy in front of s3_env
    proxied_s3_env   -> S3Env                 s3_env, but through fault_proxy

Child-process moto (its own GIL; for multi-process and kill tests)
    moto_subprocess         -> SubprocessMoto   session; `.endpoint_url`, `.pid`, `.reset()`
    moto_subprocess_s3_env  -> S3Env            on moto_subprocess, reset first
    moto_subprocess_client  -> BaseClient       a sync boto3 client on it, closed after
    moto_subprocess_proxy   -> FaultProxy       a fresh fault proxy in front of it

SeaweedFS (a real S3 server in a child process: SigV4 checked, per-identity actions)
    seaweedfs        -> SeaweedFS             session; `.endpoint_url`, `.env(identity)`
    seaweed_admin    -> S3Env                 the identity that may write
    seaweed_reader   -> S3Env                 a read-only identity (Read, List)
    seaweed_bucket   -> str                   a fresh, uniquely named, empty bucket on it

The node daemon
    start_daemon     -> (schedule, env, *args) -> Daemon   children stopped after the test

In-process engine calls
    aws_credentials  -> S3Env                 test credentials in the AWS env chain (monkeypatched,
                                              restored after the test); endpoint comes from Settings

Nothing else here mutates `os.environ`: configuration travels as values.
Add new fixtures below the matching section, with a docstring that says why they exist.
"""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from botocore.client import BaseClient
from support.daemon import Daemon
from support.faultproxy import FaultProxy
from support.motoserver import SubprocessMoto, ThreadedMoto
from support.s3env import FOREIGN_AWS_VARS, S3Env
from support.seaweedfs import Identity, SeaweedFS

# ---- xdist groups -------------------------------------------------------------------


#: marks a test whose xdist_group mark was ignored (see below)
_UNGROUPED = pytest.StashKey[bool]()


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Fail the tests whose `xdist_group` mark was ignored: the tiers marked with one (the
    SeaweedFS server, the container tier's image and pods) must share one worker.

    pytest-xdist's `--dist loadgroup` groups tests by an `@group` suffix it appends to each
    marked test's node id on the worker; pytest 9 no longer reads the attribute it sets, so
    the marks were silently ignored and every worker built its own image, played its own
    daemon pods and started its own SeaweedFS. `loadgroup` is an option of xdist's workers
    only: a run without `-n` has none."""
    if not config.getoption("loadgroup", default=False):
        return
    for item in items:
        if item.get_closest_marker("xdist_group") and "@" not in item.nodeid:
            item.stash[_UNGROUPED] = True


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.stash.get(_UNGROUPED, False):
        pytest.fail(
            "pytest-xdist ignored this test's xdist_group mark, so its tier would run on several "
            "workers at once; install the pytest pyproject.toml names",
            pytrace=False,
        )


# ---- signals ------------------------------------------------------------------------


def pytest_configure(config: pytest.Config) -> None:
    """Let the CLI children hear Ctrl-C even when the suite was started with SIGINT ignored.

    A shell without job control starts a background command (`.ci/run &`) with SIGINT ignored,
    every child inherits that, and a pull then rightly keeps running through a SIGINT, as under
    `nohup`: the tests that interrupt a command would fail for the way the suite was started. A
    handled signal is reset to its default in each child, an ignored one is not."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


# ---- S3: in-thread moto ------------------------------------------------------------


@pytest.fixture(scope="session")
def moto_server() -> Iterator[ThreadedMoto]:
    """One moto server per session: starting one costs little, but per-test servers add up."""
    with ThreadedMoto() as server:
        yield server


@pytest.fixture
def s3_env(moto_server: ThreadedMoto) -> S3Env:
    """The S3 endpoint and credentials for this test, on an emptied server.

    Resetting here rather than after each test means a failed test leaves its state
    behind for inspection, and the next one still starts clean.
    """
    moto_server.reset()
    return S3Env(moto_server.endpoint_url)


@pytest.fixture
def s3_client(s3_env: S3Env) -> Iterator[BaseClient]:
    """A sync boto3 client for arranging and inspecting S3 state around the code under test."""
    client = s3_env.boto3_client()
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def bucket(s3_client: BaseClient) -> str:
    """A new empty bucket; the name is unique so leftovers never collide."""
    name = f"test-{uuid.uuid4().hex[:16]}"
    s3_client.create_bucket(Bucket=name)
    return name


@pytest.fixture
def child_env(s3_env: S3Env) -> dict[str, str]:
    """Environment for a child process that must reach s3_env through the AWS variables."""
    return s3_env.subprocess_env()


# ---- faults ------------------------------------------------------------------------


@pytest.fixture
def fault_proxy(s3_env: S3Env) -> Iterator[FaultProxy]:
    """A fresh proxy per test, so no queued fault or stalled connection leaks into the next."""
    with FaultProxy(s3_env.endpoint_url) as proxy:
        yield proxy


@pytest.fixture
def proxied_s3_env(s3_env: S3Env, fault_proxy: FaultProxy) -> S3Env:
    """s3_env routed through fault_proxy: give this to the code under test."""
    return s3_env.via(fault_proxy.endpoint_url)


# ---- child-process moto ------------------------------------------------------------


@pytest.fixture(scope="session")
def moto_subprocess(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SubprocessMoto]:
    """moto in a child process, started on first use; its log stays in pytest's tmp dir."""
    log_dir: Path = tmp_path_factory.mktemp("moto-subprocess")
    with SubprocessMoto(log_dir=log_dir) as server:
        yield server


@pytest.fixture
def moto_subprocess_s3_env(moto_subprocess: SubprocessMoto) -> S3Env:
    """Like s3_env, for the child-process server."""
    moto_subprocess.reset()
    return S3Env(moto_subprocess.endpoint_url)


@pytest.fixture
def moto_subprocess_client(moto_subprocess_s3_env: S3Env) -> Iterator[BaseClient]:
    """Like s3_client, for the child-process server."""
    client = moto_subprocess_s3_env.boto3_client()
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def moto_subprocess_proxy(moto_subprocess_s3_env: S3Env) -> Iterator[FaultProxy]:
    """Like fault_proxy, in front of the child-process server."""
    with FaultProxy(moto_subprocess_s3_env.endpoint_url) as proxy:
        yield proxy


# ---- SeaweedFS ---------------------------------------------------------------------

SEAWEED_ADMIN = Identity.admin()
SEAWEED_READER = Identity.read_only()


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedFS]:
    """One SeaweedFS per session (it takes seconds to start); tests isolate by bucket."""
    with SeaweedFS(tmp_path_factory.mktemp("seaweedfs"), [SEAWEED_ADMIN, SEAWEED_READER]) as server:
        yield server


@pytest.fixture
def seaweed_admin(seaweedfs: SeaweedFS) -> S3Env:
    return seaweedfs.env(SEAWEED_ADMIN)


@pytest.fixture
def seaweed_reader(seaweedfs: SeaweedFS) -> S3Env:
    return seaweedfs.env(SEAWEED_READER)


@pytest.fixture
def seaweed_bucket(seaweed_admin: S3Env) -> str:
    """A new empty bucket; unique names keep tests apart on the shared server."""
    name = f"test-{uuid.uuid4().hex[:16]}"
    client = seaweed_admin.boto3_client()
    try:
        client.create_bucket(Bucket=name)
    finally:
        client.close()
    return name


# ---- the node daemon ---------------------------------------------------------------


@pytest.fixture
def start_daemon(tmp_path: Path) -> Iterator[Callable[..., Daemon]]:
    """Start `modelsync daemon` children on tmp_path/cache; every one is stopped after the test."""
    started: list[Daemon] = []

    def start(schedule: Path, env: dict[str, str], *extra: str) -> Daemon:
        daemon = Daemon(tmp_path / "cache", schedule, env, *extra)
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        daemon.stop()


# ---- in-process AWS credentials ----------------------------------------------------


@pytest.fixture
def aws_credentials(monkeypatch: pytest.MonkeyPatch) -> S3Env:
    """The test credentials in the standard AWS chain, for engine code called in-process.

    The engine builds its S3 client from the environment (as in production), so these
    tests must set it; monkeypatch restores every variable after the test. Any profile,
    endpoint or session variable of the machine is removed so it cannot leak in.
    """
    env = S3Env("http://unused.invalid")
    for name in [n for n in os.environ if n.startswith("AWS_ENDPOINT_URL")]:
        monkeypatch.delenv(name)
    for name in FOREIGN_AWS_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", env.access_key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", env.secret_access_key)
    monkeypatch.setenv("AWS_DEFAULT_REGION", env.region)
    monkeypatch.setenv("AWS_REGION", env.region)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return env
