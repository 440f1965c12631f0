"""The pull journal writes its lines in batches: late lines lose progress, never claim it."""

from __future__ import annotations

from pathlib import Path

from modelsync.adapters.cache.journal import FLUSH_BYTES, FLUSH_LINES, Journal, JournalState

KiB = 1024
SOURCE = "s3://models/org/llm/r1/"


def lines(journal: Journal) -> list[bytes]:
    return journal.path.read_bytes().splitlines()


def small_file(journal: Journal, i: int, size: int = 64 * KiB) -> None:
    """What a pull journals for a one-part file: started, its part written, verified."""
    journal.begin_file(f"f{i}", f"etag{i}", size, 16 * 1024 * KiB)
    journal.part_written(f"f{i}", 0, size)
    journal.file_verified(f"f{i}", f"{i:032x}", "manifest", size)


def test_lines_wait_until_they_vouch_for_a_mebibyte_then_go_out_in_one_write_in_order(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j", SOURCE)
    journal.start(keep=False)
    assert len(lines(journal)) == 1, "the header is written at once"
    per_file = FLUSH_BYTES // (64 * KiB) // 2  # each file's part and verified lines vouch for 64 KiB
    for i in range(per_file - 1):
        small_file(journal, i)
    assert len(lines(journal)) == 1, "under the bound, nothing is written yet"
    small_file(journal, per_file - 1)
    assert len(lines(journal)) == 1 + 3 * per_file
    small_file(journal, per_file)
    journal.close()
    state = journal.load()
    assert list(state.verified) == [f"f{i}" for i in range(per_file + 1)]


def test_a_part_of_a_large_file_is_written_at_once(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j", SOURCE)
    journal.start(keep=False)
    journal.begin_file("w.bin", "e", 64 * FLUSH_BYTES, FLUSH_BYTES)
    journal.part_written("w.bin", 3, FLUSH_BYTES)
    assert Journal(journal.path, SOURCE).load().parts == {"w.bin": {3}}
    journal.close()


def test_a_started_line_is_never_written_without_the_line_that_follows_it(tmp_path: Path) -> None:
    """A file journaled verified by its cached copy (dedup) must not be left merely started."""
    journal = Journal(tmp_path / "j", SOURCE)
    journal.start(keep=False)
    for i in range(3 * FLUSH_LINES):
        journal.begin_file(f"f{i}", "e", 1, 1)
        assert lines(journal)[-1].startswith((b'{"journal"', b'{"verified"'))
        journal.file_verified(f"f{i}", "0" * 32, "manifest", 1)
    journal.close()
    assert len(journal.load().verified) == 3 * FLUSH_LINES


def test_what_a_killed_pull_left_never_claims_more_than_was_journaled(tmp_path: Path) -> None:
    """Read the file at every step, as a kill -9 would leave it: a prefix of what was appended."""
    journal = Journal(tmp_path / "j", SOURCE)
    journal.start(keep=False)
    appended = JournalState()
    for i in range(40):
        size = (i % 7 + 1) * 100 * KiB
        small_file(journal, i, size)
        appended.files[f"f{i}"] = (f"etag{i}", size, 16 * 1024 * KiB)
        appended.parts[f"f{i}"] = {0}
        appended.verified[f"f{i}"] = (f"{i:032x}", "manifest")
        left = Journal(journal.path, SOURCE).load()
        assert left.verified.items() <= appended.verified.items()
        assert all(left.parts[path] <= appended.parts[path] for path in left.parts)
        assert set(left.verified) <= set(left.files)
    journal.close()
    assert Journal(journal.path, SOURCE).load() == appended


def test_close_writes_what_waits_and_a_resumed_journal_appends(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j", SOURCE)
    journal.start(keep=False)
    small_file(journal, 0)
    journal.close()
    journal.start(keep=True)
    small_file(journal, 1)
    journal.flush()
    assert list(journal.load().verified) == ["f0", "f1"]
    journal.close()
