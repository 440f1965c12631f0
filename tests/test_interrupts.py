"""Every command stops on SIGINT and SIGTERM the way `pull` does, caught in the middle of its work.

Each command in STOPS is started on real state (a ready model, a local model
directory, an unfinished delete) and signalled once it is provably busy: a
store that holds its answer through the fault proxy, or a child whose hashing
or deleting is slowed (tests/support/cli.py, SLOWED). It must exit 130 for
SIGINT and 143 for SIGTERM with the one `error: interrupted ...` line and no
traceback, and running the same command again must succeed. A `prefetch` that
waits on the daemon's pull is signalled the same way, with a real daemon.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from botocore.client import BaseClient
from support.cli import MODELSYNC, SLOWED, run_cli, write_model
from support.daemon import Daemon, schedule_text
from support.faultproxy import FaultProxy
from support.objects import payload, upload
from support.s3env import S3Env
from support.waiting import wait_for

from modelsync.core.refs import parse_source

pytestmark = pytest.mark.timeout(120)

KiB = 1024
MiB = 1024 * KiB
PREFIX = "org/model/rev1/"
#: files of the ready model: each above the size digest.py reads in one go, so it is hashed
#: through a memory map, the path SIGINT used to break with a BufferError
FILES = 12
FILE_BYTES = 300 * KiB
#: how long the command may take to stop once signalled
STOP_WITHIN_S = 10.0
#: each signal and the code it must exit with
EACH_SIGNAL = pytest.mark.parametrize(
    ("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["INT", "TERM"]
)


@dataclass(frozen=True, slots=True)
class Bench:
    """What one case runs against: a cache, a bucket behind the fault proxy, a scratch folder."""

    tmp: Path
    cache: Path
    #: straight to the store (the fault proxy does not relay a PUT's `Expect: 100-continue`)
    env: dict[str, str]
    proxied_env: dict[str, str]
    client: BaseClient
    bucket: str
    proxy: FaultProxy

    @property
    def source(self) -> str:
        return f"s3://{self.bucket}/{PREFIX}"

    @property
    def marker(self) -> Path:
        return self.tmp / "busy"

    def put_model(self) -> None:
        for i in range(FILES):
            self.client.put_object(
                Bucket=self.bucket, Key=f"{PREFIX}w{i:02}.bin", Body=os.urandom(FILE_BYTES)
            )

    def ready_model(self) -> None:
        self.put_model()
        done = run_cli(self.env, "pull", self.source, "-q", cache_dir=self.cache)
        assert done.returncode == 0, done.stderr

    def ready_path(self) -> Path:
        return self.cache / parse_source(self.source).cache_path

    def in_flight(self, method: str) -> bool:
        return any(not r.done for r in self.proxy.requests(PREFIX, method))


@dataclass(frozen=True, slots=True)
class Stop:
    """One command, how to make it busy, when it is, and what a second run must show."""

    id: str
    argv: tuple[str, ...]
    arrange: Callable[[Bench], None]
    busy: Callable[[Bench], bool]
    #: the system call SLOWED slows in the child ("" for none: the store is what is slow)
    slow: str = ""
    #: talks to the store through the fault proxy
    proxied: bool = False
    done: Callable[[Bench, subprocess.CompletedProcess[str]], None] = lambda bench, rerun: None


def _stalled_store(bench: Bench) -> None:
    bench.put_model()
    bench.proxy.add_fault("stall", match=PREFIX, arg=16 * KiB, times=10_000)


def _local_model(bench: Bench) -> None:
    write_model(bench.tmp / "local", {f"w{i:02}.bin": os.urandom(FILE_BYTES) for i in range(FILES)})


def _unfinished_delete(bench: Bench) -> None:
    """An evict killed while deleting: the model's files lie in the trash, for gc."""
    bench.ready_model()
    process = _start(bench, ("evict", bench.source, "--cache-dir", str(bench.cache)), "unlink", bench.env)
    try:
        _wait(lambda: bench.marker.exists(), process)
    finally:
        process.kill()
        process.communicate()
    bench.marker.unlink()


def _is_ready(bench: Bench, rerun: subprocess.CompletedProcess[str]) -> None:
    assert rerun.stdout.strip().splitlines()[-1] == str(bench.ready_path())
    assert len(list(bench.ready_path().iterdir())) == FILES


def _is_published(bench: Bench, rerun: subprocess.CompletedProcess[str]) -> None:
    listed = bench.client.list_objects_v2(Bucket=bench.bucket, Prefix=PREFIX)
    assert len(listed["Contents"]) == FILES + 1  # and the manifest


def _is_gone(bench: Bench, rerun: subprocess.CompletedProcess[str]) -> None:
    assert not bench.ready_path().exists()
    listed = run_cli(bench.env, "ls", "--json", cache_dir=bench.cache)
    assert '"models": []' in listed.stdout


def _trash_is_empty(bench: Bench, rerun: subprocess.CompletedProcess[str]) -> None:
    assert os.listdir(bench.cache / ".modelsync" / "trash") == []


