"""Dedup: a file the cache already holds with the same content is hard-linked, not fetched.

Revisions of a model share most of their files (a new config.json, the same
weights); linking them costs no bandwidth and no space, and the eviction
accounting counts each inode once (core/eviction.py).
"""

from __future__ import annotations

from typing import NamedTuple

from modelsync.adapters.cache import Cache, JournalState, Staging
from modelsync.core.etag import EtagKind, etag_kind
from modelsync.core.parts import PullPlan, layout_bytes
from modelsync.core.refs import parse_model_name
from modelsync.engine.catalog import Catalog


class Linked(NamedTuple):
    """A file staged by a hard link to a cached copy, verified by what proved the copy the same."""

    xxh3_128: str
    verified_by: str


def link_copies(
    cache: Cache, catalog: Catalog, staging: Staging, plan: PullPlan, state: JournalState
) -> dict[str, Linked]:
    """Hard-link the files of `plan` the cache holds with the same content, and journal them verified.

    Same content means same size and xxh3-128 (manifest), or same size and an
    ETag that is an MD5 of the bytes; an opaque ETag proves nothing across keys.
    Files the journal already started, and empty files, are left to the fetch.
    Returns the linked files by path.
    """
    linked: dict[str, Linked] = {}
    for work in plan.files:
        f = work.file
        if f.path in state.files or f.size_bytes == 0:
            continue
        proving_etag = None if etag_kind(f.etag) is EtagKind.OPAQUE else f.etag
        for copy in catalog.index.find_copy(f.size_bytes, f.xxh3_128, proving_etag):
            source = parse_model_name(copy.model).cache_path / copy.path
            if not staging.link_from(cache.root, source, (copy.dev, copy.ino), f.path):
                continue
            by = "manifest" if f.xxh3_128 is not None else etag_kind(f.etag).value
            staging.journal.begin_file(f.path, f.etag, f.size_bytes, layout_bytes(work.parts))
            staging.journal.file_verified(f.path, copy.xxh3_128, by, f.size_bytes)
            linked[f.path] = Linked(copy.xxh3_128, by)
            break
    return linked
