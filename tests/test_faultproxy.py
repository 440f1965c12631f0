"""The harness every S3 test stands on: each fault does exactly what it says, the proxy
forwards faithfully enough for SigV4, and the moto servers and fixtures behave.

Raw `http.client` is used where the test must see bytes the way they come off the
socket (how many arrived, how the stream ended); boto3 where the S3 meaning matters
(error codes, signatures, timeouts).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import random
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiobotocore.session
import aiohttp
import boto3
import pytest
from aiobotocore.config import AioConfig
from botocore.client import BaseClient
from botocore.config import Config
from botocore.exceptions import ClientError, ReadTimeoutError
from support.faultproxy import FaultProxy, Throttle
from support.motoserver import SubprocessMoto, ThreadedMoto
from support.s3env import CA_BUNDLE_VARS, S3Env

BLOB_BYTES = 1024 * 1024
KEY = "models/m1/model.safetensors"


@dataclass(frozen=True, slots=True)
class Blob:
    bucket: str
    key: str
    data: bytes


@pytest.fixture
def blob(s3_client: BaseClient, bucket: str) -> Blob:
    """A 1 MiB object of seeded random bytes, so any misplaced byte shows."""
    data = random.Random(20250501).randbytes(BLOB_BYTES)
    s3_client.put_object(Bucket=bucket, Key=KEY, Body=data)
    return Blob(bucket, KEY, data)


@pytest.fixture
def proxied_client(proxied_s3_env: S3Env) -> Iterator[BaseClient]:
    """boto3 through the proxy with retries off, so each fault reaches the test as is."""
    client = proxied_s3_env.boto3_client(total_max_attempts=1, read_timeout_s=5)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def raw_get(s3_client: BaseClient, fault_proxy: FaultProxy) -> Iterator[RawGet]:
    """Presigned GETs over http.client, straight at the proxy socket."""
    getter = RawGet(s3_client, fault_proxy)
    try:
        yield getter
    finally:
        getter.close()


class RawGet:
    """Opens one connection per GET; moto refuses unsigned GETs, so the URL is presigned."""

    def __init__(self, s3_client: BaseClient, proxy: FaultProxy) -> None:
        self._s3_client = s3_client
        self._proxy = proxy
        self._connections: list[http.client.HTTPConnection] = []

    def __call__(
        self, blob: Blob, timeout_s: float = 5.0, headers: dict[str, str] | None = None
    ) -> http.client.HTTPResponse:
        url = self._s3_client.generate_presigned_url(
            "get_object", Params={"Bucket": blob.bucket, "Key": blob.key}, ExpiresIn=600
        )
        parts = urlsplit(url)
        connection = http.client.HTTPConnection("127.0.0.1", self._proxy.port, timeout=timeout_s)
        self._connections.append(connection)
        connection.request("GET", f"{parts.path}?{parts.query}", headers=headers or {})
        return connection.getresponse()

    def close(self) -> None:
        for connection in self._connections:
            connection.close()


def read_until_error(response: http.client.HTTPResponse) -> tuple[bytes, BaseException | None]:
    """Everything the socket delivered, and how the stream ended (None: clean EOF)."""
    received = bytearray()
    try:
        while chunk := response.read1(64 * 1024):
            received += chunk
    except (OSError, http.client.HTTPException) as error:
        return bytes(received), error
    return bytes(received), None


# ---- forwarding --------------------------------------------------------------------


def test_proxy_forwards_reads_and_writes_unchanged(
    proxied_client: BaseClient, bucket: str, fault_proxy: FaultProxy
) -> None:
    key = "odd keys/a b+c/ü%.bin"
    proxied_client.put_object(Bucket=bucket, Key=key, Body=b"0123456789")

    whole = proxied_client.get_object(Bucket=bucket, Key=key)["Body"].read()
    ranged = proxied_client.get_object(Bucket=bucket, Key=key, Range="bytes=2-5")
    head = proxied_client.head_object(Bucket=bucket, Key=key)
    listed = proxied_client.list_objects_v2(Bucket=bucket)["Contents"]

    assert whole == b"0123456789"
    assert ranged["Body"].read() == b"2345"
    assert ranged["ContentRange"] == "bytes 2-5/10"
    assert head["ContentLength"] == 10
    assert [o["Key"] for o in listed] == [key]
    gets = fault_proxy.requests(match="a b+c", method="GET")
    assert [(r.status, r.range, r.body_bytes_sent) for r in gets] == [
        (200, None, 10),
        (206, "bytes=2-5", 4),
    ]
    assert fault_proxy.requests(method="HEAD")[0].body_bytes_sent == 0


def test_signatures_made_for_the_proxy_still_validate_upstream() -> None:
    """moto checks SigV4 only with auth enforced, so this test runs its own strict server."""
    with (
        SubprocessMoto(extra_env={"INITIAL_NO_AUTH_ACTION_COUNT": "3"}) as server,
        FaultProxy(server.endpoint_url) as proxy,
    ):
        access_key_id, secret = _create_s3_user(server.endpoint_url)
        good = S3Env(proxy.endpoint_url, access_key_id, secret).boto3_client(total_max_attempts=1)
        bad = S3Env(proxy.endpoint_url, access_key_id, "wrong").boto3_client(total_max_attempts=1)
        try:
            good.create_bucket(Bucket="signed")
            good.put_object(Bucket="signed", Key="dir/ü b+c.bin", Body=b"payload")
            body = good.get_object(Bucket="signed", Key="dir/ü b+c.bin", Range="bytes=0-2")
            assert body["Body"].read() == b"pay"
            with pytest.raises(ClientError) as refused:
                bad.list_objects_v2(Bucket="signed")
            assert refused.value.response["Error"]["Code"] == "SignatureDoesNotMatch"
        finally:
            good.close()
            bad.close()


def _create_s3_user(endpoint_url: str) -> tuple[str, str]:
    """Spend moto's three unauthenticated calls on a user allowed s3:*."""
    client = boto3.session.Session().client(
        "iam",
        endpoint_url=endpoint_url,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )
    try:
        client.create_user(UserName="puller")
        key = client.create_access_key(UserName="puller")["AccessKey"]
        client.put_user_policy(
            UserName="puller",
            PolicyName="s3",
            PolicyDocument=json.dumps(
                {
                    "Version": "2012-10-17",
                    "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}],
                }
            ),
        )
    finally:
        client.close()
    return key["AccessKeyId"], key["SecretAccessKey"]


