"""Is a model ready, and is it still intact? Local checks only: no S3 stack is imported here.

A warm `modelsync pull` in an init container lands here and returns in
milliseconds; importing aiobotocore alone would cost more than that.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from modelsync.adapters import fs, model_files
from modelsync.adapters.cache import Cache
from modelsync.adapters.model_files import Kind
from modelsync.core.record import CompletionRecord
from modelsync.core.refs import ModelRef
from modelsync.errors import UnreadableFileError


class Problem(NamedTuple):
    path: str
    reason: str


def quick_check(root: Path, record: CompletionRecord) -> list[Problem]:
    """Presence, type, size and mode of every file of the model at `root`: one lstat each, no reads."""
    problems = []
    for f in record.files:
        found = model_files.entry(root, f.path)
        if found.kind is Kind.MISSING:
            problems.append(Problem(f.path, "missing"))
        elif found.kind is Kind.SYMLINK:
            problems.append(Problem(f.path, "is a symlink"))
        elif found.kind is Kind.OTHER:
            problems.append(Problem(f.path, "not a regular file"))
        elif found.size_bytes != f.size_bytes:
            problems.append(Problem(f.path, f"size {found.size_bytes}, recorded {f.size_bytes}"))
        elif found.mode & fs.READY_FILE_MODE != fs.READY_FILE_MODE:
            # published readable by all: a consumer of another uid (vLLM) would fail with EACCES
            reason = f"mode {found.mode:03o}, not readable by all (published {fs.READY_FILE_MODE:03o})"
            problems.append(Problem(f.path, reason))
    return problems


def full_check(root: Path, record: CompletionRecord, sha256s: dict[str, str] | None = None) -> list[Problem]:
    """Re-hash every file against the record's xxh3-128; never follows a symlink, never blocks.

    A file that is gone, not a regular file or unreadable is a problem like bad bytes.

    With `sha256s`, each file's SHA-256 is computed in the same pass and stored
    there, for a signature re-check that reads nothing twice.
    """
    problems = quick_check(root, record)
    bad = {p.path for p in problems}
    with model_files.ModelDir(root) as model:
        for f in record.files:
            if f.path in bad:
                continue
            try:
                digest = model.digest(f.path, f.size_bytes, sha256=sha256s is not None)
            except UnreadableFileError as exc:
                problems.append(Problem(f.path, str(exc)))
                continue
            if sha256s is not None and digest.sha256 is not None:
                sha256s[f.path] = digest.sha256
            if digest.xxh3_128 != f.xxh3_128:
                problems.append(Problem(f.path, f"xxh3-128 {digest.xxh3_128}, recorded {f.xxh3_128}"))
    return problems


class Readiness(NamedTuple):
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
