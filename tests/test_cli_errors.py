"""The command-line contract of `modelsync pull`, checked on the real CLI in a child process.

Each user error prints exactly one line on stderr, starting `error: `, exits with
the documented code (modelsync.errors.ExitCode) and never shows a traceback or a
secret. On success the last line of stdout is the absolute ready path, and a warm
pull needs neither the network nor the S3 stack.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from botocore.client import BaseClient
from support.faultproxy import FaultProxy
from support.motoserver import SubprocessMoto
from support.s3env import S3Env

from modelsync.core.refs import parse_source
from modelsync.core.units import format_bytes
from modelsync.errors import ExitCode

MiB = 1024 * 1024
PREFIX = "org/model/rev1/"
WRONG_ACCESS_KEY = "AKIAWRONGKEY00000000"
WRONG_SECRET = "wr0ng-S3cret-must-never-be-printed-7f3a"

# Runs the CLI like the console script, then reports on stderr whether the S3 stack
# was imported; the extra line comes after the CLI's own output.
REPORT_IMPORTS = (
    "import sys\n"
    "from modelsync.__main__ import main\n"
    "try:\n"
    "    main()\n"
    "finally:\n"
    "    sys.stderr.write('aiobotocore imported: %s\\n' % ('aiobotocore' in sys.modules))\n"
)
# Runs the CLI with posix_fallocate failing with ENOSPC, as on a full volume.
NO_SPACE = (
    "import errno, os\n"
    "def no_space(*args):\n"
    "    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))\n"
    "os.posix_fallocate = no_space\n"
    "from modelsync.__main__ import main\n"
    "main()\n"
)


def run_cli(
    args: list[str], env: dict[str, str], code: str | None = None
) -> subprocess.CompletedProcess[str]:
    prefix = [sys.executable, "-c", code, "pull"] if code else [sys.executable, "-m", "modelsync", "pull"]
    return subprocess.run([*prefix, *args], env=env, capture_output=True, text=True, timeout=90)


def assert_user_error(done: subprocess.CompletedProcess[str], code: ExitCode, *mentions: str) -> str:
    """Exactly one `error: ` line on stderr, the documented code, no traceback."""
    lines = done.stderr.splitlines()
    assert done.returncode == int(code), done.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert "Traceback" not in done.stderr + done.stdout
    assert done.stdout == ""
    for text in mentions:
        assert text in lines[0]
    return lines[0]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "cache"


def assert_nothing_published(tmp_path: Path, cache: Path) -> None:
    """No ready model, and nothing written anywhere but the cache's state dir."""
    for path in tmp_path.rglob("*"):
        assert path.is_relative_to(cache), f"{path} written outside the cache"
        if path != cache:
            assert path.is_relative_to(cache / ".modelsync"), f"{path} published after a failure"


# ---- success and warm pulls --------------------------------------------------------------


def test_cli_pull_prints_the_ready_path_last_and_a_warm_pull_needs_no_network_nor_the_s3_stack(
    tmp_path: Path, cache: Path, s3_env: S3Env, s3_client: BaseClient, bucket: str
) -> None:
    data = os.urandom(2 * MiB + 3)
    s3_client.put_object(Bucket=bucket, Key=PREFIX + "weights.bin", Body=data)
    s3_client.put_object(Bucket=bucket, Key=PREFIX + "config.json", Body=b"{}")
    args = [f"s3://{bucket}/{PREFIX}", "--cache-dir", str(cache), "--part-size", "1Mi"]

    cold = run_cli(args, s3_env.subprocess_env())

    assert cold.returncode == 0, cold.stderr
    ready = cache / parse_source(f"s3://{bucket}/{PREFIX}").cache_path
    assert cold.stdout.splitlines()[-1] == str(ready)
    assert Path(cold.stdout.splitlines()[-1]).is_absolute()
    assert (ready / "weights.bin").read_bytes() == data
    assert "Traceback" not in cold.stderr

    dead = s3_env.via("http://127.0.0.1:9").subprocess_env()
    started = time.monotonic()
    warm = run_cli([*args, "--endpoint-url", "http://127.0.0.1:9"], dead, code=REPORT_IMPORTS)
    warm_s = time.monotonic() - started

    assert warm.returncode == 0, warm.stderr
    assert warm.stdout.splitlines() == [str(ready)]
    assert warm.stderr.splitlines()[-1] == "aiobotocore imported: False"
    assert warm_s < 10  # interpreter start included; the pull itself does no I/O