# ---- status faults -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("action", "status", "code"),
    [
        ("status503", 503, "SlowDown"),
        ("status500", 500, "InternalError"),
        ("status403", 403, "AccessDenied"),
        ("expired_token", 400, "ExpiredToken"),
    ],
)
def test_status_faults_answer_with_s3_error_xml(
    proxied_client: BaseClient,
    blob: Blob,
    fault_proxy: FaultProxy,
    action: str,
    status: int,
    code: str,
) -> None:
    fault_proxy.add_fault(action, match=blob.key)  # type: ignore[arg-type]

    with pytest.raises(ClientError) as failed:
        proxied_client.get_object(Bucket=blob.bucket, Key=blob.key)

    assert failed.value.response["Error"]["Code"] == code
    assert failed.value.response["ResponseMetadata"]["HTTPStatusCode"] == status
    headers = failed.value.response["ResponseMetadata"]["HTTPHeaders"]
    assert headers["content-type"] == "application/xml"
    assert proxied_client.get_object(Bucket=blob.bucket, Key=blob.key)["Body"].read() == blob.data


def test_botocore_retries_a_slowdown_by_itself(
    proxied_s3_env: S3Env, blob: Blob, fault_proxy: FaultProxy
) -> None:
    """The 503 must look like real S3 throttling, or retry tests prove nothing."""
    fault_proxy.add_fault("status503", match=blob.key)
    client = proxied_s3_env.boto3_client(total_max_attempts=2)
    try:
        body = client.get_object(Bucket=blob.bucket, Key=blob.key)["Body"].read()
    finally:
        client.close()

    assert body == blob.data
    assert [r.status for r in fault_proxy.requests(match=blob.key)] == [503, 200]


