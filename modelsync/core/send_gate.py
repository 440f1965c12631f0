"""The send gate: one per store and process, it paces the start of every request when the store
throttles, so all parts of all files slow down together; the allowed rate then recovers
gradually on successes, like the SDKs' adaptive retry mode. Pure: `now` is a parameter.
"""

from __future__ import annotations

import collections
import math


class SendGate:
    """Paces request starts for one store, shared by every transfer of a process.

    Unthrottled, the gate lets everything through at once. The first throttled
    answer sets a send rate just below the rate that was measured over the last
    `window_s`, and each further throttle (at most once per `decrease_every_s`, so
    the burst of answers to one overload counts once) multiplies it by `beta`.
    Successes raise the rate again, doubling every `doubling_s` of successful
    traffic; once it passes `free_rate_per_s` the gate stops pacing. A
    `Retry-After` holds every start until it has passed. `time_scale` multiplies
    every duration of the gate's own and divides every rate, like `RetryPolicy.scaled`.

    A request waits for the next start at the rate the gate has when it asks
    (`wait_s`) and takes its slot when it starts (`reserve`), booking none ahead:
    eight parts booked one second apart after a throttle kept a node at a part a
    second for eight seconds while the rate had recovered and the store was idle.

    Not thread-safe by itself: the caller holds a lock around each call.
    """

    def __init__(
        self,
        *,
        beta: float = 0.7,
        min_rate_per_s: float = 1.0,
        free_rate_per_s: float = 1000.0,
        doubling_s: float = 1.0,
        window_s: float = 2.0,
        decrease_every_s: float = 0.5,
        retry_after_cap_s: float = 60.0,
        time_scale: float = 1.0,
    ) -> None:
        if not 0 < beta < 1 or min(min_rate_per_s, doubling_s, window_s, time_scale) <= 0:
            raise ValueError("beta in (0, 1); rates and times positive")
        self._beta = beta
        self._min_rate = min_rate_per_s / time_scale
        self._free_rate = free_rate_per_s / time_scale
        self._doubling_s = doubling_s * time_scale
        self._window_s = window_s * time_scale
        self._decrease_every_s = decrease_every_s * time_scale
        self._retry_after_cap_s = retry_after_cap_s
        #: requests per second allowed to start; None: not paced
        self.rate_per_s: float | None = None
        self._last_start = float("-inf")
        self._hold_until = 0.0
        self._last_decrease = float("-inf")
        self._last_raise = 0.0
        self._starts: collections.deque[float] = collections.deque(maxlen=4096)

    def wait_s(self, now: float) -> float:
        """How long until the next start, at the rate of `now` (0 when a request may start now)."""
        start = max(now, self._hold_until)
        if self.rate_per_s is not None:
            start = max(start, self._last_start + 1.0 / self.rate_per_s)
        return start - now

    def reserve(self, now: float) -> float:
        """Take the next start slot; returns how long to wait before sending (0 when free)."""
        wait = self.wait_s(now)
        self._last_start = now + wait
        self._starts.append(self._last_start)
        return wait

    def try_reserve(self, now: float) -> bool:
        """Take a start slot only if it is free at `now` (`wait_s` is 0); else take none."""
        if self.wait_s(now) > 0:
            return False
        self.reserve(now)
        return True

    def throttled(self, now: float, retry_after_s: float | None = None) -> None:
        """The store answered "slow down" at `now`."""
        if retry_after_s is not None and retry_after_s > 0:
            self._hold_until = max(self._hold_until, now + min(retry_after_s, self._retry_after_cap_s))
        if now - self._last_decrease < self._decrease_every_s:
            return
        self._last_decrease = now
        measured = self.measured_rate_per_s(now)
        base = measured if self.rate_per_s is None else min(self.rate_per_s, max(measured, self._min_rate))
        self.rate_per_s = max(self._min_rate, base * self._beta)
        self._last_raise = now
        self._last_start = max(self._last_start, now)

    def succeeded(self, now: float) -> None:
        """A request finished well at `now`: let the rate recover a little."""
        if self.rate_per_s is None:
            return
        elapsed = max(0.0, now - self._last_raise)
        self._last_raise = now
        doublings = elapsed / self._doubling_s
        # Compared as exponents: after a long quiet spell (a daemon idle for half an hour after
        # one 503) 2 ** doublings is past any float, and the multiplication would overflow.
        if doublings >= math.log2(self._free_rate / self.rate_per_s):
            self.rate_per_s = None
            return
        self.rate_per_s *= 2.0 ** doublings

    def measured_rate_per_s(self, now: float) -> float:
        """Requests started over the last `window_s`, per second."""
        while self._starts and self._starts[0] < now - self._window_s:
            self._starts.popleft()
        return len(self._starts) / self._window_s
