"""What a process shares between its transfers to slow down: a bandwidth cap and the store's gate.

A pool of 100 nodes pulling the same model must not saturate the object store
at once; each node caps itself (`TokenBucket`). The bucket holds at most one
second of tokens, so a pause does not turn into a burst afterwards. When the
store throttles anyway, every transfer of the process paces its requests
through one `StoreGate` per store.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

from modelsync.core.retry import SendGate


class TokenBucket:
    def __init__(
        self,
        rate_bytes_per_s: int,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if rate_bytes_per_s <= 0:
            raise ValueError("rate must be positive")
        self._rate = float(rate_bytes_per_s)
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._tokens = self._rate
        self._stamp = clock()

    def consume(self, n_bytes: int) -> None:
        """Take `n_bytes` of budget, sleeping when it is spent (debt is paid by waiting)."""
        with self._lock:
            now = self._clock()
            self._tokens = min(self._rate, self._tokens + (now - self._stamp) * self._rate)
            self._stamp = now
            self._tokens -= n_bytes
            debt_s = -self._tokens / self._rate if self._tokens < 0 else 0.0
        if debt_s > 0:
            self._sleep(debt_s)


class StoreGate:
    """The process-wide `SendGate` of one store: its lock and clock around the pure arithmetic.

    Every part of every pull in this process that talks to the same store asks
    the same gate before each request, so when the store throttles, they all
    slow down together; the wait itself happens on the caller's event loop and
    is cancelled with it.
    """

    def __init__(self, time_scale: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._gate = SendGate(time_scale=time_scale)
        self._lock = threading.Lock()
        self._clock = clock

    async def admit(self) -> None:
        """Wait for this request's start slot."""
        with self._lock:
            wait_s = self._gate.reserve(self._clock())
        if wait_s > 0:
            await asyncio.sleep(wait_s)

    def throttled(self, retry_after_s: float | None) -> None:
        with self._lock:
            self._gate.throttled(self._clock(), retry_after_s)

    def succeeded(self) -> None:
        with self._lock:
            self._gate.succeeded(self._clock())

    @property
    def rate_per_s(self) -> float | None:
        """Requests per second the gate lets start now; None when it does not pace."""
        with self._lock:
            return self._gate.rate_per_s


_GATES: dict[tuple[str, float], StoreGate] = {}
_GATES_LOCK = threading.Lock()


def store_gate(store: str, time_scale: float = 1.0) -> StoreGate:
    """The gate of `store` (its endpoint URL) for this whole process, at a retry schedule's scale."""
    with _GATES_LOCK:
        gate = _GATES.get((store, time_scale))
        if gate is None:
            gate = _GATES[store, time_scale] = StoreGate(time_scale)
        return gate
