"""Small per-model markers: pins, last use, verification, leases, space reservations.

Each is one file named by the model's slug. Use and verification are recorded
in a marker's mtime, best effort: a read-only consumer must still get its path.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from pathlib import Path
from typing import NamedTuple

from modelsync.adapters import fs, volume
from modelsync.adapters.cache.layout import Layout
from modelsync.adapters.cache.locks import lock_is_held
from modelsync.core.refs import ModelRef


class Reservation(NamedTuple):
    """Space a running pull claimed: its source, the bytes, and what its staging held at the time."""

    source: str
    size_bytes: int
    baseline_bytes: int


class Markers(Layout):
    """The markers of the models of one cache root."""

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
        _stamp(self.used_dir / ref.slug, at)

    def last_used(self, ref: ModelRef) -> float | None:
        return _stamped_at(self.used_dir / ref.slug)

    def mark_verified(self, ref: ModelRef, at: float) -> None:
        """Record a clean verification; best effort, like `touch`."""
        _stamp(self.verified_dir / ref.slug, at)

    def verified_at(self, ref: ModelRef) -> float | None:
        return _stamped_at(self.verified_dir / ref.slug)

    def lease(self, ref: ModelRef, until: float) -> None:
        """Hold the model until `until`, or later if another holder's lease runs longer.

        Leases combine: the model stays held until the latest expiry any holder asked
        for, so a short lease never cuts a longer one short. The read and the write
        happen under a lock on the leases directory, so two holders never both win.
        """
        marker = self.leases_dir / ref.slug
        with fs.storage_errors(marker):
            fd = fs.open_dir(self.leases_dir)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                held = self.lease_until(ref)
                if held is None or until > held:
                    fs.write_atomic(marker, json.dumps({"until": until}).encode())
            finally:
                os.close(fd)  # closing the descriptor releases the lock

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
        baseline = volume.allocated_bytes(self.staging_dir / ref.slug)
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
        written = volume.allocated_bytes(self.staging_dir / slug) - claim.baseline_bytes
        return max(0, claim.size_bytes - written)

    def forget(self, ref: ModelRef) -> None:
        """Drop every marker of an evicted model."""
        for d in (self.pins_dir, self.used_dir, self.verified_dir, self.leases_dir):
            with contextlib.suppress(FileNotFoundError):
                (d / ref.slug).unlink()

    def lock_is_held(self, slug: str) -> bool:
        """Whether some process holds the model's lock (a pull in progress), without waiting."""
        return lock_is_held(self.locks_dir / f"{slug}.lock")


def _listdir(directory: Path) -> list[Path]:
    try:
        return sorted(directory.iterdir())
    except FileNotFoundError:
        return []


def _stamp(marker: Path, at: float | None) -> None:
    """Set the marker's mtime to `at` (now when None), creating it; best effort."""
    with contextlib.suppress(OSError):
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, fs.FILE_MODE)
        os.close(fd)
        os.utime(marker, None if at is None else (at, at))


def _stamped_at(marker: Path) -> float | None:
    try:
        return os.stat(marker).st_mtime
    except FileNotFoundError:
        return None
