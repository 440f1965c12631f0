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
import shutil
import sqlite3
import stat
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import test_cache_lifecycle as lifecycle
from support.cli import one_error_line
from support.faultproxy import FaultProxy
from support.other_users import OtherUser
from support.safetensors import shard
from test_cache_lifecycle import (
    KiB,
    Model,
    assert_absent,
    assert_present,
    ls_json,
    models_of,
    object_gets,
)

from modelsync.adapters.cache import Cache
from modelsync.core.units import format_bytes
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


# ---- a completion record that cannot be read ---------------------------------------------------

DAMAGES = {
    "truncated": lambda text: text[: len(text) // 2],
    "wrong-shape": lambda text: json.dumps([json.loads(text)]),
    "negative-size": lambda text: text.replace('"size": ', '"size": -', 1),
}


def damage_record(cache: Cache, model: Model, how: str) -> Path:
    path = cache.record_path(model.ref)
    path.write_text(DAMAGES[how](path.read_text()))
    return path


@pytest.mark.parametrize("how", sorted(DAMAGES))
def test_a_damaged_record_is_reported_counted_quarantined_and_repaired(
    how: str, cache: Cache, pulled: Callable[..., Model], fault_proxy: FaultProxy, run: Run
) -> None:
    broken = pulled("org/norecord/rev1/", size_bytes=512 * KiB)
    intact = pulled("org/record/rev1/", size_bytes=256 * KiB)
    record = damage_record(cache, broken, how)

    listed = run("ls", "--json")

    assert listed.returncode == 0, listed.stderr
    assert f"warning: completion record {record} cannot be read" in listed.stderr
    doc = json.loads(listed.stdout)
    rows = models_of(doc)
    assert (rows[broken.name]["state"], rows[broken.name]["size_bytes"]) == ("quarantined", broken.size_bytes)
    assert doc["totals"]["used_bytes"] == broken.size_bytes + intact.size_bytes, "its files are counted"
    assert doc["damaged_records"] == [
        {"path": str(record), "reason": doc["damaged_records"][0]["reason"], "model": broken.name}
    ]
    fault_proxy.clear()

    checked = run("verify")

    assert checked.returncode == ExitCode.INTEGRITY, checked.stderr
    assert f"bad   {broken.name}: completion record {record} cannot be read" in checked.stdout
    assert f"ok    {intact.name}" in checked.stdout
    assert not os.path.lexists(cache.ready_path(broken.ref)), "its files are not served"
    assert models_of(ls_json(run))[broken.name]["state"] == "quarantined"

    repaired = run("verify", "--repair")

    assert repaired.returncode == 0, repaired.stderr
    assert object_gets(fault_proxy) == set(broken.files), "nothing vouched for its files: all fetched again"
    assert_present(cache, broken)
    assert run("verify", "--full").returncode == 0


def test_evict_removes_a_model_whose_record_is_damaged_and_gc_a_damaged_record_without_files(
    cache: Cache, pulled: Callable[..., Model], run: Run
) -> None:
    evicted = pulled("org/evict-damaged/rev1/", size_bytes=256 * KiB)
    orphan = pulled("org/orphan-damaged/rev1/", size_bytes=256 * KiB)
    damage_record(cache, evicted, "truncated")
    orphan_record = damage_record(cache, orphan, "wrong-shape")
    os.rename(cache.ready_path(orphan.ref), cache.trash_dir / "moved-away")

    removed = run("evict", evicted.name)

    assert removed.returncode == 0, removed.stderr
    assert_absent(cache, evicted)
    assert not cache.record_path(evicted.ref).exists()
    assert "no cached model has it; `modelsync gc` removes it" in run("ls").stderr

    collected = run("gc", "--older-than", "0s")

    assert collected.returncode == 0, collected.stderr
    assert f"removed {orphan_record} (completion record of no cached model" in collected.stdout
    assert not orphan_record.exists()
    assert run("ls").stderr == ""


# ---- debris of a write that never finished --------------------------------------------------------


def test_temporary_records_left_by_a_crash_are_noted_by_verify_and_removed_by_gc(
    cache: Cache, pulled: Callable[..., Model], run: Run
) -> None:
    model = pulled("org/tmp-records/rev1/", size_bytes=256 * KiB)
    debris = [
        cache.records_dir / f".{model.ref.slug}.json.tmp-4242-0badf00d",
        cache.quarantine_dir / f".{model.ref.slug}.json.tmp-4243-deadbeef",
        cache.leases_dir / f".{model.ref.slug}.tmp-4244-01234567",
        cache.locks_dir / f".{model.ref.slug}.holder.tmp-4245-89abcdef",
    ]
    for path in debris:
        path.write_bytes(b'{"format": "modelsync-rec')

    checked = run("verify")
    collected = run("gc", "--older-than", "0s")

    assert checked.returncode == 0, checked.stderr
    assert collected.returncode == 0, collected.stderr
    for path in debris:
        assert f"note  {path}: temporary file of a write that never finished" in checked.stdout
        assert f"removed {path} (temporary file" in collected.stdout
        assert not path.exists()
    assert collected.stdout.splitlines()[-1] == f"removed {len(debris)} leftovers"
    assert_present(cache, model)


@pytest.mark.root
def test_a_record_write_that_fills_the_disk_leaves_no_temporary_file(tmp_path: Path) -> None:
    from modelsync.adapters import fs
    from modelsync.errors import DiskFullError

    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    volume = tmp_path / "full"
    volume.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "i21tmp", str(volume)], check=False)
    if mounted.returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        with pytest.raises(DiskFullError), fs.storage_errors(volume / "record.json"):
            fs.write_atomic(volume / "record.json", b"x" * (256 * KiB))
        assert os.listdir(volume) == [], "the temporary file of the failed write is gone"
    finally:
        subprocess.run(["umount", "-l", str(volume)], check=False)


