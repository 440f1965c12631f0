"""The on-disk cache: ready models, completion records, staging, journals and locks.

Layout (docs/ARCHITECTURE.md):

    <root>/<bucket>/<prefix>/          ready models, read-only files
    <root>/.modelsync/records/<slug>.json
    <root>/.modelsync/staging/<slug>/  and  staging/<slug>.journal
    <root>/.modelsync/locks/<slug>.lock
    <root>/.modelsync/trash/

Correctness never rests on the lock: staging names are unique per model, the
record is written before the ready rename, and the ready rename is atomic, so a
crash or an ineffective lock (some network filesystems) leaves either the old
state or the new one. The lock only spares duplicate downloads.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from modelsync.adapters import fs
from modelsync.core.record import CompletionRecord, parse_record, render_record
from modelsync.core.refs import ModelRef
from modelsync.core.units import format_bytes
from modelsync.errors import ManifestError

STATE_DIR = ".modelsync"
LAYOUT_VERSION = "1"
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


@dataclass(frozen=True, slots=True)
class Reservation:
    """Space a running pull claimed: its source, the bytes, and what its staging held at the time."""

    source: str
    size_bytes: int
    baseline_bytes: int


class Staging:
    """Where one model's files are written before the ready rename."""

    def __init__(self, cache: Cache, ref: ModelRef) -> None:
        self.dir = cache.staging_dir / ref.slug
        # On disk, each file is allocated whole when opened (contiguous, and a full disk is an
        # early error), its hashed ranges are written behind and it is flushed as it completes.
        # On tmpfs allocating means zero-filling RAM that the download overwrites at once
        # (about 0.25 s per GiB here), and there is nothing to flush, so all that is skipped.
        self.on_disk = not fs.in_memory(cache.root)
        self.journal = Journal(cache.staging_dir / f"{ref.slug}.journal", ref.uri)

    def prepare(self, resume: bool) -> None:
        """Create the staging directory; without resume, start from nothing."""
        if not resume:
            fs.remove_tree(self.dir)
        with fs.storage_errors(self.dir):
            fs.make_dirs(self.dir)
            self.journal.start(keep=resume)

    def discard(self) -> None:
        """Remove the staging directory and its journal (a pull that never started fetching)."""
        self.journal.close()
        fs.remove_tree(self.dir)
        with contextlib.suppress(FileNotFoundError):
            self.journal.path.unlink()

    def open_file(self, relative: str, size_bytes: int) -> int:
        """Open the staging file for writing at offsets; on disk, space is reserved up front.

        posix_fallocate alone doubled the time of a 6 GiB pull to XFS and ext4 (unwritten
        extents converted under the inode lock while the page cache filled); with the
        write-behind of engine/pull.py it is as fast as a sparse file or faster
        (docs/perf-lab.md), and it keeps the early ENOSPC.
        """
        root = fs.open_dir(self.dir)
        try:
            fd = fs.open_file_beneath(root, PurePosixPath(relative), os.O_RDWR | os.O_CREAT)
        finally:
            os.close(root)
        fs.share_with_group(fd)
        try:
            if os.fstat(fd).st_size != size_bytes:
                os.ftruncate(fd, size_bytes)
            if size_bytes and self.on_disk:
                os.posix_fallocate(fd, 0, size_bytes)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def link_from(self, root: Path, source: PurePosixPath, inode: tuple[int, int], relative: str) -> bool:
        """Hard-link `root/source` into staging as `relative` if it is still that inode.

        False when the copy has gone (evicted meanwhile), changed, or is not a plain
        file; the caller then downloads instead. Never follows a symlink.
        """
        try:
            root_fd = fs.open_dir(root)
            try:
                src_dir = fs.open_dir_beneath(root_fd, source.parent, create=False)
            finally:
                os.close(root_fd)
            try:
                st = os.stat(source.name, dir_fd=src_dir, follow_symlinks=False)
                if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != inode:
                    return False
                staging_fd = fs.open_dir(self.dir)
                try:
                    dst_dir = fs.open_dir_beneath(staging_fd, PurePosixPath(relative).parent, create=True)
                finally:
                    os.close(staging_fd)
                try:
                    name = PurePosixPath(relative).name
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(name, dir_fd=dst_dir)
                    os.link(source.name, name, src_dir_fd=src_dir, dst_dir_fd=dst_dir, follow_symlinks=False)
                finally:
                    os.close(dst_dir)
            finally:
                os.close(src_dir)
        except OSError:
            return False
        return True


