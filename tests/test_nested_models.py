"""No model inside another, and leases that combine: the real CLI and a real daemon against moto.

A pull whose prefix holds a ready model, or lies inside one, is refused in one
line naming the other (exit 2), directly and through the daemon. A cache that
already has nested models (made by an older modelsync, laid out here through
the cache's own make-ready step) is reported by `verify` and `gc` and separated
without destroying either; evicting the outer model keeps the inner one ready.
A lease never shortens another holder's, and `ls` says when a model may go.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pytest
import xxhash
from botocore.client import BaseClient
from support.cli import run_cli
from support.daemon import Daemon, schedule_text
from support.objects import payload, upload
from support.s3env import S3Env
from test_cli_errors import assert_user_error

from modelsync.adapters.cache import Cache
from modelsync.core.manifest import FileEntry
from modelsync.core.record import CompletionRecord
from modelsync.core.refs import parse_source
from modelsync.errors import ExitCode, NestedModelError
from modelsync.local_api.client import pull_via_daemon

MiB = 1024 * 1024


def put(client: BaseClient, bucket: str, prefix: str, seed: int) -> None:
    client.put_object(Bucket=bucket, Key=prefix + "weights.bin", Body=payload(MiB, seed))
    client.put_object(Bucket=bucket, Key=prefix + "config.json", Body=b"{}")


def test_a_pull_that_would_hold_a_ready_model_or_lie_inside_one_is_refused_naming_it(
    tmp_path: Path, s3_env: S3Env, s3_client: BaseClient, bucket: str
) -> None:
    put(s3_client, bucket, "org/m/v1/", 1)
    s3_client.put_object(Bucket=bucket, Key="org/m/v1/sub/tokenizer.json", Body=b"{}")
    put(s3_client, bucket, "org/m2/v1/", 3)
    env, cache = s3_env.subprocess_env(), tmp_path / "cache"
    assert run_cli(env, "pull", f"s3://{bucket}/org/m/v1/", "-q", cache_dir=cache).returncode == 0

    parent = run_cli(env, "pull", f"s3://{bucket}/org/m/", "-q", cache_dir=cache)
    assert_user_error(parent, ExitCode.USAGE, f"contains the ready model s3://{bucket}/org/m/v1/")
    inside = run_cli(env, "pull", f"s3://{bucket}/org/m/v1/sub/", "-q", cache_dir=cache)
    assert_user_error(inside, ExitCode.USAGE, f"lies inside the ready model s3://{bucket}/org/m/v1/")

    # a prefix that only shares characters is another model
    assert run_cli(env, "pull", f"s3://{bucket}/org/m2/v1/", "-q", cache_dir=cache).returncode == 0
    assert (cache / bucket / "org/m/v1/weights.bin").read_bytes() == payload(MiB, 1)
    assert not (cache / ".modelsync/staging" / parse_source(f"s3://{bucket}/org/m/").slug).exists()


def nested_cache(root: Path) -> tuple[Cache, Path, Path]:
    """A parent model holding a ready revision, as an older modelsync could leave it: the
    revision made ready first, then the parent (its files only beside the revision's directory)."""
    cache = Cache(root)
    cache.ensure()
    made = []
    for source, files in (
        ("s3://models/org/m/v1/", {"weights.bin": b"child" * 100}),
        ("s3://models/org/m/", {"README.md": b"parent" * 10}),
    ):
        ref = parse_source(source)
        if made:  # the parent's staging holds the revision's directory, as a rename over it left it
            staging = cache.staging(ref)
            staging.prepare(resume=False)
            (staging.dir / "v1").mkdir()
            cache.ready_path(parse_source("s3://models/org/m/v1/")).rename(staging.dir / "v1")
        else:
            staging = cache.staging(ref)
            staging.prepare(resume=False)
        entries = []
        for name, data in files.items():
            (staging.dir / name).write_bytes(data)
            entries.append(FileEntry(name, len(data), xxhash.xxh3_128_hexdigest(data), "etag"))
        record = CompletionRecord(ref.uri, time.time(), "manifest", tuple(entries))
        made.append(cache.make_ready(ref, staging, record))
    return cache, made[1], made[0]


def test_verify_reports_nested_models_and_separates_them_keeping_both(tmp_path: Path) -> None:
    cache, parent, child = nested_cache(tmp_path)
    assert (child / "weights.bin").read_bytes() == b"child" * 100

    done = run_cli({}, "verify", cache_dir=tmp_path)

    assert done.returncode == ExitCode.INTEGRITY, done.stderr
    outer = "bad   models/org/m: s3://models/org/m/ holds the ready model s3://models/org/m/v1/ inside it"
    assert outer in done.stdout
    assert "ok    models/org/m/v1" in done.stdout
    assert (child / "weights.bin").read_bytes() == b"child" * 100
    assert cache.ready_record(parse_source("s3://models/org/m/v1/")) is not None
    assert cache.quarantined_record(parse_source("s3://models/org/m/")) is not None
    kept = cache.quarantine_dir / parse_source("s3://models/org/m/").slug / "README.md"
    assert kept.read_bytes() == b"parent" * 10
    assert not (parent / "README.md").exists()
    models = json.loads(run_cli({}, "ls", "--json", cache_dir=tmp_path).stdout)["models"]
    listed = {m["model"]: m["state"] for m in models}
    assert listed == {"models/org/m": "quarantined", "models/org/m/v1": "ready"}


def test_gc_dry_run_reports_nested_models_and_gc_separates_them(tmp_path: Path) -> None:
    cache, _parent, child = nested_cache(tmp_path)

    dry = run_cli({}, "gc", "--dry-run", cache_dir=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert "holds the ready model s3://models/org/m/v1/" in dry.stdout
    assert cache.ready_record(parse_source("s3://models/org/m/")) is not None, "a dry run changes nothing"

    done = run_cli({}, "gc", cache_dir=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "kept in quarantine, models/org/m/v1 stays ready" in done.stdout
    assert (child / "weights.bin").read_bytes() == b"child" * 100
    assert cache.ready_record(parse_source("s3://models/org/m/")) is None
    assert "holds the ready model" not in run_cli({}, "gc", "--dry-run", cache_dir=tmp_path).stdout


def test_evicting_a_parent_model_keeps_the_ready_model_inside_it(tmp_path: Path) -> None:
    cache, parent, child = nested_cache(tmp_path)

    done = run_cli({}, "evict", "models/org/m", cache_dir=tmp_path)

    assert done.returncode == 0, done.stderr
    assert (child / "weights.bin").read_bytes() == b"child" * 100
    assert not (parent / "README.md").exists()
    assert cache.ready_record(parse_source("s3://models/org/m/v1/")) is not None
    listed = run_cli({}, "ls", cache_dir=tmp_path)
    assert "models/org/m/v1" in listed.stdout and "1 model," in listed.stdout


LEASED = "s3://models/org/leased/r1/"
OUTER = "s3://models/org/leased/"


@pytest.fixture
def daemon(tmp_path: Path, moto_subprocess_s3_env: S3Env, start_daemon: Callable[..., Daemon]) -> Daemon:
    ref = parse_source(LEASED)
    upload(moto_subprocess_s3_env, ref.bucket, ref.prefix, {"weights.bin": payload(MiB, 5)})
    schedule = tmp_path / "schedule.yaml"
    schedule.write_text(schedule_text([]))
    return start_daemon(schedule, moto_subprocess_s3_env.subprocess_env(), "--allow", "s3://models/org/")


def test_through_the_daemon_a_short_lease_never_cuts_a_longer_one_and_a_parent_pull_is_refused(
    daemon: Daemon, moto_subprocess_s3_env: S3Env
) -> None:
    ref = parse_source(LEASED)
    started = time.time()
    assert pull_via_daemon(daemon.cache, ref, 8 * 3600) is not None
    assert pull_via_daemon(daemon.cache, ref, 60) is not None

    until = Cache(daemon.cache).lease_until(ref)
    assert until is not None and until >= started + 8 * 3600 - 5, "the 1-minute lease cut the 8-hour one"
    listed = json.loads(run_cli({}, "ls", "--json", cache_dir=daemon.cache).stdout)["models"]
    assert datetime.fromisoformat(listed[0]["evictable_at"]).timestamp() == pytest.approx(until, abs=1)
    header, row = run_cli({}, "ls", cache_dir=daemon.cache).stdout.splitlines()[:2]
    assert header.split()[-1] == "EVICTABLE" and re.search(r" in (7h5\dm|8h)$", row), row

    with pytest.raises(NestedModelError) as refused:
        pull_via_daemon(daemon.cache, parse_source(OUTER), None)
    assert refused.value.exit_code == ExitCode.USAGE
    assert f"contains the ready model {LEASED}" in str(refused.value)
    assert daemon.stop()[0] == 0
