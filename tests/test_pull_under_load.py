"""The pull when a fleet meets one store: sustained throttling, expiring credentials, a real proxy.

In-process pulls against moto through the fault proxy (which can throttle for a
stretch of time, refuse a token, and check presigned expiry as S3 does), and CLI
pulls through Debian's tinyproxy.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import parse_qs

import pytest
from botocore.client import BaseClient
from support.engine import pull
from support.faultproxy import REDIRECT_ENDPOINT, REDIRECT_REGION, FaultProxy
from support.objects import payload, put_model
from support.s3env import S3Env
from support.tinyproxy import TinyProxy, tinyproxy_binary

from modelsync.config import Settings
from modelsync.core.refs import parse_source
from modelsync.engine.events import NoEvents

MiB = 1024 * 1024
PART = MiB
PREFIX = "org/model/rev1/"


def assert_pulled(settings: Settings, bucket: str, files: dict[str, bytes]) -> None:
    root = settings.cache_dir / bucket / PREFIX
    assert {p.name: p.read_bytes() for p in root.iterdir()} == files


def query_of(path: str) -> dict[str, list[str]]:
    return parse_qs(path.partition("?")[2])


def cli_pull(env: dict[str, str], bucket: str, cache: Path) -> subprocess.CompletedProcess[str]:
    """`modelsync pull` of the test model in a child process, 1 MiB parts, no progress."""
    return subprocess.run(
        [sys.executable, "-m", "modelsync", "pull", f"s3://{bucket}/{PREFIX}", "--quiet",
         "--part-size", "1Mi", "--cache-dir", str(cache)],
        env=env, capture_output=True, text=True, timeout=50,
    )  # fmt: skip


@pytest.fixture
def settings_via(tmp_path: Path, aws_credentials: S3Env) -> object:
    def make(endpoint_url: str, **overrides: object) -> Settings:
        values: dict[str, object] = {
            "cache_dir": tmp_path / "cache",
            "endpoint_url": endpoint_url,
            "part_size_bytes": PART,
            "concurrency": 4,
            "read_timeout_s": 5.0,
            "connect_timeout_s": 2.0,
            "backoff_floor_s": 0.02,
        }
        values.update(overrides)
        return Settings(**values)  # type: ignore[arg-type]

    return make


# ---- throttling -----------------------------------------------------------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize("scope", ["data-gets", "every-get"])
def test_a_pull_rides_out_eight_seconds_of_slow_down_on_every_get_with_correct_bytes(
    settings_via: object, fault_proxy: FaultProxy, s3_client: BaseClient, bucket: str, scope: str
) -> None:
    """Real time and the real retry schedule: the floor of seconds and the shared gate.

    `data-gets` throttles every ranged GET; `every-get` the manifest probe and the
    listing too, so the pull first waits in the control plane.
    """
    files = {f"weights-{i}.bin": payload(4 * PART + 77 * i, i) for i in range(3)}
    put_model(s3_client, bucket, PREFIX, files)
    settings = settings_via(fault_proxy.endpoint_url, backoff_floor_s=1.0)  # type: ignore[operator]
    fault_proxy.sustain("status503", 8.0, match="weights-" if scope == "data-gets" else f"/{bucket}")
    started = time.monotonic()

    pull(settings, parse_source(f"s3://{bucket}/{PREFIX}"), NoEvents())

    took_s = time.monotonic() - started
    assert_pulled(settings, bucket, files)
    gets = fault_proxy.requests(f"/{bucket}", method="GET")
    throttled = [r for r in gets if r.status == 503]
    assert took_s >= 8.0
    assert {r.status for r in gets if "weights-" in r.path} <= {503, 206}
    # Seconds of backoff and one gate for all parts: a few dozen 503s in 8 s, not thousands.
    assert len(throttled) < 100, len(throttled)
    print(f"SlowDown on {scope}: pull took {took_s:.1f} s, {len(throttled)} answers 503 of {len(gets)} GETs")


def test_a_part_honours_retry_after_above_its_own_backoff(
    settings_via: object, fault_proxy: FaultProxy, s3_client: BaseClient, bucket: str
) -> None:
    files = {"small.bin": payload(PART, 3)}
    put_model(s3_client, bucket, PREFIX, files)
    fault_proxy.add_fault("status503", match="small.bin", arg=1.5)  # Retry-After: 1.5
    settings = settings_via(fault_proxy.endpoint_url)  # type: ignore[operator]  # backoff floor 0.02 s
    started = time.monotonic()

    pull(settings, parse_source(f"s3://{bucket}/{PREFIX}"), NoEvents())

    assert time.monotonic() - started >= 1.5
    assert [r.status for r in fault_proxy.requests("small.bin", method="GET")] == [503, 206]
    assert_pulled(settings, bucket, files)


def test_one_throttled_answer_holds_every_file_of_the_pull_at_the_shared_gate(
    settings_via: object, fault_proxy: FaultProxy, s3_client: BaseClient, bucket: str
) -> None:
    """The first data GET is told to come back in 2 s: the other file's parts wait too.

    Two ranged GETs in flight and 8 parts per file, so whichever file the pull starts
    with, most of both files' parts are still to be sent when the 503 comes back.
    """
    files = {"a.bin": payload(8 * PART, 10), "b.bin": payload(8 * PART, 11)}
    put_model(s3_client, bucket, PREFIX, files)
    fault_proxy.add_fault("status503", match=".bin", arg=2.0)  # Retry-After: 2
    settings = settings_via(fault_proxy.endpoint_url, concurrency=2)  # type: ignore[operator]

    pull(settings, parse_source(f"s3://{bucket}/{PREFIX}"), NoEvents())

    assert_pulled(settings, bucket, files)
    data_gets = [r for r in fault_proxy.requests(".bin", method="GET")]
    throttled = [r for r in data_gets if r.status == 503]
    assert len(throttled) == 1, throttled
    other = "b.bin" if "a.bin" in throttled[0].path else "a.bin"
    after = [r.arrived_s - throttled[0].arrived_s for r in data_gets if r is not throttled[0]]
    # The one GET already on its way when the 503 came may still arrive (0.5 s of slack for a
    # loaded machine); every later one, of either file, waits out the Retry-After.
    assert [t for t in after if 0.5 <= t < 1.95] == [], after
    held = [r for r in data_gets if other in r.path and r.arrived_s - throttled[0].arrived_s >= 1.95]
    assert held, f"none of {other}'s parts were held at the gate: {after}"


def test_a_cli_pull_says_once_that_the_store_throttles(
    tmp_path: Path, proxied_s3_env: S3Env, fault_proxy: FaultProxy, s3_client: BaseClient, bucket: str
) -> None:
    files = {"weights.bin": payload(2 * PART, 13)}
    put_model(s3_client, bucket, PREFIX, files)
    fault_proxy.add_fault("status503", match="weights.bin", times=4)
    env = proxied_s3_env.subprocess_env()
    env["MODELSYNC_BACKOFF_FLOOR"] = "0.02"
    done = cli_pull(env, bucket, tmp_path / "cache")

    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [
        "note: the store asks for less load (503 SlowDown); every transfer slows down and keeps "
        "retrying, for up to 10m without progress"
    ]
    assert Path(done.stdout.strip(), "weights.bin").read_bytes() == files["weights.bin"]


# ---- credentials ----------------------------------------------------------------------

CREDENTIAL_PROCESS = """\
import json, sys, time
from pathlib import Path
counter, lifetime_s = Path(sys.argv[1]), float(sys.argv[2])
n = int(counter.read_text()) + 1 if counter.exists() else 1
counter.write_text(str(n))
expiry = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + lifetime_s))
print(json.dumps({"Version": 1, "AccessKeyId": "testing", "SecretAccessKey": "testing",
                  "SessionToken": f"session{n}x", "Expiration": expiry}))
