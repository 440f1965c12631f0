"""The warm fast path answers only plain pulls of ready models and leaves everything else to the CLI."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import xxhash
from botocore.client import BaseClient
from support.cli import run_cli

from modelsync.adapters.cache import Cache
from modelsync.core.manifest import FileEntry
from modelsync.core.record import CompletionRecord
from modelsync.core.refs import parse_source
from modelsync.errors import ExitCode
from modelsync.plain_pull import PLAIN_FLAGS, PLAIN_OPTIONS, try_warm_pull

SOURCE = "s3://models/org/model/rev1/"


def make_ready(root: Path, source: str = SOURCE) -> Path:
    """A ready model written through the cache's own staging and make-ready steps."""
    ref = parse_source(source)
    cache = Cache(root)
    cache.ensure()
    staging = cache.staging(ref)
    staging.prepare(resume=False)
    data = b"weights" * 100
    fd = staging.open_file("model.safetensors", len(data), fresh=True)
    os.pwrite(fd, data, 0)
    os.close(fd)
    entry = FileEntry("model.safetensors", len(data), xxhash.xxh3_128_hexdigest(data), "etag")
    return cache.make_ready(ref, staging, CompletionRecord(ref.uri, time.time(), "manifest", (entry,)))


def test_a_plain_pull_of_a_ready_model_answers_with_its_path(tmp_path: Path) -> None:
    ready = make_ready(tmp_path)
    assert try_warm_pull(["pull", SOURCE, "--cache-dir", str(tmp_path)], {}) == str(ready)
    assert try_warm_pull(["pull", f"--cache-dir={tmp_path}", "-q", SOURCE], {}) == str(ready)
    assert try_warm_pull(["pull", SOURCE], {"MODELSYNC_CACHE_DIR": str(tmp_path)}) == str(ready)


def test_a_warm_pull_records_the_use(tmp_path: Path) -> None:
    make_ready(tmp_path)
    cache = Cache(tmp_path)
    ref = parse_source(SOURCE)
    assert cache.last_used(ref) is None
    try_warm_pull(["pull", SOURCE, "--cache-dir", str(tmp_path)], {})
    used = cache.last_used(ref)
    assert used is not None and abs(used - time.time()) < 60


@pytest.mark.parametrize(
    "argv",
    [
        ["pull", SOURCE, "--verify"],
        ["pull", SOURCE, "--lease", "1h"],
        ["pull", "--help"],
        ["pull", SOURCE, SOURCE],
        ["pull"],
        ["ls"],
        ["pull", "s3://models/"],
        ["pull", "s3://models/org/other/"],
        ["pull", SOURCE, "--cache-dir", "elsewhere", "--cache-dir"],
        ["pull", SOURCE, "--cache-dir", "elsewhere"],
    ],
)
def test_anything_but_a_plain_pull_of_a_ready_model_falls_through(tmp_path: Path, argv: list[str]) -> None:
    make_ready(tmp_path)
    assert try_warm_pull(argv, {"MODELSYNC_CACHE_DIR": str(tmp_path)}) is None


def test_a_damaged_ready_model_falls_through_to_the_full_pull(tmp_path: Path) -> None:
    ready = make_ready(tmp_path)
    os.chmod(ready / "model.safetensors", 0o644)
    os.truncate(ready / "model.safetensors", 3)
    assert try_warm_pull(["pull", SOURCE, "--cache-dir", str(tmp_path)], {}) is None


def test_the_warm_path_imports_neither_the_s3_stack_nor_the_full_command_line(tmp_path: Path) -> None:
    """Nor what only a transfer needs: TLS (the CA bundle is only looked at), ctypes, TOML, xxhash."""
    ready = make_ready(tmp_path)
    bundle = tmp_path / "ca.crt"
    bundle.write_text("-----BEGIN CERTIFICATE-----\nMIIBAA==\n-----END CERTIFICATE-----\n")  # passes the look
    code = (
        "import sys\n"
        "from modelsync.__main__ import main\n"
        "main()\n"
        "print(sorted(m for m in ('typer', 'aiobotocore', 'botocore', 'ssl', 'ctypes', 'tomllib', 'xxhash')"
        " if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, "pull", SOURCE, "--cache-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={**os.environ, "AWS_CA_BUNDLE": str(bundle)},
    )
    assert done.stdout.splitlines() == [str(ready), "[]"]


MAIN_REPORTING_IMPORTS = (
    "import sys\n"
    "from modelsync.__main__ import main\n"
    "try:\n"
    "    main()\n"
    "finally:\n"
    "    print(sorted(m for m in ('typer', 'click', 'OpenSSL') if m in sys.modules), file=sys.stderr)\n"
)


