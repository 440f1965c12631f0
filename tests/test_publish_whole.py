"""A partial publish is never a model: through the real CLI and a real daemon, against a moto server.

`publish` marks the prefix (`modelsync.publishing`) before its first object and
clears the mark only after the manifest. A pull of a marked prefix without a
manifest is refused (exit 5, nothing ready); a rerun of the publish sends only
what is missing; a manifest policy can require one; a shard index naming a shard
the prefix lacks is refused; and a model whose source changed since it was
pulled is found by `verify --remote` and the daemon's refresh, and replaced.
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from botocore.client import BaseClient
from support.cli import MODELSYNC, run_cli
from support.daemon import Daemon, schedule_text
from support.faultproxy import FaultProxy
from support.objects import payload, upload
from support.s3env import S3Env
from support.waiting import wait_for
from test_cli_errors import assert_user_error, left_behind

from modelsync.core.completeness import PUBLISHING_NAME
from modelsync.core.manifest import MANIFEST_NAME
from modelsync.core.refs import parse_source
from modelsync.errors import ExitCode, IncompleteModelError
from modelsync.local_api.client import pull_via_daemon

MiB = 1024 * 1024


def model_dir(tmp_path: Path, weights: bytes = b"") -> Path:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text('{"layers": 2}')
    (model / "weights.bin").write_bytes(weights or payload(2 * MiB, 1))
    return model


def keys(client: BaseClient, bucket: str, prefix: str) -> set[str]:
    listing = client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    return {item["Key"].removeprefix(prefix) for item in listing}


def test_a_publish_stopped_after_its_first_object_is_refused_by_pull_and_its_rerun_sends_only_the_rest(
    tmp_path: Path, s3_env: S3Env, s3_client: BaseClient, bucket: str, fault_proxy: FaultProxy
) -> None:
    model = model_dir(tmp_path)
    source = f"s3://{bucket}/org/m/v1/"
    cache = tmp_path / "cache"
    # weights.bin's upload hangs at the proxy, so the publish is stopped with config.json alone up
    fault_proxy.add_fault("delay", match="weights.bin", arg=60, method="PUT")
    publish = subprocess.Popen(
        [*MODELSYNC, "publish", str(model), source, "-q"],
        env=s3_env.via(fault_proxy.endpoint_url).subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(
            lambda: any(r.status == 200 for r in fault_proxy.requests("config.json", "PUT")),
            what="config.json uploaded",
        )
        publish.send_signal(signal.SIGTERM)
        _, stderr = publish.communicate(timeout=30)
    finally:
        publish.kill()
        publish.wait()
    assert publish.returncode == 128 + signal.SIGTERM, stderr
    assert "run the command again to resume" in stderr
    assert keys(s3_client, bucket, "org/m/v1/") == {PUBLISHING_NAME, "config.json"}

    refused = run_cli(s3_env.subprocess_env(), "pull", source, "-q", cache_dir=cache)
    line = assert_user_error(refused, ExitCode.INTEGRITY, source, PUBLISHING_NAME, "or was interrupted")
    assert "run it again" in line
    assert left_behind(cache) == []

    fault_proxy.clear()
    rerun = run_cli(s3_env.via(fault_proxy.endpoint_url).subprocess_env(), "publish", str(model), source)
    assert rerun.returncode == 0, rerun.stderr
    assert "published 2 files" in rerun.stderr and "1 already there (13 B), not sent again" in rerun.stderr
    assert fault_proxy.requests("config.json", "PUT") == [], "config.json was sent again"
    assert len(fault_proxy.requests("weights.bin", "PUT")) == 1
    assert keys(s3_client, bucket, "org/m/v1/") == {MANIFEST_NAME, "config.json", "weights.bin"}

    pulled = run_cli(s3_env.subprocess_env(), "pull", source, "-q", cache_dir=cache)
    assert pulled.returncode == 0, pulled.stderr
    ready = Path(pulled.stdout.strip())
    assert (ready / "weights.bin").read_bytes() == payload(2 * MiB, 1)
    assert sorted(p.name for p in ready.iterdir()) == ["config.json", "weights.bin"]


def test_republishing_a_changed_model_sends_only_the_changed_file_and_no_pull_sees_it_half_done(
    tmp_path: Path, s3_env: S3Env, s3_client: BaseClient, bucket: str, fault_proxy: FaultProxy
) -> None:
    model = model_dir(tmp_path)
    source = f"s3://{bucket}/org/m/v2/"
    env = s3_env.via(fault_proxy.endpoint_url).subprocess_env()
    assert run_cli(env, "publish", str(model), source, "-q").returncode == 0
    (model / "weights.bin").write_bytes(payload(2 * MiB, 2))
    fault_proxy.clear()

    again = run_cli(env, "publish", str(model), source)

    assert again.returncode == 0, again.stderr
    assert "1 already there" in again.stderr
    assert [r.path.rsplit("/", 1)[1] for r in fault_proxy.requests(method="PUT")] == [
        PUBLISHING_NAME, "weights.bin", MANIFEST_NAME
    ]
    deletes = [r.path.rsplit("/", 1)[1] for r in fault_proxy.requests(method="DELETE")]
    assert deletes == [MANIFEST_NAME, PUBLISHING_NAME], "the old manifest goes before any file changes"
    assert keys(s3_client, bucket, "org/m/v2/") == {MANIFEST_NAME, "config.json", "weights.bin"}


def test_a_manifest_policy_of_required_refuses_a_prefix_without_one_in_its_scope_only(
    tmp_path: Path, s3_env: S3Env, s3_client: BaseClient, bucket: str
) -> None:
    for prefix in ("strict/m/r1/", "loose/m/r1/"):
        s3_client.put_object(Bucket=bucket, Key=prefix + "config.json", Body=b"{}")
    config = tmp_path / "modelsync.toml"
    config.write_text(f'[[manifest_rules]]\nscope = "s3://{bucket}/strict/"\nmode = "required"\n')
    env = s3_env.subprocess_env()
    cache = tmp_path / "cache"

    with_config = ("-q", "--config", str(config))
    strict = run_cli(env, "pull", f"s3://{bucket}/strict/m/r1/", *with_config, cache_dir=cache)
    assert_user_error(strict, ExitCode.INTEGRITY, MANIFEST_NAME, "manifest policy requires")
    loose = run_cli(env, "pull", f"s3://{bucket}/loose/m/r1/", *with_config, cache_dir=cache)
    assert loose.returncode == 0, loose.stderr
    required = {**env, "MODELSYNC_MANIFEST": "required"}
    everywhere = run_cli(required, "pull", f"s3://{bucket}/strict/m/r1/", "-q", cache_dir=cache)
    assert everywhere.returncode == ExitCode.INTEGRITY
    published = model_dir(tmp_path)
    assert run_cli(env, "publish", str(published), f"s3://{bucket}/strict/m/r2/", "-q").returncode == 0
    with_manifest = run_cli(env, "pull", f"s3://{bucket}/strict/m/r2/", *with_config, cache_dir=cache)
    assert with_manifest.returncode == 0, with_manifest.stderr


def test_a_shard_index_naming_a_shard_the_prefix_lacks_is_refused_before_any_shard_is_fetched(
    tmp_path: Path, s3_env: S3Env, s3_client: BaseClient, bucket: str, fault_proxy: FaultProxy
) -> None:
    index = {
        "metadata": {"total_size": 8},
        "weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"},
    }
    prefix = "org/sharded/r1/"
    s3_client.put_object(Bucket=bucket, Key=prefix + "model.safetensors.index.json", Body=json.dumps(index))
    s3_client.put_object(Bucket=bucket, Key=prefix + "model-00001-of-00002.safetensors", Body=b"x" * MiB)
    cache = tmp_path / "cache"

    done = run_cli(
        s3_env.via(fault_proxy.endpoint_url).subprocess_env(), "pull", f"s3://{bucket}/{prefix}", "-q",
        cache_dir=cache,
    )

    assert_user_error(done, ExitCode.INTEGRITY, "model-00002-of-00002.safetensors", "which the prefix lacks")
    assert fault_proxy.requests("model-00001-of-00002.safetensors", "GET") == []
    assert left_behind(cache) == []


def test_a_model_pulled_before_its_source_was_republished_is_found_and_replaced_by_verify_remote(
    tmp_path: Path, s3_env: S3Env, s3_client: BaseClient, bucket: str
) -> None:
    source = f"s3://{bucket}/org/legacy/r1/"
    # what an interrupted publish of an older modelsync left: config.json alone, no mark, no manifest
    s3_client.put_object(Bucket=bucket, Key="org/legacy/r1/config.json", Body=b'{"layers": 2}')
    env = s3_env.subprocess_env()
    cache = tmp_path / "cache"
    assert run_cli(env, "pull", source, "-q", cache_dir=cache).returncode == 0
    assert run_cli(env, "publish", str(model_dir(tmp_path)), source, "-q").returncode == 0
    warm = run_cli(env, "pull", source, "-q", cache_dir=cache)
    assert not (Path(warm.stdout.strip()) / "weights.bin").exists(), "the warm path trusts what is ready"

    checked = run_cli(env, "verify", "--full", "--remote", "-q", cache_dir=cache)

    assert checked.returncode == 0, checked.stderr
    assert f"stale {bucket}/org/legacy/r1: its source changed; replaced" in checked.stdout
    ready = Path(run_cli(env, "pull", source, "-q", cache_dir=cache).stdout.strip())
    assert (ready / "weights.bin").read_bytes() == payload(2 * MiB, 1)
    again = run_cli(env, "verify", "--full", "--remote", "-q", cache_dir=cache)
    assert f"ok    {bucket}/org/legacy/r1: same as its source" in again.stdout


PARTIAL = "s3://models/org/partial/r1/"
LEGACY = "s3://models/org/legacy/r1/"


@pytest.fixture
def daemon_env(moto_subprocess_s3_env: S3Env) -> S3Env:
    ref = parse_source(PARTIAL)
    upload(moto_subprocess_s3_env, ref.bucket, ref.prefix, {PUBLISHING_NAME: b"{}", "config.json": b"{}"})
    return moto_subprocess_s3_env


def test_the_daemon_refuses_a_publish_in_progress_to_a_tenant_with_exit_5(
    tmp_path: Path, daemon_env: S3Env, start_daemon: Callable[..., Daemon]
) -> None:
    schedule = tmp_path / "schedule.yaml"
    schedule.write_text(schedule_text([]))
    daemon = start_daemon(schedule, daemon_env.subprocess_env(), "--allow", "s3://models/org/")

    with pytest.raises(IncompleteModelError) as refused:
        pull_via_daemon(daemon.cache, parse_source(PARTIAL), None)

    assert refused.value.exit_code == ExitCode.INTEGRITY
    assert PUBLISHING_NAME in str(refused.value)
    assert not (daemon.cache / "models/org/partial").exists()
    assert daemon.stop()[0] == 0


def test_the_daemons_refresh_replaces_a_model_whose_source_was_republished(
    tmp_path: Path, moto_subprocess_s3_env: S3Env, start_daemon: Callable[..., Daemon]
) -> None:
    env = moto_subprocess_s3_env.subprocess_env()
    cache = tmp_path / "cache"
    upload(moto_subprocess_s3_env, "models", "org/legacy/r1/", {"config.json": b'{"layers": 2}'})
    assert run_cli(env, "pull", LEGACY, "-q", cache_dir=cache).returncode == 0
    assert run_cli(env, "publish", str(model_dir(tmp_path)), LEGACY, "-q").returncode == 0
    schedule = tmp_path / "schedule.yaml"
    schedule.write_text(schedule_text([("legacy", LEGACY, "soon")]))

    daemon = start_daemon(schedule, env, "--refresh", "1s")
    daemon.wait_for_log(lambda e: "changed at its source and was refreshed" in str(e.get("msg")))

    assert (cache / "models/org/legacy/r1/weights.bin").read_bytes() == payload(2 * MiB, 1)
    assert daemon.stop()[0] == 0
