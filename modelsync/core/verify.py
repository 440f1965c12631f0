"""What a pulled file's digest must match, and whether a ready revision is still the source's.

Pure: the engine hashes the bytes (adapters/digest.py) and asks here whether
they are what the source vouches for: the manifest's xxh3-128, else an ETag
that is an MD5 (whole or multipart), else only the size.
"""

from __future__ import annotations

from collections.abc import Sequence

from modelsync.core.etag import EtagKind, etag_kind, multipart_count, multipart_etag, part_size_fits
from modelsync.core.parts import FileWork, RemoteFile, layout_bytes, plan_parts
from modelsync.core.record import CompletionRecord
from modelsync.errors import ChecksumMismatchError, SizeMismatchError

EMPTY_MD5 = "d41d8cd98f00b204e9800998ecf8427e"


def needs_first_part(f: RemoteFile) -> bool:
    """Whether checking `f` by its ETag needs the size of its first uploaded part (multipart)."""
    return f.xxh3_128 is None and f.size_bytes > 0 and etag_kind(f.etag) is EtagKind.MULTIPART


def md5_part_bytes(f: RemoteFile, first_part_bytes: int | None = None) -> int | None:
    """How to slice `f` for an ETag check, or None when its ETag proves nothing (or the manifest does).

    `first_part_bytes` is the store's size of part 1, asked for only when
    `needs_first_part(f)`; a size that cannot have made the ETag's part count proves nothing.
    """
    if f.xxh3_128 is not None or f.size_bytes == 0:
        return None
    kind = etag_kind(f.etag)
    if kind is EtagKind.MD5:
        return f.size_bytes
    if kind is not EtagKind.MULTIPART or not first_part_bytes:
        return None
    fits = part_size_fits(f.size_bytes, first_part_bytes, multipart_count(f.etag))
    return first_part_bytes if fits else None


def check_file(f: RemoteFile, xxh3_128: str, part_md5s: Sequence[bytes], md5_part_bytes: int | None) -> str:
    """Compare a file's digests with what the source vouches for; how it was verified.

    Raises ChecksumMismatchError when they differ.
    """
    if f.xxh3_128 is not None:
        if xxh3_128 != f.xxh3_128:
            raise _mismatch(f, f"xxh3-128 {xxh3_128}, manifest says {f.xxh3_128}")
        return "manifest"
    kind = etag_kind(f.etag)
    if f.size_bytes == 0 and kind is EtagKind.MD5:
        if f.etag != EMPTY_MD5:
            raise _mismatch(f, f"empty file, ETag {f.etag}")
        return str(kind.value)
    if md5_part_bytes is None:
        return "size"
    got = part_md5s[0].hex() if kind is EtagKind.MD5 else multipart_etag(part_md5s)
    if got != f.etag:
        raise _mismatch(f, f"computed ETag {got}, server says {f.etag}")
    return str(kind.value)


def misstated_size(uri: str, f: RemoteFile, store_bytes: int | None) -> SizeMismatchError:
    """The error for a file the store holds at another size than the manifest (or listing) says.

    `store_bytes` is the size the store's answer stated; None when only the ETag
    showed it (an "empty" file whose ETag is not an empty object's).
    """
    held = f"{store_bytes} bytes" if store_bytes is not None else f"a non-empty object (ETag {f.etag})"
    said = "manifest" if f.xxh3_128 is not None else "listing"
    return SizeMismatchError(
        f"{uri}: the store holds {held}, but the {said} says {f.size_bytes} bytes; the manifest "
        "does not match the store: republish the model (modelsync publish)",
        store_bytes=store_bytes,
    )


def empty_but_etag_says_not(f: RemoteFile) -> bool:
    """Whether `f` is listed as empty while its ETag is the MD5 of some bytes: no GET would tell."""
    return f.size_bytes == 0 and etag_kind(f.etag) is EtagKind.MD5 and f.etag != EMPTY_MD5


def _mismatch(f: RemoteFile, detail: str) -> ChecksumMismatchError:
    return ChecksumMismatchError(f"checksum mismatch for {f.key} ({detail})")


#: fetches of one file whose bytes fail their check before a pull gives up on it
CORRUPT_FETCHES = 3


def after_corrupt_fetch(error: ChecksumMismatchError, digests: Sequence[str]) -> ChecksumMismatchError | None:
    """After a fetch of a file failed its check: None to fetch it again, else the error to stop with.

    `digests` are the xxh3-128 of each failed fetch so far, in order. The same
    wrong bytes twice are what the store holds: its object (or the manifest that
    vouches for it) is wrong, and only republishing mends it. Wrong bytes that
    differ every time were damaged on the way (a network path, a proxy, a NIC);
    the store may well be fine, and republishing would not help.
    """
    fetches = len(digests)
    if fetches >= 2 and digests[-1] in digests[:-1]:
        return ChecksumMismatchError(
            f"{error}: the store served the same wrong bytes in {fetches} fetches, so its object "
            "or the manifest is wrong; republish the model"
        )
    if fetches >= CORRUPT_FETCHES:
        return ChecksumMismatchError(
            f"{error}: {fetches} fetches each brought different wrong bytes, so they were damaged "
            "on the way (network, proxy, NIC), not in the store; check the path to the store and "
            "run the pull again"
        )
    return None


def unchanged(record: CompletionRecord, files: Sequence[RemoteFile]) -> bool:
    """Whether the source still holds exactly the objects the ready revision was made from."""
    have = {(f.path, f.size_bytes, f.etag) for f in record.files}
    return have == {(f.path, f.size_bytes, f.etag) for f in files}


def restart(work: FileWork, f: RemoteFile) -> FileWork:
    """The same file (or its new version `f`), all parts missing again, for its one fresh try."""
    return FileWork(file=f, parts=plan_parts(f.size_bytes, layout_bytes(work.parts)), done=frozenset())
