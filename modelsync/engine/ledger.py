"""A pull's verification ledger: what each file's digest must match, and which files are verified.

A file counts as verified once its complete bytes matched what the source
vouches for (core/verify.py `check_file`: the manifest's digest, or the
ETag), once a cached copy with the same content was linked in (engine/dedup.py),
or when the journal of an interrupted pull says so and the object has not
changed since. Only then is it journaled as verified, and the record that makes
the model ready is written from this ledger alone: nothing unverified is made
ready.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

from modelsync.adapters.cache import Journal, JournalState
from modelsync.adapters.digest import FileDigest
from modelsync.core.manifest import FileEntry
from modelsync.core.parts import FileWork, RemoteFile
from modelsync.core.record import CompletionRecord, weakest
from modelsync.core.refs import ModelRef
from modelsync.core.verify import check_file
from modelsync.engine.dedup import Linked


class VerificationLedger:
    """Per file of one pull: its verified digest and by what, its SHA-256, and the version fetched."""

    def __init__(self, journal: Journal) -> None:
        self._journal = journal
        #: path -> (xxh3_128, what vouched for it)
        self._verified: dict[str, tuple[str, str]] = {}
        #: SHA-256 of each file hashed while it downloaded (only when a signature is checked)
        self.sha256s: dict[str, str] = {}
        #: the version of each file that was fetched and verified (a restart may change it)
        self._fetched: dict[str, RemoteFile] = {}

    def __contains__(self, path: str) -> bool:
        return path in self._verified

    def resume(self, state: JournalState, files: Iterable[RemoteFile]) -> None:
        """Keep what an interrupted pull verified, for the objects that have not changed since."""
        etags = {f.path: f.etag for f in files}
        self._verified = {
            path: v for path, v in state.verified.items() if state.files[path][0] == etags[path]
        }
        self.sha256s = {path: h for path, h in state.sha256s.items() if path in self._verified}

    def linked(self, copies: Mapping[str, Linked]) -> None:
        """Files hard-linked from cached copies: verified by what verified the copy."""
        self._verified.update({path: (copy.xxh3_128, copy.verified_by) for path, copy in copies.items()})

    def accept(self, f: RemoteFile, digest: FileDigest, md5_part: int | None) -> None:
        """Check a complete file against what the source vouches for, and journal it as verified.

        Raises ChecksumMismatchError (core/verify.py) when it does not match.
        """
        verified_by = check_file(f, digest.xxh3_128, digest.part_md5s, md5_part)
        self._verified[f.path] = (digest.xxh3_128, verified_by)
        if digest.sha256 is not None:
            self.sha256s[f.path] = digest.sha256
        self._fetched[f.path] = f
        self._journal.file_verified(f.path, digest.xxh3_128, verified_by, f.size_bytes, digest.sha256)

    def fetched(self, works: Iterable[FileWork]) -> list[RemoteFile]:
        """The version of each file that is in staging: the one fetched, else the one planned."""
        return [self._fetched.get(w.file.path, w.file) for w in works]

    def record(self, ref: ModelRef, files: Iterable[RemoteFile], signer: str | None) -> CompletionRecord:
        """The record of the ready model: every file with its verified digest (KeyError if one is not)."""
        return CompletionRecord(
            source=ref.uri,
            completed_at=time.time(),
            verified_by=weakest([by for _digest, by in self._verified.values()]),
            files=tuple(FileEntry(f.path, f.size_bytes, self._verified[f.path][0], f.etag) for f in files),
            signer=signer,
        )
