"""The journal of a pull: what an interrupted pull left, so the next one resumes instead of starting over.

Append-only JSON lines: a header (source, boot id), then a line per file
started, part written and file verified. A torn last line (a crash mid-write)
is ignored on load.

Lines are written in batches, not one `write` each: a model of thousands of
small files otherwise pays three journal writes per file. A line is only ever
late, never early (it is buffered after what it records was done), so a kill
-9 can lose recent progress, which the next pull fetches again, but can never
make a part look written or a file look verified that was not. What may wait
in memory is bounded by the data the lines vouch for (`FLUSH_BYTES`): a part of
a large file, whose parts are at least 1 MiB, is written at once as before.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

from modelsync.adapters import fs

JOURNAL_VERSION = 1
#: buffered lines are written once the parts and files they vouch for add up to this many bytes,
#: so a kill -9 costs at most this much to fetch again (and as much to hash again)
FLUSH_BYTES = 1024 * 1024
#: ... or once this many lines wait (a model of many empty files)
FLUSH_LINES = 512
#: one encoder for every line (json.dumps with options builds a new one per call)
_encode = json.JSONEncoder(separators=(",", ":")).encode


def boot_id() -> str:
    """Identifies this boot: journaled parts are trusted only within the boot that wrote them.

    kill -9 keeps the page cache, so parts written before it are intact; a power
    loss may not, so a journal from an earlier boot is discarded.
    """
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


@dataclass(slots=True)
class JournalState:
    """What an interrupted pull left: per file its ETag and layout, parts written, files verified."""

    files: dict[str, tuple[str, int, int]] = field(default_factory=dict)  # path -> (etag, size, part size)
    parts: dict[str, set[int]] = field(default_factory=dict)
    verified: dict[str, tuple[str, str]] = field(default_factory=dict)  # path -> (xxh3_128, verified_by)
    #: SHA-256 of verified files, when the pull checked a signature (so a resume need not re-read them)
    sha256s: dict[str, str] = field(default_factory=dict)

    def done_parts(self) -> dict[tuple[str, str], frozenset[int]]:
        return {
            (path, etag): frozenset(self.parts.get(path, ()))
            for path, (etag, _size, _part) in self.files.items()
        }

    def part_sizes(self) -> dict[str, int]:
        return {path: part for path, (_etag, _size, part) in self.files.items()}


class Journal:
    """Append-only JSON lines, written in batches; a torn last line (crash mid-write) is ignored on load.

    Safe to call from several threads: lines keep the order in which they were appended.
    """

    def __init__(self, path: Path, source: str) -> None:
        self.path = path
        self.source = source
        self._fd: int | None = None
        self._lock = threading.Lock()
        self._pending: list[str] = []
        self._pending_bytes = 0

    def load(self) -> JournalState:
        """The state to resume from; empty when absent, from another source, or from another boot."""
        try:
            lines = self.path.read_bytes().splitlines()
        except FileNotFoundError:
            return JournalState()
        records = []
        for line in lines:
            try:
                records.append(json.loads(line))
            except ValueError:
                continue
        if not records or records[0] != self._header():
            return JournalState()
        state = JournalState()
        for rec in records[1:]:
            if not isinstance(rec, dict):
                continue
            if "file" in rec:
                path = rec["file"]
                state.files[path] = (rec["etag"], rec["size"], rec["part_size"])
                state.parts[path] = set()
                state.verified.pop(path, None)
                state.sha256s.pop(path, None)
            elif "part" in rec and rec["part"] in state.parts:
                state.parts[rec["part"]].add(rec["i"])
            elif "verified" in rec and rec["verified"] in state.files:
                state.verified[rec["verified"]] = (rec["xxh3_128"], rec["by"])
                if isinstance(rec.get("sha256"), str):
                    state.sha256s[rec["verified"]] = rec["sha256"]
        return state

    def start(self, keep: bool) -> None:
        """Open for appending; a fresh journal (keep=False) starts with its header."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
        if not keep:
            flags |= os.O_TRUNC
        self._fd = os.open(self.path, flags, fs.FILE_MODE)
        fs.share_with_group(self._fd)
        if not keep:
            self._append(self._header(), 0)
            self.flush()

    def begin_file(self, path: str, etag: str, size_bytes: int, part_size_bytes: int) -> None:
        """A file is (re)started: its earlier parts and verification no longer count.

        It never sets off a batch's write itself but goes out with the line after it, so
        a file journaled as verified by its copy (engine/dedup.py, begun and verified in
        one go) is not left started but unverified by a write between the two.
        """
        self._append({"file": path, "etag": etag, "size": size_bytes, "part_size": part_size_bytes}, None)

    def part_written(self, path: str, index: int, size_bytes: int) -> None:
        """Part `index` (`size_bytes` long) of `path` is written; call only once it is."""
        self._append({"part": path, "i": index}, size_bytes)

    def file_verified(
        self, path: str, xxh3_128: str, verified_by: str, size_bytes: int, sha256: str | None = None
    ) -> None:
        """`path` (`size_bytes` long) matched its digest; call only once it did."""
        record: dict[str, object] = {"verified": path, "xxh3_128": xxh3_128, "by": verified_by}
        if sha256 is not None:
            record["sha256"] = sha256
        self._append(record, size_bytes)

    def flush(self) -> None:
        """Write every buffered line now, in one write."""
        with self._lock:
            self._write_pending()

    def close(self) -> None:
        """Write what is buffered and close; a failed write still closes."""
        with self._lock:
            try:
                if self._fd is not None:
                    self._write_pending()
            finally:
                self._pending.clear()
                self._pending_bytes = 0
                if self._fd is not None:
                    os.close(self._fd)
                    self._fd = None

    def _header(self) -> dict[str, object]:
        return {"journal": JOURNAL_VERSION, "source": self.source, "boot_id": boot_id()}

    def _append(self, record: dict[str, object], size_bytes: int | None) -> None:
        """Buffer a line vouching for `size_bytes` of data; None: it waits for the next line."""
        line = _encode(record)
        with self._lock:
            assert self._fd is not None, "journal not started"
            self._pending.append(line)
            if size_bytes is None:
                return
            self._pending_bytes += size_bytes
            if self._pending_bytes >= FLUSH_BYTES or len(self._pending) >= FLUSH_LINES:
                self._write_pending()

    def _write_pending(self) -> None:
        """One write of the buffered lines (the caller holds the lock); O_APPEND keeps them whole."""
        if not self._pending:
            return
        assert self._fd is not None, "journal not started"
        data = ("\n".join(self._pending) + "\n").encode()
        self._pending.clear()
        self._pending_bytes = 0
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]