# ---- the index follows the records ------------------------------------------------------------------


def test_an_index_row_out_of_step_with_its_record_never_shows_and_verify_full_resyncs_the_files(
    cache: Cache, pulled: Callable[..., Model], run: Run
) -> None:
    model = pulled("org/indexed/rev1/", size_bytes=512 * KiB)
    with sqlite3.connect(cache.index_path) as db:
        db.execute("UPDATE models SET size_bytes = 1, signer = 'mallory', files = 9")
        db.execute("UPDATE files SET size_bytes = 1, xxh3_128 = ?", ("f" * 32,))
    db.close()

    row = models_of(ls_json(run))[model.name]

    assert (row["size_bytes"], row["signer"]) == (model.size_bytes, None)
    assert f"{format_bytes(model.size_bytes)}" in run("ls").stdout
    assert run("verify", "--full").returncode == 0
    with sqlite3.connect(cache.index_path) as db:
        files = dict(db.execute("SELECT path, size_bytes FROM files").fetchall())
        digests = {d for (d,) in db.execute("SELECT xxh3_128 FROM files")}
    db.close()
    assert files == {name: len(data) for name, data in model.files.items()}
    assert "f" * 32 not in digests


# ---- a cache this process cannot write ---------------------------------------------------------------

#: in a private mount namespace: the cache bind-mounted read-only at $VIEW, as a tenant pod's mount
_READ_ONLY = """
set -e
if [ "$VIEW" != "$CACHE" ]; then mount -t tmpfs read-only-view "${VIEW%/*}"; mkdir -p "$VIEW"; fi
mount --bind "$CACHE" "$VIEW"
mount -o remount,bind,ro "$VIEW"
exec "$@"
"""
needs_mount_namespace = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="a read-only bind mount needs root and unshare",
)
#: a user outside the cache's group, and where it sees the cache (a path it can reach)
STRANGER = OtherUser(10002)
STRANGERS_VIEW = Path("/mnt/model-cache")


