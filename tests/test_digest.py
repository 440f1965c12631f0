"""The prefix hasher: the digests of a file fed in uneven prefixes are those of its bytes in one go."""

from __future__ import annotations

import hashlib
import mmap
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import xxhash

from modelsync.adapters import page_cache
from modelsync.adapters.digest import MAP_BYTES, READ_BYTES, WINDOW_BYTES, PrefixHasher, hash_fd

MiB = 1024 * 1024

#: sizes around the read and window edges, and a file of several windows
SIZES = [
    0,
    1,
    READ_BYTES - 1,
    READ_BYTES + 1,
    WINDOW_BYTES,
    WINDOW_BYTES + 3 * READ_BYTES + 7,
    2 * WINDOW_BYTES + 5,
]


def _file(tmp_path: Path, size_bytes: int) -> tuple[int, bytes]:
    data = os.urandom(size_bytes)
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    return os.open(path, os.O_RDONLY), data


def _md5s(data: bytes, part_bytes: int) -> tuple[bytes, ...]:
    parts = [data[i : i + part_bytes] for i in range(0, len(data), part_bytes)] or [b""]
    return tuple(hashlib.md5(p).digest() for p in parts)


#: how each prefix is fed: read into a buffer, mapped, or the two in turn (a transfer's buffers
#: and the read back of a pull alternate so)
FEEDS = {
    "read": lambda h, fd, end, _i: h.feed(fd, end),
    "mapped": lambda h, fd, end, _i: h.feed_mapped(fd, end),
    "both": lambda h, fd, end, i: (h.feed if i % 2 else h.feed_mapped)(fd, end),
}


@pytest.mark.parametrize("how", sorted(FEEDS))
@pytest.mark.parametrize("size_bytes", SIZES)
def test_prefix_hasher_fed_in_uneven_prefixes_gives_the_whole_file_digests(
    tmp_path: Path, size_bytes: int, how: str
) -> None:
    fd, data = _file(tmp_path, size_bytes)
    md5_part_bytes = 5 * MiB + 3  # straddles reads, windows and mappings
    try:
        hasher = PrefixHasher(size_bytes, md5_part_bytes, sha256=True)
        ends = (size_bytes // 7, size_bytes // 3 + 1, size_bytes // 3 + 1, size_bytes - 1, size_bytes)
        for i, end in enumerate(ends):  # prefixes that end mid-page, so mappings start mid-page
            FEEDS[how](hasher, fd, end, i)
        got = hasher.digest()
    finally:
        os.close(fd)
    assert got.xxh3_128 == xxhash.xxh3_128_hexdigest(data)
    assert got.sha256 == hashlib.sha256(data).hexdigest()
    assert got.part_md5s == _md5s(data, md5_part_bytes)


def test_unsigned_hashing_computes_no_sha256_and_no_md5(tmp_path: Path) -> None:
    fd, data = _file(tmp_path, WINDOW_BYTES + 1)
    try:
        got = hash_fd(fd, len(data))
    finally:
        os.close(fd)
    assert got.xxh3_128 == xxhash.xxh3_128_hexdigest(data)
    assert got.sha256 is None
    assert got.part_md5s == ()



def test_a_read_back_that_cannot_map_reads_instead(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without libc (or with a mapping refused), `feed_mapped` reads the bytes the way `feed` does."""
    monkeypatch.setattr(page_cache, "_libc", lambda: None)
    fd, data = _file(tmp_path, 2 * MAP_BYTES + 5)
    read_bytes: list[int] = []
    read = os.preadv

    def counting_read(f: int, bufs: list[memoryview], at: int) -> int:
        read_bytes.append(read(f, bufs, at))
        return read_bytes[-1]

    monkeypatch.setattr(os, "preadv", counting_read)
    try:
        hasher = PrefixHasher(len(data))
        hasher.feed_mapped(fd, MAP_BYTES + 1)
        hasher.feed_mapped(fd, len(data))
        got = hasher.digest()
    finally:
        os.close(fd)
    assert got.xxh3_128 == xxhash.xxh3_128_hexdigest(data)
    assert sum(read_bytes) == len(data)  # every byte read, once


def test_a_read_back_past_the_end_of_a_short_file_says_where_it_ends(tmp_path: Path) -> None:
    """A staging file shorter than what its journal claimed landed: the read back raises, as `feed`
    does, instead of mapping pages past the end (SIGBUS would kill the pull)."""
    fd, data = _file(tmp_path, MAP_BYTES + 100)
    try:
        hasher = PrefixHasher(2 * MAP_BYTES)
        with pytest.raises(ValueError, match=f"file ends at {len(data)}"):
            hasher.feed_mapped(fd, 2 * MAP_BYTES)
    finally:
        os.close(fd)


def test_a_mapped_view_is_read_only_and_gone_after_its_block(tmp_path: Path) -> None:
    fd, data = _file(tmp_path, 3 * mmap.PAGESIZE)
    try:
        with page_cache.mapped(fd, mmap.PAGESIZE, 2 * mmap.PAGESIZE) as view:
            assert view is not None and view.readonly
            assert bytes(view) == data[mmap.PAGESIZE :]
        with pytest.raises(ValueError, match="released"):
            bytes(view)
    finally:
        os.close(fd)


def _resident_bytes(path: Path) -> int:
    """Bytes of the file in the page cache, as util-linux's fincore sees them."""
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", str(path)],
                         check=True, capture_output=True, text=True).stdout
    return int(out.strip())


@pytest.mark.skipif(shutil.which("fincore") is None, reason="fincore (util-linux) is not installed")
def test_hashing_a_whole_file_leaves_the_page_cache_as_it_found_it(tmp_path: Path) -> None:
    path = tmp_path / "shard.bin"
    mib = 1024 * 1024
    data = os.urandom(4 * WINDOW_BYTES + 3 * mib)
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        if _resident_bytes(path) != 0:
            pytest.skip("this file system keeps the file cached whatever it is told (tmpfs?)")
        os.pread(fd, 2 * mib, WINDOW_BYTES + mib)  # what a reader had loaded before the verify
        loaded = _resident_bytes(path)
        assert loaded >= 2 * mib
        assert hash_fd(fd, len(data)).xxh3_128 == xxhash.xxh3_128(data).hexdigest()
        assert _resident_bytes(path) == loaded, "what was cached stays, what the hash read goes"
    finally:
        os.close(fd)
