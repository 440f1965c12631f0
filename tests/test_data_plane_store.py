"""The data-plane start: a pull that signs its own URLs and reads its manifest over the range client.

The store must sign exactly as botocore would (checked against botocore, and by
SeaweedFS, which verifies every signature), leave to the S3 SDK what it cannot do
(credentials that are not static keys, an empty listing, a page it cannot read),
and fail exactly as the SDK's store fails: there, it is the SDK's store that
decides. The subprocess test at the end is the point of it all: a cold pull of a
model with a manifest never imports the SDK.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import functools
import hashlib
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import botocore.session
import pytest
import xxhash
from botocore.client import BaseClient
from botocore.config import Config
from support.faultproxy import FaultProxy
from support.s3env import S3Env
from support.seaweedfs import SeaweedFS

from modelsync.adapters.http.client import RangeClient
from modelsync.adapters.store.data_plane import DataPlaneStore, body_intact, open_store
from modelsync.adapters.store.presign import StaticRoute, static_route
from modelsync.adapters.store.sdk import S3, open_s3
from modelsync.backends import s3_backends
from modelsync.config import Settings
from modelsync.core import listing
from modelsync.core.manifest import MANIFEST_NAME, FileEntry, render_manifest
from modelsync.core.refs import ModelRef, parse_source
from modelsync.core.sigv4 import Credentials
from modelsync.errors import (
    AccessDeniedError,
    BucketNotFoundError,
    ModelsyncError,
    WrongEndpointError,
)

PREFIX = "org/model/rev1/"
WEIGHTS = b"weights!" * 40_000
#: one SeaweedFS per worker is seconds of start-up: its tests run on one worker, as test_seaweedfs's do
SEAWEED = pytest.mark.xdist_group("seaweedfs")

Call = Callable[[Any], Awaitable[Any]]


def put_model(client: BaseClient, bucket: str, manifest: bool = True) -> ModelRef:
    """One file and, by default, the manifest `publish` would write for it."""
    etag = client.put_object(Bucket=bucket, Key=PREFIX + "weights.bin", Body=WEIGHTS)["ETag"].strip('"')
    if manifest:
        entry = FileEntry("weights.bin", len(WEIGHTS), xxhash.xxh3_128_hexdigest(WEIGHTS), etag)
        client.put_object(Bucket=bucket, Key=PREFIX + MANIFEST_NAME, Body=render_manifest([entry]))
    return parse_source(f"s3://{bucket}/{PREFIX}")


def settings_for(endpoint_url: str, tmp_path: Path) -> Settings:
    return Settings(
        cache_dir=tmp_path / "cache",
        endpoint_url=endpoint_url,
        connect_timeout_s=1.0,
        read_timeout_s=2.0,
        backoff_floor_s=0.02,
    )


def through_store(settings: Settings, call: Call) -> tuple[Any, bool]:
    """`call(store)` on the store a pull opens (backends.s3_backends); its outcome, and whether
    the SDK was opened. An error is returned, not raised, so a test can compare it."""

    async def run() -> tuple[Any, bool]:
        async with s3_backends(settings)() as backends:
            store = backends.store
            assert isinstance(store, DataPlaneStore)
            try:
                outcome = await call(store)
            except ModelsyncError as exc:
                outcome = exc
            return outcome, store.sdk_opened

    return asyncio.run(run())


def through_sdk(settings: Settings, call: Call) -> Any:
    """`call(s3)` on the SDK's store alone, as every pull ran before; an error is returned."""

    async def run() -> Any:
        async with open_s3(settings) as s3:
            try:
                return await call(s3)
            except ModelsyncError as exc:
                return exc

    return asyncio.run(run())


def ends_as_the_sdk(settings: Settings, call: Call) -> tuple[Any, bool]:
    """`call` through the store a pull opens, checked to end as on the SDK's store alone (the same
    class and message); its outcome, and whether the SDK was opened."""
    ours, sdk_opened = through_store(settings, call)
    theirs = through_sdk(settings, call)
    assert (type(ours), str(ours)) == (type(theirs), str(theirs))
    return ours, sdk_opened


def manifest_of(ref: ModelRef) -> Call:
    """The call that asks a store for `ref`'s manifest."""
    return lambda store: store.get_manifest(ref, MANIFEST_NAME)