def test_an_error_fault_with_an_arg_carries_retry_after(
    raw_get: RawGet, blob: Blob, fault_proxy: FaultProxy
) -> None:
    fault_proxy.add_fault("status503", match=blob.key, arg=2.5)
    response = raw_get(blob)
    assert (response.status, response.getheader("Retry-After")) == (503, "2.5")
    assert raw_get(blob).getheader("Retry-After") is None  # consumed: the next GET goes through


def test_a_sustained_fault_answers_every_matching_request_until_it_runs_out(
    raw_get: RawGet, blob: Blob, fault_proxy: FaultProxy
) -> None:
    fault_proxy.sustain("status503", 1.0, match=blob.key)
    statuses = [raw_get(blob).status for _ in range(3)]
    time.sleep(1.1)
    statuses.append(raw_get(blob).status)
    assert statuses == [503, 503, 503, 200]


@pytest.mark.parametrize("signature_version", ["s3v4", "s3"])
def test_presign_expiry_is_enforced_only_when_asked(
    s3_env: S3Env, blob: Blob, signature_version: str
) -> None:
    signer = boto3.client("s3", config=Config(signature_version=signature_version), **s3_env.client_kwargs())
    try:
        expired = signer.generate_presigned_url(
            "get_object", Params={"Bucket": blob.bucket, "Key": blob.key}, ExpiresIn=1
        )
    finally:
        signer.close()
    assert ("X-Amz-Date=" in expired) == (signature_version == "s3v4")
    time.sleep(2.1)
    for enforce, status in [(False, 200), (True, 403)]:
        with FaultProxy(s3_env.endpoint_url, enforce_presign_expiry=enforce) as proxy:
            parts = urlsplit(expired)
            connection = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=5)
            try:
                connection.request("GET", f"{parts.path}?{parts.query}")
                assert connection.getresponse().status == status
            finally:
                connection.close()


# ---- body faults -------------------------------------------------------------------


def test_truncate_fault_cuts_the_body_short(raw_get: RawGet, blob: Blob, fault_proxy: FaultProxy) -> None:
    fault_proxy.add_fault("truncate", match=blob.key, arg=1000)

    response = raw_get(blob)
    with pytest.raises(http.client.IncompleteRead) as cut:
        response.read()

    assert response.status == 200
    assert response.getheader("Content-Length") == str(BLOB_BYTES)
    assert cut.value.partial == blob.data[:1000]
    assert fault_proxy.bytes_sent(match=blob.key) == 1000


def test_truncate_fault_ends_with_a_clean_close_not_a_reset(
    raw_get: RawGet, blob: Blob, fault_proxy: FaultProxy
) -> None:
    fault_proxy.add_fault("truncate", match=blob.key, arg=300_000)

    received, ending = read_until_error(raw_get(blob))

    assert received == blob.data[:300_000]
    assert ending is None


def test_reset_fault_resets_the_connection_after_arg_bytes(
    raw_get: RawGet, blob: Blob, fault_proxy: FaultProxy
) -> None:
    fault_proxy.add_fault("reset", match=blob.key, arg=100_000)

    received, ending = read_until_error(raw_get(blob))

    assert received == blob.data[:100_000]
    assert isinstance(ending, ConnectionResetError)
    assert fault_proxy.bytes_sent(match=blob.key) == 100_000


