"""The cache index: one SQLite database (WAL) of ready models and their files.

It is derived state. The completion records on disk are the truth about what is
ready; pins and last-used times live in small files beside them. The index
makes `ls`, eviction planning and deduplication fast on caches of many
thousand models, and is rebuilt from the records whenever it is missing,
corrupt or of another schema version — losing it loses nothing.

WAL mode lets readers (ls, a warm pull's dedup lookup) run while one writer
commits; the busy timeout makes concurrent writers queue instead of failing.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

from modelsync.adapters import fs
from modelsync.core.lifecycle import CacheState
from modelsync.core.record import CompletionRecord
from modelsync.errors import DiskFullError, LocalStorageError

#: 2: models.signer (who signed a model whose signature was verified)
SCHEMA_VERSION = 2
BUSY_TIMEOUT_MS = 30_000

_SCHEMA = """
CREATE TABLE models (
    model TEXT PRIMARY KEY,
    source TEXT NOT NULL,
    state TEXT NOT NULL,
    size_bytes INTEGER NOT NULL,
    files INTEGER NOT NULL,
    completed_at REAL NOT NULL,
    verified_at REAL,
    verified_by TEXT NOT NULL,
    signer TEXT
);
CREATE TABLE files (
    model TEXT NOT NULL REFERENCES models(model) ON DELETE CASCADE,
    path TEXT NOT NULL,
    size_bytes INTEGER NOT NULL,
    xxh3_128 TEXT NOT NULL,
    etag TEXT,
    dev INTEGER NOT NULL,
    ino INTEGER NOT NULL,
    PRIMARY KEY (model, path)
);
CREATE INDEX files_by_digest ON files(size_bytes, xxh3_128);
CREATE INDEX files_by_etag ON files(etag, size_bytes);
"""
_SCHEMA_IF_MISSING = _SCHEMA.replace("CREATE TABLE ", "CREATE TABLE IF NOT EXISTS ").replace(
    "CREATE INDEX ", "CREATE INDEX IF NOT EXISTS "
)


class IndexedModel(NamedTuple):
    model: str
    source: str
    state: CacheState
    size_bytes: int
    files: int
    completed_at: float
    verified_at: float | None
    verified_by: str
    signer: str | None = None


class IndexedFile(NamedTuple):
    model: str
    path: str
    size_bytes: int
    xxh3_128: str
    etag: str | None
    dev: int
    ino: int


class Index:
    """A connection to the index; open one per command, close it when done."""

    def __init__(self, path: Path | None) -> None:
        """Open the index at `path`; None: a private index in memory, gone when closed."""
        self.path = path
        with _storage_errors(path):
            try:
                self._db = self._connect()
            except sqlite3.DatabaseError as exc:
                if _error_code(exc) != sqlite3.SQLITE_NOTADB:
                    raise
                # Not a database at all (garbage bytes): even setting WAL mode fails. Start
                # afresh; is_current() then sees an empty schema and the caller rebuilds.
                self._remove_files()
                self._db = self._connect()

    def _connect(self) -> sqlite3.Connection:
        # Used from one thread at a time, but not always the one that opened it (asyncio.to_thread).
        db = sqlite3.connect(
            ":memory:" if self.path is None else self.path,
            timeout=BUSY_TIMEOUT_MS / 1000,
            isolation_level=None,
            check_same_thread=False,
        )
        db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        _use_wal(db)
        db.execute("PRAGMA synchronous = NORMAL")
        db.execute("PRAGMA foreign_keys = ON")
        if self.path is not None:
            _share_with_group(self.path)
        return db

    def close(self) -> None:
        self._db.close()

    def is_current(self) -> bool:
        """False when the schema is missing, of another version, or the database is damaged."""
        try:
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            ok = self._db.execute("PRAGMA quick_check").fetchone()[0] == "ok"
        except sqlite3.DatabaseError:
            return False
        return bool(ok and version == SCHEMA_VERSION)

    def reset(self) -> None:
        """Start an empty index of the current schema (the caller then re-adds every record)."""
        self._db.close()
        self._remove_files()
        with _storage_errors(self.path):
            self._db = self._connect()
            # Several processes may reset at once, one creating the schema in the file another
            # has just opened: IF NOT EXISTS under an immediate transaction makes that harmless.
            self._db.executescript(
                f"BEGIN IMMEDIATE; {_SCHEMA_IF_MISSING} PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;"
            )

    def _remove_files(self) -> None:
        if self.path is None:
            return
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{self.path}{suffix}")

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        with _storage_errors(self.path):
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield
                self._db.execute("COMMIT")
            except BaseException:
                # A failed COMMIT (disk full) may leave the transaction open, or may not.
                if self._db.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        self._db.execute("ROLLBACK")
                raise

    def put(
        self, model: str, record: CompletionRecord, inodes: dict[str, tuple[int, int]], state: CacheState
    ) -> None:
        """Insert or replace a model and its files; `inodes` maps path to (device, inode)."""
        with self.transaction():
            self._db.execute("DELETE FROM models WHERE model = ?", (model,))
            self._db.execute(
                "INSERT INTO models VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    model,
                    record.source,
                    state,
                    record.total_bytes,
                    len(record.files),
                    record.completed_at,
                    record.completed_at,
                    record.verified_by,
                    record.signer,
                ),
            )
            self._db.executemany(
                "INSERT INTO files VALUES (?, ?, ?, ?, ?, ?, ?)",
                [
                    (model, f.path, f.size_bytes, f.xxh3_128, f.etag, *inodes.get(f.path, (0, 0)))
                    for f in record.files
                ],
            )

    def remove(self, models: Iterable[str]) -> None:
        with self.transaction():
            self._db.executemany("DELETE FROM models WHERE model = ?", [(m,) for m in models])

    def set_verified(self, model: str, at: float) -> None:
        with _storage_errors(self.path):
            self._db.execute("UPDATE models SET verified_at = ? WHERE model = ?", (at, model))

    def models(self) -> list[IndexedModel]:
        rows = self._db.execute("SELECT * FROM models ORDER BY model").fetchall()
        return [IndexedModel(row[0], row[1], CacheState(row[2]), *row[3:]) for row in rows]

    def files(self) -> list[IndexedFile]:
        rows = self._db.execute("SELECT * FROM files").fetchall()
        return [IndexedFile(*row) for row in rows]

    def find_copy(self, size_bytes: int, xxh3_128: str | None, etag: str | None) -> list[IndexedFile]:
        """Cached files with the same content: same size and digest, or same size and proving ETag."""
        if xxh3_128 is not None:
            query, args = "f.size_bytes = ? AND f.xxh3_128 = ?", (size_bytes, xxh3_128)
        elif etag is not None:
            query, args = "f.size_bytes = ? AND f.etag = ?", (size_bytes, etag)
        else:
            return []
        rows = self._db.execute(
            f"SELECT f.* FROM files f JOIN models m ON m.model = f.model WHERE m.state = ? AND {query}",
            (CacheState.READY, *args),
        ).fetchall()
        return [IndexedFile(*row) for row in rows]


#: SQLite result codes that are the storage's fault, not the query's
_STORAGE_CODES = {
    sqlite3.SQLITE_FULL,
    sqlite3.SQLITE_IOERR,
    sqlite3.SQLITE_READONLY,
    sqlite3.SQLITE_CANTOPEN,
    sqlite3.SQLITE_PERM,
}


def _error_code(exc: sqlite3.Error) -> int | None:
    """The primary result code of a SQLite error (extended codes carry it in the low byte)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code & 0xFF if isinstance(code, int) else None


@contextlib.contextmanager
def _storage_errors(path: Path | None) -> Iterator[None]:
    """SQLite failing on a full, read-only or broken volume becomes modelsync's storage error.

    Other SQLite errors (a bad query) are bugs and keep their traceback.
    """
    try:
        yield
    except sqlite3.DatabaseError as exc:
        code = _error_code(exc)
        if code == sqlite3.SQLITE_FULL:
            raise DiskFullError(
                f"disk full writing the cache index {path}; free space (modelsync evict) "
                "or raise the volume's size"
            ) from None
        if code in _STORAGE_CODES:
            raise LocalStorageError(f"cannot use the cache index {path}: {exc}") from None
        raise


def _use_wal(db: sqlite3.Connection) -> None:
    """Switch a new database to WAL; the mode is stored in the file, so this happens once.

    Switching needs the database to itself and answers "database is locked" at once,
    without the busy timeout, when another process opens the fresh file at the same
    moment (several pulls starting together): read the mode first, and retry the switch.
    """
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            if db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                db.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def _share_with_group(path: Path) -> None:
    """Daemon and init containers may run as different uids of one group: keep the files group-writable."""
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(OSError):
            os.chmod(f"{path}{suffix}", fs.FILE_MODE)
