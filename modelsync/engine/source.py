"""What a source holds now: its files from the manifest (with digests) or, failing that, a listing.

A prefix without a manifest is taken from its listing only when it is a whole
model (core/completeness.py): no publish in progress there, a policy that does
not require a manifest, and every shard its shard index names. A pull, a
refresh check and `verify --remote` all ask here, so they agree on what the
source is.
"""

from __future__ import annotations

from modelsync.core.completeness import (
    ManifestMode,
    check_shards_listed,
    check_unmanifested,
    shard_indexes,
)
from modelsync.core.keys import safe_relative_path
from modelsync.core.manifest import MANIFEST_NAME, parse_manifest
from modelsync.core.parts import RemoteFile
from modelsync.core.refs import ModelRef
from modelsync.core.safetensors import index_shards
from modelsync.engine.ports import ObjectStore
from modelsync.errors import NotFoundError


async def source_files(store: ObjectStore, ref: ModelRef, manifest_mode: ManifestMode) -> list[RemoteFile]:
    """The model's files as the source vouches for them; IncompleteModelError when it is not a whole model."""
    data = await store.get_manifest(ref, MANIFEST_NAME)
    if data is None:
        listing = await store.list_model(ref)
        keys = {o.key for o in listing}
        check_unmanifested(ref, keys, manifest_mode)
        files = [_remote(ref, o.key, o.size_bytes, o.etag) for o in listing if not o.key.endswith("/")]
        paths = {f.path for f in files}
        for index in shard_indexes(paths):
            text = await store.get_manifest(ref, index)
            if text is not None:  # gone since the listing: the pull finds out as it fetches it
                check_shards_listed(ref, index, index_shards(index, text), paths)
        return files
    manifest = parse_manifest(data, f"{ref.uri}{MANIFEST_NAME}")
    etags = {}
    if any(f.etag is None for f in manifest.files):
        etags = {o.key: o.etag for o in await store.list_model(ref)}
    files = []
    for f in manifest.files:
        key = ref.prefix + f.path
        etag = f.etag or etags.get(key)
        if etag is None:
            raise NotFoundError(
                f"not found: s3://{ref.bucket}/{key} is in the manifest but not in the bucket; "
                "republish the model"
            )
        files.append(RemoteFile(key, f.path, f.size_bytes, etag, f.xxh3_128))
    return files


def _remote(ref: ModelRef, key: str, size_bytes: int, etag: str) -> RemoteFile:
    path = ref.relative_key(key)
    safe_relative_path(path)
    return RemoteFile(key, path, size_bytes, etag)