def test_an_asyncio_client_sees_a_reset_as_a_broken_payload(
    proxied_s3_env: S3Env, blob: Blob, fault_proxy: FaultProxy
) -> None:
    """The proxy's loop is its own, so a client on another loop (the engine's) can use it."""
    fault_proxy.add_fault("reset", match=blob.key, arg=50_000)

    async def fetch() -> bytes:
        session = aiobotocore.session.get_session()
        config = AioConfig(retries={"mode": "standard", "total_max_attempts": 1})
        async with session.create_client("s3", config=config, **proxied_s3_env.client_kwargs()) as client:
            response = await client.get_object(Bucket=blob.bucket, Key=blob.key, Range="bytes=0-199999")
            async with response["Body"] as body:
                data: bytes = await body.read()
                return data

    with pytest.raises(aiohttp.ClientPayloadError):
        asyncio.run(fetch())
    assert fault_proxy.bytes_sent(match=blob.key) == 50_000


def test_reset_fault_with_negative_arg_resets_before_the_status_line(
    raw_get: RawGet, blob: Blob, fault_proxy: FaultProxy
) -> None:
    fault_proxy.add_fault("reset", match=blob.key, arg=-1)

    with pytest.raises(ConnectionResetError):
        raw_get(blob)

    (record,) = fault_proxy.requests(match=blob.key)
    assert (record.status, record.body_bytes_sent, record.fault) == (None, 0, "reset")


def test_bitflip_fault_flips_exactly_one_bit(raw_get: RawGet, blob: Blob, fault_proxy: FaultProxy) -> None:
    offset = 700_001
    fault_proxy.add_fault("bitflip", match=blob.key, arg=offset)

    response = raw_get(blob)
    received = response.read()

    assert len(received) == len(blob.data)
    differing = [i for i, (a, b) in enumerate(zip(received, blob.data, strict=True)) if a != b]
    assert differing == [offset]
    assert bin(received[offset] ^ blob.data[offset]).count("1") == 1


def test_bitflip_offset_counts_from_the_start_of_a_ranged_body(
    proxied_client: BaseClient, blob: Blob, fault_proxy: FaultProxy
) -> None:
    """A ranged GET carries no checksum, so the corruption reaches the caller silently."""
    fault_proxy.add_fault("bitflip", match=blob.key, arg=10)

    body = proxied_client.get_object(Bucket=blob.bucket, Key=blob.key, Range="bytes=1000-1999")
    received = body["Body"].read()

    expected = bytearray(blob.data[1000:2000])
    expected[10] ^= 0x01
    assert received == bytes(expected)


def test_stall_fault_holds_the_body_until_the_client_times_out(
    proxied_s3_env: S3Env, blob: Blob, fault_proxy: FaultProxy
) -> None:
    fault_proxy.add_fault("stall", match=blob.key, arg=4096)
    client = proxied_s3_env.boto3_client(total_max_attempts=1, read_timeout_s=0.5)
    try:
        response = client.get_object(Bucket=blob.bucket, Key=blob.key)
        started = time.monotonic()
        with pytest.raises(ReadTimeoutError):
            response["Body"].read()
        waited_s = time.monotonic() - started
    finally:
        client.close()

    assert 0.4 < waited_s < 3.0
    assert fault_proxy.bytes_sent(match=blob.key) == 4096


def test_a_stalled_connection_does_not_block_other_requests(
    raw_get: RawGet, proxied_client: BaseClient, blob: Blob, fault_proxy: FaultProxy
) -> None:
    fault_proxy.add_fault("stall", match=blob.key, arg=10)
    stalled = raw_get(blob, timeout_s=10)
    assert stalled.read(10) == blob.data[:10]

    started = time.monotonic()
    body = proxied_client.get_object(Bucket=blob.bucket, Key=blob.key)["Body"].read()

    assert body == blob.data
    assert time.monotonic() - started < 2.0


