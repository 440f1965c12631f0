"""Stopping a pull while every transfer hangs: a cancel event, SIGINT, SIGTERM.

The fault proxy stalls every data GET after a few bytes and the read timeout is
the default 30 s, so only shutting the sockets down can make these stops fast.
Each stop must leave the journal, and a rerun must resume from it.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from botocore.client import BaseClient
from support.engine import pull
from support.faultproxy import FaultProxy
from support.s3env import S3Env

from modelsync.adapters.cache import STATE_DIR, Cache
from modelsync.config import Settings
from modelsync.core.refs import parse_source
from modelsync.engine.events import NoEvents
from modelsync.errors import PullCancelledError

pytestmark = pytest.mark.timeout(90)

MiB = 1024 * 1024
PREFIX = "org/stalled/rev1/"
NAME = "weights.bin"
SIZE = 8 * MiB
CONCURRENCY = 4
#: "within 1 s" from the issue; the figure is measured and printed, the bound leaves no slack
STOP_WITHIN_S = 1.0


def payload() -> bytes:
    return bytes(range(256)) * (SIZE // 256)


def stall_every_get(proxy: FaultProxy) -> None:
    proxy.add_fault("stall", match=NAME, arg=64 * 1024, times=10_000)


def wait_for_stalls(proxy: FaultProxy, count: int, timeout_s: float = 30) -> None:
    """Until `count` data GETs are hanging mid-body."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        hanging = [r for r in proxy.requests(NAME, "GET") if r.body_bytes_sent > 0 and not r.done]
        if len(hanging) >= count:
            time.sleep(0.3)  # the receivers are now blocked in recv
            return
        time.sleep(0.02)
    raise AssertionError(f"fewer than {count} stalled GETs: {proxy.requests(NAME)}")


def journals(cache: Path) -> list[Path]:
    return list((cache / STATE_DIR / "staging").glob("*.journal"))


@pytest.fixture
def stalled_model(s3_client: BaseClient, bucket: str) -> str:
    s3_client.put_object(Bucket=bucket, Key=PREFIX + NAME, Body=payload())
    return f"s3://{bucket}/{PREFIX}"


def test_a_cancelled_pull_returns_within_a_second_while_every_transfer_is_stalled(
    tmp_path: Path, proxied_s3_env: S3Env, fault_proxy: FaultProxy, aws_credentials: S3Env, stalled_model: str
) -> None:
    settings = Settings(
        cache_dir=tmp_path / "cache",
        endpoint_url=proxied_s3_env.endpoint_url,
        part_size_bytes=MiB,
        concurrency=CONCURRENCY,
        read_timeout_s=30.0,
    )
    stall_every_get(fault_proxy)
    cancel = threading.Event()
    outcome: list[BaseException] = []
    stopped_at: list[float] = []

    def run() -> None:
        try:
            pull(settings, parse_source(stalled_model), NoEvents(), cancel=cancel)
        except BaseException as exc:
            outcome.append(exc)
        stopped_at.append(time.monotonic())

    worker = threading.Thread(target=run)
    worker.start()
    wait_for_stalls(fault_proxy, CONCURRENCY)
    cancelled_at = time.monotonic()
    cancel.set()
    worker.join(30)

    assert not worker.is_alive()
    took_s = stopped_at[0] - cancelled_at
    print(f"cancelled pull returned {took_s:.3f} s after the cancel")
    assert took_s < STOP_WITHIN_S
    assert isinstance(outcome[0], PullCancelledError)
    assert journals(settings.cache_dir)


def cli_pull(env: dict[str, str], source: str, cache: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "modelsync", "pull", source, "--quiet", "--part-size", "1Mi",
         "--concurrency", str(CONCURRENCY), "--cache-dir", str(cache)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def stop_and_time(process: subprocess.Popen[str], signum: int) -> tuple[float, str]:
    sent_at = time.monotonic()
    process.send_signal(signum)
    try:
        _, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    return time.monotonic() - sent_at, err


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_stalled_cli_pull_stops_within_a_second_of_a_signal_and_a_rerun_resumes(
    tmp_path: Path,
    s3_env: S3Env,
    proxied_s3_env: S3Env,
    fault_proxy: FaultProxy,
    stalled_model: str,
    signum: int,
    code: int,
) -> None:
    cache = tmp_path / "cache"
    env = proxied_s3_env.subprocess_env()
    env["MODELSYNC_READ_TIMEOUT"] = "30"
    # Two parts arrive whole, then every GET hangs: the journal has something to resume.
    fault_proxy.add_fault("delay", match=NAME, arg=0, times=2)
    stall_every_get(fault_proxy)
    process = cli_pull(env, stalled_model, cache)
    wait_for_stalls(fault_proxy, CONCURRENCY)

    took_s, err = stop_and_time(process, signum)

    print(f"{signal.Signals(signum).name}: the CLI exited {took_s:.3f} s after the signal")
    assert took_s < STOP_WITHIN_S
    assert process.returncode == code
    name = signal.Signals(signum).name
    assert err.strip().splitlines() == [
        f"error: interrupted by {name}; completed work is kept, run the command again to resume"
    ]
    assert journals(cache)
    assert not (cache / stalled_model.removeprefix("s3://")).exists()

    fault_proxy.clear()
    resumed = subprocess.run(
        [sys.executable, "-m", "modelsync", "pull", stalled_model, "--quiet", "--part-size", "1Mi",
         "--cache-dir", str(cache)],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    assert Path(resumed.stdout.strip(), NAME).read_bytes() == payload()
    # The two parts that arrived before the stall were not fetched again.
    assert fault_proxy.bytes_sent(NAME) <= SIZE - 2 * MiB


def test_sigterm_stops_a_cli_pull_waiting_for_another_pullers_lock(
    tmp_path: Path, s3_env: S3Env, stalled_model: str
) -> None:
    """As PID 1 of a Job, SIGTERM would be ignored without a handler; any wait must end on it."""
    cache = tmp_path / "cache"
    holder = Cache(cache)
    holder.ensure()
    lock = holder.lock(parse_source(stalled_model))
    lock.acquire()
    try:
        process = cli_pull(s3_env.subprocess_env(), stalled_model, cache)
        time.sleep(2.0)  # the child is past its imports and waits for the lock
        assert process.poll() is None
        took_s, err = stop_and_time(process, signal.SIGTERM)
    finally:
        lock.release()
    assert took_s < STOP_WITHIN_S
    assert process.returncode == 143
    assert err.strip().splitlines()[-1].startswith("error: interrupted by SIGTERM")


def test_exit_codes_of_interruptions_are_documented() -> None:
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    assert "| 130 |" in readme and "| 143 |" in readme
