"""The cache's own filesystem moves, on a real disk and no server: quarantine, restage, removal, records.

Every move goes through directory file descriptors: a symlink planted where a
directory of the cache should be is refused, never followed out of the cache.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from modelsync.adapters import fs
from modelsync.adapters.cache import Cache
from modelsync.core.manifest import FileEntry
from modelsync.core.record import CompletionRecord, parse_record
from modelsync.core.refs import ModelRef, parse_model_name
from modelsync.engine.ready import Problem, full_check
from modelsync.errors import LocalStorageError

REF = parse_model_name("s3://models/org/llm/")
DATA = b"weights"


def _record(ref: ModelRef = REF) -> CompletionRecord:
    return CompletionRecord(ref.uri, 1.0, "size", (FileEntry("w.bin", len(DATA), "0" * 32, None),))


def _ready(root: Path, ref: ModelRef = REF) -> Cache:
    """A cache holding one ready model, made through the same staging and make_ready as a pull."""
    cache = Cache(root)
    cache.ensure()
    staging = cache.staging(ref)
    staging.prepare(resume=False)
    fd = staging.open_file("w.bin", len(DATA), fresh=True)
    try:
        os.pwrite(fd, DATA, 0)
    finally:
        os.close(fd)
    cache.make_ready(ref, staging, _record(ref))
    return cache


def test_quarantine_moves_the_ready_directory_and_keeps_its_record(tmp_path: Path) -> None:
    cache = _ready(tmp_path)
    cache.quarantine(REF, _record())
    assert cache.ready_record(REF) is None
    assert not cache.ready_path(REF).parent.exists()  # emptied parents are pruned
    assert (cache.quarantine_dir / REF.slug / "w.bin").read_bytes() == DATA
    assert cache.quarantined_record(REF) == _record()
    assert cache.stored_records(quarantined=True) == [(REF.slug, _record())]
    assert cache.stored_records(quarantined=False) == []


def test_quarantine_refuses_a_symlink_planted_above_the_ready_path(tmp_path: Path) -> None:
    cache = _ready(tmp_path / "cache")
    outside = tmp_path / "outside"
    (outside / "org" / "llm").mkdir(parents=True)
    (outside / "org" / "llm" / "w.bin").write_bytes(b"not ours")
    bucket = cache.root / "models"
    os.rename(bucket, tmp_path / "moved")
    os.symlink(outside, bucket)
    with pytest.raises(LocalStorageError, match="models/org/llm: a path segment is not a directory"):
        cache.quarantine(REF, _record())
    assert (outside / "org" / "llm" / "w.bin").read_bytes() == b"not ours"
    assert not (cache.quarantine_dir / REF.slug).exists()


@pytest.mark.parametrize("quarantined", [False, True])
def test_restage_moves_the_model_data_into_its_staging_area(tmp_path: Path, quarantined: bool) -> None:
    cache = _ready(tmp_path)
    if quarantined:
        cache.quarantine(REF, _record())
    staging = cache.restage(REF, quarantined=quarantined)
    assert (staging.dir / "w.bin").read_bytes() == DATA
    assert not cache.ready_path(REF).exists()
    assert not (cache.quarantine_dir / REF.slug).exists()


def test_remove_beneath_removes_a_planted_link_never_its_target(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "sub" / "tree").mkdir(parents=True)
    outside.mkdir()
    (outside / "keep").write_bytes(b"x")
    (root / "sub" / "tree" / "f").write_bytes(b"x")
    os.symlink(outside, root / "link")
    os.symlink(outside, root / "sub" / "dirlink")
    fs.remove_beneath(root, "link")
    fs.remove_beneath(root, "link/keep")  # through a link: nothing there to remove
    fs.remove_beneath(root, "sub/dirlink/keep")
    fs.remove_beneath(root, "sub/tree")
    fs.remove_beneath(root, "absent/file")
    assert sorted(p.name for p in root.rglob("*")) == ["dirlink", "sub"]
    assert (outside / "keep").exists()


def test_unlisted_entries_reports_links_and_strays_without_following_links(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "d").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret").write_bytes(b"x")
    (root / "d" / "listed").write_bytes(b"x")
    (root / "d" / "stray").write_bytes(b"x")
    os.symlink(outside, root / "d" / "link")
    assert sorted(fs.unlisted_entries(root, {"d/listed"})) == [("d/link", True), ("d/stray", False)]


def test_unreadable_records_are_skipped_and_a_broken_records_dir_is_a_storage_error(tmp_path: Path) -> None:
    cache = _ready(tmp_path)
    (cache.records_dir / "torn.json").write_bytes(b'{"format": "modelsync-rec')
    (cache.records_dir / ".tmp.json").write_bytes(b"")
    (cache.records_dir / "notes.txt").write_bytes(b"")
    assert cache.stored_records(quarantined=False) == [(REF.slug, _record())]
    fs.remove_tree(cache.records_dir)
    cache.records_dir.write_bytes(b"")  # a stray file where the directory belongs
    with pytest.raises(LocalStorageError, match="not a directory"):
        cache.stored_records(quarantined=False)


def test_a_record_written_by_make_ready_parses_back(tmp_path: Path) -> None:
    cache = _ready(tmp_path)
    assert parse_record(cache.record_path(REF).read_bytes(), "r") == _record()
    assert cache.has_data_dir(REF, quarantined=False)
    assert not cache.has_data_dir(REF, quarantined=True)


def test_a_full_check_reports_a_file_behind_a_symlinked_directory_instead_of_failing(tmp_path: Path) -> None:
    """lstat through the link sees a regular file of the right size; the read beneath the model refuses it."""
    root, outside = tmp_path / "model", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "w.bin").write_bytes(DATA)
    os.symlink(outside, root / "d")
    record = CompletionRecord(REF.uri, 1.0, "size", (FileEntry("d/w.bin", len(DATA), "0" * 32, None),))
    assert full_check(root, record) == [Problem("d/w.bin", "reachable only through a symlink")]


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
def test_a_staging_file_is_group_writable_whatever_the_umask(tmp_path: Path, umask: int) -> None:
    """Another uid of the cache's group must be able to resume it; fresh or not."""
    cache = Cache(tmp_path)
    cache.ensure()
    staging = cache.staging(REF)
    staging.prepare(resume=False)
    old = os.umask(umask)
    try:
        for fresh in (True, False):
            fd = staging.open_file("w.bin", len(DATA), fresh=fresh)
            try:
                assert stat.S_IMODE(os.fstat(fd).st_mode) == 0o664
            finally:
                os.close(fd)
    finally:
        os.umask(old)