def test_stopping_the_proxy_ends_a_stall(s3_client: BaseClient, blob: Blob, s3_env: S3Env) -> None:
    """A stall must never outlive its test, even if the client would wait forever."""
    proxy = FaultProxy(s3_env.endpoint_url).start()
    getter = RawGet(s3_client, proxy)
    try:
        proxy.add_fault("stall", match=blob.key, arg=10)
        response = getter(blob, timeout_s=30)
        assert response.read(10) == blob.data[:10]
        started = time.monotonic()
        proxy.stop()
        stop_s = time.monotonic() - started
        received, ending = read_until_error(response)
    finally:
        proxy.stop()
        getter.close()

    # The client sees the connection end (FIN or RST) with the body still short.
    assert stop_s < 3.0
    assert received == b""
    assert ending is None or isinstance(ending, ConnectionError)


def test_delay_fault_holds_the_headers_for_arg_seconds(
    proxied_client: BaseClient, blob: Blob, fault_proxy: FaultProxy
) -> None:
    fault_proxy.add_fault("delay", match=blob.key, arg=0.4)

    started = time.monotonic()
    body = proxied_client.get_object(Bucket=blob.bucket, Key=blob.key)["Body"].read()
    elapsed_s = time.monotonic() - started

    assert body == blob.data
    assert 0.4 <= elapsed_s < 2.0


def test_a_client_hanging_up_early_is_logged_but_is_not_a_proxy_error(
    raw_get: RawGet, blob: Blob, fault_proxy: FaultProxy, caplog: pytest.LogCaptureFixture
) -> None:
    """Clients that give up (timeouts, cancelled parts) are normal in fault tests."""
    fault_proxy.add_fault("delay", match=blob.key, arg=0.3)
    with pytest.raises(TimeoutError):
        raw_get(blob, timeout_s=0.1)
    raw_get.close()
    mid_body = raw_get(blob)
    assert mid_body.read(10) == blob.data[:10]
    raw_get.close()

    deadline = time.monotonic() + 5
    while not all(r.done for r in fault_proxy.requests()) and time.monotonic() < deadline:
        time.sleep(0.02)

    records = fault_proxy.requests(match=blob.key)
    assert [(r.status, r.done) for r in records] == [(200, True), (200, True)]
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == []


# ---- matching and the request log --------------------------------------------------


def test_faults_apply_only_to_matching_path_and_method(
    proxied_client: BaseClient, blob: Blob, fault_proxy: FaultProxy
) -> None:
    fault_proxy.add_fault("status500", match="some/other/key")
    fault_proxy.add_fault("status500", match=blob.key, method="PUT")

    proxied_client.head_object(Bucket=blob.bucket, Key=blob.key)
    assert proxied_client.get_object(Bucket=blob.bucket, Key=blob.key)["Body"].read() == blob.data

    assert [f.match for f in fault_proxy.pending_faults()] == ["some/other/key", blob.key]


def test_queued_faults_are_consumed_in_order_and_times_counts_uses(
    proxied_client: BaseClient, blob: Blob, fault_proxy: FaultProxy
) -> None:
    fault_proxy.add_fault("status503", match=blob.key, times=2)
    fault_proxy.add_fault("status403", match=blob.key)
    fault_proxy.add_fault("status500", match=blob.key, method=None)

    codes = []
    for _ in range(4):
        with pytest.raises(ClientError) as failed:
            proxied_client.get_object(Bucket=blob.bucket, Key=blob.key)
        codes.append(failed.value.response["Error"]["Code"])

    assert codes == ["SlowDown", "SlowDown", "AccessDenied", "InternalError"]
    assert fault_proxy.pending_faults() == []


