"""Space is claimed, not pre-filled: live pulls' claims count against free space until written."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from modelsync.adapters import volume
from modelsync.adapters.cache import Cache
from modelsync.config import Settings
from modelsync.core.refs import parse_source
from modelsync.engine.catalog import open_catalog
from modelsync.engine.evict import make_room
from modelsync.errors import DiskFullError

MiB = 1024 * 1024
A, B = parse_source("s3://models/org/a/1/"), parse_source("s3://models/org/b/1/")


def test_ram_backed_filesystems_are_recognised_from_the_mount_table(tmp_path: Path) -> None:
    if volume.filesystem_type(Path("/dev/shm")) != "tmpfs":
        pytest.skip("/dev/shm is not a tmpfs here")
    assert volume.in_memory(Path("/dev/shm/not-yet-created/deeper"))
    assert volume.filesystem_type(Path("/proc/self")) == "proc"


def test_a_claim_is_outstanding_until_its_pull_has_written_the_bytes(tmp_path: Path) -> None:
    cache = Cache(tmp_path)
    cache.ensure()
    lock = cache.lock(A)
    assert lock.try_acquire()
    try:
        cache.staging(A).prepare(resume=False)
        cache.reserve(A, 8 * MiB)
        (claim,) = cache.reservations().values()
        assert cache.outstanding_bytes(A.slug, claim) == 8 * MiB
        (cache.staging_dir / A.slug / "part.bin").write_bytes(os.urandom(3 * MiB))
        assert cache.outstanding_bytes(A.slug, claim) == 5 * MiB
    finally:
        lock.release()
    assert cache.reservations() == {}, "a claim whose pull is gone is dropped"


@contextlib.contextmanager
def small_tmpfs(where: Path, size: str) -> Iterator[Path]:
    where.mkdir()
    if (
        os.geteuid() != 0
        or subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "ms_space", str(where)]).returncode
    ):
        pytest.skip("needs root to mount a small tmpfs")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=False)


def test_two_pulls_cannot_both_count_the_same_free_bytes(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "cache", "16m") as root:
        cache = Cache(root)
        cache.ensure()
        settings = Settings(cache_dir=root)
        holder = cache.lock(A)
        assert holder.try_acquire()
        try:
            with open_catalog(cache) as catalog:
                make_room(settings, cache, catalog, A, 12 * MiB, {})
                assert volume.free_bytes(root) > 8 * MiB, "nothing is allocated up front"
                with pytest.raises(DiskFullError, match=r"needs 8\.0 MiB"):
                    make_room(settings, cache, catalog, B, 8 * MiB, {})
                make_room(settings, cache, catalog, B, 3 * MiB, {})
        finally:
            holder.release()
