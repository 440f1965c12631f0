"""Tenant pods pull through the node daemon: a real daemon process, a real read-only mount, no credentials.

The tenant runs in its own mount namespace (`unshare --mount`) where the cache
is bind-mounted read-only over itself, as a pod's `readOnly: true` hostPath
mount is, with an environment that holds no AWS variable and a HOME without
shared credential files. The daemon runs beside it with the test credentials.
Also here: the daemon's allow-list (schedule sources plus --allow prefixes)
and the CA bundle that holds no certificate.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from support.cli import run_cli
from support.daemon import Daemon, schedule_text
from support.objects import payload, upload
from support.other_users import OtherUser
from support.s3env import S3Env
from support.waiting import wait_for

from modelsync.adapters.cache import Cache
from modelsync.core.refs import parse_source
from modelsync.errors import ExitCode, NotFoundError, SourceNotAllowedError
from modelsync.local_api.client import pull_via_daemon

MiB = 1024 * 1024
SCHEDULED = "s3://models/org/served/r1/"
UNLISTED = "s3://models/org/unlisted/r1/"
EXTRA = "s3://models/extra/m/r1/"

needs_mount_namespace = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="a read-only bind mount needs root and unshare",
)

#: in a private mount namespace: make the cache read-only, record the environment, prove writes fail, run
_TENANT = """
set -e
if [ "$VIEW" != "$CACHE" ]; then mount -t tmpfs tenant-view "${VIEW%/*}"; mkdir -p "$VIEW"; fi
mount --bind "$CACHE" "$VIEW"
mount -o remount,bind,ro "$VIEW"
env > "$ENV_DUMP"
if touch "$VIEW/.tenant-probe" 2>/dev/null; then echo "the cache is writable" >&2; exit 99; fi
exec "$@"
"""


def tenant(
    cache: Path, home: Path, *args: str, as_user: tuple[str, ...] = (), view: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run modelsync as a tenant: the cache read-only at `view` (default: its own path), no AWS setting.

    A `view` elsewhere (a tmpfs of the namespace) lets a non-root `as_user` reach the cache
    without opening up the test's private temporary directories."""
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "MODELSYNC_CACHE_DIR": str(view or cache),
        "CACHE": str(cache),
        "VIEW": str(view or cache),
        "ENV_DUMP": str(home / "env"),
    }
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", _TENANT, "tenant",
         *as_user, sys.executable, "-m", "modelsync", *args],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )


def one_error_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert "Traceback" not in stderr
    return lines[0]


@pytest.fixture
def served(tmp_path: Path, moto_subprocess_s3_env: S3Env, start_daemon: Callable[..., Daemon]) -> Daemon:
    """A daemon whose schedule lists SCHEDULED (window later today) and that allows s3://models/extra/."""
    env = moto_subprocess_s3_env
    for source, seed in ((SCHEDULED, 1), (UNLISTED, 2), (EXTRA, 3)):
        ref = parse_source(source)
        upload(env, ref.bucket, ref.prefix, {"weights.bin": payload(2 * MiB, seed), "config.json": b"{}"})
    schedule = tmp_path / "schedule.yaml"
    schedule.write_text(schedule_text([("served", SCHEDULED, "later")]))
    return start_daemon(schedule, env.subprocess_env(), "--allow", "s3://models/extra/")


@needs_mount_namespace
@pytest.mark.root
def test_tenant_pull_through_a_read_only_mount_is_served_by_the_daemon_without_credentials(
    tmp_path: Path, served: Daemon
) -> None:
    home = tmp_path / "tenant-home"
    home.mkdir()
    started = time.time()
    done = tenant(served.cache, home, "pull", SCHEDULED, "--lease", "1h")
    assert done.returncode == 0, done.stderr
    ref = parse_source(SCHEDULED)
    path = served.cache / "models/org/served/r1"
    assert done.stdout.strip().splitlines()[-1] == str(path)
    assert (path / "weights.bin").read_bytes() == payload(2 * MiB, 1)
    environment = (home / "env").read_text()
    assert "AWS_" not in environment, "the tenant process must hold no AWS setting"
    assert not (served.cache / ".tenant-probe").exists()
    cache = Cache(served.cache)
    until = cache.lease_until(ref)
    assert until is not None and started + 3600 - 5 <= until <= time.time() + 3600 + 5, "the daemon leased it"
    assert (cache.last_used(ref) or 0) >= started - 1, "the daemon recorded the use"

    again = tenant(served.cache, home, "pull", SCHEDULED)
    assert again.returncode == 0 and again.stdout.strip() == str(path), again.stderr

    extra = tenant(served.cache, home, "pull", EXTRA)
    assert extra.returncode == 0, extra.stderr
    assert (served.cache / "models/extra/m/r1/weights.bin").read_bytes() == payload(2 * MiB, 3)