def test_request_log_counts_gets_and_body_bytes(
    proxied_client: BaseClient, blob: Blob, fault_proxy: FaultProxy
) -> None:
    ranges = [(0, 99_999), (100_000, 399_999), (400_000, BLOB_BYTES - 1)]
    for first, last in ranges:
        proxied_client.get_object(Bucket=blob.bucket, Key=blob.key, Range=f"bytes={first}-{last}")[
            "Body"
        ].read()
    proxied_client.head_object(Bucket=blob.bucket, Key=blob.key)

    gets = fault_proxy.requests(match=blob.key, method="GET")
    assert [r.range for r in gets] == [f"bytes={a}-{b}" for a, b in ranges]
    assert all(r.status == 206 and r.done for r in gets)
    assert fault_proxy.bytes_sent(match=blob.key) == BLOB_BYTES
    assert len(fault_proxy.requests(match=blob.key)) == 4

    fault_proxy.clear()
    assert fault_proxy.requests() == []
    assert fault_proxy.bytes_sent() == 0


def test_add_fault_refuses_what_it_cannot_do(fault_proxy: FaultProxy) -> None:
    with pytest.raises(ValueError, match="unknown fault action"):
        fault_proxy.add_fault("explode")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="times"):
        fault_proxy.add_fault("reset", times=0)
    with pytest.raises(ValueError, match="non-negative"):
        fault_proxy.add_fault("truncate", arg=-5)


def test_control_endpoint_queues_faults_and_serves_the_log_over_http(
    proxied_client: BaseClient, blob: Blob, fault_proxy: FaultProxy
) -> None:
    control = fault_proxy.endpoint_url + "/__fault__"
    spec = {"action": "status503", "match": blob.key, "times": 1}

    assert _http_json("POST", control, spec) == (201, {"queued": 1})
    with pytest.raises(ClientError):
        proxied_client.get_object(Bucket=blob.bucket, Key=blob.key)
    status, log = _http_json("GET", control)
    assert status == 200
    assert isinstance(log, list)
    assert [(r["method"], r["status"], r["fault"]) for r in log] == [("GET", 503, "status503")]

    assert _http_json("POST", control, {"action": "explode"})[0] == 400
    assert _http_json("DELETE", control)[0] == 204
    assert fault_proxy.requests() == []


def _http_json(method: str, url: str, payload: object = None) -> tuple[int, object]:
    data = None if payload is None else json.dumps(payload).encode()
    request = urllib.request.Request(url, data=data, method=method)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=5) as response:
            text = response.read()
            return response.status, json.loads(text) if text else None
    except urllib.error.HTTPError as error:
        with error:
            return error.code, json.loads(error.read() or b"null")


# ---- the servers and fixtures underneath -------------------------------------------


def test_moto_reset_drops_every_bucket(moto_server: ThreadedMoto, s3_client: BaseClient) -> None:
    s3_client.create_bucket(Bucket="doomed")

    moto_server.reset()

    assert s3_client.list_buckets()["Buckets"] == []


def test_bucket_fixture_gives_a_fresh_empty_bucket(s3_client: BaseClient, bucket: str) -> None:
    assert [b["Name"] for b in s3_client.list_buckets()["Buckets"]] == [bucket]
    assert s3_client.list_objects_v2(Bucket=bucket)["KeyCount"] == 0


def test_moto_subprocess_serves_s3_from_its_own_process(
    moto_subprocess: SubprocessMoto, moto_subprocess_s3_env: S3Env, moto_server: ThreadedMoto
) -> None:
    client = moto_subprocess_s3_env.boto3_client()
    try:
        client.create_bucket(Bucket="elsewhere")
        client.put_object(Bucket="elsewhere", Key="k", Body=b"v")
        assert client.get_object(Bucket="elsewhere", Key="k")["Body"].read() == b"v"
    finally:
        client.close()

    assert moto_subprocess.pid != os.getpid()
    assert moto_subprocess.endpoint_url != moto_server.endpoint_url


