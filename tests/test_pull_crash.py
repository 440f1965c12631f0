"""Crash and concurrency: the real `modelsync pull` CLI in child processes, killed and raced.

The server is the child-process moto (its own GIL), behind a fault proxy in this
process that counts the body bytes each run was served. A pull slowed down by
`--max-bandwidth` is SIGKILLed once its journal shows written parts; the next
run must publish the same bytes as the source while fetching only the parts the
journal did not record. Two pulls of one model at once must share one download.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from botocore.client import BaseClient
from support.cli import sigkill_when
from support.faultproxy import FaultProxy
from support.objects import put_model
from support.s3env import S3Env
from support.safetensors import shard

from modelsync.adapters.cache import Cache
from modelsync.core.refs import parse_source

MiB = 1024 * 1024
PREFIX = "org/crashy/rev1/"
MODELSYNC = [sys.executable, "-m", "modelsync"]


def payload(size: int) -> bytes:
    """Random bytes: every part differs, so a part written at the wrong offset shows."""
    return os.urandom(size)


def journal_parts(cache: Path) -> list[dict[str, object]]:
    parts = []
    for journal in (cache / ".modelsync" / "staging").glob("*.journal"):
        for line in journal.read_bytes().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # a torn last line
            if isinstance(rec, dict) and "part" in rec:
                parts.append(rec)
    return parts


def pull_command(bucket: str, cache: Path, *extra: str) -> list[str]:
    return [
        *MODELSYNC,
        "pull",
        f"s3://{bucket}/{PREFIX}",
        "--cache-dir",
        str(cache),
        "--part-size",
        "1Mi",
        *extra,
    ]


def kill_after_parts(command: list[str], env: dict[str, str], cache: Path, parts: int) -> int:
    """Run a slowed pull and SIGKILL it once its journal holds `parts` parts; its exit status."""
    slow = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    sigkill_when(slow, lambda: len(journal_parts(cache)) >= parts, f"{parts} journaled parts")
    return slow.returncode


def test_a_pull_killed_mid_transfer_resumes_and_fetches_only_the_missing_parts(
    tmp_path: Path,
    moto_subprocess_s3_env: S3Env,
    moto_subprocess_proxy: FaultProxy,
    moto_subprocess_client: BaseClient,
) -> None:
    # Valid shards (random tensor bytes): the pull's final check scrubs their headers.
    files = {"model-00001.safetensors": shard(16 * MiB), "model-00002.safetensors": shard(8 * MiB)}
    total = sum(len(d) for d in files.values())
    bucket = put_model(moto_subprocess_client, "crash", PREFIX, files).bucket
    cache = tmp_path / "cache"
    env = moto_subprocess_s3_env.via(moto_subprocess_proxy.endpoint_url).subprocess_env()
    ready = cache / parse_source(f"s3://{bucket}/{PREFIX}").cache_path

    slow = pull_command(bucket, cache, "--max-bandwidth", "4Mi", "--concurrency", "2", "--quiet")
    assert kill_after_parts(slow, env, cache, parts=2) == -signal.SIGKILL

    # Nothing published; staging and its journal stay for the resume.
    assert not os.path.lexists(ready)
    staging = cache / ".modelsync" / "staging"
    assert list(staging.glob("*.journal")) and [p for p in staging.iterdir() if p.is_dir()]
    done = {(str(r["part"]), r["i"]) for r in journal_parts(cache)}
    assert 2 <= len(done) < total // MiB
    first_run_bytes = moto_subprocess_proxy.object_bytes_sent()
    assert first_run_bytes < total

    moto_subprocess_proxy.clear()
    started = time.monotonic()
    again = subprocess.run(
        pull_command(bucket, cache, "--quiet"), env=env, capture_output=True, text=True, timeout=60
    )
    resume_s = time.monotonic() - started

    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines()[-1] == str(ready)
    # Exactly the parts the journal did not record were fetched again (1 MiB each).
    assert moto_subprocess_proxy.object_bytes_sent() == total - len(done) * MiB
    for name, data in files.items():
        assert (ready / name).read_bytes() == data
    assert list(staging.iterdir()) == []
    assert resume_s < 30


def test_a_pull_of_many_small_files_killed_mid_way_trusts_only_what_its_journal_verified(
    tmp_path: Path,
    moto_subprocess_s3_env: S3Env,
    moto_subprocess_proxy: FaultProxy,
    moto_subprocess_client: BaseClient,
) -> None:
    """Small files are journaled in batches: a kill loses the last lines, never makes one lie."""
    files = {f"file-{i:03d}.bin": payload(64 * 1024) for i in range(48)}
    total = sum(len(d) for d in files.values())
    bucket = put_model(moto_subprocess_client, "crash", PREFIX, files).bucket
    cache = tmp_path / "cache"
    env = moto_subprocess_s3_env.via(moto_subprocess_proxy.endpoint_url).subprocess_env()
    ref = parse_source(f"s3://{bucket}/{PREFIX}")
    journal = Cache(cache).staging(ref).journal

    slow = subprocess.Popen(
        pull_command(bucket, cache, "--max-bandwidth", "1Mi", "--concurrency", "2", "--quiet"),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    sigkill_when(slow, lambda: len(journal.load().verified) >= 16, "16 files journaled as verified")

    state = journal.load()
    assert 16 <= len(state.verified) < len(files)
    for path in state.verified:  # what the journal calls verified is the source's bytes
        assert (Cache(cache).staging(ref).dir / path).read_bytes() == files[path]
    written = {path for path, parts in state.parts.items() if parts}
    moto_subprocess_proxy.clear()
    again = subprocess.run(
        pull_command(bucket, cache, "--quiet"), env=env, capture_output=True, text=True, timeout=60
    )

    assert again.returncode == 0, again.stderr
    assert moto_subprocess_proxy.object_bytes_sent() == total - sum(len(files[p]) for p in written)
    ready = cache / ref.cache_path
    for name, data in files.items():
        assert (ready / name).read_bytes() == data


def test_two_concurrent_pulls_of_one_model_download_it_once_and_print_the_same_path(
    tmp_path: Path,
    moto_subprocess_s3_env: S3Env,
    moto_subprocess_proxy: FaultProxy,
    moto_subprocess_client: BaseClient,
) -> None:
    files = {"weights.bin": payload(8 * MiB), "config.json": b'{"layers": 2}'}
    total = sum(len(d) for d in files.values())
    bucket = put_model(moto_subprocess_client, "crash", PREFIX, files).bucket
    cache = tmp_path / "cache"
    env = moto_subprocess_s3_env.via(moto_subprocess_proxy.endpoint_url).subprocess_env()
    command = pull_command(bucket, cache, "--max-bandwidth", "4Mi")

    pullers = [
        subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=60) for p in pullers]

    assert [p.returncode for p in pullers] == [0, 0], outputs
    ready = str(cache / parse_source(f"s3://{bucket}/{PREFIX}").cache_path)
    assert [out.splitlines()[-1] for out, _err in outputs] == [ready, ready]
    # One of them waited on the other's lock instead of downloading a second copy.
    assert any("waiting for" in err for _out, err in outputs), outputs
    assert moto_subprocess_proxy.object_bytes_sent() == total
    for name, data in files.items():
        assert (Path(ready) / name).read_bytes() == data


def get_lengths(proxy: FaultProxy) -> list[int]:
    """The length of every ranged GET of an object body."""
    lengths = []
    for r in proxy.requests(method="GET"):
        if "X-Amz-Signature" in r.path and r.range:
            start, end = r.range.removeprefix("bytes=").split("-")
            lengths.append(int(end) - int(start) + 1)
    return lengths


@pytest.mark.parametrize("resume_with", ["4Mi", "1Mi", None])
def test_a_resume_says_when_it_keeps_the_part_size_of_the_interrupted_pull(
    resume_with: str | None,
    tmp_path: Path,
    moto_subprocess_s3_env: S3Env,
    moto_subprocess_proxy: FaultProxy,
    moto_subprocess_client: BaseClient,
) -> None:
    files = {"weights.bin": payload(12 * MiB)}
    bucket = put_model(moto_subprocess_client, "crash", PREFIX, files).bucket
    cache = tmp_path / "cache"
    env = moto_subprocess_s3_env.via(moto_subprocess_proxy.endpoint_url).subprocess_env()
    env.pop("MODELSYNC_PART_SIZE", None)
    slow = pull_command(bucket, cache, "--max-bandwidth", "4Mi", "--concurrency", "2")
    assert kill_after_parts(slow, env, cache, parts=2) == -signal.SIGKILL
    done = len(journal_parts(cache))
    moto_subprocess_proxy.clear()

    flags = ["--part-size", resume_with] if resume_with else []
    command = [*pull_command(bucket, cache), *flags, "--quiet"]
    command.remove("1Mi")
    command.remove("--part-size")
    again = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)

    assert again.returncode == 0, again.stderr
    notes = [line for line in again.stderr.splitlines() if line.startswith("note: ")]
    if resume_with == "1Mi":
        assert notes == []
    else:
        wanted = "4.0 MiB" if resume_with else "32.0 MiB"
        assert notes == [
            "note: resuming with the part size of the interrupted pull (1.0 MiB) for the files it had "
            f"started, to keep their written parts; {wanted} applies to the others"
        ]
    # what is written is kept: only the missing 1 MiB parts were fetched
    assert sorted(set(get_lengths(moto_subprocess_proxy))) == [MiB]
    assert len(get_lengths(moto_subprocess_proxy)) == 12 - done
    ready = cache / parse_source(f"s3://{bucket}/{PREFIX}").cache_path
    assert (ready / "weights.bin").read_bytes() == files["weights.bin"]


@pytest.mark.parametrize(
    ("where", "value", "problem"),
    [
        ("flag", "1Ki", "part size 1.0 KiB is under 1.0 MiB"),
        ("flag", "0", "part size 0 B is under 1.0 MiB"),
        ("flag", "1048575", "part size 1048575 B is under 1.0 MiB"),
        ("flag", "1025Mi", "part size 1074790400 B is over 1.0 GiB"),
        ("env", "1Ki", "part size 1.0 KiB is under 1.0 MiB"),
        ("env", "5Gi", "part size 5.0 GiB is over 1.0 GiB"),
    ],
)
def test_a_part_size_out_of_bounds_is_refused_with_one_line_before_anything_is_written(
    where: str, value: str, problem: str, tmp_path: Path, moto_subprocess_s3_env: S3Env
) -> None:
    cache = tmp_path / "cache"
    env = moto_subprocess_s3_env.subprocess_env()
    command = pull_command("no-such-bucket", cache, "--quiet")
    if where == "flag":
        command[command.index("1Mi")] = value
    else:
        env["MODELSYNC_PART_SIZE"] = value
        command.remove("1Mi")
        command.remove("--part-size")

    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)

    assert result.returncode == 2, result.stderr
    origin = "--part-size" if where == "flag" else "environment variable MODELSYNC_PART_SIZE"
    assert result.stderr.startswith(f"error: {origin}: ") and problem in result.stderr
    assert "use 1.0 MiB to 1.0 GiB (default 16.0 MiB)" in result.stderr
    assert len(result.stderr.splitlines()) == 1 and "Traceback" not in result.stderr
    assert not cache.exists()