@needs_mount_namespace
@pytest.mark.root
def test_a_tenant_init_container_pulls_by_the_schedules_name_with_no_keys_and_gets_the_ready_path(
    tmp_path: Path, served: Daemon
) -> None:
    home = tmp_path / "tenant-home"
    home.mkdir()
    done = tenant(served.cache, home, "pull", "served", "--lease", "1h")
    assert done.returncode == 0, done.stderr
    path = served.cache / "models/org/served/r1"
    assert done.stdout.strip().splitlines()[-1] == str(path)
    assert (path / "weights.bin").read_bytes() == payload(2 * MiB, 1)
    assert Cache(served.cache).lease_until(parse_source(SCHEDULED)) is not None, "the daemon leased it"
    unknown = tenant(served.cache, home, "pull", "unserved")
    assert unknown.returncode == ExitCode.NOT_ALLOWED
    assert "no model named 'unserved'; its names are served" in one_error_line(unknown.stderr)


@needs_mount_namespace
@pytest.mark.root
def test_tenant_pull_of_a_source_outside_the_allow_list_is_refused_with_exit_8(
    tmp_path: Path, served: Daemon
) -> None:
    home = tmp_path / "tenant-home"
    home.mkdir()
    refused = tenant(served.cache, home, "pull", UNLISTED)
    assert refused.returncode == ExitCode.NOT_ALLOWED == 8
    line = one_error_line(refused.stderr)
    assert UNLISTED in line and "not in the schedule" in line and "MODELSYNC_ALLOWED_PREFIXES" in line
    assert not (served.cache / "models/org/unlisted").exists()
    assert served.wait_for_log(lambda e: e.get("code") == "not_allowed")


@needs_mount_namespace
@pytest.mark.root
def test_tenant_pull_with_no_daemon_fails_in_one_line_unless_the_model_is_already_ready(
    tmp_path: Path, served: Daemon
) -> None:
    home = tmp_path / "tenant-home"
    home.mkdir()
    assert tenant(served.cache, home, "pull", SCHEDULED).returncode == 0
    assert served.stop()[0] == 0
    warm = tenant(served.cache, home, "pull", SCHEDULED)
    assert warm.returncode == 0 and warm.stdout.strip() == str(served.cache / "models/org/served/r1")
    assert "not recorded" in warm.stderr
    cold = tenant(served.cache, home, "pull", EXTRA)
    assert cold.returncode == ExitCode.LOCAL_STORAGE
    assert "read-only" in one_error_line(cold.stderr)


def test_daemon_refuses_prefetch_of_an_unlisted_source_and_serves_scheduled_and_allowed_ones(
    tmp_path: Path, served: Daemon, moto_subprocess_s3_env: S3Env
) -> None:
    env = moto_subprocess_s3_env.subprocess_env()
    cache = ["--cache-dir", str(served.cache)]
    staged = {"model": "models/org/served/r1", "name": "served", "variant": ""}
    wait_for(lambda: served.metric("modelsync_model_staged", **staged) == 0, what="the gauge shows it cold")
    refused = run_cli(env, "prefetch", UNLISTED, *cache)
    assert refused.returncode == ExitCode.NOT_ALLOWED
    assert "not in the schedule" in one_error_line(refused.stderr)
    # One refused model refuses the whole request: nothing of it is queued.
    mixed = run_cli(env, "prefetch", SCHEDULED, UNLISTED, *cache)
    assert mixed.returncode == ExitCode.NOT_ALLOWED
    for source in (SCHEDULED, EXTRA):
        ok = run_cli(env, "prefetch", source, *cache)
        assert ok.returncode == 0, ok.stderr
    assert not (served.cache / "models/org/unlisted").exists()
    wait_for(lambda: served.metric("modelsync_model_staged", **staged) == 1, what="the gauge shows it warm")


def test_errors_from_the_daemon_arrive_as_their_own_class_so_callers_catch_them_by_type(
    served: Daemon,
) -> None:
    with pytest.raises(SourceNotAllowedError) as refused:
        pull_via_daemon(served.cache, parse_source(UNLISTED), None)
    assert refused.value.exit_code == ExitCode.NOT_ALLOWED
    assert "not in the schedule" in str(refused.value)
    # allowed, but the store has nothing under it: the engine's NotFoundError, in the daemon's process
    with pytest.raises(NotFoundError) as missing:
        pull_via_daemon(served.cache, parse_source("s3://models/extra/absent/r1/"), None)
    assert missing.value.exit_code == ExitCode.NOT_FOUND
    assert "extra/absent/r1" in str(missing.value)


