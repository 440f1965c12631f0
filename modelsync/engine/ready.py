"""Is a model ready, and is it still intact? Local checks only: no S3 stack is imported here.

A warm `modelsync pull` in an init container lands here and returns in
milliseconds; importing aiobotocore alone would cost more than that.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from modelsync.adapters import fs
from modelsync.adapters.cache import Cache
from modelsync.core.record import CompletionRecord
from modelsync.core.refs import ModelRef


@dataclass(frozen=True, slots=True)
class Problem:
    path: str
    reason: str


def quick_check(root: Path, record: CompletionRecord) -> list[Problem]:
    """Presence, type and size of every file of the model at `root`: one lstat each, no reads."""
    problems = []
    for f in record.files:
        try:
            st = os.lstat(root / f.path)
        except FileNotFoundError:
            problems.append(Problem(f.path, "missing"))
            continue
        if stat.S_ISLNK(st.st_mode):
            problems.append(Problem(f.path, "is a symlink"))
        elif not stat.S_ISREG(st.st_mode):
            problems.append(Problem(f.path, "not a regular file"))
        elif st.st_size != f.size_bytes:
            problems.append(Problem(f.path, f"size {st.st_size}, recorded {f.size_bytes}"))
    return problems


def full_check(root: Path, record: CompletionRecord, sha256s: dict[str, str] | None = None) -> list[Problem]:
    """Re-hash every file against the record's xxh3-128; never follows a symlink.

    With `sha256s`, each file's SHA-256 is computed in the same pass and stored
    there, for a signature re-check that reads nothing twice.
    """
    from modelsync.adapters.digest import hash_fd  # here, not at the top: the warm path never hashes

    problems = quick_check(root, record)
    bad = {p.path for p in problems}
    root_fd = fs.open_dir(root)
    try:
        for f in record.files:
            if f.path in bad:
                continue
            fd = fs.open_file_beneath(root_fd, PurePosixPath(f.path), os.O_RDONLY)
            try:
                both = hash_fd(fd, f.size_bytes, sha256=sha256s is not None)
            finally:
                os.close(fd)
            digest = both.xxh3_128
            if sha256s is not None and both.sha256 is not None:
                sha256s[f.path] = both.sha256
            if digest != f.xxh3_128:
                problems.append(Problem(f.path, f"xxh3-128 {digest}, recorded {f.xxh3_128}"))
    finally:
        os.close(root_fd)
    return problems


@dataclass(frozen=True, slots=True)
class Readiness:
    """The one readiness rule, applied by every way a model is made ready (and the warm path).

    A model is ready when its completion record exists, its files pass
    `quick_check`, and, when the policy requires a signature, it was made ready
    with a verified one.
    """

    record: CompletionRecord | None
    #: what `quick_check` found wrong with a recorded model
    damaged: tuple[Problem, ...] = ()
    #: recorded without a verified signature, which the policy requires
    unsigned: bool = False

    @property
    def ready(self) -> bool:
        return self.record is not None and not self.damaged and not self.unsigned


def readiness(cache: Cache, ref: ModelRef, signed_only: bool) -> Readiness:
    """Apply the readiness rule to `ref`: one record read and one lstat per file, no hashing."""
    record = cache.ready_record(ref)
    if record is None:
        return Readiness(None)
    damaged = tuple(quick_check(cache.ready_path(ref), record))
    return Readiness(record, damaged, unsigned=signed_only and record.signer is None)


def warm_path(cache_dir: Path, ref: ModelRef, signed_only: bool) -> Path | None:
    """The ready path when `ref` is ready by the readiness rule, else None.

    `signed_only`: the policy requires a signature (`Settings.requires_signature`),
    so a model cached without a verified one is not ready: the pull checks it first.
    """
    cache = Cache(cache_dir)
    return cache.ready_path(ref) if readiness(cache, ref, signed_only).ready else None
