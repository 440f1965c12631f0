"""The shared cache's life: ls, evict, pin, budget, dedup, verify, repair, symlinks and leftovers.

Models are set up by the real pull, in-process, against the in-thread moto behind
the fault proxy (so every byte fetched is counted). The operator commands are run
as the real CLI in a child process, because their contract is the exit code, the
single `error:` line and what they print. Models are a few MiB, pulled in 256 KiB parts
in-process (the CLI allows 1 MiB at least).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import sqlite3
import stat
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

import pytest
from botocore.client import BaseClient
from support.cli import one_error_line, run_cli
from support.engine import pull
from support.faultproxy import FaultProxy
from support.objects import put_model
from support.s3env import S3Env

from modelsync.adapters.cache import Cache
from modelsync.config import Settings
from modelsync.config_values import CacheBudget
from modelsync.core.eviction import plan_named
from modelsync.core.refs import ModelRef
from modelsync.core.units import format_bytes
from modelsync.engine.catalog import open_catalog
from modelsync.engine.events import NoEvents
from modelsync.errors import ExitCode

KiB = 1024
MiB = 1024 * KiB
PART = 256 * KiB
HOUR_S = 3600.0


# ---- helpers --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Model:
    ref: ModelRef
    files: dict[str, bytes]

    @property
    def name(self) -> str:
        return self.ref.model_id

    @property
    def size_bytes(self) -> int:
        return sum(len(d) for d in self.files.values())


def tree(root: Path) -> dict[str, tuple[int, int, float, int]]:
    """Every path below `root` (links not followed) with its mode, size, mtime and inode."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            st = os.lstat(path)
            found[path.relative_to(root).as_posix()] = (st.st_mode, st.st_size, st.st_mtime, st.st_ino)
    return found


def without_index(found: dict[str, tuple[int, int, float, int]]) -> dict[str, tuple[int, int, float, int]]:
    """A cache tree minus the SQLite index, whose -wal/-shm files come and go with every reader
    (and with them the state directory's mtime); the index is derived state."""
    kept = {path: v for path, v in found.items() if not path.startswith(".modelsync/index.sqlite")}
    mode, size, _mtime, ino = kept[".modelsync"]
    kept[".modelsync"] = (mode, size, 0.0, ino)
    return kept


