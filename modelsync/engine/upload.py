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
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from modelsync.adapters import model_files
from modelsync.adapters.digest import hash_fd, xxh3_of
from modelsync.adapters.s3 import S3, open_s3
from modelsync.config import Settings
from modelsync.core.keys import safe_relative_path
from modelsync.core.manifest import MANIFEST_NAME, FileEntry, render_manifest
from modelsync.core.parts import Part, plan_parts
from modelsync.core.refs import ModelRef
from modelsync.core.signature import DEFAULT_SIGNATURE_NAME
from modelsync.engine.events import NoEvents, PullEvents
from modelsync.engine.tasks import first_error
from modelsync.errors import UsageError

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
        if relative == MANIFEST_NAME or relative in skip:
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
) -> UploadResult:
    """Upload `directory` to `ref`, sign it when `signing` is given, and write the manifest last.

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

    async def upload(rel: str) -> tuple[FileEntry, str | None]:
        async with file_slots:
            return await _upload_file(
                s3, settings, window, ref, rel, directory / rel, events, signing is not None
            )

    async with open_s3(settings) as s3:
        await s3.require_bucket(ref.bucket)
        total_bytes = sum(size_bytes for _, size_bytes in files)
        events.planned(len(files), total_bytes, total_bytes)
        with first_error():
            async with asyncio.TaskGroup() as tg:
                tasks = [tg.create_task(upload(rel)) for rel, _ in files]
        entries = [t.result()[0] for t in tasks]
        signature_key = None
        if signing is not None and signer is not None:
            sha256s = [(entry.path, sha256 or "") for entry, sha256 in (t.result() for t in tasks)]
            entry = await _upload_signature(s3, ref, signing.signature_name, signer, sha256s)
            signature_key = ref.prefix + entry.path
            entries.append(entry)
        await s3.put_bytes(ref.bucket, ref.prefix + MANIFEST_NAME, render_manifest(entries))
    return UploadResult(
        files=len(entries), total_bytes=sum(e.size_bytes for e in entries), signature_key=signature_key
    )


async def _upload_signature(
    s3: S3, ref: ModelRef, name: str, signer: Signer, sha256s: list[tuple[str, str]]
) -> FileEntry:
    """Sign the uploaded files' digests and upload the bundle as `name`; its manifest entry."""
    model_name = ref.prefix.rstrip("/").rpartition("/")[2]
    # Ignored by verifiers that hash a downloaded prefix: the bundle itself and our manifest.
    bundle = await asyncio.to_thread(signer.sign, model_name, sha256s, (name, MANIFEST_NAME))
    etag = await s3.put_bytes(ref.bucket, ref.prefix + name, bundle)
    return FileEntry(path=name, size_bytes=len(bundle), xxh3_128=xxh3_of(bundle), etag=etag)


async def _upload_file(
    s3: S3,
    settings: Settings,
    window: asyncio.Semaphore,
    ref: ModelRef,
    rel: str,
    path: Path,
    events: PullEvents,
    sha256: bool = False,
) -> tuple[FileEntry, str | None]:
    """Upload one file; its manifest entry and, when asked, its SHA-256 from the same hashing pass."""
    key = ref.prefix + rel
    with model_files.ReadOnlyFile(path) as file:
        size = file.size_bytes
        digest = await asyncio.to_thread(hash_fd, file.fd, size, None, sha256)
        parts = plan_parts(size, max(settings.part_size_bytes, MIN_UPLOAD_PART_BYTES))
        if len(parts) <= 1:
            async with window:
                data = await asyncio.to_thread(file.read, 0, size)
                etag = await s3.put_bytes(ref.bucket, key, data)
            events.fetched(size)
        else:
            etag = await _multipart(s3, window, ref.bucket, key, file, parts, events)
    return FileEntry(path=rel, size_bytes=size, xxh3_128=digest.xxh3_128, etag=etag), digest.sha256


async def _multipart(
    s3: S3,
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