"""


#: botocore refreshes temporary credentials when signing with less than this left (its advisory window)
BOTOCORE_ADVISORY_REFRESH_S = 900


@pytest.fixture
def expiring_credentials(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, aws_credentials: S3Env
) -> Path:
    """Temporary credentials from a credential process: each run hands out the next session token.

    Their lifetime is `request.param` seconds (1 h without one). Returns the file
    counting how often the chain was resolved.
    """
    lifetime_s = getattr(request, "param", 3600)
    script, counter, config = tmp_path / "creds.py", tmp_path / "resolved", tmp_path / "aws-config"
    script.write_text(CREDENTIAL_PROCESS)
    config.write_text(f"[default]\ncredential_process = {sys.executable} {script} {counter} {lifetime_s}\n")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    return counter


@pytest.mark.timeout(60)
def test_credentials_that_expire_mid_pull_are_resolved_again_and_the_pull_succeeds(
    settings_via: object,
    fault_proxy: FaultProxy,
    s3_client: BaseClient,
    bucket: str,
    expiring_credentials: Path,
) -> None:
    files = {"weights.bin": payload(8 * PART + 5, 1)}
    put_model(s3_client, bucket, PREFIX, files)
    settings = settings_via(fault_proxy.endpoint_url, max_bandwidth_bytes_per_s=3 * MiB)  # type: ignore[operator]

    def expire_first_token() -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if any(r.status == 206 for r in fault_proxy.requests("weights.bin", method="GET")):
                fault_proxy.sustain("expired_token", 60.0, match="X-Amz-Security-Token=session1x")
                return
            time.sleep(0.02)

    # The store declares the first session's token expired once the pull is under way.
    arming = threading.Thread(target=expire_first_token)
    arming.start()
    pull(settings, parse_source(f"s3://{bucket}/{PREFIX}"), NoEvents())
    arming.join()

    assert_pulled(settings, bucket, files)
    gets = fault_proxy.requests("weights.bin", method="GET")
    refused = [r for r in gets if r.fault == "expired_token"]
    assert refused, "the first token was refused mid-pull"
    tokens_after = {query_of(r.path)["X-Amz-Security-Token"][0] for r in gets if r.status == 206}
    assert {"session1x"} < tokens_after, "later parts were signed with freshly resolved credentials"
    assert int(expiring_credentials.read_text()) >= 2


def test_a_listing_refused_for_an_expired_token_is_sent_again_with_fresh_credentials(
    settings_via: object,
    fault_proxy: FaultProxy,
    s3_client: BaseClient,
    bucket: str,
    expiring_credentials: Path,
) -> None:
    files = {"weights.bin": payload(PART, 12)}
    put_model(s3_client, bucket, PREFIX, files)
    fault_proxy.add_fault("expired_token", match="list-type=2")
    settings = settings_via(fault_proxy.endpoint_url)  # type: ignore[operator]

    pull(settings, parse_source(f"s3://{bucket}/{PREFIX}"), NoEvents())

    assert_pulled(settings, bucket, files)
    assert [r.status for r in fault_proxy.requests("list-type=2", method="GET")] == [400, 200]
    assert int(expiring_credentials.read_text()) == 2


@pytest.mark.timeout(60)
@pytest.mark.parametrize("expiring_credentials", [BOTOCORE_ADVISORY_REFRESH_S + 3], indirect=True)
def test_credentials_about_to_expire_are_replaced_before_the_store_refuses_them(
    settings_via: object, s3_env: S3Env, s3_client: BaseClient, bucket: str, expiring_credentials: Path
) -> None:
    """Proactive: each session enters botocore's refresh window 3 s after it was issued, and the
    store refuses the first one from 6 s on. URLs live 2 s and are signed again halfway, with
    the refreshed session: no request carries the first session that late."""
    files = {"weights.bin": payload(12 * PART, 8)}
    put_model(s3_client, bucket, PREFIX, files)
    with FaultProxy(s3_env.endpoint_url, enforce_presign_expiry=True) as proxy:
        settings = settings_via(  # type: ignore[operator]
            proxy.endpoint_url, presign_expiry_s=2.0, max_bandwidth_bytes_per_s=3 * MiB // 2, concurrency=2
        )
        expire = threading.Timer(
            6.0,
            proxy.sustain,
            args=("expired_token", 120.0),
            kwargs={"match": "X-Amz-Security-Token=session1x"},
        )
        expire.start()
        try:
            pull(settings, parse_source(f"s3://{bucket}/{PREFIX}"), NoEvents())
        finally:
            expire.cancel()
        gets = proxy.requests("weights.bin", method="GET")
    assert_pulled(settings, bucket, files)
    assert [r.status for r in gets if r.status != 206] == [], "no answer refused a token or a URL"
    tokens = [query_of(r.path)["X-Amz-Security-Token"][0] for r in gets]
    assert len(set(tokens)) >= 2 and tokens[-1] != tokens[0], "later parts carry refreshed sessions"


@pytest.mark.timeout(60)
def test_urls_are_signed_again_before_they_expire_during_a_long_pull(
    settings_via: object, s3_env: S3Env, s3_client: BaseClient, bucket: str
) -> None:
    files = {"weights.bin": payload(10 * PART, 2)}
    put_model(s3_client, bucket, PREFIX, files)
    with FaultProxy(s3_env.endpoint_url, enforce_presign_expiry=True) as proxy:
        settings = settings_via(  # type: ignore[operator]
            proxy.endpoint_url, presign_expiry_s=3.0, max_bandwidth_bytes_per_s=2 * MiB, concurrency=2
        )
        pull(settings, parse_source(f"s3://{bucket}/{PREFIX}"), NoEvents())
        gets = proxy.requests("weights.bin", method="GET")
    assert_pulled(settings, bucket, files)
    assert [r for r in gets if r.status != 206] == [], "no request went out on an expired URL"
    assert len({query_of(r.path)["X-Amz-Date"][0] for r in gets}) >= 2, "signed again mid-pull"


# ---- control plane: decided on codes ------------------------------------------------------


def test_a_model_without_a_manifest_in_a_bucket_named_like_ml_bucket_pulls_by_listing(
    settings_via: object, s3_env: S3Env, s3_client: BaseClient
) -> None:
    bucket = f"ml-bucket-{uuid.uuid4().hex[:8]}"
    s3_client.create_bucket(Bucket=bucket)
    files = {"config.json": b"{}", "weights.bin": payload(2 * PART + 3, 5)}
    put_model(s3_client, bucket, PREFIX, files)
    settings = settings_via(s3_env.endpoint_url)  # type: ignore[operator]

    result = pull(settings, parse_source(f"s3://{bucket}/{PREFIX}"), NoEvents())

    assert result.files == 2
    assert_pulled(settings, bucket, files)


# ---- a real forward proxy ------------------------------------------------------------------

needs_tinyproxy = pytest.mark.skipif(tinyproxy_binary() is None, reason="tinyproxy is not installed")


@needs_tinyproxy
@pytest.mark.timeout(60)
def test_a_cli_pull_goes_through_a_real_proxy_and_its_log_shows_every_ranged_get(
    tmp_path: Path, s3_env: S3Env, s3_client: BaseClient, bucket: str
) -> None:
    files = {"weights.bin": payload(5 * PART + 9, 6)}
    put_model(s3_client, bucket, PREFIX, files)
    with TinyProxy(tmp_path / "tinyproxy") as proxy:
        env = s3_env.subprocess_env()
        env.update({"HTTP_PROXY": proxy.url, "http_proxy": proxy.url, "NO_PROXY": "", "no_proxy": ""})
        done = cli_pull(env, bucket, tmp_path / "cache")
        assert done.returncode == 0, done.stderr
        logged = proxy.requests(f"/{bucket}/{PREFIX}weights.bin?")
    assert (tmp_path / "cache" / bucket / PREFIX / "weights.bin").read_bytes() == files["weights.bin"]
    # One absolute-form GET per 1 MiB part, each a presigned URL of the endpoint.
    assert len(logged) == 6, logged
    assert all(line.startswith(f"GET {s3_env.endpoint_url}/") for line in logged)
    assert all("X-Amz-Signature=" in line for line in logged)


@needs_tinyproxy
@pytest.mark.timeout(60)
def test_no_proxy_sends_the_data_plane_direct_like_the_control_plane(
    tmp_path: Path, s3_env: S3Env, s3_client: BaseClient, bucket: str
) -> None:
    put_model(s3_client, bucket, PREFIX, {"weights.bin": payload(PART, 7)})
    with TinyProxy(tmp_path / "tinyproxy") as proxy:
        env = s3_env.subprocess_env()  # NO_PROXY holds 127.0.0.1
        env.update({"HTTP_PROXY": proxy.url, "http_proxy": proxy.url})
        done = cli_pull(env, bucket, tmp_path / "cache")
        assert done.returncode == 0, done.stderr
        assert proxy.requests() == []


# ---- redirects -------------------------------------------------------------------------


def test_a_redirected_pull_is_one_error_line_naming_where_the_bucket_lives(
    tmp_path: Path, proxied_s3_env: S3Env, fault_proxy: FaultProxy, s3_client: BaseClient, bucket: str
) -> None:
    put_model(s3_client, bucket, PREFIX, {"weights.bin": payload(PART, 9)})
    fault_proxy.add_fault("redirect", match="weights.bin", times=100)
    done = cli_pull(proxied_s3_env.subprocess_env(), bucket, tmp_path / "cache")

    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert f"to {REDIRECT_ENDPOINT}" in lines[0] and f"region {REDIRECT_REGION}" in lines[0]
    assert "endpoint or region is wrong" in lines[0]
    assert len(fault_proxy.requests("weights.bin", method="GET")) == 1, "a redirect is not retried"
