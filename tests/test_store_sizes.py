"""The store is the truth for sizes: a manifest that misstates one is an integrity error, never an outage.

Each answer to a ranged GET says how big the object is (`Content-Range: bytes
a-b/TOTAL`, or the whole body of a 200), and a refused range says it too (416,
`bytes */TOTAL`). A manifest whose size disagrees with the store, under or over,
stops the pull with exit 5 naming the file, both sizes and what to do
(republish), and nothing is made ready. Run through the real CLI against moto.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest
from botocore.client import BaseClient
from support.cli import one_error_line, run_cli
from support.objects import payload
from support.s3env import S3Env

from modelsync.adapters.cache import Cache
from modelsync.adapters.digest import xxh3_of
from modelsync.core.manifest import MANIFEST_NAME, FileEntry, render_manifest
from modelsync.core.refs import parse_source
from modelsync.errors import ExitCode

KiB = 1024
MiB = 1024 * KiB
TOKENIZER_BYTES = 31_791


def publish_with_manifest(
    client: BaseClient, bucket: str, prefix: str, data: bytes, manifest_bytes: int, xxh3_bytes: int
) -> None:
    """Put `tokenizer.json` and a manifest that says it is `manifest_bytes` long (with its real ETag),
    and gives the xxh3-128 of its first `xxh3_bytes` bytes."""
    client.put_object(Bucket=bucket, Key=prefix + "tokenizer.json", Body=data)
    client.put_object(Bucket=bucket, Key=prefix + "config.json", Body=b'{"model": 1}')
    entries = [
        FileEntry(
            "tokenizer.json", manifest_bytes, xxh3_of(data[:xxh3_bytes]), hashlib.md5(data).hexdigest()
        ),
        FileEntry("config.json", 12, xxh3_of(b'{"model": 1}'), hashlib.md5(b'{"model": 1}').hexdigest()),
    ]
    client.put_object(Bucket=bucket, Key=prefix + MANIFEST_NAME, Body=render_manifest(entries))


def pull(env: S3Env, cache: Path, source: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(env.subprocess_env(), "pull", source, "--cache-dir", str(cache), "-q", *args)


@pytest.mark.parametrize(
    ("name", "manifest_bytes", "part_size"),
    [
        ("under-stated", 100, "8Mi"),
        ("over-stated-in-one-part", 40_000, "8Mi"),
        ("over-stated-past-a-part", 3 * MiB, "1Mi"),
    ],
)
def test_a_manifest_that_misstates_a_size_stops_the_pull_with_exit_5_naming_both_sizes_and_republish(
    name: str,
    manifest_bytes: int,
    part_size: str,
    tmp_path: Path,
    s3_env: S3Env,
    s3_client: BaseClient,
    bucket: str,
) -> None:
    prefix = f"org/{name}/rev1/"
    data = payload(TOKENIZER_BYTES)
    publish_with_manifest(s3_client, bucket, prefix, data, manifest_bytes, min(manifest_bytes, len(data)))
    cache = tmp_path / "cache"

    done = pull(s3_env, cache, f"s3://{bucket}/{prefix}", "--part-size", part_size)

    assert done.returncode == ExitCode.INTEGRITY, done.stderr
    line = one_error_line(done.stderr)
    for text in (
        f"s3://{bucket}/{prefix}tokenizer.json",
        str(TOKENIZER_BYTES),
        str(manifest_bytes),
        "republish",
    ):
        assert text in line, line
    assert "Traceback" not in done.stderr
    ref = parse_source(f"s3://{bucket}/{prefix}")
    assert not (cache / ref.cache_path).exists(), "a short or padded file was made ready"
    assert Cache(cache).ready_record(ref) is None


def test_a_manifest_that_says_a_file_is_empty_when_its_etag_is_not_an_empty_objects_is_exit_5(
    tmp_path: Path, s3_env: S3Env, s3_client: BaseClient, bucket: str
) -> None:
    prefix = "org/emptied/rev1/"
    publish_with_manifest(s3_client, bucket, prefix, payload(TOKENIZER_BYTES), 0, 0)
    cache = tmp_path / "cache"

    done = pull(s3_env, cache, f"s3://{bucket}/{prefix}")

    assert done.returncode == ExitCode.INTEGRITY, done.stderr
    line = one_error_line(done.stderr)
    assert f"s3://{bucket}/{prefix}tokenizer.json" in line and "republish" in line, line
    assert not (cache / parse_source(f"s3://{bucket}/{prefix}").cache_path).exists()


def test_a_manifest_that_states_the_size_the_store_holds_pulls_as_before(
    tmp_path: Path, s3_env: S3Env, s3_client: BaseClient, bucket: str
) -> None:
    prefix = "org/honest/rev1/"
    data = payload(TOKENIZER_BYTES)
    publish_with_manifest(s3_client, bucket, prefix, data, len(data), len(data))
    cache = tmp_path / "cache"

    done = pull(s3_env, cache, f"s3://{bucket}/{prefix}")

    assert done.returncode == 0, done.stderr
    ready = Path(done.stdout.splitlines()[-1])
    assert (ready / "tokenizer.json").read_bytes() == data
    assert json.loads((ready / "config.json").read_bytes()) == {"model": 1}
