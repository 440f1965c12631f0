"""A daemon's start-up tells the truth: a pool no schedule entry names, a start that fails, odd files.

Real daemon processes. A pool the schedule does not name is a warning at
every load and a 0 in `modelsync_schedule_pool_matched` (which an alert
watches); a start that fails after the socket was made removes it; whatever
is not a socket where the socket goes, or not a regular file where the
schedule is, is refused in one line without blocking and left alone.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path

import pytest
from support.cli import run_cli
from support.daemon import POOL, ConfigMapDir, Daemon, schedule_text
from support.s3env import S3Env
from support.waiting import wait_for

from modelsync.errors import ExitCode
from modelsync.local_api.client import call
from modelsync.local_api.protocol import socket_path

SOURCE = "s3://models/org/m/r1/"


def last_error_line(stderr: str) -> str:
    """A failed daemon start: logs, then one `error:` line, and no traceback."""
    assert "Traceback" not in stderr, stderr
    line = stderr.strip().splitlines()[-1]
    assert line.startswith("error: "), stderr
    return line


def test_a_pool_no_schedule_entry_names_is_a_warning_at_every_load_and_a_metric_until_fixed(
    tmp_path: Path, s3_env: S3Env, start_daemon: Callable[..., Daemon]
) -> None:
    schedule = ConfigMapDir(tmp_path / "schedule")
    schedule.write(schedule_text([("m", SOURCE, "later")]))
    daemon = start_daemon(schedule.path, s3_env.subprocess_env(), "--pool", "test-pol")

    def warnings() -> list[dict[str, object]]:
        return [e for e in daemon.logs() if e.get("code") == "pool_not_in_schedule"]

    wait_for(lambda: len(warnings()) == 1, what="the warning at the first load")
    assert warnings()[0]["level"] == "warning"
    assert "test-pol" in str(warnings()[0]["msg"]) and POOL in str(warnings()[0]["msg"])
    assert daemon.metric("modelsync_schedule_pool_matched") == 0
    schedule.write(schedule_text([("m", SOURCE, "later"), ("n", "s3://models/org/n/r1/", "later")]))
    wait_for(lambda: len(warnings()) == 2, what="the warning at the next load")
    schedule.write(schedule_text([("m", SOURCE, "later")]).replace(f"[{POOL}]", "[test-pol]"))
    wait_for(lambda: daemon.metric("modelsync_schedule_pool_matched") == 1, what="the metric once it matches")
    assert len(warnings()) == 2


def test_the_pool_alert_watches_the_metric_the_daemon_exports() -> None:
    rules = (Path(__file__).parents[1] / "manifests/components/monitoring/prometheusrule.yaml").read_text()
    assert "alert: ModelsyncPoolNotInSchedule" in rules
    assert "expr: modelsync_schedule_pool_matched == 0" in rules


def daemon_args(tmp_path: Path, listen: str = "127.0.0.1:0") -> list[str]:
    schedule = tmp_path / "schedule.yaml"
    schedule.write_text(schedule_text([("m", SOURCE, "later")]))
    return ["daemon", "--schedule", str(schedule), "--pool", POOL, "--listen", listen]


def test_a_start_that_fails_after_making_its_socket_leaves_no_socket_behind(
    tmp_path: Path, s3_env: S3Env
) -> None:
    cache = tmp_path / "cache"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_cli(s3_env.subprocess_env(), *daemon_args(tmp_path, f"127.0.0.1:{port}"), cache_dir=cache)
    assert done.returncode == ExitCode.USAGE
    assert f"cannot listen on 127.0.0.1:{port}" in last_error_line(done.stderr)
    assert not socket_path(cache).exists() and not socket_path(cache).is_symlink()


@pytest.mark.parametrize("kind", ["directory", "regular file", "named pipe", "symlink"])
def test_anything_but_a_socket_where_the_socket_goes_is_refused_in_one_line_and_left_alone(
    tmp_path: Path, s3_env: S3Env, kind: str
) -> None:
    cache = tmp_path / "cache"
    sock = socket_path(cache)
    sock.parent.mkdir(parents=True)
    target = tmp_path / "elsewhere"
    target.write_text("not the daemon's")
    make: dict[str, Callable[[], None]] = {
        "directory": sock.mkdir,
        "regular file": lambda: sock.write_text("a note"),
        "named pipe": lambda: os.mkfifo(sock),
        "symlink": lambda: sock.symlink_to(target),
    }
    make[kind]()
    before = os.lstat(sock)

    done = run_cli(s3_env.subprocess_env(), *daemon_args(tmp_path), cache_dir=cache, timeout_s=30)

    assert done.returncode == ExitCode.USAGE
    assert f"daemon.sock is a {kind}, not the daemon's socket" in last_error_line(done.stderr)
    after = os.lstat(sock)
    assert (after.st_ino, after.st_mode) == (before.st_ino, before.st_mode)
    assert target.read_text() == "not the daemon's"


@pytest.mark.parametrize("kind", ["named pipe", "directory"])
def test_a_schedule_that_is_not_a_file_is_refused_without_blocking_the_daemon(
    tmp_path: Path, s3_env: S3Env, start_daemon: Callable[..., Daemon], kind: str
) -> None:
    schedule = tmp_path / "schedule.yaml"
    if kind == "named pipe":
        os.mkfifo(schedule)
    else:
        schedule.mkdir()
    daemon = start_daemon(schedule, s3_env.subprocess_env())  # returns once it serves: nothing blocked

    refused = daemon.wait_for_log(lambda e: e.get("code") == "bad_schedule")
    assert f"the schedule is a {kind}, not a regular file" in str(refused["msg"])
    assert daemon.get("/readyz")[0] == 503
    assert call(socket_path(daemon.cache), {"op": "status"}, timeout_s=10) is not None
