"""Valid safetensors files for tests: the pull's final check scrubs every `.safetensors` file.

A file is `[u64 N][N bytes of JSON header][tensor bytes]`; these helpers write
real headers (so the scrub passes) around deterministic or random tensor bytes.
"""

from __future__ import annotations

import json
import math
import os
import struct

from modelsync.core.safetensors import DTYPE_BITS


def header_bytes(tensors: list[tuple[str, str, list[int]]]) -> tuple[bytes, int]:
    """The length prefix and header for `(name, dtype, shape)` tensors laid out in order;
    also the data section's size."""
    doc: dict[str, object] = {}
    offset = 0
    for name, dtype, shape in tensors:
        n_bytes = math.prod(shape) * DTYPE_BITS[dtype] // 8
        doc[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n_bytes]}
        offset += n_bytes
    header = json.dumps(doc).encode()
    header += b" " * (-len(header) % 8)  # the format pads to 8 bytes; loaders expect it
    return struct.pack("<Q", len(header)) + header, offset


def safetensors_file(tensors: list[tuple[str, str, list[int]]], data: bytes | None = None) -> bytes:
    """A whole file; tensor bytes random unless given."""
    head, data_bytes = header_bytes(tensors)
    return head + (data if data is not None else os.urandom(data_bytes))


def shard(total_bytes: int, name: str = "weight") -> bytes:
    """A valid file of about `total_bytes`: one U8 tensor filling what the header leaves."""
    head, _ = header_bytes([(name, "U8", [total_bytes])])
    return safetensors_file([(name, "U8", [max(0, total_bytes - len(head))])])
