"""The benchmark's data sets: their shapes, one-time generation, manifests and checks.

Each data set is one bucket holding one model prefix, laid out as nginx serves it:
`<data root>/<bucket>/<prefix>/<file>`. Contents are random but cheap to make: one
64 MiB block from os.urandom, passed through a different byte permutation for every
64 MiB block of every file, so no two blocks are alike (a later dedup cannot flatter
anyone) while generation runs near memory speed.

Shards and their index are valid safetensors (a real header, one U8 tensor filling the
shard; an index whose total_size adds up), since every pull scrubs their headers.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import xxhash

from bench.nginx import nginx_etag
from modelsync.core.manifest import MANIFEST_NAME, FileEntry, render_manifest
from modelsync.core.safetensors import INDEX_NAME, is_safetensors

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
BLOCK = 64 * MiB
PREFIX = "model"
_MARKER = ".complete.json"
#: bumped when generated contents change shape, so older sets are made again
_LAYOUT = 2

# The small files of a Hugging Face style model, smallest first (sizes run 1 KiB .. 5 MiB).
_MODEL_SIDE_FILES = (
    "added_tokens.json", "special_tokens_map.json", "generation_config.json", "config.json",
    "preprocessor_config.json", "processor_config.json", "params.json", "chat_template.jinja",
    "NOTICE", "USE_POLICY.md", "LICENSE", "README.md", "tokenizer_config.json",
    "model.safetensors.index.json", "merges.txt", "vocab.json", "tokenizer.model",
    "sentencepiece.bpe.model", "spiece.model", "tokenizer.json",
)


@dataclass(frozen=True, slots=True)
class DataSet:
    """One bucket with one model prefix; `files` are (relative path, size)."""

    name: str
    files: tuple[tuple[str, int], ...]
    #: False for a model as other tools upload it: no manifest, so a pull lists the prefix
    manifest: bool = True

    @property
    def bucket(self) -> str:
        return self.name

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{PREFIX}/"

    @property
    def total_bytes(self) -> int:
        return sum(size for _, size in self.files)

    @property
    def count(self) -> int:
        return len(self.files)

    def model_dir(self, data_root: Path) -> Path:
        return data_root / self.bucket / PREFIX


def datasets(small: bool) -> dict[str, DataSet]:
    """The throughput sets, a 64 MiB model for the cold start (with a manifest, and without one as
    other tools upload it) and a 100-file one for the warm pull."""
    side = tuple(
        (name, round(KiB * (5 * 1024) ** (i / (len(_MODEL_SIDE_FILES) - 1))))
        for i, name in enumerate(_MODEL_SIDE_FILES)
    )
    shard = 8 * MiB if small else 512 * MiB
    shards = tuple((f"model-{i:05d}-of-00008.safetensors", shard) for i in range(1, 9))
    # 12 x 512 MiB: past this machine's dirty-page limits (24 GiB RAM, dirty_ratio 20 % of
    # what is available), as every real model is; below them "to disk" measures the page cache.
    shards_12 = tuple((f"model-{i:05d}-of-00012.safetensors", shard) for i in range(1, 13))
    n_small = 200 if small else 2000
    cold = (("config.json", 4 * KiB), ("model.safetensors", 8 * MiB if small else 64 * MiB))
    return {
        "object-4g": DataSet("object-4g", (("object.bin", 64 * MiB if small else 4 * GiB),)),
        "model-set": DataSet("model-set", shards + side),
        "model-set-6g": DataSet("model-set-6g", shards_12 + side),
        "cold-64m": DataSet("cold-64m", cold),
        "cold-64m-bare": DataSet("cold-64m-bare", cold, manifest=False),
        "small-files": DataSet(
            "small-files", tuple((f"file-{i:05d}.bin", 64 * KiB) for i in range(n_small))
        ),
        "warm-100": DataSet("warm-100", tuple((f"file-{i:03d}.bin", 64 * KiB) for i in range(100))),
    }


@dataclass(frozen=True, slots=True)
class Prepared:
    """A data set on disk with the digests of its files (the manifest's entries)."""

    dataset: DataSet
    entries: tuple[FileEntry, ...]


def missing_bytes(ds: DataSet, data_root: Path) -> int:
    """Bytes that `prepare` would have to write (0 when the set is already complete)."""
    return 0 if _load_marker(ds, data_root) is not None else ds.total_bytes


def prepare(ds: DataSet, data_root: Path, log: Callable[[str], None] = print) -> Prepared:
    """Reuse a complete set, else (re)generate it; then write its manifest with current ETags.

    The manifest is re-rendered on every run because nginx's ETag carries the mtime, which a
    copy of the cache folder would change; the digests come from the completion marker.
    """
    digests = _load_marker(ds, data_root)
    if digests is None:
        log(f"generating {ds.name}: {ds.count} files, {ds.total_bytes / GiB:.2f} GiB ...")
        digests = _generate(ds, data_root)
        _write_marker(ds, data_root, digests)
    model_dir = ds.model_dir(data_root)
    entries = tuple(
        FileEntry(path=p, size_bytes=s, xxh3_128=digests[p], etag=nginx_etag((model_dir / p).stat()))
        for p, s in ds.files
    )
    target = model_dir / MANIFEST_NAME
    if not ds.manifest:
        target.unlink(missing_ok=True)
        return Prepared(ds, entries)
    manifest = render_manifest(entries)
    if not target.exists() or target.read_bytes() != manifest:
        target.write_bytes(manifest)
    return Prepared(ds, entries)


def link_subset(src: DataSet, name: str, paths: list[str], data_root: Path) -> DataSet:
    """A new data set (bucket `name`) of some of `src`'s files, hard-linked, not copied.

    Why links: a second copy of gigabytes would cost disk and, worse, page cache on a
    shared machine. A link keeps the mtime, so nginx serves the same ETag, and the
    digests come from `src`'s marker; call `prepare` on the result for its manifest.
    `src` must be prepared first.
    """
    digests = _load_marker(src, data_root)
    if digests is None:
        raise ValueError(f"{src.name} is not generated in {data_root}")
    sizes = dict(src.files)
    ds = DataSet(name, tuple((p, sizes[p]) for p in paths))
    if _load_marker(ds, data_root) is None:
        shutil.rmtree(data_root / ds.bucket, ignore_errors=True)
        ds.model_dir(data_root).mkdir(parents=True)
        for path in paths:
            os.link(src.model_dir(data_root) / path, ds.model_dir(data_root) / path)
        _write_marker(ds, data_root, {p: digests[p] for p in paths})
    return ds


def _write_marker(ds: DataSet, data_root: Path, digests: dict[str, str]) -> None:
    marker = {"layout": _LAYOUT, "files": [[p, s] for p, s in ds.files], "xxh3_128": digests}
    (data_root / f"{ds.name}{_MARKER}").write_text(json.dumps(marker))


def _load_marker(ds: DataSet, data_root: Path) -> dict[str, str] | None:
    marker = data_root / f"{ds.name}{_MARKER}"
    try:
        doc = json.loads(marker.read_text())
    except (OSError, ValueError):
        return None
    if doc.get("layout") != _LAYOUT or [tuple(f) for f in doc.get("files", [])] != list(ds.files):
        return None
    model_dir = ds.model_dir(data_root)
    for path, size in ds.files:
        try:
            if (model_dir / path).stat().st_size != size:
                return None
        except OSError:
            return None
    digests: dict[str, str] = doc["xxh3_128"]
    return digests


def _generate(ds: DataSet, data_root: Path) -> dict[str, str]:
    (data_root / f"{ds.name}{_MARKER}").unlink(missing_ok=True)
    shutil.rmtree(data_root / ds.bucket, ignore_errors=True)
    model_dir = ds.model_dir(data_root)
    model_dir.mkdir(parents=True)
    base = os.urandom(BLOCK)
    digests: dict[str, str] = {}
    heads = _safetensors_heads(ds.files)
    for index, (path, size) in enumerate(ds.files):
        rng = random.Random(f"{ds.name}/{index}")
        hasher = xxhash.xxh3_128()
        with open(model_dir / path, "wb") as f:
            head = heads.get(path, b"")[:size]
            f.write(head)
            hasher.update(head)
            left = size - len(head)
            while left:
                n = min(left, BLOCK)
                start = rng.randrange(BLOCK - n + 1)
                table = list(range(256))
                rng.shuffle(table)
                chunk = base[start : start + n].translate(bytes(table))
                hasher.update(chunk)
                f.write(chunk)
                left -= n
        digests[path] = hasher.hexdigest()
    return digests


def _safetensors_heads(files: tuple[tuple[str, int], ...]) -> dict[str, bytes]:
    """The leading bytes that make shards valid safetensors and the index valid JSON
    (padded with spaces to its size), by path; the rest of each file stays random."""
    heads: dict[str, bytes] = {}
    weight_map: dict[str, str] = {}
    total = 0
    for path, size in files:
        if not is_safetensors(path):
            continue
        name, header, previous = f"weight-{len(weight_map)}", b"", None
        while header != previous:  # the tensor's length depends on the header's, and back
            previous, n_bytes = header, size - 8 - len(header)
            text = json.dumps({name: {"dtype": "U8", "shape": [n_bytes], "data_offsets": [0, n_bytes]}})
            header = text.encode() + b" " * (-len(text) % 8)
        heads[path] = struct.pack("<Q", len(header)) + header
        weight_map[name] = path
        total += size - 8 - len(header)
    for path, size in files:
        if path.rpartition("/")[2] == INDEX_NAME:
            index = json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}).encode()
            heads[path] = index + b" " * max(0, size - len(index))
    return heads


