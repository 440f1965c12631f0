"""A pull that does not fit yet waits for the room that is coming, on the real CLI against moto.

The cache budget holds one of two 1 MiB models. The second pull fits once the
first model's in-use grace (or its lease, or its running pull) is over: it says
once on stderr what it waits for, and succeeds. It fails with exit 6 at once when
the room would come only after its wait (`--room-wait`, MODELSYNC_ROOM_WAIT), or
never (a pinned model), and its one line says which; a wait that runs out says so.
A signal ends the wait within a second, as it ends a transfer.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest
from botocore.client import BaseClient
from support.cli import MODELSYNC, one_error_line, run_cli
from support.objects import payload, put_model
from support.waiting import wait_for

from modelsync.adapters.cache import Cache
from modelsync.core.refs import ModelRef
from modelsync.errors import ExitCode

MiB = 1024 * 1024
BUDGET = {"MODELSYNC_CACHE_MAX_BYTES": "1.5Mi"}
#: the wait itself ends at once; the rest is the interpreter's exit, slow on a loaded machine
STOP_WITHIN_S = 3.0


@pytest.fixture
def models(s3_client: BaseClient, bucket: str) -> tuple[ModelRef, ModelRef]:
    first = put_model(s3_client, bucket, "org/first/rev1/", {"weights.bin": payload(MiB, 1)})
    second = put_model(s3_client, bucket, "org/second/rev1/", {"weights.bin": payload(MiB, 2)})
    return first, second


def pull(env: dict[str, str], cache: Path, ref: ModelRef, *extra: str) -> subprocess.CompletedProcess[str]:
    return run_cli(env, "pull", ref.uri, "--quiet", *extra, cache_dir=cache)


def first_pulled(
    tmp_path: Path, child_env: dict[str, str], first: ModelRef, grace: str
) -> tuple[dict[str, str], Path]:
    """The environment (the budget, the grace) and the cache, once the first model is pulled."""
    cache = tmp_path / "cache"
    env = {**child_env, **BUDGET, "MODELSYNC_IN_USE_GRACE": grace}
    assert pull(env, cache, first).returncode == 0
    return env, cache


def notes(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("note: ")]


def test_a_pull_that_fits_once_a_model_is_no_longer_in_use_waits_for_it_says_so_once_and_succeeds(
    tmp_path: Path, child_env: dict[str, str], models: tuple[ModelRef, ModelRef]
) -> None:
    first, second = models
    # A grace long enough that the second pull reaches its claim within it, even on a busy machine.
    env, cache = first_pulled(tmp_path, child_env, first, "12s")

    result = pull(env, cache, second)

    assert result.returncode == 0, result.stderr
    (note,) = notes(result.stderr)
    assert note.startswith("note: no room yet: waiting up to 10m for 512.0 KiB more with a cache budget of ")
    assert f"{first.model_id} (in use: used " in note and "grace 12s) end" in note, note
    assert "Traceback" not in result.stderr
    assert not Cache(cache).ready_path(first).exists(), "the model that was in use made room"
    assert (Cache(cache).ready_path(second) / "weights.bin").read_bytes() == payload(MiB, 2)


def test_a_pull_whose_room_comes_only_after_its_wait_fails_at_once_saying_when(
    tmp_path: Path, child_env: dict[str, str], models: tuple[ModelRef, ModelRef]
) -> None:
    first, second = models
    env, cache = first_pulled(tmp_path, child_env, first, "1h")

    # Were either to wait, the test would time out: the wait is minutes.
    result = pull(env, cache, second, "--room-wait", "5m")
    off = pull({**env, "MODELSYNC_ROOM_WAIT": "0"}, cache, second)

    assert result.returncode == off.returncode == ExitCode.LOCAL_STORAGE
    line = one_error_line(result.stderr)
    assert f"{first.model_id} (in use: used " in line
    assert "room is expected only at " in line
    assert "the wait for room (MODELSYNC_ROOM_WAIT, --room-wait) ends at " in line, line
    assert "the wait for room (MODELSYNC_ROOM_WAIT, --room-wait) is off" in one_error_line(off.stderr)
    assert Cache(cache).ready_path(first).exists()


def test_a_pull_that_cannot_fit_even_once_models_are_done_fails_at_once(
    tmp_path: Path, child_env: dict[str, str], models: tuple[ModelRef, ModelRef]
) -> None:
    first, second = models
    env, cache = first_pulled(tmp_path, child_env, first, "3s")
    assert run_cli(env, "pin", first.model_id, cache_dir=cache).returncode == 0

    result = pull(env, cache, second)  # it waits for nothing: the test would time out

    assert result.returncode == ExitCode.LOCAL_STORAGE
    line = one_error_line(result.stderr)
    assert f"{first.model_id} (pinned)" in line
    assert "it cannot fit even once the models in use or being pulled are done" in line, line


def test_a_pull_waiting_for_another_pull_gives_up_when_its_wait_runs_out_and_says_so(
    tmp_path: Path, child_env: dict[str, str], s3_client: BaseClient, bucket: str
) -> None:
    big = put_model(s3_client, bucket, "org/big/rev1/", {"weights.bin": payload(8 * MiB, 3)})
    small = put_model(s3_client, bucket, "org/small/rev1/", {"weights.bin": payload(MiB, 4)})
    cache = tmp_path / "cache"
    env = {**child_env, "MODELSYNC_CACHE_MAX_BYTES": "8.5Mi", "MODELSYNC_IN_USE_GRACE": "1s"}
    slow = subprocess.Popen(  # 32 s at this rate: it is still pulling when the wait runs out
        [*MODELSYNC, "pull", big.uri, "--quiet", "--max-bandwidth", "256Ki", "--cache-dir", str(cache)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: list(Cache(cache).reservations().values()), "the big pull's claim", proc=slow)
        result = pull(env, cache, small, "--room-wait", "2s")
    finally:
        slow.kill()
        slow.communicate()

    assert result.returncode == ExitCode.LOCAL_STORAGE, result.stderr
    (note,) = notes(result.stderr)
    assert f"{big.model_id} (pulling)" in note, note
    line = one_error_line("\n".join(x for x in result.stderr.splitlines() if not x.startswith("note: ")))
    assert "the wait for room (MODELSYNC_ROOM_WAIT, --room-wait) ran out after 2s" in line, line


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_ends_the_wait_for_room_within_a_second(
    signum: int,
    code: int,
    tmp_path: Path,
    child_env: dict[str, str],
    models: tuple[ModelRef, ModelRef],
) -> None:
    first, second = models
    env, cache = first_pulled(tmp_path, child_env, first, "5m")
    waiting = subprocess.Popen(
        [*MODELSYNC, "pull", second.uri, "--cache-dir", str(cache)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    staging = Cache(cache).staging_dir
    wait_for(lambda: any(staging.iterdir()), "the second pull to stage", proc=waiting)
    time.sleep(1.0)  # well into the wait: its note is out
    assert waiting.poll() is None, waiting.communicate()

    waiting.send_signal(signum)
    signalled = time.monotonic()
    _out, err = waiting.communicate(timeout=10)

    stopped_s = time.monotonic() - signalled
    print(f"{signal.Signals(signum).name}: the waiting pull exited {stopped_s:.3f} s after the signal")
    assert stopped_s < STOP_WITHIN_S
    assert waiting.returncode == code
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith(f"error: interrupted by {signal.Signals(signum).name}")
    assert Cache(cache).ready_path(first).exists()
