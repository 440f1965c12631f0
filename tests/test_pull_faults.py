"""The pull under faults: transient network failures, corruption, overwrites, bad input, disk full.

Every test drives `modelsync.engine.ensure.ensure_ready` in-process against a real moto server,
most of them through the fault proxy, and asserts the outcome and the invariants:
the ready path exists only after a verified pull, nothing is written outside the
cache root, and a failed pull leaves only its own staging area (kept for resume).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import json
import os
import re
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
from botocore.client import BaseClient
from support.engine import pull
from support.faultproxy import FaultProxy, RequestRecord
from support.objects import payload
from support.s3env import S3Env
from support.waiting import wait_for

import modelsync.adapters.cache.staging as staging_adapter
import modelsync.adapters.fs as fs_adapter
import modelsync.adapters.http.body as body_copy
from modelsync.adapters.cache import STATE_DIR, Cache
from modelsync.adapters.volume import in_memory
from modelsync.backends import s3_writer
from modelsync.config import Settings
from modelsync.core.manifest import MANIFEST_NAME, FileEntry, render_manifest
from modelsync.core.refs import ModelRef, parse_source
from modelsync.core.units import format_bytes, parse_size
from modelsync.engine.ensure import PullResult
from modelsync.engine.events import NoEvents
from modelsync.engine.upload import upload
from modelsync.errors import (
    AccessDeniedError,
    ChecksumMismatchError,
    DiskFullError,
    ExitCode,
    IntegrityError,
    ManifestError,
    NotFoundError,
    ObjectChangedError,
    RemoteUnavailableError,
    UnsafeKeyError,
)

MiB = 1024 * 1024
PART = MiB
PREFIX = "org/model/rev1/"
KEY_NAME = "weights.bin"


# ---- helpers --------------------------------------------------------------------------


def model_ref(bucket: str) -> ModelRef:
    return parse_source(f"s3://{bucket}/{PREFIX}")


def data_gets(proxy: FaultProxy, name: str = KEY_NAME) -> list[RequestRecord]:
    """Ranged GETs of one object's body (presigned data-plane requests)."""
    return proxy.object_gets(name)


def range_start(record: RequestRecord) -> int:
    assert record.range is not None and record.range.startswith("bytes=")
    return int(record.range[len("bytes=") :].split("-")[0])


def files_under(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if not p.is_dir())


def assert_failed_cleanly(tmp_path: Path, settings: Settings, ref: ModelRef) -> None:
    """After a failed pull: no ready path, no record, nothing outside the cache's state dir."""
    cache = Cache(settings.cache_dir)
    assert not cache.ready_path(ref).exists()
    assert not os.path.lexists(cache.ready_path(ref))
    assert not cache.record_path(ref).exists()
    state = settings.cache_dir / STATE_DIR
    for path in files_under(tmp_path):
        if path.is_relative_to(settings.cache_dir):
            assert path.is_relative_to(state), f"{path} written outside the cache's state dir"
        else:
            assert path.is_relative_to(tmp_path / "src"), f"{path} written outside the cache"
    # What remains of the pull is its own staging area (kept for resume) or nothing.
    staging = cache.staging_dir
    if staging.exists():
        for path in staging.iterdir():
            assert path.name in {ref.slug, f"{ref.slug}.journal"}, f"stray staging entry {path}"


def assert_ready(result: PullResult, settings: Settings, ref: ModelRef, expected: dict[str, bytes]) -> None:
    assert result.path == settings.cache_dir / ref.cache_path
    got = {p.relative_to(result.path).as_posix(): p.read_bytes() for p in files_under(result.path)}
    assert got.keys() == expected.keys()
    for name, data in expected.items():
        assert got[name] == data, f"{name} differs from the source"
    staging = Cache(settings.cache_dir).staging_dir
    assert list(staging.iterdir()) == [], "staging left behind after a successful pull"


