"""The bandwidth cap of one pull's range client: a token bucket its transfer threads draw from.

A pool of 100 nodes pulling the same model must not saturate the object store
at once; each node caps each pull (`plan --nodes` suggests the cap). Capped
nodes draw no 503 from a store that sheds load near saturation only if the
store's egress follows their caps closely, so a capped pull asks for little at
a time (`capped_read_bytes`):

- the bucket starts empty and holds at most a tenth of a second of tokens: a pull
  starts at its cap, and after a pause a node bursts that much, not a second's
  worth at once with the others;
- each connection reads, and buffers in the kernel, a tenth of a second of its
  share of the cap (64 KiB at least). The bucket is paid after each read, so every connection can
  have one read under way that no token holds back: eight 1 MiB reads per node,
  plus receive buffers the kernel grows to megabytes, let a store that fell
  behind for a moment stay saturated for seconds. 16 nodes capped at 95% of
  their share kept the store's egress 100% busy that way (docs/schedule.md,
  "The pool plan against a measured pool").

The range client (adapters/http/client.py) takes both; the edge builds them
(modelsync/backends.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

#: the bucket's depth, and what each connection reads and buffers at a time, in seconds of the cap
BURST_S = 0.1
#: the least a capped connection reads at a time: a response head must fit (http/head.py)
_MIN_READ_BYTES = 64 * 1024
#: above this per connection, leave reads and buffers as they are: such a cap's bursts are short
#: anyway, and a fixed receive buffer is clipped to net.core.rmem_max (208 KiB on many kernels)
_MAX_READ_BYTES = 1024 * 1024


def capped_read_bytes(rate_bytes_per_s: int, connections: int) -> int | None:
    """What each of `connections` reads and buffers at a time in a pull capped at `rate_bytes_per_s`:
    BURST_S of its share of the cap; None to leave both as they are."""
    wanted = int(rate_bytes_per_s / max(1, connections) * BURST_S)
    if wanted > _MAX_READ_BYTES:
        return None
    return max(wanted, _MIN_READ_BYTES)


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
        self._depth = self._rate * BURST_S
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._tokens = 0.0
        self._stamp = clock()

    def consume(self, n_bytes: int) -> None:
        """Take `n_bytes` of budget, sleeping when it is spent (debt is paid by waiting)."""
        with self._lock:
            now = self._clock()
            self._tokens = min(self._depth, self._tokens + (now - self._stamp) * self._rate)
            self._stamp = now
            self._tokens -= n_bytes
            debt_s = -self._tokens / self._rate if self._tokens < 0 else 0.0
        if debt_s > 0:
            self._sleep(debt_s)