def test_child_env_lets_a_child_process_reach_the_server(
    child_env: dict[str, str], s3_client: BaseClient, bucket: str
) -> None:
    s3_client.put_object(Bucket=bucket, Key="seen-by-child", Body=b"x")
    script = (
        "import boto3; c = boto3.client('s3');"
        f"print([o['Key'] for o in c.list_objects_v2(Bucket='{bucket}')['Contents']]); c.close()"
    )

    result = subprocess.run(
        [sys.executable, "-c", script],
        env=child_env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "['seen-by-child']"


def test_child_env_sets_the_aws_variables_without_touching_os_environ(s3_env: S3Env) -> None:
    base = {"AWS_PROFILE": "prod", "AWS_ENDPOINT_URL_S3": "http://elsewhere", "PATH": "/bin"}
    base |= {name: "/etc/ssl/ca.pem" for name in CA_BUNDLE_VARS}

    kept = s3_env.subprocess_env(base)
    dropped = s3_env.subprocess_env(base, keep_ca_bundle=False)

    assert kept["AWS_ENDPOINT_URL"] == s3_env.endpoint_url
    assert (kept["AWS_ACCESS_KEY_ID"], kept["AWS_SECRET_ACCESS_KEY"]) == ("testing", "testing")
    assert kept["AWS_DEFAULT_REGION"] == "us-east-1"
    assert kept["AWS_EC2_METADATA_DISABLED"] == "true"
    assert "AWS_PROFILE" not in kept and "AWS_ENDPOINT_URL_S3" not in kept
    assert all(kept[name] == "/etc/ssl/ca.pem" for name in CA_BUNDLE_VARS)
    assert not any(name in dropped for name in CA_BUNDLE_VARS)
    assert os.environ.get("AWS_ENDPOINT_URL") != s3_env.endpoint_url


def test_proxy_threads_do_not_outlive_the_proxy(s3_env: S3Env) -> None:
    before = {t.name for t in threading.enumerate()}
    with FaultProxy(s3_env.endpoint_url):
        assert "fault-proxy" in {t.name for t in threading.enumerate()}
    assert {t.name for t in threading.enumerate()} - before == set()


# ---- throttling ----------------------------------------------------------------------


def test_throttle_admits_k_requests_a_second_and_answers_the_rest_503_slowdown_with_retry_after(
    raw_get: RawGet, blob: Blob, fault_proxy: FaultProxy
) -> None:
    fault_proxy.set_throttle(Throttle(requests_per_s=3, retry_after_s=2, match=blob.key))

    responses = [raw_get(blob) for _ in range(5)]  # bodies are read after, to keep the burst short
    answers = [(r.status, r.getheader("Retry-After"), r.read()) for r in responses]
    time.sleep(1.1)
    after_a_second = raw_get(blob)

    # Five requests well within one second (a loaded machine has a full second for them).
    assert [status for status, _, _ in answers] == [200, 200, 200, 503, 503]
    assert [retry for status, retry, _ in answers if status == 503] == ["2", "2"]
    assert all(b"<Code>SlowDown</Code>" in body for status, _, body in answers if status == 503)
    assert answers[0][2] == blob.data
    assert after_a_second.status == 200 and after_a_second.read() == blob.data
    assert [r.status for r in fault_proxy.requests(match=blob.key)] == [200, 200, 200, 503, 503, 200]


def test_throttle_leaves_other_requests_alone_and_lifts_when_cleared(
    raw_get: RawGet, proxied_client: BaseClient, blob: Blob, fault_proxy: FaultProxy
) -> None:
    fault_proxy.set_throttle(Throttle(requests_per_s=1, match=blob.key, method="GET"))
    assert raw_get(blob).status == 200
    assert raw_get(blob).status == 503
    assert proxied_client.head_object(Bucket=blob.bucket, Key=blob.key)["ContentLength"] == BLOB_BYTES

    fault_proxy.set_throttle(None)

    assert [raw_get(blob).status for _ in range(3)] == [200, 200, 200]
    with pytest.raises(ValueError):
        fault_proxy.set_throttle(Throttle(requests_per_s=0))