def record_of(settings: Settings, ref: ModelRef) -> dict[str, object]:
    data: dict[str, object] = json.loads(Cache(settings.cache_dir).record_path(ref).read_bytes())
    return data


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def pulling_in_background(settings: Settings, ref: ModelRef) -> Iterator[Future[PullResult]]:
    """Run a pull in a thread, so the test can change S3 while it is in flight."""
    with ThreadPoolExecutor(1) as pool:
        yield pool.submit(pull, settings, ref, NoEvents())


# ---- fixtures -------------------------------------------------------------------------


@pytest.fixture
def make_settings(tmp_path: Path, proxied_s3_env: S3Env, aws_credentials: S3Env) -> Callable[..., Settings]:
    """Settings for a fast pull through the fault proxy; keyword overrides per test."""

    def make(**overrides: object) -> Settings:
        values: dict[str, object] = {
            "cache_dir": tmp_path / "cache",
            "endpoint_url": proxied_s3_env.endpoint_url,
            "part_size_bytes": PART,
            "concurrency": 4,
            "read_timeout_s": 1.0,
            "connect_timeout_s": 1.0,
            "part_attempts": 4,
            # The retry schedule's shape, at a fiftieth of its waits: tests stay fast.
            "backoff_floor_s": 0.02,
        }
        values.update(overrides)
        return Settings(**values)  # type: ignore[arg-type]

    return make


@pytest.fixture
def publish_model(
    tmp_path: Path, s3_env: S3Env, aws_credentials: S3Env
) -> Callable[[str, dict[str, bytes]], None]:
    """Publish files (with a manifest) straight to moto, bypassing the proxy."""

    def run(bucket: str, files: dict[str, bytes]) -> None:
        src = tmp_path / "src"
        for name, data in files.items():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            (src / name).write_bytes(data)
        settings = Settings(endpoint_url=s3_env.endpoint_url, part_size_bytes=5 * MiB, concurrency=4)
        asyncio.run(upload(settings, src, model_ref(bucket), writer=s3_writer(settings)))

    return run


# ---- transient faults at the part level -----------------------------------------------


@pytest.mark.parametrize("action", ["reset", "truncate", "stall"])
def test_pull_resumes_a_part_from_the_last_byte_written_after_a_broken_body(
    action: str,
    tmp_path: Path,
    make_settings: Callable[..., Settings],
    fault_proxy: FaultProxy,
    s3_client: BaseClient,
    bucket: str,
) -> None:
    # Whole parts only: the fault meets whichever part's GET comes first, and a tail part
    # shorter than the cut would end before the fault does.
    data = payload(3 * PART)
    s3_client.put_object(Bucket=bucket, Key=PREFIX + KEY_NAME, Body=data)
    cut = 300_000
    fault_proxy.add_fault(action, match=KEY_NAME, arg=cut)  # type: ignore[arg-type]
    settings = make_settings()

    result = pull(settings, model_ref(bucket), NoEvents())

    assert_ready(result, settings, model_ref(bucket), {KEY_NAME: data})
    assert fault_proxy.pending_faults() == []
    gets = data_gets(fault_proxy)
    broken = [r for r in gets if r.fault == action]
    assert len(broken) == 1 and broken[0].body_bytes_sent == cut
    first = range_start(broken[0])
    retries = [r for r in gets if r.fault is None and first < range_start(r) < first + PART]
    assert len(retries) == 1, f"expected one resumed range after {broken[0].range}: {gets}"
    # The retry asked only for what was not written: fewer bytes than the whole part.
    assert retries[0].body_bytes_sent < PART
    assert range_start(retries[0]) == first + cut
    assert fault_proxy.bytes_sent(KEY_NAME) == len(data) + (range_start(retries[0]) - first - cut)


