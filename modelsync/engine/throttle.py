"""The store's gate: when the store throttles, every transfer of the process paces its requests.

`StoreGate` wraps the pure `SendGate` (core/retry.py) with its lock and clock.
The engine does not pick a gate: it comes in with the backends
(engine/ports.py `Backends.gate`), and the edge gives every pull of one store
the same one (`store_gate`, called by modelsync/backends.py). The bandwidth cap
is the range client's (adapters/http/rate_limit.py).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

from modelsync.core.send_gate import SendGate


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
        """Wait until a start slot is free, then take it: a request that waits books no slot
        ahead, so when the rate recovers meanwhile, every waiting request starts at the new rate."""
        while True:
            with self._lock:
                now = self._clock()
                if self._gate.try_reserve(now):
                    return
                wait_s = self._gate.wait_s(now)
            await asyncio.sleep(wait_s)

    def try_admit(self) -> bool:
        """Take this request's start slot if it is free now; False, and no slot taken, when it would wait.

        For a transfer thread, which must not sleep in the gate: the caller then waits on its event loop.
        """
        with self._lock:
            return self._gate.try_reserve(self._clock())

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
