"""The cache reports what it holds: modes, files that are not files, damaged records, the index, debris.

Each case is a state someone with write access to a node can leave behind (a
chmod, a deleted or replaced file, a truncated record, a full disk while a record
is written, an edited index row), and the real CLI must see it: not ready, reported,
quarantined, counted, repaired or removed. Models are pulled in-process through the
fault proxy (every byte fetched is counted), as in tests/test_cache_lifecycle.py,
whose fixtures these tests share.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import test_cache_lifecycle as lifecycle
from support.cli import one_error_line
from support.faultproxy import FaultProxy
from support.safetensors import shard
from test_cache_lifecycle import (
    KiB,
    Model,
    assert_present,
    ls_json,
    models_of,
    object_gets,
)

from modelsync.adapters.cache import Cache
from modelsync.errors import ExitCode

Run = Callable[..., subprocess.CompletedProcess[str]]
#: the fixtures of tests/test_cache_lifecycle.py: a cache, a fast in-process pull through the fault
#: proxy, and the CLI in a child process (`run`)
cache, cache_dir, cli_env, pulled, run, settings, upload = (
    lifecycle.cache,
    lifecycle.cache_dir,
    lifecycle.cli_env,
    lifecycle.pulled,
    lifecycle.run,
    lifecycle.settings,
    lifecycle.upload,
)


def shards_and_files(pulled: Callable[..., Model], prefix: str) -> Model:
    """A model with a safetensors shard (which `verify --full` scrubs) and b.bin, which tests damage."""
    files = {
        "model.safetensors": shard(256 * KiB),
        "b.bin": os.urandom(256 * KiB),
        "config.json": json.dumps({"id": prefix}).encode(),
    }
    return pulled(prefix, files)


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


# ---- a file others cannot read is not ready -------------------------------------------------


def test_a_ready_file_with_mode_000_is_not_ready_and_a_warm_pull_fetches_it_again(
    cache: Cache, pulled: Callable[..., Model], fault_proxy: FaultProxy, run: Run
) -> None:
    model = shards_and_files(pulled, "org/mode/rev1/")
    damaged = cache.ready_path(model.ref) / "b.bin"
    os.chmod(damaged, 0)
    fault_proxy.clear()

    warm = run("pull", model.ref.uri)

    assert warm.returncode == 0, warm.stderr
    assert object_gets(fault_proxy) == {"b.bin"}, "only the unreadable file is fetched again"
    assert mode_of(damaged) == 0o444
    assert_present(cache, model)


def test_verify_reports_a_mode_000_file_quarantines_its_model_and_repair_restores_it(
    cache: Cache, pulled: Callable[..., Model], fault_proxy: FaultProxy, run: Run
) -> None:
    model = shards_and_files(pulled, "org/mode-verify/rev1/")
    os.chmod(cache.ready_path(model.ref) / "b.bin", 0)
    fault_proxy.clear()

    checked = run("verify", "--full")

    assert checked.returncode == ExitCode.INTEGRITY, checked.stderr
    assert "verify --repair" in one_error_line(checked.stderr)
    assert f"bad   {model.name}/b.bin: mode 000, not readable by all (published 444)" in checked.stdout
    assert models_of(ls_json(run))[model.name]["state"] == "quarantined"

    repaired = run("verify", "--full", "--repair")

    assert repaired.returncode == 0, repaired.stderr
    assert f"repaired {model.name}" in repaired.stdout
    assert object_gets(fault_proxy) == {"b.bin"}
    assert mode_of(cache.ready_path(model.ref) / "b.bin") == 0o444
    assert_present(cache, model)
    assert run("verify", "--full").returncode == 0


# ---- verify --full: a file that is not there, or not a file ------------------------------------


def replace_file(path: Path, how: str, tmp_path: Path) -> None:
    os.unlink(path)
    if how == "directory":
        path.mkdir()
    elif how == "symlink":
        target = tmp_path / "elsewhere.bin"
        target.write_bytes(os.urandom(256 * KiB))
        os.symlink(target, path)
    elif how == "fifo":
        os.mkfifo(path)


@pytest.mark.parametrize(
    ("how", "which"),
    [
        ("deleted", "model.safetensors"),
        ("directory", "model.safetensors"),
        ("symlink", "model.safetensors"),
        ("fifo", "model.safetensors"),
        ("fifo", "b.bin"),
    ],
)
def test_verify_full_quarantines_a_model_whose_file_is_gone_or_not_a_file_and_checks_the_rest(
    how: str,
    which: str,
    tmp_path: Path,
    cache: Cache,
    pulled: Callable[..., Model],
    fault_proxy: FaultProxy,
    run: Run,
) -> None:
    broken = shards_and_files(pulled, "org/broken/rev1/")
    intact = shards_and_files(pulled, "org/zintact/rev1/")
    replace_file(cache.ready_path(broken.ref) / which, how, tmp_path)
    fault_proxy.clear()
    done: list[subprocess.CompletedProcess[str]] = []
    checking = threading.Thread(target=lambda: done.append(run("verify", "--full")), daemon=True)

    checking.start()
    checking.join(30)

    assert done, "verify --full hung"
    checked = done[0]
    assert checked.returncode == ExitCode.INTEGRITY, checked.stderr
    assert "verify --repair" in one_error_line(checked.stderr)
    assert f"bad   {broken.name}/{which}: " in checked.stdout
    assert f"ok    {intact.name}" in checked.stdout, "the other models are still checked"
    rows = models_of(ls_json(run))
    assert (rows[broken.name]["state"], rows[intact.name]["state"]) == ("quarantined", "ready")

    repaired = run("verify", "--repair")

    assert repaired.returncode == 0, repaired.stderr
    assert object_gets(fault_proxy) == {which}
    assert_present(cache, broken)
    assert run("verify", "--full").returncode == 0
