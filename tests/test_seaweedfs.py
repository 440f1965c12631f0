"""The integration tier: the real CLI and engine against SeaweedFS, a real S3 server.

moto accepts any signature and serves ranges by reading whole objects; SeaweedFS
checks SigV4 (presigned ranged GETs included), enforces what each identity may do,
and computes real multipart ETags. Models are published by the admin identity and
pulled by a read-only one, as on a node. Where a test counts bytes, the pull goes
through the fault proxy (which forwards the client's Host, so signatures still
validate); object bodies are the presigned GETs with a Range (`FaultProxy.object_gets`):
a manifest's GET is presigned too, but of the whole object. Objects are a few MiB.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.cli import MODELSYNC, one_error_line, publish, run_cli, sigkill_when, write_model
from support.faultproxy import FaultProxy
from support.s3env import S3Env
from support.seaweedfs import SeaweedFS

from modelsync.adapters.cache import Cache
from modelsync.core.manifest import MANIFEST_NAME
from modelsync.core.refs import ModelRef, parse_source
from modelsync.errors import ExitCode

# One SeaweedFS per worker is seconds of start-up: the tier runs on one worker.
pytestmark = [pytest.mark.seaweedfs, pytest.mark.xdist_group("seaweedfs")]

KiB = 1024
MiB = 1024 * KiB
PRESIGNED = "X-Amz-Signature"


@pytest.fixture
def proxy(seaweedfs: SeaweedFS) -> Iterator[FaultProxy]:
    with FaultProxy(seaweedfs.endpoint_url) as started:
        yield started


def pull(env: S3Env, cache: Path, ref: ModelRef, *extra: str) -> subprocess.CompletedProcess[str]:
    return run_cli(env.subprocess_env(), "pull", ref.uri, "--cache-dir", str(cache), "--quiet", *extra)


def record_of(cache: Path, ref: ModelRef) -> dict[str, Any]:
    return json.loads(Cache(cache).record_path(ref).read_text())


def assert_ready(cache: Path, ref: ModelRef, files: dict[str, bytes]) -> None:
    ready = Cache(cache).ready_path(ref)
    assert sorted(p.name for p in ready.iterdir()) == sorted(files)
    for name, data in files.items():
        assert (ready / name).read_bytes() == data, name


def test_a_model_published_by_the_admin_is_pulled_by_a_read_only_identity_with_every_byte_checked(
    tmp_path: Path, seaweed_admin: S3Env, seaweed_reader: S3Env, seaweed_bucket: str
) -> None:
    files = {"weights.bin": os.urandom(6 * MiB), "config.json": b'{"layers": 2}'}
    ref = publish(seaweed_admin, tmp_path, f"s3://{seaweed_bucket}/org/m/rev1/", files, "--part-size", "5Mi")

    result = pull(seaweed_reader, tmp_path / "cache", ref)

    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == str(Cache(tmp_path / "cache").ready_path(ref))
    assert_ready(tmp_path / "cache", ref, files)
    record = record_of(tmp_path / "cache", ref)
    assert record["verified_by"] == "manifest"
    etags = {f["path"]: f["etag"] for f in record["files"]}
    assert etags["weights.bin"].endswith("-2"), "published in two 5 MiB parts"


def test_a_pull_killed_mid_transfer_resumes_and_fetches_only_the_missing_parts(
    tmp_path: Path, seaweed_admin: S3Env, seaweed_reader: S3Env, seaweed_bucket: str, proxy: FaultProxy
) -> None:
    files = {"weights.bin": os.urandom(12 * MiB)}
    ref = publish(seaweed_admin, tmp_path, f"s3://{seaweed_bucket}/org/crash/rev1/", files)
    cache = tmp_path / "cache"
    journal = Cache(cache).staging(ref).journal
    env = seaweed_reader.via(proxy.endpoint_url).subprocess_env()
    slow = subprocess.Popen(
        [*MODELSYNC, "pull", ref.uri, "--cache-dir", str(cache), "--quiet", "--part-size", "1Mi",
         "--concurrency", "2", "--max-bandwidth", "4Mi"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    sigkill_when(slow, lambda: sum(len(p) for p in journal.load().parts.values()) >= 2, "two journaled parts")
    assert not os.path.lexists(Cache(cache).ready_path(ref))
    done = journal.load().parts["weights.bin"]
    assert 2 <= len(done) < 12
    proxy.clear()

    again = run_cli(env, "pull", ref.uri, "--cache-dir", str(cache), "--quiet")

    assert again.returncode == 0, again.stderr
    assert_ready(cache, ref, files)
    assert proxy.object_bytes_sent() == len(files["weights.bin"]) - len(done) * MiB


def test_a_second_revision_hard_links_the_file_it_shares_instead_of_downloading_it(
    tmp_path: Path, seaweed_admin: S3Env, seaweed_reader: S3Env, seaweed_bucket: str, proxy: FaultProxy
) -> None:
    shared = os.urandom(2 * MiB)
    rev1_files = {"shared.bin": shared, "only1.bin": os.urandom(512 * KiB)}
    rev2_files = {"shared.bin": shared, "only2.bin": os.urandom(256 * KiB)}
    rev1 = publish(seaweed_admin, tmp_path, f"s3://{seaweed_bucket}/org/m/rev1/", rev1_files)
    rev2 = publish(seaweed_admin, tmp_path, f"s3://{seaweed_bucket}/org/m/rev2/", rev2_files)
    cache = tmp_path / "cache"
    reader = seaweed_reader.via(proxy.endpoint_url)
    assert pull(reader, cache, rev1).returncode == 0
    proxy.clear()

    second = pull(reader, cache, rev2)

    assert second.returncode == 0, second.stderr
    assert_ready(cache, rev2, rev2_files)
    one = os.stat(Cache(cache).ready_path(rev1) / "shared.bin")
    two = os.stat(Cache(cache).ready_path(rev2) / "shared.bin")
    assert (one.st_dev, one.st_ino) == (two.st_dev, two.st_ino)
    assert proxy.bytes_sent("shared.bin") == 0
    assert proxy.object_bytes_sent() == len(rev2_files["only2.bin"])


def test_verify_repair_refetches_only_the_damaged_file_of_a_quarantined_model(
    tmp_path: Path, seaweed_admin: S3Env, seaweed_reader: S3Env, seaweed_bucket: str, proxy: FaultProxy
) -> None:
    files = {"a.bin": os.urandom(MiB), "b.bin": os.urandom(768 * KiB), "config.json": b'{"x": 1}'}
    ref = publish(seaweed_admin, tmp_path, f"s3://{seaweed_bucket}/org/rot/rev1/", files)
    cache = tmp_path / "cache"
    env = seaweed_reader.via(proxy.endpoint_url).subprocess_env()
    assert pull(seaweed_reader, cache, ref).returncode == 0
    damaged = Cache(cache).ready_path(ref) / "b.bin"
    os.chmod(damaged, 0o644)
    with damaged.open("r+b") as fh:
        fh.seek(300 * KiB)
        fh.write(b"\0" * 16)

    full = run_cli(env, "verify", ref.model_id, "--full", "--cache-dir", str(cache))
    assert full.returncode == ExitCode.INTEGRITY
    assert "verify --repair" in one_error_line(full.stderr)
    repaired = run_cli(env, "verify", "--repair", "--cache-dir", str(cache))

    assert repaired.returncode == 0, repaired.stderr
    assert f"repaired {ref.model_id}" in repaired.stdout
    assert proxy.object_bytes_sent() == len(files["b.bin"])
    assert_ready(cache, ref, files)


def test_the_daemon_stages_a_scheduled_model_from_seaweedfs_with_read_only_keys(
    tmp_path: Path, seaweed_admin: S3Env, seaweed_reader: S3Env, seaweed_bucket: str
) -> None:
    files = {"weights.bin": os.urandom(3 * MiB), "config.json": b"{}"}
    ref = publish(seaweed_admin, tmp_path, f"s3://{seaweed_bucket}/org/daemon/rev1/", files)
    schedule = tmp_path / "schedule.yaml"
    schedule.write_text(
        f"version: 1\nmodels:\n  - source: {ref.uri}\n    pools: [pool-a]\n    windows: [always]\n"
    )
    cache = tmp_path / "cache"
    log = (tmp_path / "daemon.log").open("wb")
    daemon = subprocess.Popen(
        [*MODELSYNC, "daemon", "--schedule", str(schedule), "--pool", "pool-a", "--cache-dir", str(cache),
         "--listen", "127.0.0.1:0", "--tick", "1s", "--jitter", "0"],
        env=seaweed_reader.subprocess_env(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while Cache(cache).ready_record(ref) is None:
            assert daemon.poll() is None, (tmp_path / "daemon.log").read_text()
            assert time.monotonic() < deadline, (tmp_path / "daemon.log").read_text()
            time.sleep(0.1)
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=15) == 0, (tmp_path / "daemon.log").read_text()
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
        log.close()
    assert_ready(cache, ref, files)
    assert record_of(cache, ref)["verified_by"] == "manifest"


def test_a_read_only_identity_cannot_publish_exits_4_and_writes_nothing(
    tmp_path: Path, seaweed_admin: S3Env, seaweed_reader: S3Env, seaweed_bucket: str
) -> None:
    local = write_model(tmp_path / "model", {"weights.bin": os.urandom(6 * MiB), "config.json": b"{}"})

    result = run_cli(
        seaweed_reader.subprocess_env(), "publish", str(local), f"s3://{seaweed_bucket}/org/m/rev1/",
        "--part-size", "5Mi", "--quiet",
    )  # fmt: skip

    assert result.returncode == ExitCode.ACCESS_DENIED
    assert "AccessDenied" in one_error_line(result.stderr)
    admin = seaweed_admin.boto3_client()
    try:
        assert admin.list_objects_v2(Bucket=seaweed_bucket).get("KeyCount") == 0
    finally:
        admin.close()


@pytest.mark.parametrize(
    ("wrong", "code"),
    [("secret", "SignatureDoesNotMatch"), ("access key", "InvalidAccessKeyId")],
)
def test_wrong_keys_fail_a_pull_with_exit_4_naming_the_s3_error_and_publish_nothing(
    tmp_path: Path, seaweed_admin: S3Env, seaweed_bucket: str, wrong: str, code: str
) -> None:
    ref = publish(seaweed_admin, tmp_path, f"s3://{seaweed_bucket}/org/m/rev1/", {"w.bin": b"x" * KiB})
    if wrong == "secret":
        bad = S3Env(seaweed_admin.endpoint_url, seaweed_admin.access_key_id, "not-the-secret")
    else:
        bad = S3Env(seaweed_admin.endpoint_url, "no-such-key", seaweed_admin.secret_access_key)

    result = pull(bad, tmp_path / "cache", ref)

    assert result.returncode == ExitCode.ACCESS_DENIED
    assert code in one_error_line(result.stderr)
    assert not os.path.lexists(Cache(tmp_path / "cache").ready_path(ref))


def test_a_multipart_file_pulled_without_a_manifest_is_verified_by_its_md5_n_etag(
    tmp_path: Path, seaweed_admin: S3Env, seaweed_reader: S3Env, seaweed_bucket: str, proxy: FaultProxy
) -> None:
    files = {"weights.bin": os.urandom(11 * MiB)}
    ref = publish(seaweed_admin, tmp_path, f"s3://{seaweed_bucket}/org/mp/rev1/", files, "--part-size", "5Mi")
    admin = seaweed_admin.boto3_client()
    try:
        etag = admin.head_object(Bucket=seaweed_bucket, Key=ref.prefix + "weights.bin")["ETag"].strip('"')
        admin.delete_object(Bucket=seaweed_bucket, Key=ref.prefix + MANIFEST_NAME)
    finally:
        admin.close()
    assert etag.endswith("-3"), etag
    reader = seaweed_reader.via(proxy.endpoint_url)
    # Every ranged GET of the file has one bit flipped: only the md5-N check can notice.
    proxy.add_fault("bitflip", match="weights.bin", arg=1000, times=1000)

    corrupted = pull(reader, tmp_path / "cache", ref, "--part-size", "1Mi")

    assert corrupted.returncode == ExitCode.INTEGRITY, corrupted.stderr
    assert not os.path.lexists(Cache(tmp_path / "cache").ready_path(ref))
    proxy.clear()

    clean = pull(reader, tmp_path / "cache", ref, "--part-size", "1Mi")

    assert clean.returncode == 0, clean.stderr
    assert_ready(tmp_path / "cache", ref, files)
    record = record_of(tmp_path / "cache", ref)
    assert record["verified_by"] == "etag-multipart"
    [entry] = record["files"]
    assert (entry["path"], entry["size"], entry["etag"]) == ("weights.bin", 11 * MiB, etag)


def test_an_object_overwritten_mid_pull_is_refused_by_if_match_and_fetched_again_whole(
    tmp_path: Path, seaweed_admin: S3Env, seaweed_reader: S3Env, seaweed_bucket: str, proxy: FaultProxy
) -> None:
    """No manifest: the listing's ETag is all a pull trusts, and SeaweedFS answers 412 to a stale one."""
    key = "org/moving/rev1/weights.bin"
    old, new = os.urandom(8 * MiB), os.urandom(8 * MiB)
    ref = parse_source(f"s3://{seaweed_bucket}/org/moving/rev1/")
    cache = tmp_path / "cache"
    journal = Cache(cache).staging(ref).journal
    admin = seaweed_admin.boto3_client()
    admin.put_object(Bucket=seaweed_bucket, Key=key, Body=old)
    slow = subprocess.Popen(
        [*MODELSYNC, "pull", ref.uri, "--cache-dir", str(cache), "--quiet", "--part-size", "1Mi",
         "--concurrency", "2", "--max-bandwidth", "2Mi"],
        env=seaweed_reader.via(proxy.endpoint_url).subprocess_env(), text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not any(journal.load().parts.values()):
            assert slow.poll() is None and time.monotonic() < deadline, "no journaled part within 30 s"
            time.sleep(0.02)
        admin.put_object(Bucket=seaweed_bucket, Key=key, Body=new)
        _out, err = slow.communicate(timeout=60)
    finally:
        admin.close()
        if slow.poll() is None:
            slow.kill()
            slow.communicate()

    assert slow.returncode == 0, err
    assert_ready(cache, ref, {"weights.bin": new})
    assert 412 in {r.status for r in proxy.requests(PRESIGNED)}


def test_the_server_checks_presigned_signatures_so_the_tier_is_not_a_moto_in_disguise(
    seaweed_admin: S3Env, seaweed_reader: S3Env, seaweed_bucket: str
) -> None:
    admin = seaweed_admin.boto3_client()
    reader = seaweed_reader.boto3_client(signature_version="s3v4")
    try:
        admin.put_object(Bucket=seaweed_bucket, Key="k.bin", Body=b"payload")
        url = reader.generate_presigned_url(
            "get_object", Params={"Bucket": seaweed_bucket, "Key": "k.bin"}, ExpiresIn=600
        )
    finally:
        admin.close()
        reader.close()
    signature = url.rsplit("X-Amz-Signature=", 1)[1]
    tampered = url.replace(signature, ("0" if signature[0] != "0" else "1") + signature[1:])
    unsigned = url.split("?", 1)[0]

    assert _status(url, {"Range": "bytes=0-2"}) == (206, b"pay")
    assert _status(tampered, {})[0] == 403
    assert _status(unsigned, {})[0] == 403


def _status(url: str, headers: dict[str, str]) -> tuple[int, bytes]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(urllib.request.Request(url, headers=headers), timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def test_a_publish_cut_short_is_refused_to_a_reader_and_its_rerun_sends_only_what_is_missing(
    tmp_path: Path, seaweed_admin: S3Env, seaweed_reader: S3Env, seaweed_bucket: str, proxy: FaultProxy
) -> None:
    files = {"weights.bin": os.urandom(6 * MiB), "config.json": b"{}"}
    local = write_model(tmp_path / "model", files)
    uri = f"s3://{seaweed_bucket}/org/m/rev1/"
    ref = parse_source(uri)
    admin = seaweed_admin.boto3_client()
    try:
        # what a publish killed before its manifest leaves: the mark, a multipart weights.bin, no manifest
        admin.put_object(Bucket=seaweed_bucket, Key=ref.prefix + "modelsync.publishing", Body=b"{}")
        upload = admin.create_multipart_upload(Bucket=seaweed_bucket, Key=ref.prefix + "weights.bin")
        parts = []
        for number, start in enumerate((0, 5 * MiB), start=1):
            body = files["weights.bin"][start : start + 5 * MiB]
            answer = admin.upload_part(
                Bucket=seaweed_bucket, Key=ref.prefix + "weights.bin", UploadId=upload["UploadId"],
                PartNumber=number, Body=body,
            )  # fmt: skip
            parts.append({"PartNumber": number, "ETag": answer["ETag"]})
        admin.complete_multipart_upload(
            Bucket=seaweed_bucket, Key=ref.prefix + "weights.bin", UploadId=upload["UploadId"],
            MultipartUpload={"Parts": parts},
        )  # fmt: skip
        cache = tmp_path / "cache"

        refused = pull(seaweed_reader, cache, ref)
        assert refused.returncode == ExitCode.INTEGRITY
        assert "modelsync.publishing is there" in one_error_line(refused.stderr)
        assert not Cache(cache).ready_path(ref).exists()

        proxied = seaweed_admin.via(proxy.endpoint_url).subprocess_env()
        rerun = run_cli(proxied, "publish", str(local), uri, "--part-size", "5Mi")
        assert rerun.returncode == 0, rerun.stderr
        assert "1 already there (6.0 MiB), not sent again" in rerun.stderr
        assert proxy.requests("weights.bin", "PUT") == [] and proxy.requests("weights.bin", "POST") == []
        keys = {o["Key"] for o in admin.list_objects_v2(Bucket=seaweed_bucket)["Contents"]}
        assert keys == {ref.prefix + name for name in (MANIFEST_NAME, "weights.bin", "config.json")}
    finally:
        admin.close()
    assert pull(seaweed_reader, cache, ref).returncode == 0
    assert_ready(cache, ref, files)