@pytest.mark.parametrize("action, status", [("status503", 503), ("status500", 500)])
def test_pull_retries_a_part_answered_with_a_server_error(
    action: str,
    status: int,
    make_settings: Callable[..., Settings],
    fault_proxy: FaultProxy,
    s3_client: BaseClient,
    bucket: str,
) -> None:
    data = payload(2 * PART + 17, seed=1)
    s3_client.put_object(Bucket=bucket, Key=PREFIX + KEY_NAME, Body=data)
    fault_proxy.add_fault(action, match=KEY_NAME, times=2)  # type: ignore[arg-type]
    settings = make_settings()

    result = pull(settings, model_ref(bucket), NoEvents())

    assert_ready(result, settings, model_ref(bucket), {KEY_NAME: data})
    gets = data_gets(fault_proxy)
    failed = [r for r in gets if r.status == status]
    assert len(failed) == 2
    # Each failed range was asked for again, whole (nothing of it had been written).
    for r in failed:
        assert [g for g in gets if g.range == r.range and g.status == 206]
    assert fault_proxy.bytes_sent(KEY_NAME) - sum(r.body_bytes_sent for r in failed) == len(data)


@pytest.mark.parametrize(
    ("action", "overrides"),
    [
        ("status500", {"part_attempts": 3}),
        # Throttling does not count against part_attempts, only against the retry budget.
        ("status503", {"part_attempts": 2, "retry_budget_s": 1.5}),
    ],
    ids=["server-error-after-attempts", "throttled-after-budget"],
)
def test_pull_gives_up_on_a_part_that_keeps_failing_with_exit_7(
    tmp_path: Path,
    make_settings: Callable[..., Settings],
    fault_proxy: FaultProxy,
    s3_client: BaseClient,
    bucket: str,
    action: str,
    overrides: dict[str, object],
) -> None:
    s3_client.put_object(Bucket=bucket, Key=PREFIX + KEY_NAME, Body=payload(PART))
    fault_proxy.add_fault(action, match=KEY_NAME, times=100_000)  # type: ignore[arg-type]
    settings = make_settings(**overrides)

    started = time.monotonic()
    with pytest.raises(RemoteUnavailableError, match="without progress") as info:
        pull(settings, model_ref(bucket), NoEvents())

    took_s = time.monotonic() - started
    assert info.value.exit_code == ExitCode.REMOTE_UNAVAILABLE
    assert "resumes" in str(info.value)
    if action == "status500":
        assert len(data_gets(fault_proxy)) == 3
    else:
        assert 1.5 <= took_s < 15
        assert len(data_gets(fault_proxy)) > 2  # more than part_attempts: throttling kept it going
    assert_failed_cleanly(tmp_path, settings, model_ref(bucket))


# ---- corruption: a flipped bit ----------------------------------------------------------


def _upload_multipart(s3_client: BaseClient, bucket: str, key: str, data: bytes, part_bytes: int) -> str:
    upload = s3_client.create_multipart_upload(Bucket=bucket, Key=key)
    parts = []
    for number, start in enumerate(range(0, len(data), part_bytes), start=1):
        resp = s3_client.upload_part(
            Bucket=bucket,
            Key=key,
            UploadId=upload["UploadId"],
            PartNumber=number,
            Body=data[start : start + part_bytes],
        )
        parts.append({"PartNumber": number, "ETag": resp["ETag"]})
    resp = s3_client.complete_multipart_upload(
        Bucket=bucket, Key=key, UploadId=upload["UploadId"], MultipartUpload={"Parts": parts}
    )
    return str(resp["ETag"]).strip('"')


@pytest.fixture(params=["manifest", "etag-md5", "etag-multipart"])
def corruptible_model(
    request: pytest.FixtureRequest,
    s3_client: BaseClient,
    bucket: str,
    publish_model: Callable[[str, dict[str, bytes]], None],
) -> tuple[str, bytes]:
    """One object verified three ways: the manifest's xxh3, a plain MD5 ETag, an `md5-N` ETag."""
    kind = str(request.param)
    if kind == "manifest":
        data = payload(3 * PART + 5, seed=2)
        publish_model(bucket, {KEY_NAME: data})
    elif kind == "etag-md5":
        data = payload(3 * PART + 5, seed=3)
        s3_client.put_object(Bucket=bucket, Key=PREFIX + KEY_NAME, Body=data)
    else:
        data = payload(6 * MiB + 5, seed=4)
        etag = _upload_multipart(s3_client, bucket, PREFIX + KEY_NAME, data, 5 * MiB)
        assert etag.endswith("-2")
    return kind, data


