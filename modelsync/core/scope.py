"""Scopes of per-source rules: which models a rule covers, as a prefix of `bucket/prefix/`.

A rule (the signature policy's `[[signature_rules]]`, or any other rule given per
bucket or prefix) covers a model when the model's `bucket/prefix/` starts with the
rule's scope. A scope is a plain prefix, so text that reads as something else is
refused when the settings are read, not matched against nothing later:

- a glob (`s3://models/org/*`) would match no model, since `*` is a character of
  a key like any other, and a `required` policy would be off without a word;
- a file key (`s3://models/org/m/config.json`) would become the prefix
  `models/org/m/config.json/`, under which no model lives;
- a bucket name S3 refuses, or a `..` or `.` segment, names a source no pull
  accepts (core/refs.py), so the rule could never match either.

`*` alone (or an empty scope) covers every source.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from modelsync.core.keys import safe_relative_path
from modelsync.core.refs import is_bucket_name
from modelsync.errors import UnsafeKeyError, UsageError

__all__ = ["parse_scope"]

_GLOB = frozenset("*?[]{}")
#: suffixes of the files a model holds: a scope ending in one without a slash names a file
_FILE_SUFFIXES = frozenset(
    {
        ".bin", ".ckpt", ".gguf", ".h5", ".json", ".md", ".model", ".msgpack", ".npz", ".onnx",
        ".pt", ".pth", ".py", ".safetensors", ".sig", ".tiktoken", ".txt", ".yaml", ".yml",
    }
)


def parse_scope(text: str, what: str = "scope") -> str:
    """`s3://bucket/`, `s3://bucket/prefix/`, `bucket/prefix` or `*` as `bucket/prefix/` ("" for all).

    `what` names the rule's field in the error (e.g. `signature scope`); every refusal
    says what to write instead.
    """
    stripped = text.strip()
    if stripped in {"", "*"}:
        return ""
    body = stripped.removeprefix("s3://")
    form = "s3://bucket/ or s3://bucket/prefix/"
    glob = next((i for i, ch in enumerate(body) if ch in _GLOB), None)
    if glob is not None:
        before = body[:glob].rpartition("/")[0]
        hint = f"write s3://{before}/, which covers every model below it" if before else f"write {form}"
        raise UsageError(
            f"{what} {text!r} is a glob; a scope is a plain prefix and {body[glob]!r} would match "
            f"nothing: {hint}"
        )
    bucket, _, prefix = body.partition("/")
    if not is_bucket_name(bucket):
        raise UsageError(
            f"{what} {text!r}: {bucket!r} is not a valid bucket name, so the rule could never match; "
            f"write {form}"
        )
    if not body.endswith("/") and PurePosixPath(prefix).suffix.lower() in _FILE_SUFFIXES:
        folder = body.rpartition("/")[0]
        raise UsageError(
            f"{what} {text!r} names a file; a scope is a model's prefix or one above it: "
            f"write s3://{folder}/"
        )
    prefix = prefix.strip("/")
    if prefix:
        try:
            safe_relative_path(prefix)
        except UnsafeKeyError:
            raise UsageError(
                f"{what} {text!r} could never match a model: no source has an empty, '.' or '..' "
                f"segment, a backslash or a control character; write {form}"
            ) from None
    return f"{bucket}/{prefix}/" if prefix else f"{bucket}/"