def on_read_only_mount(
    cache_dir: Path, *args: str, as_user: tuple[str, ...] = (), view: Path | None = None
) -> subprocess.CompletedProcess[str]:
    seen = view or cache_dir
    env = {
        "PATH": os.environ["PATH"],
        "HOME": "/",
        "LANG": "C.UTF-8",
        "CACHE": str(cache_dir),
        "VIEW": str(seen),
    }
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", _READ_ONLY, "read-only",
         *as_user, sys.executable, "-m", "modelsync", *args, "--cache-dir", str(seen)],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def no_sqlite_words(done: subprocess.CompletedProcess[str]) -> None:
    for words in ("unable to open database file", "readonly database", "Traceback"):
        assert words not in done.stderr, done.stderr


@needs_mount_namespace
@pytest.mark.root
def test_read_only_commands_work_on_a_read_only_cache_and_the_others_say_why_not_in_one_line(
    cache: Cache, cache_dir: Path, pulled: Callable[..., Model], run: Run
) -> None:
    model = pulled("org/read-only/rev1/", size_bytes=256 * KiB)
    (cache.staging_dir / "org--gone-aaaaaaaaaaaa").mkdir()
    os.utime(cache.staging_dir / "org--gone-aaaaaaaaaaaa", (0, 0))
    os.unlink(cache.index_path)  # the index must be rebuilt, which a read-only mount cannot store

    listed = on_read_only_mount(cache_dir, "ls", "--json")
    checked = on_read_only_mount(cache_dir, "verify", "--full")
    dry_evict = on_read_only_mount(cache_dir, "evict", model.name, "--dry-run")
    dry_gc = on_read_only_mount(cache_dir, "gc", "--dry-run")

    for done in (listed, checked, dry_evict, dry_gc):
        assert done.returncode == 0, done.stderr
        no_sqlite_words(done)
    assert models_of(json.loads(listed.stdout))[model.name]["size_bytes"] == model.size_bytes
    assert f"ok    {model.name}" in checked.stdout and "read-only here" in checked.stdout
    assert model.name in dry_evict.stdout
    assert "would remove" in dry_gc.stdout and "org--gone-aaaaaaaaaaaa" in dry_gc.stdout
    os.chmod(cache.ready_path(model.ref) / "weights.bin", 0)
    damaged = on_read_only_mount(cache_dir, "verify")
    assert damaged.returncode == ExitCode.INTEGRITY, damaged.stderr
    assert "not quarantined: this cache is read-only here" in one_error_line(damaged.stderr)
    os.chmod(cache.ready_path(model.ref) / "weights.bin", 0o444)
    for args in (("evict", model.name), ("gc", "--older-than", "0s")):
        refused = on_read_only_mount(cache_dir, *args)
        assert refused.returncode == ExitCode.LOCAL_STORAGE, refused.stderr
        assert "read-only filesystem" in one_error_line(refused.stderr)
    assert_present(cache, model)


@STRANGER.needs_the_checkout
@needs_mount_namespace
@pytest.mark.root
@pytest.mark.parametrize("state_mode", [0o2775, 0o2770], ids=["readable-by-others", "group-only"])
def test_a_user_outside_the_cache_group_reads_what_it_may_or_is_told_to_join_the_group_in_one_line(
    state_mode: int, cache: Cache, cache_dir: Path, pulled: Callable[..., Model], run: Run
) -> None:
    model = pulled("org/foreign/rev1/", size_bytes=256 * KiB)
    os.chmod(cache_dir, 0o2775)
    os.chmod(cache.state_dir, state_mode)

    for args in (("ls",), ("verify",), ("gc", "--dry-run"), ("evict", model.name, "--dry-run")):
        done = on_read_only_mount(cache_dir, *args, as_user=STRANGER.setpriv, view=STRANGERS_VIEW)

        no_sqlite_words(done)
        if state_mode & 0o005:
            assert done.returncode == 0, done.stderr
            assert model.name in done.stdout or args[0] == "gc"
        else:
            assert done.returncode == ExitCode.LOCAL_STORAGE, done.stderr
            line = one_error_line(done.stderr)
            assert "not in the cache's group (gid 0)" in line and "supplementalGroups" in line, line
