"""Structured concurrency helpers: TaskGroup failures surface as one user-facing error."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from modelsync.errors import ModelsyncError


def _leaves(group: BaseExceptionGroup[BaseException]) -> Iterator[BaseException]:
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            yield from _leaves(exc)
        else:
            yield exc


@contextlib.contextmanager
def first_error() -> Iterator[None]:
    """Re-raise the first ModelsyncError of a TaskGroup's failures, so the CLI prints one line.

    Other failures (bugs) propagate as the group, with every traceback.
    """
    try:
        yield
    except BaseExceptionGroup as group:
        for exc in _leaves(group):
            if isinstance(exc, ModelsyncError):
                raise exc from None
        raise
