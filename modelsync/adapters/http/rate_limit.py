"""The bandwidth cap of one pull's range client: a token bucket its transfer threads draw from.

A pool of 100 nodes pulling the same model must not saturate the object store
at once; each node caps each pull. The bucket holds at most one second of
tokens, so a pause does not turn into a burst afterwards. The range client
(adapters/http/client.py) takes it as its `rate_limiter`; the edge builds both
(modelsync/backends.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


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
