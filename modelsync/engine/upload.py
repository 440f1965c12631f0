"""Upload a local model directory as one revision, writing its manifest last.

Readers take the manifest's presence to mean the upload finished, so it is
written only after every file is uploaded, with each file's size, xxh3-128 and
the ETag the store returned. Memory is bounded by `concurrency × part_size`:
each in-flight part is read into memory once, then sent.

With a signing key, the same hashing pass also computes each file's SHA-256, and
an OpenSSF model signature (`model.sig`, a Sigstore bundle as `model_signing sign`
makes) is uploaded after the files and before the manifest, which lists it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from modelsync.adapters import model_files
from modelsync.adapters.digest import FileDigest, hash_fd, xxh3_of
from modelsync.config import Settings
from modelsync.core.completeness import PUBLISHING_NAME
from modelsync.core.etag import EtagKind, etag_kind, multipart_etag
from modelsync.core.keys import safe_relative_path
from modelsync.core.manifest import MANIFEST_NAME, FileEntry, parse_manifest, render_manifest
from modelsync.core.parts import ObjectInfo, Part, RemoteFile, plan_parts
from modelsync.core.refs import ModelRef
from modelsync.core.signature import DEFAULT_SIGNATURE_NAME
from modelsync.core.verify import md5_part_bytes, needs_first_part
from modelsync.engine.events import NoEvents, PullEvents
from modelsync.engine.ports import ObjectWriter, OpenWriter
from modelsync.engine.tasks import first_error
from modelsync.errors import ManifestError, NotFoundError, UsageError

if TYPE_CHECKING:
    from modelsync.adapters.oms import Signer

#: S3 refuses multipart parts below 5 MiB (except the last)
MIN_UPLOAD_PART_BYTES = 5 * 1024 * 1024
MAX_OPEN_FILES = 32


@dataclass(frozen=True, slots=True)
class UploadResult:
    files: int
    total_bytes: int
    #: the signature's key under the prefix, when the model was signed
    signature_key: str | None = None
    #: files the prefix held already (an interrupted publish run again), not sent again
    skipped_files: int = 0
    skipped_bytes: int = 0


@dataclass(frozen=True, slots=True)
class SigningKey:
    """What `publish --sign-key` signs with: a PEM EC private key, and optionally its certificate."""

    private_key: Path
    certificate: Path | None = None
    #: intermediates and root shipped in the bundle with the certificate
    certificate_chain: tuple[Path, ...] = ()
    #: the signature's file name under the prefix
    signature_name: str = DEFAULT_SIGNATURE_NAME


def local_files(directory: Path, skip: frozenset[str] = frozenset()) -> list[tuple[str, int]]:
    """Every regular file below `directory` as (relative key, size), but the manifest and `skip`;
    symlinks are refused."""
    if not model_files.is_dir(directory):
        raise UsageError(f"{directory} is not a directory")
    files, links = model_files.tree_files(directory)
    if links:
        raise UsageError(f"{directory / links[0]} is a symlink; publish real files only")
    found = []
    for relative, size_bytes in files:
        if relative in (MANIFEST_NAME, PUBLISHING_NAME) or relative in skip:
            continue
        safe_relative_path(relative)
        found.append((relative, size_bytes))
    if not found:
        raise UsageError(f"{directory} holds no files to publish")
    return found


async def upload(
    settings: Settings,
    directory: Path,
    ref: ModelRef,
    events: PullEvents | None = None,
    signing: SigningKey | None = None,
    *,
    writer: OpenWriter,
) -> UploadResult:
    """Upload `directory` to `ref` through the store `writer` opens (the edge's
    `modelsync.backends.s3_writer`), sign it when `signing` is given, and write the manifest last.

    The prefix is marked (`modelsync.publishing`) before its first object and the
    mark removed only after the manifest, so a pull never takes a publish in
    progress, or one cut short, for a model; an old manifest goes right after the
    mark. A file the prefix already holds with the same size and content (its ETag,
    or the old manifest's xxh3-128) is not sent again: a rerun resumes.
    `events` hears the plan and every byte sent, as a pull's would. A signature
    already in the directory is uploaded as it is, unless this upload signs:
    then it is replaced by the new one.
    """
    signer = None
    if signing is not None:
        from modelsync.adapters.oms import Signer

        signer = Signer(signing.private_key, signing.certificate, signing.certificate_chain)
    skip = frozenset({signing.signature_name}) if signing is not None else frozenset()
    files = local_files(directory, skip)
    window = asyncio.Semaphore(settings.concurrency)
    file_slots = asyncio.Semaphore(MAX_OPEN_FILES)
    events = events or NoEvents()

    async with writer() as s3:
        await s3.require_bucket(ref.bucket)
        there = await _already_there(s3, ref)
        await s3.put_bytes(ref.bucket, ref.prefix + PUBLISHING_NAME, json.dumps({"at": time.time()}).encode())
        if there.manifest:
            await s3.delete(ref.bucket, ref.prefix + MANIFEST_NAME)
        total_bytes = sum(size_bytes for _, size_bytes in files)
        events.planned(len(files), total_bytes, total_bytes)

        async def upload(rel: str) -> _Sent:
            async with file_slots:
                sender = _Sender(s3, settings, window, ref, events, signing is not None)
                return await sender.send(rel, directory / rel, there)

        with first_error():
            async with asyncio.TaskGroup() as tg:
                tasks = [tg.create_task(upload(rel)) for rel, _ in files]
        sent = [t.result() for t in tasks]
        entries = [s.entry for s in sent]
        signature_key = None
        if signing is not None and signer is not None:
            sha256s = [(s.entry.path, s.sha256 or "") for s in sent]
            entry = await _upload_signature(s3, ref, signing.signature_name, signer, sha256s)
            signature_key = ref.prefix + entry.path
            entries.append(entry)
        await s3.put_bytes(ref.bucket, ref.prefix + MANIFEST_NAME, render_manifest(entries))
        await s3.delete(ref.bucket, ref.prefix + PUBLISHING_NAME)
    kept = [s.entry for s in sent if s.kept]
    return UploadResult(
        files=len(entries),
        total_bytes=sum(e.size_bytes for e in entries),
        signature_key=signature_key,
        skipped_files=len(kept),
        skipped_bytes=sum(e.size_bytes for e in kept),
    )


@dataclass(frozen=True, slots=True)
class _There:
    """What the prefix held before this upload: objects by key, and the old manifest's entries by path."""

    objects: Mapping[str, ObjectInfo]
    entries: Mapping[str, FileEntry]
    manifest: bool


async def _already_there(s3: ObjectWriter, ref: ModelRef) -> _There:
    try:
        listing = await s3.list_model(ref)
    except NotFoundError:
        return _There({}, {}, manifest=False)
    objects = {o.key: o for o in listing}
    entries: dict[str, FileEntry] = {}
    manifest = ref.prefix + MANIFEST_NAME in objects
    data = await s3.get_manifest(ref, MANIFEST_NAME) if manifest else None
    if data is not None:
        with contextlib.suppress(ManifestError):  # a bad old manifest vouches for nothing
            entries = {e.path: e for e in parse_manifest(data, ref.uri + MANIFEST_NAME).files}
    return _There(objects, entries, manifest)


class _Sent(NamedTuple):
    entry: FileEntry
    sha256: str | None
    #: the prefix held the file already; it was not sent again
    kept: bool


async def _upload_signature(
    s3: ObjectWriter, ref: ModelRef, name: str, signer: Signer, sha256s: list[tuple[str, str]]
) -> FileEntry:
    """Sign the uploaded files' digests and upload the bundle as `name`; its manifest entry."""
    model_name = ref.prefix.rstrip("/").rpartition("/")[2]
    # Ignored by verifiers that hash a downloaded prefix: the bundle itself and our manifest.
    bundle = await asyncio.to_thread(signer.sign, model_name, sha256s, (name, MANIFEST_NAME))
    etag = await s3.put_bytes(ref.bucket, ref.prefix + name, bundle)
    return FileEntry(path=name, size_bytes=len(bundle), xxh3_128=xxh3_of(bundle), etag=etag)


class _Sender:
    """Uploads one file at a time, unless the prefix already holds it."""

    def __init__(
        self,
        s3: ObjectWriter,
        settings: Settings,
        window: asyncio.Semaphore,
        ref: ModelRef,
        events: PullEvents,
        sha256: bool,
    ) -> None:
        self.s3, self.settings, self.window, self.ref = s3, settings, window, ref
        self.events, self.sha256 = events, sha256

    async def send(self, rel: str, path: Path, there: _There) -> _Sent:
        """Upload one file; its manifest entry and, when asked, its SHA-256 from the same hashing pass."""
        key = self.ref.prefix + rel
        with model_files.ReadOnlyFile(path) as file:
            size = file.size_bytes
            remote = there.objects.get(key)
            if remote is not None and remote.size_bytes != size:
                remote = None
            md5_part = await self._md5_part_bytes(remote)
            digest = await asyncio.to_thread(hash_fd, file.fd, size, md5_part, self.sha256)
            if remote is not None and _same(remote, there.entries.get(rel), digest, md5_part):
                self.events.fetched(size)
                entry = FileEntry(path=rel, size_bytes=size, xxh3_128=digest.xxh3_128, etag=remote.etag)
                return _Sent(entry, digest.sha256, kept=True)
            parts = plan_parts(size, max(self.settings.part_size_bytes, MIN_UPLOAD_PART_BYTES))
            if len(parts) <= 1:
                async with self.window:
                    data = await asyncio.to_thread(file.read, 0, size)
                    etag = await self.s3.put_bytes(self.ref.bucket, key, data)
                self.events.fetched(size)
            else:
                etag = await _multipart(self.s3, self.window, self.ref.bucket, key, file, parts, self.events)
        entry = FileEntry(path=rel, size_bytes=size, xxh3_128=digest.xxh3_128, etag=etag)
        return _Sent(entry, digest.sha256, kept=False)

    async def _md5_part_bytes(self, remote: ObjectInfo | None) -> int | None:
        """How to slice the local file to compute the ETag `remote` has, when its ETag can tell."""
        if remote is None:
            return None
        f = RemoteFile(remote.key, remote.key, remote.size_bytes, remote.etag)
        first = None
        if needs_first_part(f):
            first = await self.s3.first_part_bytes(self.ref.bucket, remote.key)
        return md5_part_bytes(f, first)


def _same(remote: ObjectInfo, old: FileEntry | None, digest: FileDigest, md5_part: int | None) -> bool:
    """Whether the object already there is the local file: its ETag says so, or the old manifest does."""
    if old is not None and old.etag == remote.etag and old.size_bytes == remote.size_bytes:
        return old.xxh3_128 == digest.xxh3_128
    if md5_part is None or not digest.part_md5s:
        return False
    md5s = digest.part_md5s
    local = md5s[0].hex() if etag_kind(remote.etag) is EtagKind.MD5 else multipart_etag(md5s)
    return local == remote.etag


async def _multipart(
    s3: ObjectWriter,
    window: asyncio.Semaphore,
    bucket: str,
    key: str,
    file: model_files.ReadOnlyFile,
    parts: tuple[Part, ...],
    events: PullEvents,
) -> str:
    upload_id = await s3.start_multipart(bucket, key)

    async def send(part: Part) -> str:
        async with window:
            data = await asyncio.to_thread(file.read, part.start, part.size_bytes)
            etag = await s3.upload_part(bucket, key, upload_id, part.index + 1, data)
        events.fetched(part.size_bytes)
        return etag

    try:
        with first_error():
            async with asyncio.TaskGroup() as tg:
                tasks = [tg.create_task(send(p)) for p in parts]
        return await s3.complete_multipart(bucket, key, upload_id, [t.result() for t in tasks])
    except BaseException:
        await asyncio.shield(s3.abort_multipart(bucket, key, upload_id))
        raise
