"""A background server a test starts and stops: usable as a context manager."""

from __future__ import annotations

from types import TracebackType
from typing import Self


class Service:
    """Subclasses implement `start` (returning self) and `stop`; `with` does both."""

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