# ---- user errors -------------------------------------------------------------------------


def test_cli_pull_of_a_missing_bucket_exits_3_naming_the_bucket(
    tmp_path: Path, cache: Path, s3_env: S3Env
) -> None:
    done = run_cli(
        ["s3://no-such-bucket-cli/org/m/", "--cache-dir", str(cache), "-q"], s3_env.subprocess_env()
    )
    assert_user_error(done, ExitCode.NOT_FOUND, "no-such-bucket-cli")
    assert_nothing_published(tmp_path, cache)


def test_cli_pull_of_an_empty_prefix_exits_3_naming_the_prefix(
    tmp_path: Path, cache: Path, s3_env: S3Env, bucket: str
) -> None:
    done = run_cli([f"s3://{bucket}/{PREFIX}", "--cache-dir", str(cache), "-q"], s3_env.subprocess_env())
    assert_user_error(done, ExitCode.NOT_FOUND, f"s3://{bucket}/{PREFIX}")
    assert_nothing_published(tmp_path, cache)


@pytest.mark.parametrize(
    "source", ["s3://models/", "s3://models", "https://models/org/m/", "s3://Bad_Bucket/m/"]
)
def test_cli_pull_of_a_source_that_names_no_model_exits_2(tmp_path: Path, cache: Path, source: str) -> None:
    env = S3Env(f"http://127.0.0.1:{closed_port()}").subprocess_env()
    done = run_cli([source, "--cache-dir", str(cache), "-q"], env)
    assert_user_error(done, ExitCode.USAGE, repr(source))
    assert not cache.exists()


def test_cli_pull_with_a_bad_setting_exits_2(tmp_path: Path, cache: Path) -> None:
    env = {**S3Env("http://127.0.0.1:9").subprocess_env(), "MODELSYNC_CONCURRENCY": "lots"}
    done = run_cli(["s3://models/org/m/", "--cache-dir", str(cache), "-q"], env)
    assert_user_error(done, ExitCode.USAGE, "MODELSYNC_CONCURRENCY")


def test_cli_pull_of_an_unsafe_key_exits_5_before_any_byte(
    tmp_path: Path, cache: Path, s3_env: S3Env, s3_client: BaseClient, bucket: str
) -> None:
    s3_client.put_object(Bucket=bucket, Key=PREFIX + "ok.bin", Body=b"fine")
    s3_client.put_object(Bucket=bucket, Key=PREFIX + "../../escape.bin", Body=b"evil")
    done = run_cli([f"s3://{bucket}/{PREFIX}", "--cache-dir", str(cache), "-q"], s3_env.subprocess_env())
    assert_user_error(done, ExitCode.INTEGRITY, "../../escape.bin")
    assert_nothing_published(tmp_path, cache)


def test_cli_pull_with_a_malformed_manifest_exits_5_with_the_reason(
    tmp_path: Path, cache: Path, s3_env: S3Env, s3_client: BaseClient, bucket: str
) -> None:
    s3_client.put_object(Bucket=bucket, Key=PREFIX + "a.bin", Body=b"data")
    doc = {"format": "modelsync-manifest", "version": 7, "files": []}
    s3_client.put_object(Bucket=bucket, Key=PREFIX + "modelsync.manifest.json", Body=json.dumps(doc).encode())
    done = run_cli([f"s3://{bucket}/{PREFIX}", "--cache-dir", str(cache), "-q"], s3_env.subprocess_env())
    assert_user_error(done, ExitCode.INTEGRITY, "malformed manifest", "unsupported version 7")
    assert_nothing_published(tmp_path, cache)


def test_cli_pull_of_bytes_corrupt_on_every_fetch_exits_5(
    tmp_path: Path,
    cache: Path,
    proxied_s3_env: S3Env,
    fault_proxy: FaultProxy,
    s3_client: BaseClient,
    bucket: str,
) -> None:
    s3_client.put_object(Bucket=bucket, Key=PREFIX + "weights.bin", Body=os.urandom(MiB + 1))
    fault_proxy.add_fault("bitflip", match="weights.bin", arg=10, times=100)
    done = run_cli(
        [f"s3://{bucket}/{PREFIX}", "--cache-dir", str(cache), "--part-size", "1Mi", "-q"],
        proxied_s3_env.subprocess_env(),
    )
    assert_user_error(done, ExitCode.INTEGRITY, "checksum mismatch", "weights.bin")
    assert_nothing_published(tmp_path, cache)


