"""The safetensors scrub as pure functions: tables of broken headers and indexes, and properties."""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.safetensors import header_bytes

from modelsync.core.safetensors import (
    DTYPE_BITS,
    MAX_HEADER_BYTES,
    Header,
    check_index,
    header_length,
    parse_header,
)
from modelsync.errors import MalformedModelError

Tensor = tuple[str, str, list[int]]


def parse(tensors: list[Tensor], extra_data_bytes: int = 0) -> Header:
    """Parse a file made of `tensors` whose data section is `extra_data_bytes` longer than they need."""
    head, data_bytes = header_bytes(tensors)
    file_bytes = len(head) + data_bytes + extra_data_bytes
    length = header_length("m.safetensors", head[:8], file_bytes)
    return parse_header("m.safetensors", head[8 : 8 + length], file_bytes)


def parse_doc(doc: object, data_bytes: int) -> Header:
    header = json.dumps(doc).encode()
    return parse_header("m.safetensors", header, 8 + len(header) + data_bytes)


def test_a_valid_file_gives_its_tensors_and_data_bytes() -> None:
    header = parse([("a", "BF16", [2, 3]), ("b", "F4", [4]), ("c", "U8", [])])
    assert header == Header(tensors=frozenset({"a", "b", "c"}), data_bytes=12 + 2 + 1)


@pytest.mark.parametrize(
    ("file_bytes", "prefix", "reason"),
    [
        (4, b"\x00" * 4, "too short"),
        (100, struct.pack("<Q", 93), "runs past the end"),
        (MAX_HEADER_BYTES * 2, struct.pack("<Q", MAX_HEADER_BYTES + 1), "exceeds"),
    ],
)
def test_a_bad_header_length_is_refused(file_bytes: int, prefix: bytes, reason: str) -> None:
    with pytest.raises(MalformedModelError, match=reason):
        header_length("m.safetensors", prefix, file_bytes)


@pytest.mark.parametrize(
    ("doc", "data_bytes", "reason"),
    [
        ([1, 2], 0, "not a JSON object"),
        ({"w": {"dtype": "Q8", "shape": [1], "data_offsets": [0, 1]}}, 1, "tensor 'w': unknown dtype 'Q8'"),
        ({"w": {"dtype": "U8", "shape": [-1], "data_offsets": [0, 1]}}, 1, "tensor 'w': shape"),
        ({"w": {"dtype": "U8", "shape": [True], "data_offsets": [0, 1]}}, 1, "tensor 'w': shape"),
        ({"w": {"dtype": "U8", "shape": [1], "data_offsets": [0]}}, 1, "tensor 'w': data_offsets"),
        ({"w": {"dtype": "U8", "shape": [2], "data_offsets": [2, 0]}}, 2, "end before they begin"),
        (
            {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}},
            4,
            "needs 8 bytes, data_offsets span 4",
        ),
        ({"w": {"dtype": "F4", "shape": [3], "data_offsets": [0, 2]}}, 2, "not a whole number of bytes"),
        (
            {
                "a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
                "b": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]},
            },
            6,
            "tensor 'b' at offset 2 overlaps",
        ),
        (
            {
                "a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
                "b": {"dtype": "U8", "shape": [4], "data_offsets": [6, 10]},
            },
            10,
            "tensor 'b' at offset 6 leaves a gap",
        ),
        (
            {"w": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}},
            3,
            "after tensor 'w' but the data section holds 3",
        ),
        ({"w": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}}, 5, "holds 5 bytes"),
        ({"__metadata__": {"format": 1}}, 0, "__metadata__"),
        ({}, 1, "tensors end at data offset 0 but the data section holds 1"),
    ],
)
def test_a_header_that_does_not_add_up_is_refused_naming_the_tensor(
    doc: object, data_bytes: int, reason: str
) -> None:
    with pytest.raises(MalformedModelError, match=reason.replace("(", r"\(")) as caught:
        parse_doc(doc, data_bytes)
    assert str(caught.value).startswith("m.safetensors: ")


def test_a_header_that_is_not_json_is_refused() -> None:
    with pytest.raises(MalformedModelError, match="not valid JSON"):
        parse_header("m.safetensors", b'{"w": ', 100)


tensors = st.lists(
    st.tuples(
        st.sampled_from(sorted(n for n, bits in DTYPE_BITS.items() if bits % 8 == 0)),
        st.lists(st.integers(0, 6), max_size=3),
    ),
    max_size=6,
).map(lambda items: [(f"t{i}", dtype, shape) for i, (dtype, shape) in enumerate(items)])


@given(tensors)
def test_every_well_formed_layout_parses_and_its_data_bytes_are_the_sum_of_its_tensors(
    layout: list[Tensor],
) -> None:
    header = parse(layout)
    assert header.tensors == {name for name, _dtype, _shape in layout}
    _, data_bytes = header_bytes(layout)
    assert header.data_bytes == data_bytes


@given(tensors, st.integers(-64, 64).filter(lambda n: n != 0))
def test_any_file_longer_or_shorter_than_its_tensors_is_refused(layout: list[Tensor], delta: int) -> None:
    _, data_bytes = header_bytes(layout)
    if data_bytes + delta < 0:
        return
    with pytest.raises(MalformedModelError, match="truncated or padded"):
        parse(layout, extra_data_bytes=delta)


# ---- the shard index -------------------------------------------------------------------------


SHARDS = {
    "m-1.safetensors": Header(frozenset({"a", "b"}), 100),
    "m-2.safetensors": Header(frozenset({"c"}), 50),
}
FILES = frozenset({*SHARDS, "model.safetensors.index.json"})


def index(weight_map: dict[str, str], total: object = 150) -> bytes:
    return json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}).encode()


GOOD_MAP = {"a": "m-1.safetensors", "b": "m-1.safetensors", "c": "m-2.safetensors"}


def test_a_consistent_index_passes_and_total_size_is_optional() -> None:
    check_index("model.safetensors.index.json", index(GOOD_MAP), SHARDS, FILES)
    check_index("model.safetensors.index.json", json.dumps({"weight_map": GOOD_MAP}).encode(), SHARDS, FILES)


def test_an_index_in_a_subdirectory_names_shards_beside_it() -> None:
    shards = {f"sub/{k}": v for k, v in SHARDS.items()}
    files = frozenset({*shards, "sub/model.safetensors.index.json"})
    check_index("sub/model.safetensors.index.json", index(GOOD_MAP), shards, files)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"[", "not valid JSON"),
        (json.dumps({"weight_map": ["a"]}).encode(), "'weight_map' is not a mapping"),
        (
            index({**GOOD_MAP, "d": "m-3.safetensors"}),
            "tensor 'd' maps to 'm-3.safetensors', which the model lacks",
        ),
        (index({**GOOD_MAP, "c": "m-1.safetensors"}), "tensor 'c' is not in 'm-1.safetensors'"),
        (index(GOOD_MAP, total=149), "total_size is 149 but its shards hold 150"),
        (index(GOOD_MAP, total="150"), "not a non-negative integer"),
    ],
)
def test_an_inconsistent_index_is_refused(data: bytes, reason: str) -> None:
    with pytest.raises(MalformedModelError, match=reason):
        check_index("model.safetensors.index.json", data, SHARDS, FILES)