def md5_hex(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def set_last_used(cache: Cache, model: Model, hours_ago: float) -> None:
    cache.touch(model.ref, at=time.time() - hours_ago * HOUR_S)


def ls_json(run: Callable[..., subprocess.CompletedProcess[str]]) -> dict[str, object]:
    result = run("ls", "--json")
    assert result.returncode == 0, result.stderr
    doc: dict[str, object] = json.loads(result.stdout)
    return doc


def models_of(doc: dict[str, object]) -> dict[str, dict[str, object]]:
    rows = doc["models"]
    assert isinstance(rows, list)
    return {row["model"]: row for row in rows}


def object_gets(proxy: FaultProxy) -> set[str]:
    """The files whose bytes were fetched (presigned ranged GETs), by name."""
    return {r.path.split("?")[0].rsplit("/", 1)[-1] for r in proxy.object_gets()}


def damage(path: Path, how: str) -> None:
    """Damage a published (read-only) file the way a disk or an operator might."""
    if how == "deleted":
        path.unlink()
        return
    os.chmod(path, 0o644)
    with open(path, "r+b") as fh:
        if how == "truncated":
            fh.truncate(1000)
        else:  # a flipped byte: same size, found only by re-hashing
            fh.seek(1000)
            byte = fh.read(1)
            fh.seek(1000)
            fh.write(bytes([byte[0] ^ 0x01]))
    os.chmod(path, 0o444)


def three_files(pulled: Callable[..., Model], prefix: str) -> Model:
    """A model whose b.bin (768 KiB) the tests damage."""
    files = {"a.bin": os.urandom(MiB), "b.bin": os.urandom(768 * KiB), "config.json": b'{"x": 1}'}
    return pulled(prefix, files)


# ---- fixtures -------------------------------------------------------------------------


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    return tmp_path / "cache"


@pytest.fixture
def settings(cache_dir: Path, proxied_s3_env: S3Env, aws_credentials: S3Env) -> Settings:
    """A fast pull through the fault proxy, with a short in-use grace so LRU tests can age models."""
    return Settings(
        cache_dir=cache_dir,
        endpoint_url=proxied_s3_env.endpoint_url,
        part_size_bytes=PART,
        concurrency=4,
        read_timeout_s=5.0,
        connect_timeout_s=2.0,
        in_use_grace_s=1.0,
    )


@pytest.fixture
def cli_env(proxied_s3_env: S3Env) -> dict[str, str]:
    env = proxied_s3_env.subprocess_env()
    env["MODELSYNC_IN_USE_GRACE"] = "1s"
    env["MODELSYNC_PART_SIZE"] = "1Mi"  # the smallest part size allowed
    return env


@pytest.fixture
def run(cache_dir: Path, cli_env: dict[str, str]) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run `modelsync <args> --cache-dir <cache>` in a child process; `env=` adds variables."""

    def invoke(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return run_cli({**cli_env, **(env or {})}, *args, cache_dir=cache_dir, timeout_s=60)

    return invoke


@pytest.fixture
def upload(s3_client: BaseClient, bucket: str) -> Callable[..., Model]:
    """Put a model's files in the bucket (single PUTs: their ETags are MD5s of the bytes)."""

    def put(prefix: str, files: dict[str, bytes]) -> Model:
        return Model(put_model(s3_client, bucket, prefix, files), files)

    return put


@pytest.fixture
def pulled(settings: Settings, upload: Callable[..., Model]) -> Callable[..., Model]:
    """Upload a model and pull it into the cache in-process."""

    def make(prefix: str, files: dict[str, bytes] | None = None, size_bytes: int = MiB) -> Model:
        # config.json differs per model: equal bytes would be hard-linked and counted once
        default = {"weights.bin": os.urandom(size_bytes), "config.json": json.dumps({"id": prefix}).encode()}
        model = upload(prefix, files or default)
        result = pull(settings, model.ref, NoEvents())
        assert result.path == settings.cache_dir / model.ref.cache_path
        return model

    return make


@pytest.fixture
def cache(cache_dir: Path) -> Cache:
    return Cache(cache_dir)


def assert_present(cache: Cache, model: Model) -> None:
    ready = cache.ready_path(model.ref)
    assert cache.ready_record(model.ref) is not None
    for name, data in model.files.items():
        assert (ready / name).read_bytes() == data


def assert_absent(cache: Cache, model: Model) -> None:
    assert not os.path.lexists(cache.ready_path(model.ref))
    assert not cache.record_path(model.ref).exists()
    with open_catalog(cache) as catalog:
        assert catalog.view(model.name) is None


# ---- ls ------------------------------------------------------------------------------


def test_ls_lists_size_last_use_pin_state_and_verification_with_totals_against_the_budget(
    cache: Cache, pulled: Callable[..., Model], run: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    old = pulled("org/old/rev1/", size_bytes=MiB)
    new = pulled("org/new/rev1/", size_bytes=2 * MiB)
    before_s = time.time()
    set_last_used(cache, old, hours_ago=3)
    assert run("pin", new.name).returncode == 0

    doc = ls_json(lambda *a: run(*a, env={"MODELSYNC_CACHE_MAX_BYTES": "100Mi"}))
    after_s = time.time()
    rows = models_of(doc)

    assert rows.keys() == {old.name, new.name}
    assert rows[old.name]["size_bytes"] == old.size_bytes
    assert rows[new.name]["size_bytes"] == new.size_bytes
    assert rows[old.name]["state"] == rows[new.name]["state"] == "ready"
    assert (rows[old.name]["pinned"], rows[new.name]["pinned"]) == (False, True)
    assert rows[old.name]["source"] == old.ref.uri
    last_used_old = str(rows[old.name]["last_used"])
    # Bounded by the clock around the test, not by a slack that a loaded machine outruns.
    assert before_s - 3 * HOUR_S - 1 <= _epoch(last_used_old) <= after_s - 3 * HOUR_S + 1
    assert before_s - 60 <= _epoch(str(rows[new.name]["last_used"])) <= after_s + 1
    assert rows[new.name]["verified_at"] is not None
    assert doc["totals"] == {
        "used_bytes": old.size_bytes + new.size_bytes,
        "budget_bytes": 100 * MiB,
        "free_bytes": doc["totals"]["free_bytes"],  # type: ignore[index]
    }

    text = run("ls", env={"MODELSYNC_CACHE_MAX_BYTES": "100Mi"})
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    header = ["MODEL", "STATE", "SIZE", "LAST", "USED", "PINNED", "VERIFIED", "SIGNED", "BY", "EVICTABLE"]
    assert lines[0].split() == header
    by_model = {line.split()[0]: line for line in lines[1:-1]}
    assert "3.0h ago" in by_model[old.name] or "3h ago" in by_model[old.name], by_model[old.name]
    assert " yes " in by_model[new.name] and " yes " not in by_model[old.name]
    assert format_bytes(new.size_bytes) in by_model[new.name]
    assert lines[-1].startswith("2 models, ")
    assert f"{format_bytes(old.size_bytes + new.size_bytes)} used of a 100.0 MiB budget" in lines[-1]


def _epoch(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


@pytest.mark.parametrize("damage", ["deleted", "garbage"])
def test_ls_shows_the_same_models_after_the_index_is_deleted_or_corrupted(
    damage: str,
    cache: Cache,
    pulled: Callable[..., Model],
    run: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    a = pulled("org/a/rev1/")
    b = pulled("org/b/rev1/", size_bytes=512 * KiB)
    set_last_used(cache, a, hours_ago=5)
    assert run("pin", b.name).returncode == 0
    assert run("verify", a.name).returncode == 0  # a verification time later than completion
    before = ls_json(run)

    for suffix in ("-wal", "-shm"):
        Path(f"{cache.index_path}{suffix}").unlink(missing_ok=True)
    if damage == "deleted":
        cache.index_path.unlink()
    else:
        cache.index_path.write_bytes(os.urandom(64 * KiB))
    after = ls_json(run)

    # Every field survives: last use, pins and verification times live beside the records.
    rows_before, rows_after = models_of(before), models_of(after)
    assert rows_after.keys() == rows_before.keys() == {a.name, b.name}
    for name, row in rows_before.items():
        for key, value in row.items():
            assert rows_after[name][key] == value, f"{name} {key}"
    assert after["totals"]["used_bytes"] == before["totals"]["used_bytes"]  # type: ignore[index]
    with sqlite3.connect(cache.index_path) as db:
        assert db.execute("PRAGMA quick_check").fetchone()[0] == "ok"


# ---- evict ----------------------------------------------------------------------------


def test_evict_by_name_unpublishes_the_model_deletes_its_data_and_ls_no_longer_shows_it(
    cache: Cache, pulled: Callable[..., Model], run: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    gone = pulled("org/gone/rev1/")
    kept = pulled("org/kept/rev1/")

    result = run("evict", gone.name)

    assert result.returncode == 0, result.stderr
    assert "evicted 1 model" in result.stdout
    assert_absent(cache, gone)
    assert not (cache.used_dir / gone.ref.slug).exists()
    assert list(cache.trash_dir.iterdir()) == []
    assert_present(cache, kept)
    assert models_of(ls_json(run)).keys() == {kept.name}
    # Only the kept model's bytes remain anywhere under the cache.
    data_bytes = sum(
        p.stat().st_size for p in cache.root.rglob("*") if p.is_file() and cache.state_dir not in p.parents
    )
    assert data_bytes == kept.size_bytes


def test_evicting_leaves_no_empty_directories_and_keeps_those_other_models_still_use(
    cache: Cache,
    pulled: Callable[..., Model],
    upload: Callable[..., Model],
    run: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    rev1 = pulled("org/deep/model/rev1/", size_bytes=256 * KiB)
    rev2 = pulled("org/deep/model/rev2/", size_bytes=256 * KiB)
    other = pulled("org/other/rev1/", size_bytes=256 * KiB)
    bucket_dir = cache.root / rev1.ref.bucket

    assert run("evict", rev1.name).returncode == 0
    assert sorted(os.listdir(bucket_dir / "org/deep/model")) == ["rev2"]
    assert run("evict", rev2.name).returncode == 0
    assert os.listdir(bucket_dir / "org") == ["other"], "org/deep/model/ went with its last revision"
    assert run("evict", other.name).returncode == 0
    assert os.listdir(cache.root) == [".modelsync"]

    again = upload("org/deep/model/rev3/", {"w.bin": os.urandom(256 * KiB)})
    assert run("pull", again.ref.uri, "--quiet").returncode == 0, "the pruned parents are made again"
    assert_present(cache, again)


def test_pulls_leave_no_foreground_markers_behind_even_for_a_mistyped_prefix(
    cache: Cache, upload: Callable[..., Model], run: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    model = upload("org/fg/rev1/", {"w.bin": os.urandom(256 * KiB)})

    assert run("pull", model.ref.uri, "--quiet").returncode == 0
    for typo in ("org/fg/rev2/", "org/gf/rev1/", "org/fg/rev1/w.bin/"):
        assert run("pull", f"s3://{model.ref.bucket}/{typo}", "--quiet").returncode == ExitCode.NOT_FOUND

    assert os.listdir(cache.state_dir / "foreground") == []
    collected = run("gc", "--older-than", "0s")
    assert "foreground marker" not in collected.stdout
    assert_present(cache, model)


@pytest.mark.parametrize("command", ["evict", "pin", "unpin"])
def test_naming_a_model_that_is_not_cached_exits_3_with_one_line(
    command: str, pulled: Callable[..., Model], run: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    pulled("org/present/rev1/", size_bytes=64 * KiB)

    result = run(command, "nosuchbucket/org/absent/rev1")

    assert result.returncode == ExitCode.NOT_FOUND
    assert "nosuchbucket/org/absent/rev1" in one_error_line(result.stderr)


def test_evicting_a_pinned_model_exits_2_with_the_hint_to_unpin_and_force_evicts_it(
    cache: Cache, pulled: Callable[..., Model], run: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    model = pulled("org/pinned/rev1/")
    assert run("pin", model.name).returncode == 0

    refused = run("evict", model.name)

    assert refused.returncode == ExitCode.USAGE
    line = one_error_line(refused.stderr)
    assert f"modelsync unpin {model.name}" in line and "--force" in line
    assert_present(cache, model)

    forced = run("evict", model.name, "--force")

    assert forced.returncode == 0, forced.stderr
    assert_absent(cache, model)
    assert not (cache.pins_dir / model.ref.slug).exists()


def test_pin_and_unpin_round_trip_through_ls(
    pulled: Callable[..., Model], run: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    model = pulled("org/roundtrip/rev1/", size_bytes=64 * KiB)
    assert models_of(ls_json(run))[model.name]["pinned"] is False

    pinned = run("pin", f"{model.ref.uri}")  # the s3:// form names the same model
    assert pinned.returncode == 0 and pinned.stdout.strip() == f"pinned {model.name}"
    assert models_of(ls_json(run))[model.name]["pinned"] is True

    unpinned = run("unpin", model.name)
    assert unpinned.returncode == 0 and unpinned.stdout.strip() == f"unpinned {model.name}"
    assert models_of(ls_json(run))[model.name]["pinned"] is False


def test_evict_dry_run_prints_what_goes_and_the_bytes_freed_and_changes_nothing(
    cache: Cache, pulled: Callable[..., Model], run: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    a = pulled("org/a/rev1/", size_bytes=MiB)
    b = pulled("org/b/rev1/", size_bytes=MiB)
    set_last_used(cache, a, hours_ago=2)
    set_last_used(cache, b, hours_ago=1)
    before = without_index(tree(cache.root))

    by_name = run("evict", a.name, "--dry-run")
    to_size = run("evict", "--to-size", "0", "--dry-run")
    unused = run("evict", "--unused-for", "90m", "--dry-run")

    assert [r.returncode for r in (by_name, to_size, unused)] == [0, 0, 0]
    assert by_name.stdout.splitlines() == [
        f"evict 1 model, freeing {format_bytes(a.size_bytes)}",
        f"  evict {a.name}",
    ]
    assert to_size.stdout.splitlines()[0].startswith(
        f"evict 2 models, freeing {format_bytes(a.size_bytes + b.size_bytes)}"
    )
    assert to_size.stdout.splitlines()[1:3] == [f"  evict {a.name}", f"  evict {b.name}"]
    assert unused.stdout.splitlines()[:2] == [
        f"evict 1 model, freeing {format_bytes(a.size_bytes)}",
        f"  evict {a.name}",
    ]
    assert without_index(tree(cache.root)) == before


def test_evict_to_size_and_unused_for_go_in_lru_order_and_skip_pinned_and_in_use_models(
    cache: Cache, pulled: Callable[..., Model], run: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    oldest = pulled("org/oldest/rev1/", size_bytes=MiB)
    pinned = pulled("org/pinned/rev1/", size_bytes=MiB)
    older = pulled("org/older/rev1/", size_bytes=MiB)
    in_use = pulled("org/in-use/rev1/", size_bytes=MiB)
    set_last_used(cache, oldest, hours_ago=40)
    set_last_used(cache, pinned, hours_ago=50)
    set_last_used(cache, older, hours_ago=30)
    assert run("pin", pinned.name).returncode == 0
    # in_use was touched just now: within a grace of an hour it stays.
    hour_grace = {"MODELSYNC_IN_USE_GRACE": "1h"}

    plan = run("evict", "--to-size", "0", "--dry-run", env=hour_grace)
    assert plan.returncode == ExitCode.USAGE  # 0 bytes can never be reached with pinned + in use
    refused = one_error_line(plan.stderr)
    assert "cannot free" in refused
    assert f"{pinned.name} (pinned)" in refused
    assert f"{in_use.name} (in use: used " in refused and ", grace 1h)" in refused, refused
    assert "(in use (" not in refused, "the reason is said once"

    to_size = run("evict", "--to-size", str(3 * in_use.size_bytes), env=hour_grace)
    assert to_size.returncode == 0, to_size.stderr
    assert to_size.stdout.splitlines()[1:2] == [f"  evict {oldest.name}"]
    assert_absent(cache, oldest)
    for model in (pinned, older, in_use):
        assert_present(cache, model)

    unused = run("evict", "--unused-for", "1d", env=hour_grace)
    assert unused.returncode == 0, unused.stderr
    assert [line for line in unused.stdout.splitlines() if line.startswith("  evict")] == [
        f"  evict {older.name}"
    ]
    assert f"  keep {pinned.name}: pinned" in unused.stdout
    assert f"  keep {in_use.name}: in use" in unused.stdout
    assert_absent(cache, older)
    assert_present(cache, pinned)
    assert_present(cache, in_use)


# ---- the budget ----------------------------------------------------------------------


def test_a_pull_over_the_budget_evicts_the_least_recently_used_model_first(
    cache: Cache, settings: Settings, pulled: Callable[..., Model], upload: Callable[..., Model]
) -> None:
    lru = pulled("org/lru/rev1/", size_bytes=MiB)
    mru = pulled("org/mru/rev1/", size_bytes=MiB)
    set_last_used(cache, lru, hours_ago=2)
    set_last_used(cache, mru, hours_ago=1)
    incoming = upload("org/incoming/rev1/", {"weights.bin": os.urandom(MiB), "config.json": b"{}"})
    budget = replace(settings, cache_budget=CacheBudget(size_bytes=int(2.5 * MiB)))

    pull(budget, incoming.ref, NoEvents())

    assert_absent(cache, lru)
    assert_present(cache, mru)
    assert_present(cache, incoming)
    assert list(cache.reservations_dir.iterdir()) == []


def test_a_pull_that_can_never_fit_exits_6_naming_what_is_pinned_and_publishes_nothing(
    cache: Cache,
    pulled: Callable[..., Model],
    upload: Callable[..., Model],
    run: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    first = pulled("org/first/rev1/", size_bytes=MiB)
    second = pulled("org/second/rev1/", size_bytes=MiB)
    for model in (first, second):
        set_last_used(cache, model, hours_ago=5)
        assert run("pin", model.name).returncode == 0
    incoming = upload("org/incoming/rev1/", {"weights.bin": os.urandom(MiB)})

    result = run("pull", incoming.ref.uri, "--quiet", env={"MODELSYNC_CACHE_MAX_BYTES": "2.5Mi"})

    assert result.returncode == ExitCode.LOCAL_STORAGE
    line = one_error_line(result.stderr)
    assert f"{first.name} (pinned)" in line and f"{second.name} (pinned)" in line
    assert "needs 1.0 MiB, with a cache budget of 2.5 MiB; cannot free " in line
    assert "bytes" not in line, "one human unit style throughout"
    assert not os.path.lexists(cache.ready_path(incoming.ref))
    assert not cache.record_path(incoming.ref).exists()
    assert list(cache.reservations_dir.iterdir()) == []
    assert list(cache.staging_dir.iterdir()) == [], "a refused pull leaves no staging or journal"
    assert os.listdir(cache.state_dir / "foreground") == []
    assert_present(cache, first)
    assert_present(cache, second)


# ---- dedup across revisions ------------------------------------------------------------


def test_a_second_revision_hard_links_a_shared_file_instead_of_fetching_it(
    cache: Cache, pulled: Callable[..., Model], fault_proxy: FaultProxy
) -> None:
    shared = os.urandom(MiB)
    rev1 = pulled("org/m/rev1/", {"shared.bin": shared, "only1.bin": os.urandom(512 * KiB)})
    fault_proxy.clear()
    rev2 = pulled("org/m/rev2/", {"shared.bin": shared, "only2.bin": os.urandom(256 * KiB)})

    one = os.stat(cache.ready_path(rev1.ref) / "shared.bin")
    two = os.stat(cache.ready_path(rev2.ref) / "shared.bin")
    assert (one.st_dev, one.st_ino) == (two.st_dev, two.st_ino)
    assert one.st_nlink == 2
    assert fault_proxy.object_bytes_sent("rev2/shared.bin") == 0
    assert fault_proxy.object_bytes_sent() == len(rev2.files["only2.bin"])
    assert_present(cache, rev2)


def test_evicting_one_revision_keeps_the_shared_file_and_frees_only_its_unshared_bytes(
    cache: Cache, pulled: Callable[..., Model], run: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    shared = os.urandom(MiB)
    rev1 = pulled("org/m/rev1/", {"shared.bin": shared, "only1.bin": os.urandom(512 * KiB)})
    rev2 = pulled("org/m/rev2/", {"shared.bin": shared, "only2.bin": os.urandom(256 * KiB)})
    with open_catalog(cache) as catalog:
        plan = plan_named(catalog.eviction_entries(), [rev1.name], force=False)
    assert plan.freed_bytes == 512 * KiB

    dry = run("evict", rev1.name, "--dry-run")
    assert dry.stdout.splitlines()[0] == f"evict 1 model, freeing {format_bytes(512 * KiB)}"
    assert (
        ls_json(run)["totals"]["used_bytes"]  # type: ignore[index]
        == len(shared) + 512 * KiB + 256 * KiB
    )

    assert run("evict", rev1.name).returncode == 0

    assert_absent(cache, rev1)
    assert_present(cache, rev2)
    assert os.stat(cache.ready_path(rev2.ref) / "shared.bin").st_nlink == 1
    assert run("verify", rev2.name, "--full").returncode == 0


# ---- verify, quarantine and repair -----------------------------------------------------


def test_verify_quick_and_full_pass_on_an_intact_cache_and_record_when(
    pulled: Callable[..., Model], run: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    a = pulled("org/a/rev1/")
    b = pulled("org/b/rev1/")
    before = models_of(ls_json(run))

    quick = run("verify")
    full = run("verify", "--full")

    for result in (quick, full):
        assert result.returncode == 0, result.stderr
        assert sorted(result.stdout.splitlines()) == [f"ok    {a.name}", f"ok    {b.name}"]
    after = models_of(ls_json(run))
    for name in (a.name, b.name):
        assert str(after[name]["verified_at"]) > str(before[name]["verified_at"])


def test_verify_full_quarantines_a_corrupted_model_and_repair_fetches_only_the_bad_file(
    cache: Cache,
    pulled: Callable[..., Model],
    fault_proxy: FaultProxy,
    run: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    model = three_files(pulled, "org/rot/rev1/")
    damage(cache.ready_path(model.ref) / "b.bin", "flipped")

    assert run("verify", model.name).returncode == 0  # quick: sizes still match
    full = run("verify", model.name, "--full")

    assert full.returncode == ExitCode.INTEGRITY
    assert "verify --repair" in one_error_line(full.stderr)
    assert f"bad   {model.name}/b.bin: xxh3-128" in full.stdout
    assert not os.path.lexists(cache.ready_path(model.ref))
    row = models_of(ls_json(run))[model.name]
    assert (row["state"], row["verified_at"]) == ("quarantined", None)
    # evictable now: its last use is past the in-use grace (1 s here, which the commands above
    # may not take; none for this `ls`)
    listed = [line.split() for line in run("ls", env={"MODELSYNC_IN_USE_GRACE": "0s"}).stdout.splitlines()]
    assert [model.name, "quarantined"] == listed[1][:2] and listed[1][-2:] == ["failed", "now"]
    fault_proxy.clear()
    repaired = run("verify", "--repair")

    assert repaired.returncode == 0, repaired.stderr
    assert f"repaired {model.name}" in repaired.stdout
    assert f"3 files, {format_bytes(768 * KiB)} to fetch" in repaired.stderr, "only the bad file is announced"
    assert fault_proxy.object_bytes_sent("b.bin") == len(model.files["b.bin"])
    assert fault_proxy.object_bytes_sent() == len(model.files["b.bin"])
    assert_present(cache, model)
    assert models_of(ls_json(run))[model.name]["state"] == "ready"
    assert run("verify", model.name, "--full").returncode == 0


def test_a_pull_of_a_quarantined_model_makes_it_ready_again_and_ls_agrees(
    cache: Cache,
    settings: Settings,
    pulled: Callable[..., Model],
    run: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    model = pulled("org/again/rev1/", {"a.bin": os.urandom(MiB)})
    damaged = cache.ready_path(model.ref) / "a.bin"
    os.chmod(damaged, 0o644)
    with open(damaged, "r+b") as fh:
        fh.write(b"\0" * 16)
    assert run("verify", "--full").returncode == ExitCode.INTEGRITY

    result = pull(settings, model.ref, NoEvents())

    assert result.path == cache.ready_path(model.ref)
    assert_present(cache, model)
    assert models_of(ls_json(run))[model.name]["state"] == "ready"
    assert run("verify", "--full").returncode == 0
    assert run("evict", model.name).returncode == 0
    assert_absent(cache, model)
    assert list(cache.quarantine_dir.iterdir()) == []


@pytest.mark.parametrize("how", ["truncated", "deleted"])
def test_a_warm_pull_that_finds_a_damaged_file_fetches_only_that_file(
    how: str,
    cache: Cache,
    pulled: Callable[..., Model],
    fault_proxy: FaultProxy,
    run: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    model = three_files(pulled, f"org/warm-{how}/rev1/")
    intact = os.stat(cache.ready_path(model.ref) / "a.bin").st_ino
    damage(cache.ready_path(model.ref) / "b.bin", how)
    fault_proxy.clear()

    result = run("pull", model.ref.uri)

    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == str(cache.ready_path(model.ref))
    assert object_gets(fault_proxy) == {"b.bin"}
    assert fault_proxy.object_bytes_sent() == len(model.files["b.bin"])
    assert f"3 files, {format_bytes(768 * KiB)} to fetch" in result.stderr
    assert_present(cache, model)
    assert os.stat(cache.ready_path(model.ref) / "a.bin").st_ino == intact, "the intact file was kept"
    assert list(cache.staging_dir.iterdir()) == []
    assert run("verify", model.name, "--full").returncode == 0


def test_pull_verify_records_the_verification_or_fetches_only_the_file_it_finds_damaged(
    cache: Cache,
    pulled: Callable[..., Model],
    fault_proxy: FaultProxy,
    run: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    model = three_files(pulled, "org/pull-verify/rev1/")
    before = models_of(ls_json(run))[model.name]["verified_at"]
    time.sleep(1.1)  # the verified time has a resolution of seconds in ls

    checked = run("pull", model.ref.uri, "--verify", "--quiet")

    assert checked.returncode == 0, checked.stderr
    after = models_of(ls_json(run))[model.name]["verified_at"]
    assert str(after) > str(before), "pull --verify records the verification like verify does"
    assert object_gets(fault_proxy) - {"a.bin", "b.bin", "config.json"} == set()
    fault_proxy.clear()
    damage(cache.ready_path(model.ref) / "b.bin", "flipped")
    assert run("pull", model.ref.uri, "--quiet").returncode == 0  # a plain warm pull checks sizes only
    assert object_gets(fault_proxy) == set()

    repaired = run("pull", model.ref.uri, "--verify", "--quiet")

    assert repaired.returncode == 0, repaired.stderr
    assert f"warning: {model.name}/b.bin: xxh3-128" in repaired.stderr
    assert object_gets(fault_proxy) == {"b.bin"}
    assert fault_proxy.object_bytes_sent() == len(model.files["b.bin"])
    assert_present(cache, model)
    assert run("verify", model.name, "--full").returncode == 0


# ---- symlinks planted in the cache -----------------------------------------------------


@pytest.mark.parametrize("where", ["stray-file-link", "stray-dir-link", "link-instead-of-a-file"])
def test_a_planted_symlink_is_reported_by_verify_and_never_followed_by_verify_or_evict(
    where: str,
    tmp_path: Path,
    cache: Cache,
    pulled: Callable[..., Model],
    run: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    model = pulled("org/linked/rev1/", {"a.bin": os.urandom(512 * KiB), "sub/b.bin": os.urandom(256 * KiB)})
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = outside / "secret.bin"
    secret.write_bytes(os.urandom(256 * KiB))  # the same size as sub/b.bin
    os.chmod(secret, 0o600)
    (outside / "inner").mkdir()
    (outside / "inner" / "keep.txt").write_bytes(b"keep me")
    ready = cache.ready_path(model.ref)
    if where == "stray-file-link":
        link, target = ready / "sub" / "evil", secret
    elif where == "stray-dir-link":
        link, target = ready / "evil-dir", outside / "inner"
    else:
        link, target = ready / "sub" / "b.bin", secret
        os.unlink(link)
    os.symlink(target, link)
    outside_before = tree(outside)
    secret_before = secret.read_bytes()

    checked = run("verify", "--full")

    relative = link.relative_to(ready).as_posix()
    assert checked.returncode == ExitCode.INTEGRITY
    one_error_line(checked.stderr)
    assert f"bad   {model.name}/{relative}: is a symlink" in checked.stdout
    assert models_of(ls_json(run))[model.name]["state"] == "quarantined"
    assert tree(outside) == outside_before
    assert secret.read_bytes() == secret_before
    assert stat.S_IMODE(os.stat(secret).st_mode) == 0o600

    evicted = run("evict", model.name)

    assert evicted.returncode == 0, evicted.stderr
    assert_absent(cache, model)
    assert list(cache.quarantine_dir.iterdir()) == []
    assert tree(outside) == outside_before
    assert secret.read_bytes() == secret_before


def test_evict_of_a_model_with_a_planted_directory_link_removes_the_link_not_the_target(
    tmp_path: Path,
    cache: Cache,
    pulled: Callable[..., Model],
    run: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    model = pulled("org/linked/rev1/", size_bytes=256 * KiB)
    outside = tmp_path / "outside"
    (outside / "deep").mkdir(parents=True)
    (outside / "deep" / "data.bin").write_bytes(b"precious")
    os.symlink(outside, cache.ready_path(model.ref) / "escape")
    os.symlink(outside / "deep" / "data.bin", cache.ready_path(model.ref) / "escape-file")
    before = tree(outside)

    result = run("evict", model.name)

    assert result.returncode == 0, result.stderr
    assert_absent(cache, model)
    assert tree(outside) == before
    assert (outside / "deep" / "data.bin").read_bytes() == b"precious"


# ---- leftovers of crashes ----------------------------------------------------------------


def test_crash_leftovers_never_crash_a_command_verify_reports_them_and_gc_removes_them(
    cache: Cache,
    settings: Settings,
    pulled: Callable[..., Model],
    upload: Callable[..., Model],
    run: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    model = pulled("org/alive/rev1/", size_bytes=256 * KiB)
    (cache.staging_dir / "org--gone-aaaaaaaaaaaa" / "sub").mkdir(parents=True)
    (cache.staging_dir / "org--gone-aaaaaaaaaaaa" / "sub" / "w.bin").write_bytes(b"x" * 100)
    (cache.staging_dir / "org--lost-bbbbbbbbbbbb.journal").write_bytes(
        b'{"journal": 1, "source": "s3://x/y/"}\n{"part'
    )
    (cache.locks_dir / "org--orphan-cccccccccccc.lock").write_bytes(b"")
    (cache.locks_dir / "org--orphan-cccccccccccc.holder").write_bytes(b"not json")
    (cache.trash_dir / "rev1-999-deadbeef").mkdir()
    (cache.trash_dir / "rev1-999-deadbeef" / "half.bin").write_bytes(b"half")
    # An eviction by an older version left empty directories; pulls killed or long gone left markers.
    (cache.root / "old-bucket" / "org" / "gone").mkdir(parents=True)
    foreground = cache.state_dir / "foreground"
    foreground.mkdir()
    (foreground / "org--killed-dddddddddddd").write_bytes(b"old-bucket/org/killed")
    for marker_dir in (cache.used_dir, cache.verified_dir, cache.leases_dir):
        (marker_dir / "org--evicted-eeeeeeeeeeee").write_bytes(b"")
    held = foreground / "org--waiting-ffffffffffff"
    held.write_bytes(b"old-bucket/org/waiting")
    leftovers = [
        cache.staging_dir / "org--gone-aaaaaaaaaaaa",
        cache.staging_dir / "org--lost-bbbbbbbbbbbb.journal",
        cache.locks_dir / "org--orphan-cccccccccccc.lock",
        cache.locks_dir / "org--orphan-cccccccccccc.holder",
        cache.trash_dir / "rev1-999-deadbeef",
        cache.root / "old-bucket" / "org" / "gone",
        cache.root / "old-bucket" / "org",
        cache.root / "old-bucket",
        foreground / "org--killed-dddddddddddd",
        cache.used_dir / "org--evicted-eeeeeeeeeeee",
        cache.verified_dir / "org--evicted-eeeeeeeeeeee",
        cache.leases_dir / "org--evicted-eeeeeeeeeeee",
    ]
    holder = os.open(held, os.O_RDONLY)
    fcntl.flock(holder, fcntl.LOCK_SH)  # a foreground pull still waiting
    # And the model about to be pulled left a journal claiming parts whose data is gone.
    incoming = upload("org/incoming/rev1/", {"weights.bin": os.urandom(MiB)})
    staging = cache.staging(incoming.ref)
    staging.journal.start(keep=False)
    staging.journal.begin_file("weights.bin", md5_hex(incoming.files["weights.bin"]), MiB, PART)
    for i in range(3):
        staging.journal.part_written("weights.bin", i, PART)
    staging.journal.close()

    listed = run("ls")
    verified = run("verify")
    dry = run("gc", "--older-than", "0s", "--dry-run")

    for result in (listed, verified, dry):
        assert result.returncode == 0, result.stderr
    for path in leftovers:
        assert f"note  {path}:" in verified.stdout
        assert f"would remove {path} (" in dry.stdout
        assert os.path.lexists(path)
    assert f"ok    {model.name}" in verified.stdout

    pulled_again = run("pull", incoming.ref.uri, "--quiet")
    assert pulled_again.returncode == 0, pulled_again.stderr
    assert_present(cache, incoming)

    young = run("gc")  # the default threshold keeps leftovers younger than a day
    assert young.returncode == 0 and all(os.path.lexists(p) for p in leftovers)

    collected = run("gc", "--older-than", "0s")

    assert collected.returncode == 0, collected.stderr
    for path in leftovers:
        assert f"removed {path} (" in collected.stdout
        assert not os.path.lexists(path)
    assert_present(cache, model)
    assert_present(cache, incoming)
    assert held.exists(), "a marker a pull holds stays"
    os.close(holder)
    released = run("gc", "--older-than", "0s").stdout.splitlines()
    assert released[0] == f"removed {held} (foreground marker of a pull that has ended)"
    assert len(released) == 2 and not held.exists()
    again = run("verify", "--full")
    assert again.returncode == 0 and "note" not in again.stdout, again.stdout


def test_a_reader_holding_a_file_keeps_reading_whole_bytes_after_the_model_is_evicted(
    cache: Cache, pulled: Callable[..., Model], run: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    model = pulled("org/held/rev1/", size_bytes=MiB)
    with open(cache.ready_path(model.ref) / "weights.bin", "rb") as reader:
        head = reader.read(1000)

        evicted = run("evict", model.name)

        assert evicted.returncode == 0, evicted.stderr
        assert_absent(cache, model)
        assert head + reader.read() == model.files["weights.bin"]