def test_cli_pull_when_the_disk_is_full_exits_6_with_bytes_needed_and_free(
    tmp_path: Path, cache: Path, s3_env: S3Env, s3_client: BaseClient, bucket: str
) -> None:
    s3_client.put_object(Bucket=bucket, Key=PREFIX + "weights.bin", Body=os.urandom(MiB))
    done = run_cli(
        [f"s3://{bucket}/{PREFIX}", "--cache-dir", str(cache), "-q"], s3_env.subprocess_env(), NO_SPACE
    )
    assert_user_error(done, ExitCode.LOCAL_STORAGE, f"needs {format_bytes(MiB)}", " free")
    assert_nothing_published(tmp_path, cache)


def test_cli_pull_from_an_unreachable_endpoint_exits_7_within_a_bounded_time(
    tmp_path: Path, cache: Path, record_property: Callable[[str, object], None]
) -> None:
    env = S3Env(f"http://127.0.0.1:{closed_port()}").subprocess_env()
    started = time.monotonic()
    done = run_cli(["s3://models/org/m/", "--cache-dir", str(cache), "-q"], env)
    elapsed_s = time.monotonic() - started
    record_property("cli_unreachable_s", round(elapsed_s, 2))
    print(f"CLI, unreachable endpoint: exit {done.returncode} after {elapsed_s:.2f} s")
    assert_user_error(done, ExitCode.REMOTE_UNAVAILABLE, "127.0.0.1")
    assert elapsed_s < 60
    assert_nothing_published(tmp_path, cache)


# ---- wrong credentials against a server that checks them -----------------------------------


@pytest.fixture(scope="module")
def auth_moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[S3Env, str]]:
    """A moto that enforces SigV4 after two free calls, which arrange a bucket and an object."""
    log_dir = tmp_path_factory.mktemp("auth-moto")
    with SubprocessMoto(extra_env={"INITIAL_NO_AUTH_ACTION_COUNT": "2"}, log_dir=log_dir) as server:
        env = S3Env(server.endpoint_url)
        bucket = f"auth-{uuid.uuid4().hex[:12]}"
        client = env.boto3_client()
        try:
            client.create_bucket(Bucket=bucket)
            client.put_object(Bucket=bucket, Key=PREFIX + "weights.bin", Body=b"secret weights")
        finally:
            client.close()
        yield env, bucket


def test_cli_pull_with_wrong_credentials_exits_4_with_a_hint_and_never_prints_the_secret(
    tmp_path: Path, cache: Path, auth_moto: tuple[S3Env, str]
) -> None:
    env_value, bucket = auth_moto
    wrong = S3Env(env_value.endpoint_url, access_key_id=WRONG_ACCESS_KEY, secret_access_key=WRONG_SECRET)
    done = run_cli([f"s3://{bucket}/{PREFIX}", "--cache-dir", str(cache), "-q"], wrong.subprocess_env())
    line = assert_user_error(done, ExitCode.ACCESS_DENIED, "credentials")
    assert WRONG_SECRET not in done.stdout + done.stderr
    assert "access denied" in line.lower()
    assert_nothing_published(tmp_path, cache)


def test_cli_pull_answered_403_by_the_data_plane_exits_4_without_leaking_the_signature(
    tmp_path: Path,
    cache: Path,
    proxied_s3_env: S3Env,
    fault_proxy: FaultProxy,
    s3_client: BaseClient,
    bucket: str,
) -> None:
    s3_client.put_object(Bucket=bucket, Key=PREFIX + "weights.bin", Body=b"w" * 1000)
    fault_proxy.add_fault("status403", match="weights.bin", times=100)
    done = run_cli(
        [f"s3://{bucket}/{PREFIX}", "--cache-dir", str(cache), "-q"], proxied_s3_env.subprocess_env()
    )
    line = assert_user_error(done, ExitCode.ACCESS_DENIED, "credentials")
    assert "X-Amz-Signature" not in line and "X-Amz-Credential" not in line
    assert proxied_s3_env.secret_access_key not in done.stdout + done.stderr
    assert_nothing_published(tmp_path, cache)
