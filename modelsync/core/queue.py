"""The daemon's queue: which model it pulls next, and when a running pull must yield.

Pure: `now` (monotonic seconds) and randomness are parameters, so the order,
the jitter, the backoff and the foreground precedence are tested as tables at
chosen instants. engine/reconcile.py feeds it the node plan and each pull's
outcome, and runs what it chooses.

- **Order.** Requests (`modelsync prefetch`, tenant pulls) first, in arrival
  order; then the plan's fetches in fetch order (window start, then priority);
  then due refresh checks of staged models.
- **Jitter.** A fetch or refresh becomes due `start_jitter_s` after it first
  appeared in the plan, so a pool of nodes does not hit the store in the same
  second. Requests skip the jitter.
- **Backoff.** A failed model waits 2^n seconds (capped at `max_retry_s`,
  jittered down to half) before its next attempt; the others go on. A request
  for it is a reason to try at once. A model the store holds broken (an
  integrity failure) waits `max_retry_s` at once: only a republish fixes it.
- **Foreground first.** While a foreground pull is announced nothing starts,
  and a running pull of another model yields; so does a background pull when a
  waiting pod requests another model.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

from modelsync.core.plan import start_jitter_s

#: the longest a failed model waits before its next attempt
MAX_RETRY_S = 300.0


@dataclass(frozen=True, slots=True)
class Job:
    model_id: str
    #: asked for through the API (it has waiters); else the plan's
    requested: bool
    #: a check of a staged model against its source, not a fetch
    refresh: bool = False


@dataclass(frozen=True, slots=True)
class Retry:
    failures: int
    #: when the next attempt may start
    at: float


def retry_delay_s(failures: int, rand: float, max_retry_s: float = MAX_RETRY_S) -> float:
    """The wait after the `failures`-th failure in a row (1, 2, ...); `rand` in [0, 1) jitters it."""
    return min(max_retry_s, 2.0 ** (failures - 1)) * (0.5 + 0.5 * rand)


class JobQueue:
    """What the daemon should pull, and when; it holds no I/O and reads no clock."""

    def __init__(self, node: str, jitter_max_s: float, refresh_s: float, max_retry_s: float = MAX_RETRY_S):
        self._node = node
        self._jitter_max_s = jitter_max_s
        self._refresh_s = refresh_s
        self._max_retry_s = max_retry_s
        self._requested: dict[str, None] = {}  # insertion-ordered set
        self._fetch: list[str] = []
        self._staged: list[str] = []
        self._eligible_at: dict[str, float] = {}
        self._refresh_at: dict[str, float] = {}
        self.retries: dict[str, Retry] = {}

    # -- inputs ------------------------------------------------------------------------

    def request(self, model_id: str) -> None:
        """Stage `model_id` ahead of the schedule; an operator asking is a reason to try now."""
        self._requested.setdefault(model_id)
        self.retries.pop(model_id, None)

    def plan(self, fetch: Iterable[str], staged: Iterable[str], now: float) -> None:
        """The plan's fetches (in fetch order) and its staged, protected models (refresh candidates).

        Each model new to either list starts its jitter clock now; models no
        longer wanted are forgotten.
        """
        self._fetch = list(fetch)
        self._staged = list(staged) if self._refresh_s else []
        for due, wanted in ((self._eligible_at, self._fetch), (self._refresh_at, self._staged)):
            for model_id in wanted:
                if model_id not in due:
                    due[model_id] = now + start_jitter_s(self._node, model_id, self._jitter_max_s)
            for model_id in due.keys() - set(wanted):
                del due[model_id]

    def finished(
        self, job: Job, now: float, *, failed: bool, rand: float = 0.0, store_at_fault: bool = False
    ) -> float | None:
        """A pull ended (not cancelled); after a failure, the seconds until its next attempt.

        `store_at_fault`: the failure is the published model's (its manifest misstates a
        size, its bytes or signature do not match): only a republish fixes it, so it
        waits the longest backoff at once instead of retrying within seconds.
        """
        model_id = job.model_id
        self._requested.pop(model_id, None)
        checked = model_id in self._refresh_at if job.refresh else not failed and bool(self._refresh_s)
        if checked:
            self._refresh_at[model_id] = now + self._refresh_s  # it was just checked (or fetched)
        if not failed:
            self.retries.pop(model_id, None)
            return None
        failures = self.retries[model_id].failures + 1 if model_id in self.retries else 1
        delay_s = retry_delay_s(failures, rand, self._max_retry_s)
        if store_at_fault:
            delay_s = self._max_retry_s * (0.5 + 0.5 * rand)
        self.retries[model_id] = Retry(failures, now + delay_s)
        return delay_s

    # -- decisions ---------------------------------------------------------------------

    def next(self, now: float, paused: bool = False) -> Job | None:
        """The job to start now, if any: requests first, then due fetches, then due refresh checks."""
        if paused:
            return None
        for model_id in self._requested:
            return Job(model_id, requested=True)
        queues = ((self._fetch, self._eligible_at, False), (self._staged, self._refresh_at, True))
        for candidates, due, refresh in queues:
            for model_id in candidates:
                retry = self.retries.get(model_id)
                if now >= due[model_id] and (retry is None or now >= retry.at):
                    return Job(model_id, requested=False, refresh=refresh)
        return None

    @property
    def requested(self) -> tuple[str, ...]:
        return tuple(self._requested)


def yields_to_foreground(running: Job, announced: Collection[str]) -> bool:
    """Whether a running pull stops for announced foreground pulls: unless it pulls one of them.

    A running pull of the announced model goes on: the foreground pull waits for
    its lock and returns its path.
    """
    return bool(announced) and running.model_id not in announced


def yields_to_request(running: Job, waiting: Collection[str]) -> bool:
    """Whether a background pull stops for models a pod waits for (a tenant's pull)."""
    return bool(waiting) and not running.requested and running.model_id not in waiting
