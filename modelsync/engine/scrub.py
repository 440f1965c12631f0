"""Scrub a model's safetensors headers and shard index on disk (see core/safetensors.py).

Reads only the first 8 bytes and the header of each `.safetensors` file (two
preads), and the index file itself: a few kilobytes per shard whatever the
model's size. Files are opened beneath the model's directory without following
symlinks, as every other check here does.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from modelsync.adapters.model_files import ModelDir
from modelsync.core import safetensors
from modelsync.engine.ready import Problem
from modelsync.errors import MalformedModelError, UnreadableFileError


def scrub(root: Path, files: Iterable[tuple[str, int]]) -> list[Problem]:
    """Problems of the safetensors files and index among `files` (path, size) below `root`."""
    listed = dict(files)
    headers: dict[str, safetensors.Header] = {}
    problems: list[Problem] = []
    with ModelDir(root) as model:
        for path, size_bytes in sorted(listed.items()):
            if not safetensors.is_safetensors(path):
                continue
            try:
                headers[path] = _header(model, path, size_bytes)
            except MalformedModelError as exc:
                problems.append(Problem(path, str(exc).removeprefix(f"{path}: ")))
            except UnreadableFileError as exc:
                problems.append(Problem(path, str(exc)))
        for path in sorted(p for p in listed if p.rpartition("/")[2] == safetensors.INDEX_NAME):
            if listed[path] > safetensors.MAX_INDEX_BYTES:  # not read: its size is the problem
                size, limit = listed[path], safetensors.MAX_INDEX_BYTES
                problems.append(Problem(path, f"a shard index of {size} bytes, over the limit of {limit}"))
                continue
            try:
                data = model.read(path, 0, listed[path])
                safetensors.check_index(path, data, headers, frozenset(listed))
            except MalformedModelError as exc:
                problems.append(Problem(path, str(exc).removeprefix(f"{path}: ")))
            except UnreadableFileError as exc:
                problems.append(Problem(path, str(exc)))
    return problems


def raise_first(problems: list[Problem]) -> None:
    """For the pull's final check: the first problem as the error that keeps the model from being ready."""
    if problems:
        p = problems[0]
        raise MalformedModelError(
            f"{p.path}: {p.reason}; the published model is broken, republish it"
            + (f" ({len(problems) - 1} more problem(s))" if len(problems) > 1 else "")
        )


def _header(model: ModelDir, path: str, size_bytes: int) -> safetensors.Header:
    prefix = model.read(path, 0, safetensors.PREFIX_BYTES)
    length = safetensors.header_length(path, prefix, size_bytes)
    header = model.read(path, safetensors.PREFIX_BYTES, length)
    return safetensors.parse_header(path, header, size_bytes)
