"""The `modelsync.manifest.json` format: what a model revision contains, and its digests.

A manifest is written last by `modelsync publish`, so its presence means the
upload finished. Format (version 1):

    {
      "format": "modelsync-manifest",
      "version": 1,
      "files": [
        {"path": "model-00001-of-00002.safetensors", "size": 4096,
         "xxh3_128": "<32 lowercase hex>", "etag": "<ETag without quotes, optional>"}
      ]
    }

Paths are relative to the model prefix, `/`-separated, and obey `keys.safe_relative_path`.
Unknown top-level or per-file keys are ignored, so later versions can add fields;
a different `version` is refused.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from typing import NamedTuple

from modelsync.core.keys import safe_relative_path
from modelsync.errors import ManifestError

MANIFEST_NAME = "modelsync.manifest.json"
FORMAT = "modelsync-manifest"
VERSION = 1
#: a manifest larger than this is refused before parsing (100k files fit easily)
MAX_MANIFEST_BYTES = 64 * 1024 * 1024
_HEX128 = re.compile(r"^[0-9a-f]{32}$")


class FileEntry(NamedTuple):
    path: str
    #: `size` in the manifest and the completion record
    size_bytes: int
    xxh3_128: str
    etag: str | None = None


class Manifest(NamedTuple):
    files: tuple[FileEntry, ...]

    @property
    def total_bytes(self) -> int:
        return sum(f.size_bytes for f in self.files)


def render_manifest(files: Iterable[FileEntry]) -> bytes:
    """Serialise deterministically (sorted by path) so equal models give equal bytes."""
    entries = []
    for f in sorted(files, key=lambda e: e.path):
        entry: dict[str, object] = {"path": f.path, "size": f.size_bytes, "xxh3_128": f.xxh3_128}
        if f.etag is not None:
            entry["etag"] = f.etag
        entries.append(entry)
    doc = {"format": FORMAT, "version": VERSION, "files": entries}
    return (json.dumps(doc, indent=1, sort_keys=False) + "\n").encode()


def parse_manifest(data: bytes, source: str) -> Manifest:
    """Parse and validate; every problem is a ManifestError naming `source` and the reason."""

    def bad(reason: str) -> ManifestError:
        return ManifestError(f"malformed manifest {source}: {reason}; republish the model")

    if len(data) > MAX_MANIFEST_BYTES:
        raise bad(f"{len(data)} bytes, over the limit of {MAX_MANIFEST_BYTES}")
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad(f"not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise bad("top level is not an object")
    if doc.get("format") != FORMAT:
        raise bad(f"'format' is not {FORMAT!r}")
    if doc.get("version") != VERSION:
        raise bad(f"unsupported version {doc.get('version')!r} (this modelsync reads {VERSION})")
    raw_files = doc.get("files")
    if not isinstance(raw_files, list):
        raise bad("'files' is not a list")
    files: list[FileEntry] = []
    seen: set[str] = set()
    for i, raw in enumerate(raw_files):
        files.append(parse_file_entry(raw, i, bad))
        if files[-1].path in seen:
            raise bad(f"files[{i}]: duplicate path {files[-1].path!r}")
        seen.add(files[-1].path)
    return Manifest(files=tuple(files))


def parse_file_entry(raw: object, i: int, bad: Callable[[str], ManifestError]) -> FileEntry:
    if not isinstance(raw, dict):
        raise bad(f"files[{i}] is not an object")
    path, size, digest, etag = (
        raw.get("path"),
        raw.get("size"),
        raw.get("xxh3_128"),
        raw.get("etag"),
    )
    if not isinstance(path, str):
        raise bad(f"files[{i}].path is not a string")
    safe_relative_path(path)
    if path == MANIFEST_NAME:
        raise bad(f"files[{i}] lists the manifest itself")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise bad(f"files[{i}].size is not a non-negative integer")
    if not isinstance(digest, str) or not _HEX128.match(digest):
        raise bad(f"files[{i}].xxh3_128 is not 32 lowercase hex digits")
    if etag is not None and not isinstance(etag, str):
        raise bad(f"files[{i}].etag is not a string")
    return FileEntry(path=path, size_bytes=size, xxh3_128=digest, etag=etag.strip('"') if etag else None)