def test_pull_refetches_a_file_once_when_a_bit_flipped_in_transit(
    corruptible_model: tuple[str, bytes],
    make_settings: Callable[..., Settings],
    fault_proxy: FaultProxy,
    bucket: str,
) -> None:
    kind, data = corruptible_model
    parts = -(-len(data) // PART)
    # the first ranged GET to arrive takes the fault, and it may be the 5-byte tail part: flip a
    # byte every part's body has, or the fault is spent on nothing and nothing is refetched
    fault_proxy.add_fault("bitflip", match=KEY_NAME, arg=0)
    settings = make_settings()

    result = pull(settings, model_ref(bucket), NoEvents())

    assert_ready(result, settings, model_ref(bucket), {KEY_NAME: data})
    assert fault_proxy.pending_faults() == []
    assert len(data_gets(fault_proxy)) == 2 * parts, "the whole file is fetched exactly twice"
    assert record_of(settings, model_ref(bucket))["verified_by"] == kind
    if kind == "etag-multipart":
        heads = fault_proxy.requests(KEY_NAME, method="HEAD")
        assert any("partNumber=1" in r.path for r in heads), "part size inferred with HEAD partNumber=1"


def test_pull_fails_with_a_checksum_mismatch_when_every_fetch_is_corrupt(
    corruptible_model: tuple[str, bytes],
    tmp_path: Path,
    make_settings: Callable[..., Settings],
    fault_proxy: FaultProxy,
    bucket: str,
) -> None:
    _kind, data = corruptible_model
    parts = -(-len(data) // PART)
    fault_proxy.add_fault("bitflip", match=KEY_NAME, arg=1000, times=1000)
    settings = make_settings()

    with pytest.raises(ChecksumMismatchError) as info:
        pull(settings, model_ref(bucket), NoEvents())

    assert info.value.exit_code == ExitCode.INTEGRITY == 5
    assert KEY_NAME in str(info.value)
    assert len(data_gets(fault_proxy)) == 2 * parts, "one re-fetch, then give up"
    assert_failed_cleanly(tmp_path, settings, model_ref(bucket))


# ---- the object is overwritten during the pull ------------------------------------------


def test_pull_restarts_an_overwritten_file_from_a_fresh_head_and_returns_the_new_bytes(
    make_settings: Callable[..., Settings],
    fault_proxy: FaultProxy,
    s3_client: BaseClient,
    bucket: str,
) -> None:
    old, new = payload(3 * PART, seed=5), payload(3 * PART + 999, seed=6)
    s3_client.put_object(Bucket=bucket, Key=PREFIX + KEY_NAME, Body=old)
    fault_proxy.add_fault("delay", match=KEY_NAME, arg=1.0, times=3)
    settings = make_settings()

    with pulling_in_background(settings, model_ref(bucket)) as future:
        wait_for(lambda: len(data_gets(fault_proxy)) == 3, "three delayed part GETs")
        s3_client.put_object(Bucket=bucket, Key=PREFIX + KEY_NAME, Body=new)
        result = future.result(timeout=30)

    assert_ready(result, settings, model_ref(bucket), {KEY_NAME: new})
    gets = data_gets(fault_proxy)
    assert [r.status for r in gets[:3]] == [412, 412, 412], "If-Match refused the old version"
    assert fault_proxy.requests(KEY_NAME, method="HEAD"), "restarted from a fresh HEAD"
    etag = hashlib.md5(new).hexdigest()
    files = record_of(settings, model_ref(bucket))["files"]
    assert isinstance(files, list) and files[0]["etag"] == etag and files[0]["size"] == len(new)
    # The record describes what was published, so the next pull is warm.
    requests_before = len(fault_proxy.requests())
    again = pull(settings, model_ref(bucket), NoEvents())
    assert again.fetched_bytes == 0 and len(fault_proxy.requests()) == requests_before


def test_pull_never_mixes_versions_when_a_part_is_still_streaming_the_old_object(
    make_settings: Callable[..., Settings],
    fault_proxy: FaultProxy,
    s3_client: BaseClient,
    bucket: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One part is mid-body with old bytes when another is refused with 412.

    The restart must not begin while a thread of the first attempt can still write
    old bytes: not into the restarted file, and not into whatever file descriptor
    reuses the number of the one the first attempt closed.
    """
    old, new = payload(3 * PART, seed=7), payload(3 * PART, seed=8)
    s3_client.put_object(Bucket=bucket, Key=PREFIX + KEY_NAME, Body=old)
    # First part GET: 200 kB of old bytes, then silence until the client's read timeout.
    fault_proxy.add_fault("stall", match=KEY_NAME, arg=200_000)
    # Second: held until after the overwrite, so If-Match answers 412.
    fault_proxy.add_fault("delay", match=KEY_NAME, arg=0.5)
    # Every write the range client makes, and where it landed.
    writes: list[tuple[str, int]] = []
    real_pwrite = os.pwrite

    def spying_pwrite(fd: int, data: bytes | memoryview, offset: int) -> int:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            target = "<closed>"
        try:
            n = real_pwrite(fd, data, offset)
        except OSError as exc:
            writes.append((f"error {errno.errorcode.get(exc.errno or 0)} on {target}", offset))
            raise
        writes.append((target, offset))
        return n

    monkeypatch.setattr(body_copy.os, "pwrite", spying_pwrite)
    settings = make_settings(read_timeout_s=1.5, concurrency=3)

    with pulling_in_background(settings, model_ref(bucket)) as future:
        wait_for(
            lambda: (
                any(r.fault == "stall" and r.body_bytes_sent == 200_000 for r in data_gets(fault_proxy))
                and any(r.fault == "delay" for r in data_gets(fault_proxy))
            ),
            "a stalled part and a delayed part",
        )
        s3_client.put_object(Bucket=bucket, Key=PREFIX + KEY_NAME, Body=new)
        result = future.result(timeout=30)

    assert_ready(result, settings, model_ref(bucket), {KEY_NAME: new})
    staging_file = str(settings.cache_dir / STATE_DIR / "staging" / model_ref(bucket).slug / KEY_NAME)
    strays = [(target, offset) for target, offset in writes if target != staging_file]
    assert strays == [], f"the range client wrote somewhere other than the staging file: {strays}"


def test_pull_fails_with_object_changed_when_the_object_changes_again_after_the_restart(
    tmp_path: Path,
    make_settings: Callable[..., Settings],
    fault_proxy: FaultProxy,
    s3_client: BaseClient,
    bucket: str,
) -> None:
    s3_client.put_object(Bucket=bucket, Key=PREFIX + KEY_NAME, Body=payload(2 * PART, seed=9))
    fault_proxy.add_fault("delay", match=KEY_NAME, arg=0.7, times=1000)
    settings = make_settings()

    with pulling_in_background(settings, model_ref(bucket)) as future:
        wait_for(lambda: len(data_gets(fault_proxy)) == 2, "the first attempt's GETs")
        s3_client.put_object(Bucket=bucket, Key=PREFIX + KEY_NAME, Body=payload(2 * PART, seed=10))
        wait_for(lambda: len(data_gets(fault_proxy)) == 4, "the restart's GETs")
        s3_client.put_object(Bucket=bucket, Key=PREFIX + KEY_NAME, Body=payload(2 * PART, seed=11))
        with pytest.raises(ObjectChangedError) as info:
            future.result(timeout=30)

    assert info.value.exit_code == ExitCode.INTEGRITY
    assert KEY_NAME in str(info.value)
    assert len(fault_proxy.requests(KEY_NAME, method="HEAD")) == 1, "one restart only"
    assert_failed_cleanly(tmp_path, settings, model_ref(bucket))


# ---- not found, access denied -----------------------------------------------------------


def test_pull_of_a_missing_bucket_is_not_found_naming_the_bucket(
    tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    settings = make_settings()
    ref = parse_source("s3://no-such-bucket-here/org/model/")
    with pytest.raises(NotFoundError) as info:
        pull(settings, ref, NoEvents())
    assert info.value.exit_code == ExitCode.NOT_FOUND == 3
    assert "no-such-bucket-here" in str(info.value)
    assert_failed_cleanly(tmp_path, settings, ref)


def test_pull_of_an_empty_prefix_is_not_found_naming_the_prefix(
    tmp_path: Path, make_settings: Callable[..., Settings], s3_client: BaseClient, bucket: str
) -> None:
    s3_client.put_object(Bucket=bucket, Key="org/other/x.bin", Body=b"x")
    settings = make_settings()
    with pytest.raises(NotFoundError) as info:
        pull(settings, model_ref(bucket), NoEvents())
    assert info.value.exit_code == ExitCode.NOT_FOUND
    assert PREFIX in str(info.value)
    assert_failed_cleanly(tmp_path, settings, model_ref(bucket))


@pytest.mark.parametrize("with_etags", [True, False], ids=["manifest-with-etags", "manifest-without-etags"])
def test_pull_of_a_file_listed_in_the_manifest_but_missing_is_not_found_naming_the_key(
    with_etags: bool,
    tmp_path: Path,
    make_settings: Callable[..., Settings],
    publish_model: Callable[[str, dict[str, bytes]], None],
    s3_client: BaseClient,
    bucket: str,
) -> None:
    publish_model(bucket, {"a.bin": payload(1000), "gone.bin": payload(2000, seed=1)})
    if not with_etags:
        manifest = json.loads(s3_client.get_object(Bucket=bucket, Key=PREFIX + MANIFEST_NAME)["Body"].read())
        entries = [FileEntry(f["path"], f["size"], f["xxh3_128"]) for f in manifest["files"]]
        s3_client.put_object(Bucket=bucket, Key=PREFIX + MANIFEST_NAME, Body=render_manifest(entries))
    s3_client.delete_object(Bucket=bucket, Key=PREFIX + "gone.bin")
    settings = make_settings()

    with pytest.raises(NotFoundError) as info:
        pull(settings, model_ref(bucket), NoEvents())

    assert info.value.exit_code == ExitCode.NOT_FOUND
    assert "gone.bin" in str(info.value)
    assert "X-Amz-Signature" not in str(info.value)
    assert_failed_cleanly(tmp_path, settings, model_ref(bucket))


@pytest.mark.parametrize("where", ["control-plane", "data-plane"])
def test_pull_answered_403_is_access_denied_with_a_hint(
    where: str,
    tmp_path: Path,
    make_settings: Callable[..., Settings],
    fault_proxy: FaultProxy,
    s3_client: BaseClient,
    bucket: str,
) -> None:
    s3_client.put_object(Bucket=bucket, Key=PREFIX + KEY_NAME, Body=payload(PART))
    if where == "control-plane":
        fault_proxy.add_fault("status403", match="", method=None, times=1000)
    else:
        fault_proxy.add_fault("status403", match=KEY_NAME, times=1000)
    settings = make_settings()

    with pytest.raises(AccessDeniedError) as info:
        pull(settings, model_ref(bucket), NoEvents())

    message = str(info.value)
    assert info.value.exit_code == ExitCode.ACCESS_DENIED == 4
    assert "credentials" in message, "the message says what to check"
    assert "X-Amz-Signature" not in message and "X-Amz-Credential" not in message
    assert_failed_cleanly(tmp_path, settings, model_ref(bucket))


# ---- unsafe keys ------------------------------------------------------------------------


UNSAFE_KEYS = {
    "parent": "../x.bin",
    "absolute": "/abs.bin",
    "dot-segment": "a/./b.bin",
    "double-slash": "a//b.bin",
    "backslash": "a\\b.bin",
    "nul": "a\x00b.bin",
    "long-segment": "x" * 256 + ".bin",
}


@pytest.mark.parametrize("suffix", list(UNSAFE_KEYS.values()), ids=list(UNSAFE_KEYS))
def test_pull_refuses_an_unsafe_key_before_writing_any_byte(
    suffix: str,
    tmp_path: Path,
    make_settings: Callable[..., Settings],
    fault_proxy: FaultProxy,
    s3_client: BaseClient,
    bucket: str,
) -> None:
    s3_client.put_object(Bucket=bucket, Key=PREFIX + "good.bin", Body=payload(1000))
    s3_client.put_object(Bucket=bucket, Key=PREFIX + suffix, Body=b"evil")
    settings = make_settings()

    with pytest.raises(UnsafeKeyError) as info:
        pull(settings, model_ref(bucket), NoEvents())

    assert info.value.exit_code == ExitCode.INTEGRITY
    assert repr(suffix) in str(info.value)
    # Only the manifest probe and the listing went out: no object body was asked for.
    assert fault_proxy.object_gets() == []
    assert fault_proxy.requests(method="HEAD") == []
    assert_failed_cleanly(tmp_path, settings, model_ref(bucket))
    assert not (settings.cache_dir / STATE_DIR / "staging" / model_ref(bucket).slug).exists()
    assert not (tmp_path / "x.bin").exists() and not Path("/abs.bin").exists()


# ---- malformed manifests --------------------------------------------------------------


def _manifest(files: list[dict[str, object]], version: int = 1) -> bytes:
    return json.dumps({"format": "modelsync-manifest", "version": version, "files": files}).encode()


GOOD_DIGEST = "0" * 32
BAD_MANIFESTS = {
    "not-json": (b"{not json", "not JSON", ManifestError),
    "wrong-version": (_manifest([], version=2), "unsupported version 2", ManifestError),
    "bad-digest": (
        _manifest([{"path": "a.bin", "size": 4, "xxh3_128": "XYZ"}]),
        "xxh3_128 is not 32 lowercase hex digits",
        ManifestError,
    ),
    "traversal": (
        _manifest([{"path": "../../etc/passwd", "size": 4, "xxh3_128": GOOD_DIGEST}]),
        "path segment '..'",
        UnsafeKeyError,
    ),
}


@pytest.mark.parametrize("body, reason, error", list(BAD_MANIFESTS.values()), ids=list(BAD_MANIFESTS))
def test_pull_refuses_a_malformed_manifest_with_the_reason(
    body: bytes,
    reason: str,
    error: type[IntegrityError],
    tmp_path: Path,
    make_settings: Callable[..., Settings],
    fault_proxy: FaultProxy,
    s3_client: BaseClient,
    bucket: str,
) -> None:
    s3_client.put_object(Bucket=bucket, Key=PREFIX + "a.bin", Body=b"data")
    s3_client.put_object(Bucket=bucket, Key=PREFIX + MANIFEST_NAME, Body=body)
    settings = make_settings()

    with pytest.raises(error) as info:
        pull(settings, model_ref(bucket), NoEvents())

    assert info.value.exit_code == ExitCode.INTEGRITY
    assert reason in str(info.value)
    assert fault_proxy.object_gets() == []
    assert_failed_cleanly(tmp_path, settings, model_ref(bucket))


# ---- disk full ----------------------------------------------------------------------------


@pytest.mark.parametrize("seam", ["pwrite", "posix_fallocate", "fdatasync"])
def test_pull_reports_disk_full_with_bytes_needed_and_free_when_a_write_hits_enospc(
    seam: str,
    tmp_path: Path,
    make_settings: Callable[..., Settings],
    s3_client: BaseClient,
    bucket: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    s3_client.put_object(Bucket=bucket, Key=PREFIX + KEY_NAME, Body=payload(2 * PART))

    def no_space(*_args: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    if seam == "pwrite":
        monkeypatch.setattr(body_copy.os, "pwrite", no_space)
    elif seam == "fdatasync":  # a completed file of several parts is flushed as soon as it lands
        assert not in_memory(tmp_path), "fdatasync is skipped on tmpfs"
        monkeypatch.setattr(fs_adapter.os, "fdatasync", no_space)
    else:
        monkeypatch.setattr(staging_adapter.os, "posix_fallocate", no_space)
    settings = make_settings()

    with pytest.raises(DiskFullError) as info:
        pull(settings, model_ref(bucket), NoEvents())

    message = str(info.value)
    assert info.value.exit_code == ExitCode.LOCAL_STORAGE == 6
    assert " free" in message and "needs" in message
    assert_failed_cleanly(tmp_path, settings, model_ref(bucket))


def resident_bytes(path: Path) -> int:
    """Bytes of `path` in the page cache (util-linux fincore)."""
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", str(path)],
                         capture_output=True, text=True, check=True)
    return int(out.stdout.split()[0])


def test_a_pull_to_disk_writes_behind_the_hasher_and_leaves_no_model_in_the_page_cache(
    tmp_path: Path, make_settings: Callable[..., Settings], s3_client: BaseClient, bucket: str
) -> None:
    """Hashed ranges are written out and dropped as the pull goes, not left for writeback."""
    if subprocess.run(["which", "fincore"], capture_output=True, check=False).returncode != 0:
        pytest.skip("fincore (util-linux) is not installed")
    settings = make_settings()
    if in_memory(settings.cache_dir.parent):
        pytest.skip("the test directory is on tmpfs: nothing is written behind there")
    size = 8 * PART
    s3_client.put_object(Bucket=bucket, Key=PREFIX + KEY_NAME, Body=payload(size))
    control = tmp_path / "written-plainly.bin"
    control.write_bytes(payload(size))
    assert resident_bytes(control) > size // 2  # this file system does keep written pages

    result = pull(settings, model_ref(bucket), NoEvents())

    assert (result.path / KEY_NAME).stat().st_size == size  # verified by the pull; reading would cache it
    assert resident_bytes(result.path / KEY_NAME) < size // 4


@contextlib.contextmanager
def small_tmpfs(mountpoint: Path, size: str) -> Iterator[None]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mountpoint.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "modelsync-test", str(mountpoint)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["umount", str(mountpoint)], check=True)


def test_pull_into_a_full_tmpfs_is_disk_full_and_publishes_nothing(
    tmp_path: Path,
    make_settings: Callable[..., Settings],
    s3_client: BaseClient,
    bucket: str,
) -> None:
    size = 3 * PART
    s3_client.put_object(Bucket=bucket, Key=PREFIX + KEY_NAME, Body=payload(size))
    cache_dir = tmp_path / "cache"
    with small_tmpfs(cache_dir, "2m"):
        settings = make_settings(cache_dir=cache_dir)
        with pytest.raises(DiskFullError) as info:
            pull(settings, model_ref(bucket), NoEvents())
        message = str(info.value)
        assert info.value.exit_code == ExitCode.LOCAL_STORAGE
        assert f"needs {format_bytes(size)}" in message
        reported = re.search(r"([\d.]+ \w*B) free", message)
        assert reported is not None and 0 < parse_size(reported.group(1)) < 2 * MiB
        assert_failed_cleanly(tmp_path, settings, model_ref(bucket))


# ---- endpoint unreachable -----------------------------------------------------------------


def test_pull_from_an_unreachable_endpoint_is_remote_unavailable_within_a_bounded_time(
    tmp_path: Path, aws_credentials: S3Env, record_property: Callable[[str, object], None]
) -> None:
    settings = Settings(
        cache_dir=tmp_path / "cache",
        endpoint_url=f"http://127.0.0.1:{closed_port()}",
    )  # default timeouts: the bound holds for what users get
    ref = parse_source("s3://models/org/model/")
    started = time.monotonic()
    with pytest.raises(RemoteUnavailableError) as info:
        pull(settings, ref, NoEvents())
    elapsed_s = time.monotonic() - started
    record_property("unreachable_s", round(elapsed_s, 2))
    print(f"unreachable endpoint: exit 7 after {elapsed_s:.2f} s")
    assert info.value.exit_code == ExitCode.REMOTE_UNAVAILABLE == 7
    assert elapsed_s < 60
    assert "127.0.0.1" in str(info.value) or "endpoint" in str(info.value)
    assert_failed_cleanly(tmp_path, settings, ref)