def test_daemon_refuses_a_malformed_allowed_prefix_at_start(
    tmp_path: Path, moto_subprocess_s3_env: S3Env
) -> None:
    schedule = tmp_path / "schedule.yaml"
    schedule.write_text(schedule_text([]))
    done = run_cli(
        moto_subprocess_s3_env.subprocess_env(), "daemon", "--schedule", str(schedule), "--pool", "p",
        "--listen", "127.0.0.1:0", "--cache-dir", str(tmp_path / "cache"), "--allow", "models/org",
    )
    assert done.returncode == ExitCode.USAGE
    assert "not an s3:// URI" in one_error_line(done.stderr)


@pytest.mark.parametrize("command", ["pull", "daemon"])
def test_a_ca_bundle_without_a_certificate_is_one_configuration_line_and_exit_2(
    tmp_path: Path, moto_subprocess_s3_env: S3Env, command: str
) -> None:
    placeholder = tmp_path / "ca.crt"
    placeholder.write_text("# REPLACE_WITH_PRIVATE_CA_PEM\n")
    env = moto_subprocess_s3_env.subprocess_env() | {"AWS_CA_BUNDLE": str(placeholder)}
    schedule = tmp_path / "schedule.yaml"
    schedule.write_text(schedule_text([]))
    args = {
        "pull": ["pull", SCHEDULED],
        "daemon": ["daemon", "--schedule", str(schedule), "--pool", "p", "--listen", "127.0.0.1:0"],
    }[command]
    done = run_cli(env, *args, "--cache-dir", str(tmp_path / "cache"))
    assert done.returncode == ExitCode.USAGE
    line = one_error_line(done.stderr)
    assert "AWS_CA_BUNDLE" in line and "holds no PEM certificate" in line and str(placeholder) in line


@needs_mount_namespace
@pytest.mark.root
def test_a_tenants_cold_pull_preempts_the_daemons_background_prefetch_which_resumes_later(
    tmp_path: Path, moto_subprocess_s3_env: S3Env, start_daemon: Callable[..., Daemon]
) -> None:
    env = moto_subprocess_s3_env
    slow = parse_source("s3://models/org/slow/r1/")
    upload(env, slow.bucket, slow.prefix, {"slow.bin": payload(32 * MiB, 4)})
    extra = parse_source(EXTRA)
    upload(env, extra.bucket, extra.prefix, {"weights.bin": payload(2 * MiB, 3)})
    schedule = tmp_path / "schedule.yaml"
    schedule.write_text(schedule_text([("slow", slow.uri, "soon")]))
    daemon = start_daemon(
        schedule, env.subprocess_env(), "--allow", "s3://models/extra/", "--max-bandwidth", "2Mi/s",
        "--part-size", "1Mi",
    )
    fetched = "modelsync_fetched_bytes_total"
    wait_for(lambda: (daemon.metric(fetched) or 0) > 0, what="the background prefetch")
    home = tmp_path / "tenant-home"
    home.mkdir()
    done = tenant(daemon.cache, home, "pull", EXTRA)
    assert done.returncode == 0, done.stderr
    assert not (daemon.cache / "models/org/slow/r1").exists(), "the tenant did not wait for the slow model"
    daemon.wait_for_log(lambda e: "yields to a waiting pod's pull" in str(e.get("msg")))
    def starts() -> int:
        return sum(str(e.get("msg")).startswith("prefetch slow") for e in daemon.logs())

    wait_for(lambda: starts() >= 2, what="the background prefetch resumes")


#: a user outside the cache's group
STRANGER = OtherUser(10002)


@STRANGER.needs_the_checkout
@needs_mount_namespace
@pytest.mark.root
def test_a_tenant_outside_the_cache_group_is_told_to_add_it_in_one_line(
    tmp_path: Path, served: Daemon
) -> None:
    home = tmp_path / "tenant-home"  # the stranger cannot reach it, and needs not
    home.mkdir()
    view = Path("/mnt/model-cache")
    done = tenant(served.cache, home, "pull", SCHEDULED, as_user=STRANGER.setpriv, view=view)
    assert done.returncode == ExitCode.LOCAL_STORAGE, done.stderr
    line = one_error_line(done.stderr)
    assert "/mnt/model-cache/.modelsync/daemon.sock" in line and "supplementalGroups" in line
