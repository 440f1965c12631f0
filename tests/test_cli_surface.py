"""The command line around the mistakes of tests/test_cli_errors.py: the neighbouring cases that must work.

Rates with `/s` in flags and variables, a bad variable that only the commands using it
notice, read-only commands that never create a cache, a dry run that shows what blocks
it, publish progress, schedule names, JSON output, counts in English, and the demo.
All through the real CLI against moto.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import ssl
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from botocore.client import BaseClient
from botocore.exceptions import SSLError
from support.cli import run_cli
from support.s3env import S3Env

from modelsync.adapters.store.sdk import open_s3
from modelsync.adapters.store.sdk_errors import s3_errors
from modelsync.config import Settings
from modelsync.errors import ConfigError, ExitCode, UsageError

MiB = 1024 * 1024
Run = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "cache"


@pytest.fixture
def cli(child_env: dict[str, str]) -> Run:
    """`modelsync ARGS...` in a child process on moto; `env=` adds variables. Nothing is in use for long."""
    base = {**child_env, "MODELSYNC_IN_USE_GRACE": "0"}

    def invoke(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return run_cli({**base, **(env or {})}, *args, timeout_s=120)

    return invoke


@pytest.fixture
def model(s3_client: BaseClient, bucket: str) -> Callable[[str], str]:
    """Upload a small model under `prefix`; its s3:// URI."""

    def put(prefix: str) -> str:
        s3_client.put_object(Bucket=bucket, Key=f"{prefix}/weights.bin", Body=os.urandom(MiB))
        s3_client.put_object(Bucket=bucket, Key=f"{prefix}/config.json", Body=prefix.encode())
        return f"s3://{bucket}/{prefix}/"

    return put


def one_error(done: subprocess.CompletedProcess[str], code: ExitCode) -> str:
    assert done.returncode == int(code), done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


def test_rates_take_a_per_second_suffix_in_flags_and_variables(
    cli: Run, cache: Path, model: Callable[[str], str]
) -> None:
    first, second = model("org/a/1"), model("org/b/1")

    by_flag = cli("pull", first, "--cache-dir", str(cache), "-q", "--max-bandwidth", "500Mi/s")
    by_variable = cli(
        "pull", second, "--cache-dir", str(cache), "-q", env={"MODELSYNC_MAX_BANDWIDTH": "500Mi/s"}
    )

    assert by_flag.returncode == 0, by_flag.stderr
    assert by_variable.returncode == 0, by_variable.stderr
    assert cli("plan", "--help").returncode == 0


def test_a_bad_variable_stops_only_the_commands_that_use_it(
    cli: Run, cache: Path, model: Callable[[str], str]
) -> None:
    uri = model("org/a/1")
    assert cli("pull", uri, "--cache-dir", str(cache), "-q").returncode == 0
    bad = {"MODELSYNC_MAX_BANDWIDTH": "fast", "MODELSYNC_PART_SIZE": "0"}

    for command in (["ls"], ["gc", "--dry-run"], ["verify"], ["evict", "--unused-for", "7d", "--dry-run"]):
        done = cli(*command, "--cache-dir", str(cache), env=bad)
        assert done.returncode == 0, (command, done.stderr)
        assert done.stderr == ""
    refused = cli("pull", model("org/b/1"), "--cache-dir", str(cache), "-q", env=bad)
    assert "environment variable MODELSYNC_" in one_error(refused, ExitCode.USAGE)