STOPS = [
    Stop(
        "verify-full",
        ("verify", "--full", "--cache-dir", "{cache}"),
        Bench.ready_model,
        lambda bench: bench.marker.exists(),
        slow="hash",
        done=lambda bench, rerun: rerun.stdout.startswith("ok "),
    ),
    Stop(
        "publish",
        ("publish", "{tmp}/local", "{source}", "-q"),
        _local_model,
        lambda bench: bench.marker.exists(),
        slow="hash",
        done=_is_published,
    ),
    Stop(
        "prefetch-without-a-daemon",
        ("prefetch", "{source}", "-q", "--cache-dir", "{cache}"),
        _stalled_store,
        lambda bench: bench.in_flight("GET"),
        proxied=True,
        done=_is_ready,
    ),
    Stop(
        "evict",
        ("evict", "{source}", "--cache-dir", "{cache}"),
        Bench.ready_model,
        lambda bench: bench.marker.exists(),
        slow="unlink",
        done=_is_gone,
    ),
    Stop(
        "gc",
        ("gc", "--older-than", "0s", "--cache-dir", "{cache}"),
        _unfinished_delete,
        lambda bench: bench.marker.exists(),
        slow="unlink",
        done=_trash_is_empty,
    ),
]


def _start(bench: Bench, argv: tuple[str, ...], slow: str, env: dict[str, str]) -> subprocess.Popen[str]:
    start = (sys.executable, "-c", SLOWED) if slow else MODELSYNC
    env = {**env, "SLOWED_CALL": slow, "SLOWED_MARKER": str(bench.marker)}
    return subprocess.Popen(
        [*start, *argv], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _wait(condition: Callable[[], bool], process: subprocess.Popen[str], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert process.poll() is None, f"it ended before it was busy: {process.communicate()}"
        assert time.monotonic() < deadline, "not busy in time"
        time.sleep(0.02)


def assert_stops_on(process: subprocess.Popen[str], signum: int, code: int, once: Callable[[], None]) -> None:
    """Signal `process` once `once()` returns: it must exit with `code` and the one interrupt line."""
    try:
        once()
        process.send_signal(signum)
        _, err = process.communicate(timeout=STOP_WITHIN_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    name = signal.Signals(signum).name
    assert (process.returncode, err.strip().splitlines()) == (
        code,
        [f"error: interrupted by {name}; completed work is kept, run the command again to resume"],
    )


@EACH_SIGNAL
@pytest.mark.parametrize("stop", STOPS, ids=[s.id for s in STOPS])
def test_a_busy_command_stops_on_a_signal_with_one_line_and_its_code_and_a_rerun_succeeds(
    stop: Stop,
    signum: int,
    code: int,
    tmp_path: Path,
    s3_env: S3Env,
    proxied_s3_env: S3Env,
    fault_proxy: FaultProxy,
    s3_client: BaseClient,
    bucket: str,
) -> None:
    bench = Bench(
        tmp_path,
        tmp_path / "cache",
        s3_env.subprocess_env(),
        proxied_s3_env.subprocess_env(),
        s3_client,
        bucket,
        fault_proxy,
    )
    stop.arrange(bench)
    argv = tuple(a.format(cache=bench.cache, tmp=bench.tmp, source=bench.source) for a in stop.argv)
    env = bench.proxied_env if stop.proxied else bench.env
    process = _start(bench, argv, stop.slow, env)

    def busy() -> None:
        _wait(lambda: stop.busy(bench), process)
        time.sleep(0.2)  # well inside the work, past its first step

    assert_stops_on(process, signum, code, once=busy)
    fault_proxy.clear()
    rerun = run_cli(env, *argv)
    assert rerun.returncode == 0, rerun.stderr
    assert "Traceback" not in rerun.stderr
    stop.done(bench, rerun)


@EACH_SIGNAL
def test_a_prefetch_waiting_on_the_daemon_stops_on_a_signal_and_a_rerun_gets_the_path(
    signum: int, code: int, tmp_path: Path, s3_env: S3Env, start_daemon: Callable[..., Daemon]
) -> None:
    """The daemon goes on with the model; the rerun waits for it again and prints its path."""
    ref = upload(s3_env, "models", "org/slow/r1/", {"weights.bin": payload(6 * MiB, 7)})
    schedule = tmp_path / "schedule.yaml"
    schedule.write_text(schedule_text([]))
    env = s3_env.subprocess_env()
    # 1 MiB parts one at a time: the daemon reports its first bytes after about a second and pulls
    # for five more, so the signal reaches the prefetch while it waits. With the whole 6 MiB in one
    # part, the first bytes were reported as the pull ended, and a pull that was ready tens of
    # milliseconds later (the hash done as the bytes came) could answer the prefetch first.
    daemon = start_daemon(
        schedule, env, "--allow", "s3://models/org/", "--max-bandwidth", "1Mi/s",
        "--part-size", "1Mi", "--concurrency", "1",
    )  # fmt: skip
    argv = ("prefetch", ref.uri, "--cache-dir", str(daemon.cache))
    process = subprocess.Popen(
        [*MODELSYNC, *argv], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    fetched = "modelsync_fetched_bytes_total"
    assert_stops_on(
        process, signum, code, once=lambda: wait_for(lambda: (daemon.metric(fetched) or 0) > 0, "its pull")
    )
    rerun = run_cli(env, *argv)
    assert rerun.returncode == 0, rerun.stderr
    assert rerun.stdout.strip() == str(daemon.cache / ref.cache_path)
