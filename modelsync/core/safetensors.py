"""A format-aware scrub of safetensors files and their shard index: headers only, never tensor bytes.

xxh3 and signatures prove a file is the one that was published; they cannot tell
that what was published is broken (a shard truncated at a tensor boundary with a
manifest made to match, a garbled header). vLLM finds those at load, as a crash.
These checks find them before a model is served, from the header alone:

    [8 bytes: N, little-endian u64][N bytes: JSON header][data section]

- N is sane and the header is a JSON object of tensors
  `{"name": {"dtype": "BF16", "shape": [4096, 4096], "data_offsets": [begin, end]}}`
  (plus an optional `__metadata__` of strings);
- each tensor's span is exactly `numel × dtype bits / 8` bytes;
- sorted by offset, the spans tile the data section: contiguous from 0, ending
  exactly at the file's size.

`model.safetensors.index.json` must name only shards the model has, map each
tensor to a shard that holds it, and its `metadata.total_size` must equal the
shards' tensor bytes. Every problem is a `MalformedModelError` naming the file
and, where there is one, the tensor.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import NamedTuple

from modelsync.errors import MalformedModelError

SUFFIX = ".safetensors"
INDEX_NAME = "model.safetensors.index.json"
#: bytes of the length prefix
PREFIX_BYTES = 8
#: the safetensors library refuses larger headers; so do we, before reading one
MAX_HEADER_BYTES = 100 * 1024 * 1024
#: an index larger than this is refused before parsing
MAX_INDEX_BYTES = 64 * 1024 * 1024

#: bits per element of every dtype the format defines
DTYPE_BITS: Mapping[str, int] = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "I64": 64,
    "U64": 64,
    "F64": 64,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "C64": 64,
}


class Header(NamedTuple):
    """What the scrub learned from one file's header."""

    tensors: frozenset[str]
    #: the size of the data section: the sum of the tensors' spans
    data_bytes: int


def is_safetensors(path: str) -> bool:
    return path.endswith(SUFFIX)


def header_length(path: str, prefix: bytes, file_bytes: int) -> int:
    """N from the first 8 bytes, checked against the file's size and the format's limit."""
    if file_bytes < PREFIX_BYTES or len(prefix) < PREFIX_BYTES:
        raise MalformedModelError(f"{path}: {file_bytes} bytes, too short for a safetensors header")
    length = int.from_bytes(prefix[:PREFIX_BYTES], "little")
    if length > MAX_HEADER_BYTES:
        raise MalformedModelError(f"{path}: header length {length} exceeds {MAX_HEADER_BYTES} bytes")
    if PREFIX_BYTES + length > file_bytes:
        raise MalformedModelError(
            f"{path}: header length {length} runs past the end of the file ({file_bytes} bytes)"
        )
    return length


def parse_header(path: str, header: bytes, file_bytes: int) -> Header:
    """Check one header against the file's size; the first problem raises, naming the tensor."""
    try:
        doc = json.loads(header)
    except (ValueError, UnicodeDecodeError) as exc:
        raise MalformedModelError(f"{path}: header is not valid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise MalformedModelError(f"{path}: header is not a JSON object")
    data_bytes = file_bytes - PREFIX_BYTES - len(header)
    spans = []
    for name, entry in doc.items():
        if name == "__metadata__":
            _check_metadata(path, entry)
            continue
        begin, end = _span(path, name, entry)
        spans.append((begin, end, name))
    spans.sort()
    position = 0
    for begin, end, name in spans:
        if begin != position:
            what = "overlaps the tensor before it" if begin < position else "leaves a gap before it"
            raise MalformedModelError(
                f"{path}: tensor {name!r} at offset {begin} {what} (expected {position})"
            )
        position = end
    if position != data_bytes:
        last = f"after tensor {spans[-1][2]!r} " if spans else ""
        raise MalformedModelError(
            f"{path}: tensors end at data offset {position} {last}but the data section holds "
            f"{data_bytes} bytes (truncated or padded file)"
        )
    return Header(tensors=frozenset(name for _b, _e, name in spans), data_bytes=data_bytes)


def _check_metadata(path: str, entry: object) -> None:
    if not isinstance(entry, dict) or not all(isinstance(v, str) for v in entry.values()):
        raise MalformedModelError(f"{path}: __metadata__ is not a mapping of strings")


def _span(path: str, name: str, entry: object) -> tuple[int, int]:
    """The tensor's [begin, end) after checking its dtype and shape agree with its length."""

    def bad(reason: str) -> MalformedModelError:
        return MalformedModelError(f"{path}: tensor {name!r}: {reason}")

    if not isinstance(entry, dict):
        raise bad("entry is not an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        raise bad(f"unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(_natural(d) for d in shape):
        raise bad(f"shape {shape!r} is not a list of non-negative integers")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_natural(o) for o in offsets):
        raise bad(f"data_offsets {offsets!r} is not a pair of non-negative integers")
    begin, end = offsets
    if end < begin:
        raise bad(f"data_offsets [{begin}, {end}] end before they begin")
    bits = math.prod(shape) * DTYPE_BITS[dtype]
    if bits % 8:
        raise bad(f"{dtype} × {shape} is not a whole number of bytes")
    if end - begin != bits // 8:
        raise bad(f"{dtype} × {shape} needs {bits // 8} bytes, data_offsets span {end - begin}")
    return begin, end


def _natural(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def check_index(path: str, data: bytes, shards: Mapping[str, Header], files: frozenset[str]) -> None:
    """A shard index names only shards the model has, and its total_size is their tensor bytes.

    `path` is the index's path in the model; shard names in it are relative to its
    directory. `shards` holds the parsed header of every safetensors file, by path.
    """
    doc, weight_map = _parse_index(path, data)
    named: set[str] = set()
    for tensor, shard_path in weight_map.items():
        shard = shard_path.rpartition("/")[2]
        if shard_path not in files:
            raise MalformedModelError(f"{path}: tensor {tensor!r} maps to {shard!r}, which the model lacks")
        header = shards.get(shard_path)
        if header is not None and tensor not in header.tensors:
            raise MalformedModelError(f"{path}: tensor {tensor!r} is not in {shard!r}")
        named.add(shard_path)
    metadata = doc.get("metadata")
    total = metadata.get("total_size") if isinstance(metadata, dict) else None
    if total is None:
        return  # optional in the format; loaders do not need it
    if not _natural(total):
        raise MalformedModelError(f"{path}: metadata.total_size {total!r} is not a non-negative integer")
    actual = sum(shards[s].data_bytes for s in named if s in shards)
    if total != actual:
        raise MalformedModelError(
            f"{path}: metadata.total_size is {total} but its shards hold {actual} tensor bytes"
        )


def index_shards(path: str, data: bytes) -> dict[str, str]:
    """Each tensor's shard in the index at `path`, as a path in the model (read before any shard is)."""
    return _parse_index(path, data)[1]


def _parse_index(path: str, data: bytes) -> tuple[dict[str, object], dict[str, str]]:
    """The index document and its weight map, shard names made paths relative to the model's root."""
    if len(data) > MAX_INDEX_BYTES:
        raise MalformedModelError(
            f"{path}: a shard index of {len(data)} bytes, over the limit of {MAX_INDEX_BYTES}"
        )
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise MalformedModelError(f"{path}: not valid JSON ({exc})") from None
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise MalformedModelError(f"{path}: 'weight_map' is not a mapping of tensor names to shard files")
    directory = path.rpartition("/")[0]
    return doc, {t: f"{directory}/{s}" if directory else s for t, s in weight_map.items()}
