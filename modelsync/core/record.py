"""Completion records: what a ready model holds, so checks need no network.

Written by a pull just before the model is made ready, read by a warm pull,
`ls`, `verify` and the index rebuild. Format `modelsync-record`, version 1:

    {"format": "modelsync-record", "version": 1,
     "source": "s3://models/org/model/rev/", "completed_at": 1767139200.0,
     "verified_by": "manifest" | "etag-md5" | "etag-multipart" | "size",
     "files": [{"path": "...", "size": 1, "xxh3_128": "...", "etag": "..."}],
     "signer": "key release.pub.pem (sha256:…)"}

`verified_by` is the weakest check any file passed: a model without a manifest
whose objects have opaque ETags was checked for size only, and says so.
`signer` (optional) names who signed the model when its OpenSSF signature was
verified before it was made ready; records without it were not checked.
"""

from __future__ import annotations

import json
from typing import NamedTuple

from modelsync.core.manifest import FileEntry, parse_file_entry
from modelsync.errors import ManifestError

FORMAT = "modelsync-record"
VERSION = 1
VERIFIERS = ("manifest", "etag-md5", "etag-multipart", "size")


class CompletionRecord(NamedTuple):
    source: str
    completed_at: float
    verified_by: str
    files: tuple[FileEntry, ...]
    #: who signed the model, when its signature was verified before it was made ready
    signer: str | None = None

    @property
    def total_bytes(self) -> int:
        return sum(f.size_bytes for f in self.files)


def weakest(verifiers: list[str]) -> str:
    """The weakest of the per-file verifications, for the record's summary."""
    return max(verifiers, key=VERIFIERS.index) if verifiers else "manifest"


def render_record(record: CompletionRecord) -> bytes:
    doc = {
        "format": FORMAT,
        "version": VERSION,
        "source": record.source,
        "completed_at": record.completed_at,
        "verified_by": record.verified_by,
        "files": [
            {"path": f.path, "size": f.size_bytes, "xxh3_128": f.xxh3_128, "etag": f.etag}
            for f in sorted(record.files, key=lambda f: f.path)
        ],
    }
    if record.signer is not None:
        doc["signer"] = record.signer
    return (json.dumps(doc, indent=1) + "\n").encode()


def parse_record(data: bytes, origin: str) -> CompletionRecord:
    """Parse a record; a damaged one raises ManifestError and the model counts as not ready."""

    def bad(reason: str) -> ManifestError:
        return ManifestError(f"damaged completion record {origin}: {reason}")

    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad(f"not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("version") != VERSION:
        raise bad("unknown format or version")
    source, completed_at, verified_by = (
        doc.get("source"),
        doc.get("completed_at"),
        doc.get("verified_by"),
    )
    if not isinstance(source, str) or not isinstance(completed_at, int | float):
        raise bad("missing source or completed_at")
    if verified_by not in VERIFIERS:
        raise bad(f"unknown verified_by {verified_by!r}")
    raw_files = doc.get("files")
    if not isinstance(raw_files, list):
        raise bad("'files' is not a list")
    files = tuple(parse_file_entry(raw, i, bad) for i, raw in enumerate(raw_files))
    signer = doc.get("signer")
    if signer is not None and not isinstance(signer, str):
        raise bad("'signer' is not a string")
    return CompletionRecord(
        source=source, completed_at=float(completed_at), verified_by=verified_by, files=files, signer=signer
    )
