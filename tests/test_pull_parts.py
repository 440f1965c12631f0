"""The pull's bookkeeping classes on their own: the presigned URLs and the verification ledger.

The flows that use them (expiry mid-pull, resume, dedup) are tested end to end in
test_engine_flow.py, test_pull_faults.py and test_pull_under_load.py; these pin the
rules each class keeps, without a pull around them.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import xxhash

from modelsync.adapters.cache import Journal, JournalState
from modelsync.adapters.digest import FileDigest
from modelsync.core.parts import RemoteFile
from modelsync.core.refs import parse_source
from modelsync.engine.dedup import Linked
from modelsync.engine.ledger import VerificationLedger
from modelsync.engine.presigned import PresignedUrls
from modelsync.errors import ChecksumMismatchError

REF = parse_source("s3://models/org/m/")
F = RemoteFile("org/m/a.bin", "a.bin", 3, "etag-a", xxhash.xxh3_128_hexdigest(b"abc"))


class _Signer:
    """A store that signs SigV4-looking URLs at a given time, and counts what it is asked."""

    def __init__(self) -> None:
        self.signed_at = time.time()
        self.presigned = 0
        self.renewals = 0

    async def presign_get(self, bucket: str, key: str, expiry_s: float) -> str:
        self.presigned += 1
        date = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(self.signed_at))
        return f"https://s/{bucket}/{key}?X-Amz-Date={date}&X-Amz-Expires={int(expiry_s)}&n={self.presigned}"

    async def renew_credentials(self) -> None:
        self.renewals += 1
        await asyncio.sleep(0)


def test_a_url_is_kept_until_half_its_lifetime_is_gone_then_signed_again() -> None:
    async def scenario() -> None:
        store = _Signer()
        urls = PresignedUrls(store, "b", 900.0)  # type: ignore[arg-type]
        first = await urls.get(F)
        assert await urls.get(F) == first and store.presigned == 1
        store.signed_at -= 500  # the next URL is signed as if 500 s ago: past half of 900 s
        urls.forget(F)
        old = await urls.get(F)
        assert old != first
        assert await urls.get(F) != old, "a URL past half its lifetime is signed again"

    asyncio.run(scenario())


def test_a_burst_of_expired_tokens_resolves_the_credentials_once() -> None:
    async def scenario() -> None:
        store = _Signer()
        urls = PresignedUrls(store, "b", 900.0)  # type: ignore[arg-type]
        url = await urls.get(F)
        generation = urls.generation
        await asyncio.gather(*(urls.renew(F, url, generation, token_expired=True) for _ in range(5)))
        assert store.renewals == 1 and urls.generation == generation + 1
        assert await urls.get(F) != url, "the expired URL is not handed out again"

    asyncio.run(scenario())


def _journal(tmp_path: Path) -> Journal:
    journal = Journal(tmp_path / "m.journal", REF.uri)
    journal.start(keep=False)
    return journal


def test_the_ledger_keeps_only_what_was_verified_of_objects_that_did_not_change(tmp_path: Path) -> None:
    ledger = VerificationLedger(_journal(tmp_path))
    b = RemoteFile("org/m/b.bin", "b.bin", 3, "etag-b2")
    state = JournalState(
        files={"a.bin": ("etag-a", 3, 3), "b.bin": ("etag-b1", 3, 3)},
        verified={"a.bin": (F.xxh3_128 or "", "manifest"), "b.bin": ("x", "md5")},
        sha256s={"a.bin": "s-a", "b.bin": "s-b"},
    )
    ledger.resume(state, [F, b])
    assert "a.bin" in ledger and "b.bin" not in ledger, "b.bin changed since it was verified"
    assert ledger.sha256s == {"a.bin": "s-a"}
    ledger.linked({"b.bin": Linked("x2", "md5")})
    assert "b.bin" in ledger


def test_the_ledger_refuses_a_mismatch_and_a_record_of_an_unverified_file(tmp_path: Path) -> None:
    ledger = VerificationLedger(_journal(tmp_path))
    with pytest.raises(ChecksumMismatchError):
        ledger.accept(F, FileDigest("0" * 32), None)
    assert "a.bin" not in ledger
    with pytest.raises(KeyError):
        ledger.record(REF, [F], None)
    ledger.accept(F, FileDigest(F.xxh3_128 or "", sha256="s"), None)
    record = ledger.record(REF, ledger.fetched([]), None)
    assert record.files == () and ledger.sha256s == {"a.bin": "s"}
    (entry,) = ledger.record(REF, [F], "key k").files
    assert (entry.path, entry.xxh3_128, entry.etag) == ("a.bin", F.xxh3_128, "etag-a")