def test_read_only_commands_on_a_directory_without_a_cache_say_so_and_create_nothing(
    cli: Run, tmp_path: Path
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    for command in (["ls"], ["verify"], ["gc"], ["evict", "--to-size", "1G"], ["pin", "models/org/m"]):
        done = cli(*command, "--cache-dir", str(empty))
        assert f"no modelsync cache at {empty}" in one_error(done, ExitCode.NOT_FOUND), command
    assert list(empty.iterdir()) == []


def test_a_pull_creates_the_cache_and_ls_counts_in_english(
    cli: Run, cache: Path, model: Callable[[str], str]
) -> None:
    assert cli("pull", model("org/a/1"), "--cache-dir", str(cache), "-q").returncode == 0

    listing = cli("ls", "--cache-dir", str(cache))

    assert listing.returncode == 0, listing.stderr
    assert listing.stdout.splitlines()[-1].startswith("1 model, ")
    assert cli("gc", "--cache-dir", str(cache)).stdout.splitlines()[-1] == "removed 0 leftovers"


def test_evict_dry_run_blocked_by_a_pin_prints_the_partial_plan_and_what_blocks_it(
    cli: Run, cache: Path, model: Callable[[str], str], bucket: str
) -> None:
    pinned, other = model("org/pinned/1"), model("org/other/1")
    for uri in (pinned, other):
        assert cli("pull", uri, "--cache-dir", str(cache), "-q").returncode == 0
    assert cli("pin", pinned, "--cache-dir", str(cache)).returncode == 0

    dry = cli("evict", "--to-size", "0", "--dry-run", "--cache-dir", str(cache))
    as_json = cli("evict", "--to-size", "0", "--dry-run", "--json", "--cache-dir", str(cache))
    real = cli("evict", "--to-size", "0", "--cache-dir", str(cache))

    line = one_error(dry, ExitCode.USAGE)
    assert "cannot free" in line and f"{bucket}/org/pinned/1 (pinned)" in line
    assert f"  evict {bucket}/org/other/1" in dry.stdout.splitlines()
    assert f"  keep {bucket}/org/pinned/1: pinned" in dry.stdout.splitlines()
    one_error(as_json, ExitCode.USAGE)
    doc = json.loads(as_json.stdout)
    assert doc["satisfied"] is False and doc["victims"] == [f"{bucket}/org/other/1"]
    assert doc["protected"] == [{"model": f"{bucket}/org/pinned/1", "reason": "pinned"}]
    one_error(real, ExitCode.USAGE)
    assert real.stdout == ""
    listing = json.loads(cli("ls", "--json", "--cache-dir", str(cache)).stdout)
    assert len(listing["models"]) == 2, "a refused eviction evicted something"


def test_publish_shows_progress_and_a_final_line_and_quiet_silences_it(
    cli: Run, tmp_path: Path, bucket: str
) -> None:
    directory = tmp_path / "model"
    directory.mkdir()
    (directory / "weights.bin").write_bytes(os.urandom(6 * MiB))
    (directory / "config.json").write_text("{}")

    loud = cli("publish", str(directory), f"s3://{bucket}/org/m/1/", "--part-size", "5Mi")
    quiet = cli("publish", str(directory), f"s3://{bucket}/org/m/2/", "-q")

    assert loud.returncode == 0, loud.stderr
    lines = loud.stderr.splitlines()
    assert lines[0] == f"s3://{bucket}/org/m/1/: 2 files, 6.0 MiB to upload"
    assert "6.0 MiB/6.0 MiB 100.0%" in lines[-2] and " in " in lines[-2]
    assert lines[-1] == f"published 2 files (6.0 MiB) to s3://{bucket}/org/m/1/"
    assert loud.stdout == f"s3://{bucket}/org/m/1/\n"
    assert quiet.returncode == 0 and quiet.stderr == ""


def test_a_pull_without_a_terminal_ends_its_log_with_a_final_line(
    cli: Run, cache: Path, model: Callable[[str], str]
) -> None:
    done = cli("pull", model("org/a/1"), "--cache-dir", str(cache))

    assert done.returncode == 0, done.stderr
    last = done.stderr.splitlines()[-1]
    assert "1.0 MiB/1.0 MiB 100.0%" in last and "/s in " in last
    assert "\r" not in done.stderr and "\x1b" not in done.stderr


def test_prefetch_resolves_a_name_of_the_schedule(
    cli: Run, cache: Path, tmp_path: Path, model: Callable[[str], str]
) -> None:
    uri = model("org/named/1")
    schedule = tmp_path / "schedule.yaml"
    schedule.write_text(
        f"version: 1\nmodels:\n  - name: named\n    source: {uri}\n    pools: [p]\n    windows: [always]\n"
    )

    done = cli("prefetch", "--schedule", str(schedule), "named", "--cache-dir", str(cache), "-q")

    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [str(cache / uri.removeprefix("s3://").rstrip("/"))]


def test_report_commands_print_json(cli: Run, cache: Path, model: Callable[[str], str], bucket: str) -> None:
    assert cli("pull", model("org/a/1"), "--cache-dir", str(cache), "-q").returncode == 0

    verify = json.loads(cli("verify", "--json", "--cache-dir", str(cache)).stdout)
    gc = json.loads(cli("gc", "--json", "--dry-run", "--cache-dir", str(cache)).stdout)
    evict = json.loads(cli("evict", f"{bucket}/org/a/1", "--json", "--cache-dir", str(cache)).stdout)

    assert verify["models"] == [{"model": f"{bucket}/org/a/1", "busy": False, "problems": []}]
    assert gc["dry_run"] is True and gc["leftovers"] == []
    assert evict == {"evicted": [f"{bucket}/org/a/1"], "skipped": []}


def test_a_missing_aws_profile_is_a_configuration_error(
    aws_credentials: S3Env, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The daemon logs a ModelsyncError with its code: `bad_config`, not a bug with a traceback."""
    config = tmp_path / "aws-config"
    config.write_text("[profile known]\nregion = us-east-1\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_PROFILE", "nosuchprofile")

    async def open_it() -> None:
        async with open_s3(Settings(endpoint_url="http://127.0.0.1:9")):
            pass

    with pytest.raises(ConfigError) as caught:
        asyncio.run(open_it())
    assert caught.value.code == "bad_config"
    assert "'nosuchprofile'" in str(caught.value) and "known" in str(caught.value)


def test_the_demo_does_not_end_on_a_path_it_deleted(cli: Run) -> None:
    done = cli("demo")

    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    last = done.stderr.splitlines()[-1]
    assert last.startswith("demo: removed ") and "--keep" in last
    assert not Path(last.split()[2]).exists()


def test_the_demo_with_keep_ends_on_the_ready_path_it_kept(cli: Run) -> None:
    done = cli("demo", "--keep")

    assert done.returncode == 0, done.stderr
    ready = Path(done.stdout.splitlines()[-1])
    kept = done.stderr.splitlines()[-1]
    cache = Path(kept.rsplit("--cache-dir ", 1)[1])
    try:
        assert kept.startswith(f"demo: kept the model and the cache in {cache.parent};")
        assert (ready / "config.json").is_file() and ready.is_relative_to(cache)
        listing = cli("ls", "--cache-dir", str(cache))
        assert listing.returncode == 0 and listing.stdout.splitlines()[-1].startswith("1 model, ")
    finally:
        if cache.parent.name.startswith("modelsync-demo-"):
            shutil.rmtree(cache.parent, ignore_errors=True)


@pytest.mark.parametrize(
    ("reason", "advice"),
    [
        ("WRONG_VERSION_NUMBER", "speaks plain HTTP"),
        ("RECORD_LAYER_FAILURE", "speaks plain HTTP"),
        ("CERTIFICATE_VERIFY_FAILED", "AWS_CA_BUNDLE"),
        (None, "AWS_CA_BUNDLE"),
    ],
)
def test_a_tls_failure_is_told_apart_by_openssls_reason(reason: str | None, advice: str) -> None:
    """The plain-HTTP case also runs for real in the mistakes table; a bad certificate keeps its advice."""
    with pytest.raises(UsageError, match=advice), s3_errors("listing s3://b/p/", "b"):
        raise SSLError(endpoint_url="https://127.0.0.1:9", error=ssl_error(reason))


def ssl_error(reason: str | None) -> ssl.SSLError:
    error = ssl.SSLError(1, f"[SSL: {reason}] handshake failed")
    error.reason = reason  # set by OpenSSL on a real failure
    return error