class ModelLock:
    """An exclusive flock per model; the kernel releases it when its holder dies, even by kill -9."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.holder_path = path.with_suffix(".holder")
        self._fd: int | None = None

    def acquire(self, on_wait: Callable[[str], None] | None = None, poll_s: float = 0.2) -> None:
        """Block until held; `on_wait` is called now and then with who holds it and how far it is."""
        next_report = 0.0
        while not self.try_acquire():
            now = time.monotonic()
            if on_wait is not None and now >= next_report:
                on_wait(self.describe_holder())
                next_report = now + 5.0
            time.sleep(poll_s)
        self.update_holder()

    def try_acquire(self) -> bool:
        """Take the lock if it is free; never waits."""
        with fs.storage_errors(self.path):
            fd = os.open(self.path, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, fs.FILE_MODE)
        fs.share_with_group(fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def update_holder(self, done_bytes: int = 0, total_bytes: int = 0) -> None:
        """Tell waiters who holds the model and how far the pull is (best effort)."""
        holder = {
            "pid": os.getpid(),
            "host": os.uname().nodename,
            "done_bytes": done_bytes,
            "total_bytes": total_bytes,
        }
        with contextlib.suppress(OSError):
            fs.write_atomic(self.holder_path, json.dumps(holder).encode(), fsync=False)

    def describe_holder(self) -> str:
        try:
            holder = json.loads(self.holder_path.read_bytes())
            who = f"pid {holder['pid']} on {holder['host']}"
            done, total = int(holder["done_bytes"]), int(holder["total_bytes"])
        except (OSError, ValueError, KeyError, TypeError):
            return "another process"
        return f"{who} ({format_bytes(done)} of {format_bytes(total)})" if total else who

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(FileNotFoundError):
                self.holder_path.unlink()
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None


class Cache:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.state_dir = root / STATE_DIR
        self.records_dir = self.state_dir / "records"
        self.staging_dir = self.state_dir / "staging"
        self.locks_dir = self.state_dir / "locks"
        self.trash_dir = self.state_dir / "trash"
        self.quarantine_dir = self.state_dir / "quarantine"
        #: pins/<slug>: the operator asked to keep the model
        self.pins_dir = self.state_dir / "pins"
        #: used/<slug>: its mtime is when the model was last pulled or touched
        self.used_dir = self.state_dir / "used"
        #: verified/<slug>: its mtime is when `verify` last found the model intact (kept
        #: beside the records, so rebuilding the index does not forget it)
        self.verified_dir = self.state_dir / "verified"
        #: leases/<slug>: a consumer holds the model until the time written inside
        self.leases_dir = self.state_dir / "leases"
        #: reservations/<slug>: disk space claimed by a running pull (valid while its lock is held)
        self.reservations_dir = self.state_dir / "reservations"
        self.index_path = self.state_dir / "index.sqlite"

    def ensure(self) -> None:
        """Create the layout; fails with LocalStorageError when the root is unusable."""
        with fs.storage_errors(self.root):
            for d in (
                self.records_dir,
                self.staging_dir,
                self.locks_dir,
                self.trash_dir,
                self.quarantine_dir,
                self.pins_dir,
                self.used_dir,
                self.verified_dir,
                self.leases_dir,
                self.reservations_dir,
            ):
                fs.make_dirs(d, up_to=self.root)
            layout = self.state_dir / "layout"
            if not layout.exists():
                fs.write_atomic(layout, LAYOUT_VERSION.encode() + b"\n")

    def ready_path(self, ref: ModelRef) -> Path:
        return self.root / ref.cache_path

    def record_path(self, ref: ModelRef) -> Path:
        return self.records_dir / f"{ref.slug}.json"

    def load_record(self, ref: ModelRef) -> CompletionRecord | None:
        path = self.record_path(ref)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            record = parse_record(data, str(path))
        except ManifestError:
            return None
        return record if record.source == ref.uri else None

    def ready_record(self, ref: ModelRef) -> CompletionRecord | None:
        """The record of a ready model: its record exists and its directory is a real directory."""
        record = self.load_record(ref)
        if record is None:
            return None
        try:
            st = os.lstat(self.ready_path(ref))
        except FileNotFoundError:
            return None
        return record if stat.S_ISDIR(st.st_mode) else None

    # -- small per-model markers: pins, last use, leases, reservations ----------------

    def pin(self, ref: ModelRef, pinned: bool) -> None:
        marker = self.pins_dir / ref.slug
        with fs.storage_errors(marker):
            if pinned:
                fs.write_atomic(marker, ref.uri.encode() + b"\n")
            else:
                with contextlib.suppress(FileNotFoundError):
                    marker.unlink()

    def is_pinned(self, ref: ModelRef) -> bool:
        return (self.pins_dir / ref.slug).exists()

    def touch(self, ref: ModelRef, at: float | None = None) -> None:
        """Record a use; best effort, since a read-only consumer must still get its path."""
        marker = self.used_dir / ref.slug
        with contextlib.suppress(OSError):
            fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, fs.FILE_MODE)
            os.close(fd)
            os.utime(marker, None if at is None else (at, at))

    def last_used(self, ref: ModelRef) -> float | None:
        try:
            return os.stat(self.used_dir / ref.slug).st_mtime
        except FileNotFoundError:
            return None

    def mark_verified(self, ref: ModelRef, at: float) -> None:
        """Record a clean verification; best effort, like `touch`."""
        marker = self.verified_dir / ref.slug
        with contextlib.suppress(OSError):
            fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, fs.FILE_MODE)
            os.close(fd)
            os.utime(marker, (at, at))

    def verified_at(self, ref: ModelRef) -> float | None:
        try:
            return os.stat(self.verified_dir / ref.slug).st_mtime
        except FileNotFoundError:
            return None

    def lease(self, ref: ModelRef, until: float) -> None:
        marker = self.leases_dir / ref.slug
        with fs.storage_errors(marker):
            fs.write_atomic(marker, json.dumps({"until": until}).encode())

    def lease_until(self, ref: ModelRef) -> float | None:
        try:
            until = json.loads((self.leases_dir / ref.slug).read_bytes())["until"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return float(until) if isinstance(until, int | float) else None

    def reserve(self, ref: ModelRef, n_bytes: int) -> None:
        """Claim `n_bytes` for a pull; files are allocated as they are opened, so the claim
        also notes what the staging area already holds, to tell later how much is still to come."""
        marker = self.reservations_dir / ref.slug
        baseline = fs.allocated_bytes(self.staging_dir / ref.slug)
        doc = {"bytes": n_bytes, "source": ref.uri, "baseline": baseline}
        with fs.storage_errors(marker):
            fs.write_atomic(marker, json.dumps(doc).encode())

    def release_reservation(self, ref: ModelRef) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.reservations_dir / ref.slug).unlink()

    def reservations(self) -> dict[str, Reservation]:
        """Live reservations by slug; one whose pull died (lock free) is dropped on the way."""
        live = {}
        for marker in _listdir(self.reservations_dir):
            if marker.name.startswith("."):
                continue  # a marker still being written (fs.write_atomic's temporary name): not ours to drop
            try:
                doc = json.loads(marker.read_bytes())
                claim = Reservation(str(doc["source"]), int(doc["bytes"]), int(doc.get("baseline", 0)))
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if self.lock_is_held(marker.name):
                live[marker.name] = claim
            else:
                with contextlib.suppress(FileNotFoundError):
                    marker.unlink()
        return live

    def outstanding_bytes(self, slug: str, claim: Reservation) -> int:
        """Bytes a live pull has claimed but not yet allocated: free space that is already spoken for."""
        written = fs.allocated_bytes(self.staging_dir / slug) - claim.baseline_bytes
        return max(0, claim.size_bytes - written)

    def forget(self, ref: ModelRef) -> None:
        """Drop every marker of an evicted model."""
        for d in (self.pins_dir, self.used_dir, self.verified_dir, self.leases_dir):
            with contextlib.suppress(FileNotFoundError):
                (d / ref.slug).unlink()

    def lock_is_held(self, slug: str) -> bool:
        """Whether some process holds the model's lock (a pull in progress), without waiting."""
        try:
            fd = os.open(self.locks_dir / f"{slug}.lock", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False

    def staging(self, ref: ModelRef) -> Staging:
        return Staging(self, ref)

    def lock(self, ref: ModelRef) -> ModelLock:
        return ModelLock(self.locks_dir / f"{ref.slug}.lock")

    @contextlib.contextmanager
    def locked(self, ref: ModelRef, on_wait: Callable[[str], None] | None = None) -> Iterator[None]:
        lock = self.lock(ref)
        lock.acquire(on_wait)
        try:
            yield
        finally:
            lock.release()

    def make_ready(self, ref: ModelRef, staging: Staging, record: CompletionRecord) -> Path:
        """Make the staged model ready in one rename, after its record is durable.

        A revision already at the ready path (a refresh) is swapped out in the same
        step where the kernel can exchange two paths; readers holding its files keep them.
        """
        ready = self.ready_path(ref)
        with fs.storage_errors(ready):
            staging.journal.close()
            _seal_tree(staging.dir)
            fs.write_atomic(self.record_path(ref), render_record(record))
            for attempt in range(1, _MAKE_READY_ATTEMPTS + 1):
                try:
                    self._rename_into_place(ref, staging)
                    break
                except _ParentRemovedError:
                    # an eviction of a sibling pruned the (then empty) parent: make it again
                    if attempt == _MAKE_READY_ATTEMPTS:
                        raise FileNotFoundError(f"{ready.parent} kept disappearing") from None
            with contextlib.suppress(FileNotFoundError):
                staging.journal.path.unlink()
            self._drop_quarantine(ref)
        return ready

    def _rename_into_place(self, ref: ModelRef, staging: Staging) -> None:
        try:
            parent = self._open_parent(ref, create=True)
        except FileNotFoundError:
            raise _ParentRemovedError from None
        staging_fd = fs.open_dir(staging.dir.parent)
        try:
            name = ref.cache_path.name
            if _exists(parent, name) and fs.exchange(staging_fd, staging.dir.name, parent, name):
                fs.remove_tree(staging.dir)  # the old revision, now at the staging path
            else:
                self._move_aside(parent, name)
                try:
                    os.rename(staging.dir.name, name, src_dir_fd=staging_fd, dst_dir_fd=parent)
                except FileNotFoundError:
                    if os.fstat(parent).st_nlink == 0:
                        raise _ParentRemovedError from None
                    raise
            os.fsync(parent)
        finally:
            os.close(staging_fd)
            os.close(parent)

    def prune_parents(self, ref: ModelRef) -> None:
        """Remove the directories above a model's ready path that its removal left empty.

        Stops at the first one that is not empty, and never goes above the cache root
        or through a symlink. A `make_ready` that loses its parent to this race makes it again.
        """
        parts = ref.cache_path.parts[:-1]
        root = fs.open_dir(self.root)
        try:
            for depth in range(len(parts), 0, -1):
                try:
                    parent = fs.open_dir_beneath(root, PurePosixPath(*parts[: depth - 1]), create=False)
                except OSError:
                    return
                try:
                    os.rmdir(parts[depth - 1], dir_fd=parent)
                except OSError:
                    return  # not empty (another model, a concurrent `make_ready`), or gone
                finally:
                    os.close(parent)
        finally:
            os.close(root)

    def _drop_quarantine(self, ref: ModelRef) -> None:
        """A quarantined copy is stale once the model is ready again: record first, then data."""
        with contextlib.suppress(FileNotFoundError):
            (self.quarantine_dir / f"{ref.slug}.json").unlink()
        fs.remove_tree(self.quarantine_dir / ref.slug)

    def remove_ready(self, ref: ModelRef) -> None:
        """Make a model not ready: the ready path disappears in one rename, then the data goes."""
        with fs.storage_errors(self.ready_path(ref)):
            try:
                parent = self._open_parent(ref, create=False)
            except (FileNotFoundError, NotADirectoryError):
                parent = None
            if parent is not None:
                try:
                    self._move_aside(parent, ref.cache_path.name)
                finally:
                    os.close(parent)
            with contextlib.suppress(FileNotFoundError):
                self.record_path(ref).unlink()

    def _open_parent(self, ref: ModelRef, create: bool) -> int:
        """The ready path's parent directory, reached without following any symlink."""
        root = fs.open_dir(self.root)
        try:
            return fs.open_dir_beneath(root, PurePosixPath(*ref.cache_path.parts[:-1]), create=create)
        finally:
            os.close(root)

    def _move_aside(self, parent_fd: int, name: str) -> None:
        """Whatever is at the ready path goes to trash in one rename, then is deleted."""
        if not _exists(parent_fd, name):
            return
        doomed = self.trash_dir / f"{name}-{os.getpid()}-{os.urandom(4).hex()}"
        os.rename(name, doomed, src_dir_fd=parent_fd)
        fs.remove_tree(doomed)


#: how often making a model ready makes the ready path's parent again when a concurrent prune removed it
_MAKE_READY_ATTEMPTS = 5


class _ParentRemovedError(Exception):
    """The ready path's parent was removed while a model was being made ready in it."""


def _exists(dir_fd: int, name: str) -> bool:
    try:
        os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    return True


def _listdir(directory: Path) -> list[Path]:
    try:
        return sorted(directory.iterdir())
    except FileNotFoundError:
        return []


def _seal_tree(directory: Path) -> None:
    """Make files read-only and everything below `directory` durable before it becomes visible.

    One syncfs of the file system where the kernel has it: a model of 2,000 small files
    otherwise pays 2,000 journal commits here (fsync per file), the bulk of its time to
    disk. Where syncfs is missing, every file and directory is fsynced.
    """
    files, dirs = [], [directory]
    for dirpath, dirnames, filenames in os.walk(directory, followlinks=False):
        files += [os.path.join(dirpath, name) for name in filenames]
        dirs += [Path(dirpath, name) for name in dirnames]
    for path in files:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.fchmod(fd, fs.READY_FILE_MODE)
        finally:
            os.close(fd)
    root = fs.open_dir(directory)
    try:
        synced = fs.syncfs(root)
    finally:
        os.close(root)
    if synced:
        return
    for path in files:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    for d in dirs:
        fs.fsync_dir(d)
