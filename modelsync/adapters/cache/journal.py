"""The journal of a pull: what an interrupted pull left, so the next one resumes instead of starting over.

Append-only JSON lines: a header (source, boot id), then a line per file
started, part written and file verified. A torn last line (a crash mid-write)
is ignored on load.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from modelsync.adapters import fs

JOURNAL_VERSION = 1


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
    """Append-only JSON lines; a torn last line (crash mid-write) is ignored on load."""

    def __init__(self, path: Path, source: str) -> None:
        self.path = path
        self.source = source
        self._fd: int | None = None

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
            self._append(self._header())

    def begin_file(self, path: str, etag: str, size_bytes: int, part_size_bytes: int) -> None:
        self._append({"file": path, "etag": etag, "size": size_bytes, "part_size": part_size_bytes})

    def part_written(self, path: str, index: int) -> None:
        self._append({"part": path, "i": index})

    def file_verified(self, path: str, xxh3_128: str, verified_by: str, sha256: str | None = None) -> None:
        record: dict[str, object] = {"verified": path, "xxh3_128": xxh3_128, "by": verified_by}
        if sha256 is not None:
            record["sha256"] = sha256
        self._append(record)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _header(self) -> dict[str, object]:
        return {"journal": JOURNAL_VERSION, "source": self.source, "boot_id": boot_id()}

    def _append(self, record: dict[str, object]) -> None:
        assert self._fd is not None, "journal not started"
        # One write per line: O_APPEND keeps concurrent lines whole.
        os.write(self._fd, json.dumps(record, separators=(",", ":")).encode() + b"\n")