def test_a_plain_cold_pull_runs_without_the_full_command_line(
    tmp_path: Path, s3_client: BaseClient, bucket: str, child_env: dict[str, str]
) -> None:
    """The init container's cold pull skips typer's import (and pyOpenSSL, which botocore would
    load only to find the standard library's SSLContext); same path on stdout, same progress."""
    s3_client.put_object(Bucket=bucket, Key="org/model/weights.bin", Body=b"w" * 300_000)
    done = subprocess.run(
        [sys.executable, "-c", MAIN_REPORTING_IMPORTS, "pull", f"s3://{bucket}/org/model/",
         "--cache-dir", str(tmp_path / "new-cache"), "--quiet"],  # a first pull creates the cache
        env=child_env, capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr
    path = Path(done.stdout.splitlines()[-1])
    assert (path / "weights.bin").read_bytes() == b"w" * 300_000
    assert done.stderr.splitlines()[-1] == "[]"


def test_a_plain_cold_pull_ends_an_error_as_the_full_command_does(
    tmp_path: Path, bucket: str, child_env: dict[str, str]
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", MAIN_REPORTING_IMPORTS, "pull", f"s3://{bucket}/no/such/model/",
         "--cache-dir", str(tmp_path)],
        env=child_env, capture_output=True, text=True, timeout=120, check=False,
    )
    lines = done.stderr.splitlines()
    assert done.returncode == int(ExitCode.NOT_FOUND)
    assert len(lines) == 2 and lines[0].startswith("error: ") and "Traceback" not in done.stderr
    assert lines[1] == "[]"  # answered without the full command line


def test_the_fast_paths_options_are_options_of_the_full_pull_that_set_the_same_settings() -> None:
    from typer.main import get_group

    from modelsync.cli.app import app

    full = get_group(app).commands["pull"]
    setting_of = {option: param.name for param in full.params for option in param.opts}
    assert {option: setting_of.get(option) for option in PLAIN_OPTIONS} == PLAIN_OPTIONS
    assert {setting_of.get(flag) for flag in PLAIN_FLAGS} == {"quiet"}


FULL_COMMAND_LINE = "import sys\nfrom modelsync.cli import run\nsys.exit(run(sys.argv[1:]))\n"


@pytest.mark.parametrize(
    ("situation", "answered_fast", "exit_code"),
    [
        ("a ready model", True, 0),
        ("a model the store lacks", True, int(ExitCode.NOT_FOUND)),
        ("an unsigned model the settings require signed", True, int(ExitCode.INTEGRITY)),
        ("a signature policy that trusts no key", False, int(ExitCode.USAGE)),
        ("a cache root that is a file", True, int(ExitCode.LOCAL_STORAGE)),
    ],
)
def test_the_fast_path_reaches_the_full_commands_verdict(
    tmp_path: Path,
    s3_client: BaseClient,
    bucket: str,
    child_env: dict[str, str],
    situation: str,
    answered_fast: bool,
    exit_code: int,
) -> None:
    """Same exit code, same path or `error:` line; and the fast path answered without typer where it can."""
    source = f"s3://{bucket}/org/model/"
    s3_client.put_object(Bucket=bucket, Key="org/model/weights.bin", Body=b"w" * 1000)
    cache = tmp_path / "cache"
    env = {**child_env, "MODELSYNC_CACHE_DIR": str(cache)}
    if situation == "a ready model":
        assert run_cli(env, "pull", source, "-q").returncode == 0
    elif situation == "a model the store lacks":
        source = f"s3://{bucket}/org/missing/"
    elif situation == "an unsigned model the settings require signed":
        key = tmp_path / "release.pub.pem"
        key.write_text("-----BEGIN PUBLIC KEY-----\n")
        env |= {"MODELSYNC_SIGNATURE": "required", "MODELSYNC_SIGNATURE_PUBLIC_KEYS": str(key)}
    elif situation == "a signature policy that trusts no key":
        env["MODELSYNC_SIGNATURE"] = "required"
    else:
        cache.write_text("not a directory")

    fast = run_cli(env, "pull", source, "-q", code=MAIN_REPORTING_IMPORTS)
    full = run_cli(env, "pull", source, "-q", code=FULL_COMMAND_LINE)

    def verdict(done: subprocess.CompletedProcess[str]) -> tuple[int, list[str], list[str]]:
        errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
        return done.returncode, done.stdout.splitlines(), errors

    assert verdict(fast) == verdict(full)
    assert fast.returncode == exit_code, fast.stderr
    assert (fast.stderr.splitlines()[-1] == "[]") is answered_fast
