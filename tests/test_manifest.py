"""The manifest format: round trips, and every malformation is one clear ManifestError."""

from __future__ import annotations

import json

import pytest

from modelsync.core.manifest import FileEntry, parse_manifest, render_manifest
from modelsync.core.record import CompletionRecord, parse_record, render_record, weakest
from modelsync.errors import ExitCode, ManifestError, UnsafeKeyError

DIGEST = "0123456789abcdef0123456789abcdef"


def test_a_rendered_manifest_parses_back_to_the_same_files_sorted() -> None:
    files = [FileEntry("b.bin", 2, DIGEST, "etag-b"), FileEntry("a/c.json", 0, DIGEST)]
    manifest = parse_manifest(render_manifest(files), "m")
    assert [f.path for f in manifest.files] == ["a/c.json", "b.bin"]
    assert manifest.files[1] == files[0]
    assert manifest.total_bytes == 2


def test_rendering_is_deterministic() -> None:
    files = [FileEntry("b", 1, DIGEST), FileEntry("a", 1, DIGEST)]
    assert render_manifest(files) == render_manifest(reversed(files))


def _doc(**overrides: object) -> bytes:
    doc: dict[str, object] = {
        "format": "modelsync-manifest",
        "version": 1,
        "files": [{"path": "a.bin", "size": 1, "xxh3_128": DIGEST}],
    }
    doc.update(overrides)
    return json.dumps(doc).encode()


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"{not json", "not JSON"),
        (b"[]", "not an object"),
        (_doc(format="other"), "'format'"),
        (_doc(version=2), "unsupported version 2"),
        (_doc(files={}), "'files' is not a list"),
        (_doc(files=[{"path": "a", "size": -1, "xxh3_128": DIGEST}]), "size"),
        (_doc(files=[{"path": "a", "size": True, "xxh3_128": DIGEST}]), "size"),
        (_doc(files=[{"path": "a", "size": 1, "xxh3_128": "XYZ"}]), "xxh3_128"),
        (_doc(files=[{"path": 3, "size": 1, "xxh3_128": DIGEST}]), "path"),
        (_doc(files=[{"path": "a", "size": 1, "xxh3_128": DIGEST}] * 2), "duplicate"),
        (
            _doc(files=[{"path": "modelsync.manifest.json", "size": 1, "xxh3_128": DIGEST}]),
            "manifest itself",
        ),
    ],
)
def test_malformed_manifests_are_refused_with_the_reason(data: bytes, reason: str) -> None:
    with pytest.raises(ManifestError, match=reason) as info:
        parse_manifest(data, "s3://b/p/modelsync.manifest.json")
    assert info.value.exit_code == ExitCode.INTEGRITY
    assert "s3://b/p/modelsync.manifest.json" in str(info.value)


def test_a_traversal_path_in_a_manifest_is_refused() -> None:
    with pytest.raises(UnsafeKeyError):
        parse_manifest(_doc(files=[{"path": "../etc/passwd", "size": 1, "xxh3_128": DIGEST}]), "m")


def test_a_completion_record_round_trips() -> None:
    record = CompletionRecord("s3://b/p/", 12.5, "etag-md5", (FileEntry("a", 1, DIGEST, "e"),))
    assert parse_record(render_record(record), "r") == record


def test_a_damaged_completion_record_is_refused() -> None:
    with pytest.raises(ManifestError, match="damaged completion record"):
        parse_record(b'{"format": "modelsync-record", "version": 1}', "r")


def test_the_record_states_the_weakest_verification_of_its_files() -> None:
    assert weakest(["manifest", "size", "etag-md5"]) == "size"
    assert weakest(["manifest", "etag-multipart"]) == "etag-multipart"