def http_get(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with opener.open(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.fixture
def static_keys(aws_credentials: S3Env, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> S3Env:
    """The test keys in the environment and no shared config file, even on a machine that has one."""
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    return aws_credentials


# ---- which routes are signed here ----------------------------------------------------------------

KEYS = {"AWS_ACCESS_KEY_ID": "AKID", "AWS_SECRET_ACCESS_KEY": "secret", "AWS_CONFIG_FILE": "/nonexistent"}
ENDPOINT = "http://127.0.0.1:9000"


@pytest.mark.parametrize(
    ("settings", "env", "base_url"),
    [
        ({}, {}, ENDPOINT),
        ({"endpoint_url": "https://s3.example.com/"}, {}, "https://s3.example.com"),
        ({"endpoint_url": "https://s3.example.com/base"}, {}, "https://s3.example.com/base"),
        ({"region": "eu-central-1"}, {}, ENDPOINT),
        ({}, {"AWS_ACCESS_KEY_ID": ""}, None),
        ({}, {"AWS_SECRET_ACCESS_KEY": ""}, None),
        ({}, {"AWS_PROFILE": "ml"}, None),
        ({}, {"AWS_DEFAULT_PROFILE": "ml"}, None),
        ({}, {"AWS_CREDENTIAL_EXPIRATION": "2030-01-01T00:00:00Z"}, None),
        ({}, {"AWS_USE_FIPS_ENDPOINT": "true"}, None),
        ({}, {"AWS_USE_DUALSTACK_ENDPOINT": "true"}, None),
        ({}, {"AWS_CONFIG_FILE": __file__}, None),  # any file there may change how botocore signs
        ({"endpoint_url": None}, {}, None),
        ({"addressing_style": "virtual"}, {}, None),
        ({"addressing_style": "auto"}, {}, None),
        ({"region": "bad_region"}, {}, None),
        ({"region": "12345"}, {}, None),
        ({"endpoint_url": "http://user:pw@127.0.0.1:9000"}, {}, None),
        ({"endpoint_url": "http://127.0.0.1:9000?x=1"}, {}, None),
        ({"endpoint_url": "HTTP://127.0.0.1:9000"}, {}, None),
    ],
)
def test_a_route_is_signed_here_only_where_botocore_would_sign_it_the_same_way(
    settings: dict[str, Any], env: dict[str, str], base_url: str | None
) -> None:
    route = static_route(Settings(**{"endpoint_url": ENDPOINT, **settings}), {**KEYS, **env})
    assert (route.base_url if route else None) == base_url


@pytest.mark.parametrize(
    ("tokens", "token"),
    [
        ({}, None),
        ({"AWS_SESSION_TOKEN": "session"}, "session"),
        ({"AWS_SECURITY_TOKEN": "legacy", "AWS_SESSION_TOKEN": "session"}, "legacy"),
        ({"AWS_SECURITY_TOKEN": "", "AWS_SESSION_TOKEN": "session"}, "session"),
    ],
)
def test_the_session_token_is_the_one_botocore_reads(tokens: dict[str, str], token: str | None) -> None:
    route = static_route(Settings(endpoint_url=ENDPOINT), {**KEYS, **tokens})
    assert route is not None and route.credentials == Credentials("AKID", "secret", token)


CRC32_OF_HELLO = "NhCmhg=="  # base64 of zlib.crc32(b"hello"), big-endian, as S3 sends it


@pytest.mark.parametrize(
    ("headers", "intact"),
    [
        ({}, True),
        ({"x-amz-checksum-crc32": CRC32_OF_HELLO, "x-amz-checksum-type": "FULL_OBJECT"}, True),
        ({"x-amz-checksum-crc32": "AAAAAA=="}, False),
        ({"x-amz-checksum-sha256": base64.b64encode(hashlib.sha256(b"hello").digest()).decode()}, True),
        ({"x-amz-checksum-sha1": base64.b64encode(hashlib.sha1(b"hello!").digest()).decode()}, False),
        ({"x-amz-checksum-crc32c": "mnG7TA=="}, False),  # not computed here: the SDK checks it
        ({"x-amz-checksum-crc32": "AAAAAA==-3"}, True),  # of a multipart upload's parts: botocore skips it
    ],
)
def test_a_manifest_body_is_checked_against_the_stores_checksum(
    headers: dict[str, str], intact: bool
) -> None:
    assert body_intact(headers, b"hello") is intact


@functools.cache
def _botocore_session() -> botocore.session.Session:
    return botocore.session.get_session()


@pytest.mark.parametrize(
    ("endpoint", "region", "bucket", "key"),
    [
        ("http://127.0.0.1:9000", "us-east-1", "models", f"{PREFIX}{MANIFEST_NAME}"),
        ("https://s3.example.com", "eu-west-3", "my.bucket", "a b/c+d~e%f/ü.bin"),
        ("https://s3.example.com/", "us-east-1", "bucket", "k"),
        ("https://s3.example.com:443", "us-east-1", "bucket", "k"),
        ("http://S3.Example.com:8080/base/", "cn-north-1", "bucket", "a//b/../c/./d"),
        ("http://[::1]:9000", "us-gov-west-1", "b-s3alias", "k" + chr(1)),
    ],
)
def test_urls_signed_here_are_the_urls_botocore_signs(
    endpoint: str, region: str, bucket: str, key: str
) -> None:
    creds = Credentials("AKIDEXAMPLE", "secret/+=", "token")
    client = _botocore_session().create_client(
        "s3",
        region_name=region,
        endpoint_url=endpoint,
        aws_access_key_id=creds.access_key,
        aws_secret_access_key=creds.secret_key,
        aws_session_token=creds.token,
        config=Config(signature_version="s3v4", s3={"addressing_style": "path"}),
    )
    try:
        params = {"Bucket": bucket, "Key": key}
        theirs = client.generate_presigned_url("get_object", Params=params, ExpiresIn=600)
    finally:
        client.close()
    target, _, query = theirs.partition("?")
    signed = dict(parse_qsl(query))
    when = dt.datetime.strptime(signed["X-Amz-Date"], "%Y%m%dT%H%M%SZ").replace(tzinfo=dt.UTC)
    settings = Settings(endpoint_url=endpoint, region=region)
    route = StaticRoute(endpoint.rstrip("/"), region, creds)

    async def sign() -> str:
        with RangeClient() as client:
            store = DataPlaneStore(settings, route, client, now=lambda: when)
            return await store.presign_get(bucket, key, 600)

    ours_target, _, ours_query = asyncio.run(sign()).partition("?")
    assert (ours_target, dict(parse_qsl(ours_query))) == (target, signed)


# ---- a real store checks the signatures --------------------------------------------------------


@pytest.fixture
def as_reader(static_keys: S3Env, seaweed_reader: S3Env, monkeypatch: pytest.MonkeyPatch) -> S3Env:
    """The read-only identity's keys in the environment, where both the store and the SDK read them."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", seaweed_reader.access_key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", seaweed_reader.secret_access_key)
    return seaweed_reader


@pytest.fixture
def seaweed_model(seaweed_admin: S3Env, seaweed_bucket: str) -> Iterator[ModelRef]:
    admin = seaweed_admin.boto3_client()
    try:
        yield put_model(admin, seaweed_bucket)
    finally:
        admin.close()


@pytest.mark.usefixtures("as_reader")
@pytest.mark.seaweedfs
@SEAWEED
def test_seaweedfs_accepts_the_manifest_get_and_the_urls_signed_here_without_the_sdk(
    tmp_path: Path, seaweedfs: SeaweedFS, seaweed_model: ModelRef
) -> None:
    async def manifest_and_url(store: DataPlaneStore) -> tuple[bytes | None, str]:
        url = await store.presign_get(seaweed_model.bucket, seaweed_model.prefix + "weights.bin", 600)
        return await store.get_manifest(seaweed_model, MANIFEST_NAME), url

    settings = settings_for(seaweedfs.endpoint_url, tmp_path)

    (manifest, url), sdk_opened = through_store(settings, manifest_and_url)

    assert manifest is not None and b'"weights.bin"' in manifest
    assert http_get(url, {"Range": "bytes=8-15"}) == (206, WEIGHTS[8:16])
    assert not sdk_opened


@pytest.mark.usefixtures("as_reader")
@pytest.mark.seaweedfs
@SEAWEED
def test_seaweedfs_accepts_a_listing_signed_here_without_the_sdk(
    tmp_path: Path, seaweedfs: SeaweedFS, seaweed_model: ModelRef
) -> None:
    settings = settings_for(seaweedfs.endpoint_url, tmp_path)
    rows, sdk_opened = through_store(settings, listing_of(seaweed_model))

    assert [key for key, _, _ in rows] == [seaweed_model.prefix + k for k in (MANIFEST_NAME, "weights.bin")]
    assert not sdk_opened


@pytest.mark.seaweedfs
@SEAWEED
def test_a_wrong_secret_is_access_denied_in_the_sdks_words(
    tmp_path: Path,
    seaweedfs: SeaweedFS,
    seaweed_model: ModelRef,
    as_reader: S3Env,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-" + as_reader.secret_access_key)
    settings = settings_for(seaweedfs.endpoint_url, tmp_path)

    error, sdk_opened = ends_as_the_sdk(settings, manifest_of(seaweed_model))

    assert isinstance(error, AccessDeniedError)
    assert sdk_opened


# ---- what the SDK does, and how errors end ----------------------------------------------------


#: keys a listing must carry whole: a space, non-ASCII, a plus, a percent sign, a control character
ODD_KEYS = ("a b.bin", "naïve.json", "x+y.txt", "100%.md", "tab\there.txt")


def listing_of(ref: ModelRef) -> Call:
    """The call that lists `ref` on a store, as (key, size, ETag) rows."""

    async def listing(store: Any) -> list[tuple[str, int, str]]:
        return [(o.key, o.size_bytes, o.etag) for o in await store.list_model(ref)]

    return listing


def test_a_model_without_a_manifest_is_listed_here_page_by_page_as_the_sdk_lists_it(
    tmp_path: Path, static_keys: S3Env, s3_env: S3Env, s3_client: BaseClient, bucket: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ref = put_model(s3_client, bucket, manifest=False)
    for key in ODD_KEYS:
        s3_client.put_object(Bucket=bucket, Key=ref.prefix + key, Body=key.encode())
    monkeypatch.setitem(listing.LIST_PARAMS, "max-keys", "2")  # 6 objects: three pages, signed as sent
    settings = settings_for(s3_env.endpoint_url, tmp_path)

    rows, sdk_opened = through_store(settings, listing_of(ref))

    assert rows == through_sdk(settings, listing_of(ref))
    assert sorted(r[0] for r in rows) == sorted(ref.prefix + k for k in (*ODD_KEYS, "weights.bin"))
    assert not sdk_opened


def test_an_empty_listing_is_left_to_the_sdk_and_ends_in_its_words(
    tmp_path: Path, static_keys: S3Env, s3_env: S3Env, bucket: str
) -> None:
    ref = parse_source(f"s3://{bucket}/org/nothing-here/")

    error, sdk_opened = ends_as_the_sdk(settings_for(s3_env.endpoint_url, tmp_path), listing_of(ref))

    assert "no objects under" in str(error)
    assert sdk_opened


@pytest.mark.parametrize(
    "body",
    [
        b"not xml",
        b"<Error><Code>AccessDenied</Code></Error>",
        b"<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>",
        b"<ListBucketResult><Contents><Key>k</Key><Size>-1</Size><ETag>e</ETag></Contents></ListBucketResult>",
        b"<ListBucketResult><Contents><Key>k</Key><Size>1</Size></Contents></ListBucketResult>",
    ],
    ids=["not-xml", "not-a-listing", "truncated-without-token", "negative-size", "no-etag"],
)
def test_a_listing_page_that_is_not_understood_is_none_so_the_sdk_is_asked(body: bytes) -> None:
    assert listing.parse_list_page(body) is None


def test_without_static_keys_the_sdk_store_serves_alone(tmp_path: Path, s3_env: S3Env) -> None:
    settings = settings_for(s3_env.endpoint_url, tmp_path)

    async def opened(env: dict[str, str]) -> type:
        with RangeClient() as client:
            async with open_store(settings, client, env) as store:
                return type(store)

    assert asyncio.run(opened({**KEYS, "AWS_PROFILE": "ml"})) is S3
    assert asyncio.run(opened({"AWS_WEB_IDENTITY_TOKEN_FILE": "/var/run/token"})) is S3
    assert asyncio.run(opened(KEYS)) is DataPlaneStore


def test_after_the_credentials_are_renewed_the_sdk_signs(
    tmp_path: Path, static_keys: S3Env, s3_env: S3Env, s3_client: BaseClient, bucket: str
) -> None:
    ref = put_model(s3_client, bucket)

    async def renew_then_sign(store: DataPlaneStore) -> tuple[bool, str]:
        await store.renew_credentials()
        return store.sdk_opened, await store.presign_get(bucket, ref.prefix + "weights.bin", 600)

    (opened, url), _ = through_store(settings_for(s3_env.endpoint_url, tmp_path), renew_then_sign)

    assert opened
    assert http_get(url) == (200, WEIGHTS)


@pytest.mark.parametrize(
    ("fault", "error"),
    [
        ("status403", AccessDeniedError),
        ("expired_token", AccessDeniedError),
        ("redirect", WrongEndpointError),
    ],
)
def test_a_refused_manifest_get_ends_as_the_sdks_store_ends_it(
    fault: str,
    error: type[ModelsyncError],
    tmp_path: Path,
    static_keys: S3Env,
    proxied_s3_env: S3Env,
    fault_proxy: FaultProxy,
    s3_client: BaseClient,
    bucket: str,
) -> None:
    ref = put_model(s3_client, bucket)
    fault_proxy.add_fault(fault, match=MANIFEST_NAME, times=1000)  # type: ignore[arg-type]
    settings = settings_for(proxied_s3_env.endpoint_url, tmp_path)

    ours, sdk_opened = ends_as_the_sdk(settings, manifest_of(ref))

    assert isinstance(ours, error) and sdk_opened


def test_a_missing_bucket_ends_as_the_sdks_store_ends_it(
    tmp_path: Path, static_keys: S3Env, s3_env: S3Env
) -> None:
    """A dead endpoint ends the same way too: test_pull_faults' unreachable endpoint, through this store."""
    ref = parse_source(f"s3://no-such-bucket-here/{PREFIX}")
    settings = settings_for(s3_env.endpoint_url, tmp_path)

    ours, _ = ends_as_the_sdk(settings, manifest_of(ref))

    assert isinstance(ours, BucketNotFoundError)


def test_a_throttled_manifest_get_is_ridden_out_by_the_sdks_retries(
    tmp_path: Path,
    static_keys: S3Env,
    proxied_s3_env: S3Env,
    fault_proxy: FaultProxy,
    s3_client: BaseClient,
    bucket: str,
) -> None:
    ref = put_model(s3_client, bucket)
    fault_proxy.add_fault("status503", match=MANIFEST_NAME)

    settings = settings_for(proxied_s3_env.endpoint_url, tmp_path)

    manifest, sdk_opened = through_store(settings, manifest_of(ref))

    assert isinstance(manifest, bytes) and b'"weights.bin"' in manifest
    assert sdk_opened
    assert [r.status for r in fault_proxy.requests(MANIFEST_NAME)] == [503, 200]


def test_a_manifest_damaged_in_transit_is_fetched_again_by_the_sdk(
    tmp_path: Path,
    static_keys: S3Env,
    proxied_s3_env: S3Env,
    fault_proxy: FaultProxy,
    s3_client: BaseClient,
    bucket: str,
) -> None:
    """The store keeps a CRC32 of every object put by a current SDK; the flipped bit fails it here."""
    ref = put_model(s3_client, bucket)
    intact = s3_client.get_object(Bucket=bucket, Key=ref.prefix + MANIFEST_NAME)["Body"].read()
    fault_proxy.add_fault("bitflip", match=MANIFEST_NAME, arg=10)
    settings = settings_for(proxied_s3_env.endpoint_url, tmp_path)

    manifest, sdk_opened = through_store(settings, manifest_of(ref))

    assert (manifest, sdk_opened) == (intact, True)
    assert [r.fault for r in fault_proxy.requests(MANIFEST_NAME)] == ["bitflip", None]


# ---- the point of it: a cold pull without the SDK ------------------------------------------------

#: what a cold pull must not load: the S3 SDK, the full command line, and what only other paths
#: need (a refusal's date, removals, retries' jitter, size parsing, `ctypes.util`'s ldconfig);
#: and the collector must run again once the pull's code is in (__main__ holds it off until then).
#: The line before names the dataclasses it made, each class's methods compiled as it is imported.
REPORTING_IMPORTS = (
    "import dataclasses, gc, sys\n"
    "made = []\n"
    "process_class = dataclasses._process_class\n"
    "def counting(cls, *args):\n"
    "    made.append(cls.__qualname__)\n"
    "    return process_class(cls, *args)\n"
    "dataclasses._process_class = counting\n"
    "from modelsync.__main__ import main\n"
    "try:\n"
    "    main()\n"
    "finally:\n"
    "    print(sorted(made), file=sys.stderr)\n"
    "    print(sorted(m for m in ('aiobotocore', 'botocore', 'aiohttp', 'urllib3', 'typer', '_strptime',"
    " 'email', 'shutil', 'random', 'decimal', 'ctypes.util') if m in sys.modules)"
    " + ([] if gc.isenabled() else ['collector off']), file=sys.stderr)\n"
)


def cold_pull(env: dict[str, str], ref: ModelRef, cache: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", REPORTING_IMPORTS, "pull", ref.uri, "--cache-dir", str(cache), "--quiet"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def no_proxy_env(env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """No proxy variable (one would load botocore's proxy rules) and no shared config file."""
    return {k: v for k, v in env.items() if not k.lower().endswith("_proxy")} | {
        "AWS_CONFIG_FILE": str(tmp_path / "no-aws-config")
    }


def test_a_cold_pull_of_a_model_with_a_manifest_never_imports_the_s3_sdk(
    tmp_path: Path, child_env: dict[str, str], s3_client: BaseClient, bucket: str
) -> None:
    ref = put_model(s3_client, bucket)

    done = cold_pull(no_proxy_env(child_env, tmp_path), ref, tmp_path / "cache")

    assert done.returncode == 0, done.stderr
    assert (Path(done.stdout.splitlines()[-1]) / "weights.bin").read_bytes() == WEIGHTS
    assert done.stderr.splitlines()[-1] == "[]"


#: the dataclasses a cold pull may make: those that need what a NamedTuple lacks (a field left out of
#: repr, a default factory, keyword-only fields, mutable state, a field named like a tuple method).
#: Each costs 0.3-2 ms of start-up to compile its methods; the other records on this path are
#: NamedTuples (docs/ARCHITECTURE.md, "Values").
COLD_PATH_DATACLASSES = [
    "Backends", "Credentials", "JournalState", "Part", "PartRetries", "PullJob", "RangeRequest",
    "ReadyOptions", "ResponseHead", "Settings",
]


def test_a_cold_pull_of_a_model_without_a_manifest_never_imports_the_s3_sdk(
    tmp_path: Path, child_env: dict[str, str], s3_client: BaseClient, bucket: str
) -> None:
    """Nor makes a dataclass beyond those that need to be one."""
    ref = put_model(s3_client, bucket, manifest=False)

    done = cold_pull(no_proxy_env(child_env, tmp_path), ref, tmp_path / "cache")

    assert done.returncode == 0, done.stderr
    assert (Path(done.stdout.splitlines()[-1]) / "weights.bin").read_bytes() == WEIGHTS
    assert done.stderr.splitlines()[-2:] == [str(COLD_PATH_DATACLASSES), "[]"]


def test_a_cold_pull_with_keys_in_a_credentials_file_goes_through_the_sdk(
    tmp_path: Path, child_env: dict[str, str], s3_env: S3Env, s3_client: BaseClient, bucket: str
) -> None:
    ref = put_model(s3_client, bucket)
    credentials = tmp_path / "credentials"
    credentials.write_text(
        f"[default]\naws_access_key_id = {s3_env.access_key_id}\n"
        f"aws_secret_access_key = {s3_env.secret_access_key}\n"
    )
    env = no_proxy_env(child_env, tmp_path) | {"AWS_SHARED_CREDENTIALS_FILE": str(credentials)}
    del env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]

    done = cold_pull(env, ref, tmp_path / "cache")

    assert done.returncode == 0, done.stderr
    assert (Path(done.stdout.splitlines()[-1]) / "weights.bin").read_bytes() == WEIGHTS
    assert "aiobotocore" in done.stderr.splitlines()[-1]
