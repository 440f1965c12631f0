"""Several processes on one cache at once: the real CLI in child processes.

The server is the child-process moto (its own GIL) behind a fault proxy in this
process, which counts the body bytes it served. Pulls are slowed with
`--max-bandwidth` when a test needs one in flight. Each test ends by checking the
cache is consistent: every model is fully present or fully absent, its record
and ready directory agree, and `ls` / `verify --full` are clean.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest
from botocore.client import BaseClient
from support.cli import run_cli
from support.faultproxy import FaultProxy
from support.objects import put_model
from support.s3env import S3Env
from support.safetensors import shard
from support.waiting import wait_for

from modelsync.adapters.cache import Cache
from modelsync.core.refs import ModelRef
from modelsync.engine.catalog import open_catalog

KiB = 1024
MiB = 1024 * KiB
MODELSYNC = [sys.executable, "-m", "modelsync"]
BUCKET = "conc"  # the child moto is emptied before each test


# ---- helpers --------------------------------------------------------------------------


def journal_parts(cache: Path) -> int:
    count = 0
    for journal in (cache / ".modelsync" / "staging").glob("*.journal"):
        for line in journal.read_bytes().splitlines():
            with contextlib.suppress(ValueError):
                if "part" in json.loads(line):
                    count += 1
    return count


def assert_all_or_nothing(cache: Cache, ref: ModelRef, files: dict[str, bytes]) -> bool:
    """The model is fully present (record, ready dir, every byte, index row) or fully absent."""
    ready = cache.ready_path(ref)
    record = cache.load_record(ref)
    with open_catalog(cache) as catalog:
        view = catalog.view(ref.model_id)
    if os.path.lexists(ready):
        assert record is not None, "a ready directory without its record"
        got = {p.relative_to(ready).as_posix(): p.read_bytes() for p in ready.rglob("*") if p.is_file()}
        assert got == files, "a ready directory that is not the whole model"
        assert view is not None and view.state == "ready"
        return True
    assert record is None, "a record without its ready directory"
    assert view is None or view.state == "pulling"
    return False


@pytest.fixture
def env(moto_subprocess_s3_env: S3Env, moto_subprocess_proxy: FaultProxy) -> dict[str, str]:
    child = moto_subprocess_s3_env.via(moto_subprocess_proxy.endpoint_url).subprocess_env()
    child["MODELSYNC_PART_SIZE"] = "1Mi"  # the smallest part size allowed
    return child


def start(
    args: list[str], cache: Path, env: dict[str, str], stderr: IO[str] | None = None
) -> subprocess.Popen[str]:
    """A child CLI; its stderr goes to a pipe, or to `stderr` to be read while it runs."""
    return subprocess.Popen(
        [*MODELSYNC, *args, "--cache-dir", str(cache)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=stderr if stderr is not None else subprocess.PIPE,
        text=True,
    )


def assert_cache_clean(cache_dir: Path, env: dict[str, str]) -> None:
    listed = run_cli(env, "ls", "--json", cache_dir=cache_dir)
    assert listed.returncode == 0, listed.stderr
    assert all(m["state"] == "ready" for m in json.loads(listed.stdout)["models"]), listed.stdout
    checked = run_cli(env, "verify", "--full", cache_dir=cache_dir)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "bad" not in checked.stdout


@contextlib.contextmanager
def reaped(*procs: subprocess.Popen[str]) -> Iterator[None]:
    try:
        yield
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.communicate()


# ---- single flight -------------------------------------------------------------------


def test_eight_concurrent_pulls_of_one_model_all_print_its_path_and_fetch_it_about_once(
    tmp_path: Path, moto_subprocess_client: BaseClient, moto_subprocess_proxy: FaultProxy, env: dict[str, str]
) -> None:
    files = {"model.safetensors": shard(4 * MiB), "config.json": b'{"layers": 4}'}
    total = sum(len(d) for d in files.values())
    ref = put_model(moto_subprocess_client, BUCKET, "org/popular/rev1/", files)
    cache_dir = tmp_path / "cache"

    pullers = [start(["pull", ref.uri, "--max-bandwidth", "4Mi"], cache_dir, env) for _ in range(8)]
    with reaped(*pullers):
        outputs = [p.communicate(timeout=90) for p in pullers]

    assert [p.returncode for p in pullers] == [0] * 8, outputs
    ready = str(Cache(cache_dir).ready_path(ref))
    assert {out.splitlines()[-1] for out, _err in outputs} == {ready}
    served = moto_subprocess_proxy.object_bytes_sent()
    ratio = served / total
    print(f"8 concurrent pulls of {total} bytes: the server sent {served} bytes ({ratio:.3f}x)")
    assert ratio == 1.0
    waited = sum("waiting for pid" in err for _out, err in outputs)
    assert waited >= 1, outputs
    assert assert_all_or_nothing(Cache(cache_dir), ref, files)
    assert_cache_clean(cache_dir, env)


def test_a_waiter_takes_over_at_once_when_the_holder_is_killed_and_resumes_its_parts(
    tmp_path: Path, moto_subprocess_client: BaseClient, moto_subprocess_proxy: FaultProxy, env: dict[str, str]
) -> None:
    files = {"model.safetensors": shard(12 * MiB)}
    total = 12 * MiB
    ref = put_model(moto_subprocess_client, BUCKET, "org/handover/rev1/", files)
    cache_dir = tmp_path / "cache"
    cache = Cache(cache_dir)
    holder_file = cache.lock(ref).holder_path

    holder = start(["pull", ref.uri, "--max-bandwidth", "2Mi", "--concurrency", "2", "-q"], cache_dir, env)
    with reaped(holder):
        wait_for(lambda: journal_parts(cache_dir) >= 3, "the holder's journaled parts", proc=holder)
        waiter_err = tmp_path / "waiter.err"
        with (
            waiter_err.open("w") as err_file,
            reaped(waiter := start(["pull", ref.uri], cache_dir, env, err_file)),
        ):
            wait_for(lambda: "waiting for pid" in waiter_err.read_text(), "the waiter to wait", proc=waiter)
            assert f"pid {holder.pid}" in waiter_err.read_text()
            done_parts = journal_parts(cache_dir)
            os.kill(holder.pid, signal.SIGKILL)
            killed_at = time.monotonic()
            holder.wait(timeout=10)
            moto_subprocess_proxy.clear()  # from here on, every byte served is the waiter's

            def waiter_holds() -> bool:
                with contextlib.suppress(OSError, ValueError):
                    return bool(json.loads(holder_file.read_bytes())["pid"] == waiter.pid)
                return waiter.poll() is not None

            wait_for(waiter_holds, "the waiter to take the lock", timeout_s=5)
            takeover_s = time.monotonic() - killed_at
            out, _ = waiter.communicate(timeout=60)

    assert holder.returncode == -signal.SIGKILL
    assert waiter.returncode == 0, waiter_err.read_text()
    assert out.splitlines()[-1] == str(cache.ready_path(ref))
    fetched = moto_subprocess_proxy.object_bytes_sent()
    print(f"takeover {takeover_s:.2f} s after kill -9; waiter fetched {fetched} of {total} bytes")
    assert takeover_s < 3.0  # the lock wakes it (milliseconds); slack for a loaded machine
    # It resumed: the parts the dead holder journaled were not fetched again.
    assert moto_subprocess_proxy.object_bytes_sent() <= total - done_parts * MiB
    assert assert_all_or_nothing(cache, ref, files)
    assert_cache_clean(cache_dir, env)


# ---- evict racing a pull ---------------------------------------------------------------


def test_an_evict_racing_a_pull_of_the_same_model_leaves_it_fully_present_or_fully_absent(
    tmp_path: Path, moto_subprocess_client: BaseClient, env: dict[str, str]
) -> None:
    files = {"a.bin": os.urandom(2 * MiB), "b.bin": os.urandom(MiB)}
    ref = put_model(moto_subprocess_client, BUCKET, "org/raced/rev1/", files)
    cache_dir = tmp_path / "cache"
    cache = Cache(cache_dir)
    outcomes = []
    evict_codes: set[int] = set()

    # A slow pull with evicts fired at it throughout, and once more as it finishes.
    puller = start(["pull", ref.uri, "--max-bandwidth", "4Mi", "-q"], cache_dir, env)
    with reaped(puller):
        while puller.poll() is None:
            result = run_cli(env, "evict", ref.model_id, cache_dir=cache_dir)
            evict_codes.add(result.returncode)
            assert result.returncode in (0, 2, 3), result.stderr
            assert "Traceback" not in result.stderr
        assert puller.wait() == 0
    outcomes.append(assert_all_or_nothing(cache, ref, files))

    # The pull and the evict started together, the model ready or not beforehand.
    for _ in range(3):
        puller = start(["pull", ref.uri, "-q"], cache_dir, env)
        evicter = start(["evict", ref.model_id], cache_dir, env)
        with reaped(puller, evicter):
            _, pull_err = puller.communicate(timeout=60)
            _, evict_err = evicter.communicate(timeout=60)
        assert puller.returncode == 0, pull_err
        assert evicter.returncode in (0, 2, 3), evict_err
        evict_codes.add(evicter.returncode)
        outcomes.append(assert_all_or_nothing(cache, ref, files))

    print(f"outcomes (present?): {outcomes}; evict exit codes seen: {sorted(evict_codes)}")
    assert list(cache.staging_dir.iterdir()) == []
    assert list(cache.reservations_dir.iterdir()) == []
    assert_cache_clean(cache_dir, env)


# ---- disk full -----------------------------------------------------------------------------


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 12 MiB tmpfs as the cache (root only): ENOSPC for real, mid-pull."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=12m", "ms_cache_tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def fill(path: Path) -> int:
    """Write zeros until the filesystem says ENOSPC; returns the bytes written."""
    written = 0
    with path.open("wb", buffering=0) as fh:
        block = b"\0" * (64 * KiB)
        with contextlib.suppress(OSError):
            while True:
                written += fh.write(block)
    return written


@pytest.mark.root
def test_disk_full_in_the_middle_of_two_pulls_fails_or_succeeds_cleanly_and_serves_nothing_half_written(
    small_tmpfs: Path, moto_subprocess_client: BaseClient, env: dict[str, str]
) -> None:
    cache_dir = small_tmpfs / "cache"
    cache = Cache(cache_dir)
    first = {"w.bin": os.urandom(3 * MiB), "x.bin": os.urandom(MiB)}
    second = {"w.bin": os.urandom(3 * MiB), "y.bin": os.urandom(MiB)}
    ref1 = put_model(moto_subprocess_client, BUCKET, "org/first/rev1/", first)
    ref2 = put_model(moto_subprocess_client, BUCKET, "org/second/rev1/", second)
    ref3 = put_model(moto_subprocess_client, BUCKET, "org/third/rev1/", {"z.bin": os.urandom(MiB)})

    # 1 MiB parts at 1 MiB/s: each pull is in flight for about four seconds
    one = start(["pull", ref1.uri, "--max-bandwidth", "1Mi", "-q"], cache_dir, env)
    two = start(["pull", ref2.uri, "--max-bandwidth", "1Mi", "-q"], cache_dir, env)
    with reaped(one, two):
        wait_for(lambda: journal_parts(cache_dir) >= 2, "both pulls in flight", proc=one)
        filler = small_tmpfs / "filler"
        filled = fill(filler)  # another tenant of the volume takes every byte left
        third = run_cli(env, "pull", ref3.uri, "-q", cache_dir=cache_dir)
        results = [p.communicate(timeout=60) for p in (one, two)]

    print(f"filled {filled} bytes; exits {one.returncode}, {two.returncode}; third {third.returncode}")
    for proc, (_out, err), ref, files in ((one, results[0], ref1, first), (two, results[1], ref2, second)):
        assert proc.returncode in (0, 6), err
        if proc.returncode == 6:
            line = err.strip().splitlines()
            assert len(line) == 1 and line[0].startswith("error: ") and "Traceback" not in err, err
        present = assert_all_or_nothing(cache, ref, files)
        assert present == (proc.returncode == 0)
    # A pull started on the full disk is refused with one line, and publishes nothing.
    assert third.returncode == 6, third.stderr
    assert len(third.stderr.strip().splitlines()) == 1 and "Traceback" not in third.stderr
    assert not os.path.lexists(cache.ready_path(ref3))

    # The operator can still see the cache on the full disk, to choose what to evict.
    listed = run_cli(env, "ls", "--json", cache_dir=cache_dir)
    assert listed.returncode == 0, listed.stderr
    ready_now = {m["model"] for m in json.loads(listed.stdout)["models"] if m["state"] == "ready"}
    expected = {r.model_id for r, p in ((ref1, one), (ref2, two)) if p.returncode == 0}
    assert ready_now == expected

    filler.unlink()
    assert_cache_clean(cache_dir, env)
    for ref, files in ((ref1, first), (ref2, second)):
        again = run_cli(env, "pull", ref.uri, "-q", cache_dir=cache_dir)
        assert again.returncode == 0, again.stderr
        assert assert_all_or_nothing(cache, ref, files)
    assert_cache_clean(cache_dir, env)
