"""The error tree: one module holds every class, each with its own code, and a code rebuilds its class.

The daemon sends an error over its socket as (code, message, exit code); the
CLI that asked rebuilds it from the code, so a caller's `except NotFoundError`
works the same whether the pull ran in its own process or in the daemon's.
The round trip through a real daemon is in tests/test_tenant_pull.py.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import modelsync
from modelsync import errors
from modelsync.errors import (
    ERRORS_BY_CODE,
    ExitCode,
    ModelsyncError,
    NotFoundError,
    PresignedUrlExpiredError,
    error_from_code,
)

PACKAGE = Path(modelsync.__file__).parent
ALL_ERRORS = sorted(ERRORS_BY_CODE.values(), key=lambda cls: cls.__name__)


def test_every_exception_class_of_the_package_is_defined_in_the_errors_module() -> None:
    """Private classes (`_StaleConnection`) are a module's own control flow and may stay with it."""
    elsewhere = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "errors.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                bases = {ast.unparse(base) for base in node.bases}
                if node.name.endswith("Error") or any(b.endswith(("Error", "Exception")) for b in bases):
                    elsewhere.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {node.name}")
    assert elsewhere == []


def test_every_error_class_has_its_own_code_and_is_drawn_in_the_module_docstring() -> None:
    classes = [
        obj
        for obj in vars(errors).values()
        if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == errors.__name__
    ]
    modelsync_errors = [cls for cls in classes if issubclass(cls, ModelsyncError)]
    assert sorted(ALL_ERRORS, key=lambda c: c.__name__) == sorted(modelsync_errors, key=lambda c: c.__name__)
    codes = [cls.code for cls in modelsync_errors]
    assert len(codes) == len(set(codes)), "two classes share a code"
    doc = errors.__doc__ or ""
    assert [cls.__name__ for cls in classes if cls.__name__ not in doc] == []


@pytest.mark.parametrize("cls", ALL_ERRORS, ids=lambda cls: cls.__name__)
def test_a_code_rebuilds_its_own_class_with_the_message_and_exit_code(cls: type[ModelsyncError]) -> None:
    rebuilt = error_from_code(cls.code, "what went wrong", int(cls.exit_code))
    assert type(rebuilt) is cls
    assert (str(rebuilt), rebuilt.code, rebuilt.exit_code) == ("what went wrong", cls.code, cls.exit_code)


def test_a_rebuilt_subclass_is_caught_by_its_parents_except_clause() -> None:
    with pytest.raises(NotFoundError) as caught:
        raise error_from_code("no_such_bucket", "bucket 'x' does not exist", 3)
    assert caught.value.exit_code == ExitCode.NOT_FOUND


@pytest.mark.parametrize(
    ("exit_code", "expected"),
    [(6, ExitCode.LOCAL_STORAGE), (99, ExitCode.INTERNAL), (None, ExitCode.INTERNAL)],
)
def test_a_code_this_version_does_not_know_keeps_its_code_and_a_known_exit_code(
    exit_code: int | None, expected: ExitCode
) -> None:
    rebuilt = error_from_code("from_a_newer_daemon", "something new", exit_code)
    assert type(rebuilt) is ModelsyncError
    assert (str(rebuilt), rebuilt.code) == ("something new", "from_a_newer_daemon")
    assert rebuilt.exit_code == expected


def test_a_presigned_url_error_rebuilt_from_its_code_does_not_claim_the_token_expired() -> None:
    rebuilt = error_from_code(PresignedUrlExpiredError.code, "expired", 4)
    assert isinstance(rebuilt, PresignedUrlExpiredError) and rebuilt.token_expired is False