def hash_file(path: Path, buf: bytearray) -> str:
    """xxh3-128 of a file, read in len(buf)-sized blocks into one reused buffer."""
    hasher = xxhash.xxh3_128()
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(view):
            hasher.update(view[:n])
    return hasher.hexdigest()


def check_files(root: Path, entries: tuple[FileEntry, ...], *, full: bool) -> str | None:
    """None if every entry is under `root` with its size (and digest when `full`), else why not."""
    buf = bytearray(BLOCK) if full else bytearray()
    for e in entries:
        path = root / e.path
        try:
            size = path.stat().st_size
        except OSError:
            return f"missing {path}"
        if size != e.size_bytes:
            return f"{path}: {size} bytes, expected {e.size_bytes}"
        if full and hash_file(path, buf) != e.xxh3_128:
            return f"{path}: xxh3-128 mismatch"
    return None


def warm_page_cache(ds: DataSet, data_root: Path) -> None:
    """Read the source once so every contender is served from the page cache, as nginx would."""
    buf = memoryview(bytearray(BLOCK))
    for path, _ in ds.files:
        with open(ds.model_dir(data_root) / path, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass


def signed_copy(src: DataSet, name: str, data_root: Path) -> tuple[DataSet, Path]:
    """`src` hard-linked into bucket `name` with an OpenSSF signature (`model.sig`) over its
    files, and the public key that verifies it; made once, then reused.

    Signing hashes every file with SHA-256 once, here, outside any measured run.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    from modelsync.adapters.oms import Signer
    from modelsync.core.signature import DEFAULT_SIGNATURE_NAME as SIG

    digests = _load_marker(src, data_root)
    if digests is None:
        raise ValueError(f"{src.name} is not generated in {data_root}")
    model_dir = data_root / name / PREFIX
    private, public = data_root / f"{name}.key.pem", data_root / f"{name}.pub.pem"
    sig = model_dir / SIG
    if sig.exists() and public.exists():
        ds = DataSet(name, (*src.files, (SIG, sig.stat().st_size)))
        if _load_marker(ds, data_root) is not None:
            return ds, public
    shutil.rmtree(data_root / name, ignore_errors=True)
    model_dir.mkdir(parents=True)
    for path, _size in src.files:
        (model_dir / path).parent.mkdir(parents=True, exist_ok=True)
        os.link(src.model_dir(data_root) / path, model_dir / path)
    key = ec.generate_private_key(ec.SECP256R1())
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    sha256s = []
    for path, _size in src.files:
        with open(model_dir / path, "rb") as f:
            sha256s.append((path, hashlib.file_digest(f, "sha256").hexdigest()))
    bundle = Signer(private).sign(PREFIX, sha256s, (SIG, MANIFEST_NAME))
    sig.write_bytes(bundle)
    ds = DataSet(name, (*src.files, (SIG, len(bundle))))
    _write_marker(ds, data_root, {**digests, SIG: xxhash.xxh3_128_hexdigest(bundle)})
    return ds, public
