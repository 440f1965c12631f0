"""How a pull reacts to each answer of the object store: pure policy, `now` as a parameter.

Decided here once and used by both planes:

- `classify`: what an S3 answer means (throttled, retry, re-presign, denied, ...),
  from its status and S3 error code, never from its message text.
- `backoff_s`: how long one part waits before its next attempt. Throttling waits
  whole seconds (a floor), growing to a cap, with jitter so a pool of nodes does
  not retry in step; `Retry-After` is honoured. Other transient failures retry
  fast, as s3transfer does.
- `PartRetries`: when one part gives up: after `attempts` failures that were not
  throttling, or `budget_s` without progress.
- the shared gate that paces every request of a process when the store throttles
  is core/send_gate.py's `SendGate`.

Expiry of a presigned URL is read from the URL's own `X-Amz-Date` and
`X-Amz-Expires` (`presigned_expiry`), not guessed from an error message.
"""

from __future__ import annotations

import datetime as dt
import functools
from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple, Protocol
from urllib.parse import parse_qs, urlsplit

__all__ = [
    "PartRetries",
    "RetryPolicy",
    "Verdict",
    "backoff_s",
    "classify",
    "missing_object",
    "presigned_expiry",
]


class Verdict(Enum):
    """What an answer of the store means for the request that got it."""

    OK = "ok"
    #: the store asks for less load: back off in seconds, slow every request down
    THROTTLED = "throttled"
    #: a failure that another attempt may not see (5xx, timeout)
    RETRY = "retry"
    #: the signature's credentials or the URL expired: presign again, then retry
    EXPIRED = "expired"
    DENIED = "denied"
    NOT_FOUND = "not_found"
    #: the object is not the version asked for (If-Match, range): restart the file
    CHANGED = "changed"
    #: the store points elsewhere: the endpoint or the region is wrong
    REDIRECT = "redirect"
    #: an answer that no retry will change (400, 501, 505, ...)
    INVALID = "invalid"


_THROTTLE_CODES = frozenset(
    {
        "SlowDown",
        "SlowDownRead",
        "SlowDownWrite",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestLimitExceeded",
        "TooManyRequests",
        "TooManyRequestsException",
        "ServiceUnavailable",
        "RequestThrottledException",
        "ProvisionedThroughputExceededException",
        "BandwidthLimitExceeded",
        "EC2ThrottledException",
        "PriorRequestNotComplete",
    }
)
_RETRY_CODES = frozenset({"InternalError", "RequestTimeout", "RequestTimeoutException", "OperationAborted"})
_EXPIRED_CODES = frozenset(
    {"ExpiredToken", "ExpiredTokenException", "TokenRefreshRequired", "RequestExpired"}
)
_DENIED_CODES = frozenset(
    {
        "AccessDenied",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "InvalidToken",
        "AllAccessDisabled",
        "AccountProblem",
        "InvalidSecurity",
    }
)
_NOT_FOUND_CODES = frozenset({"NoSuchKey", "NoSuchBucket", "NotFound", "404"})
_CHANGED_CODES = frozenset({"PreconditionFailed", "InvalidRange"})
_REDIRECT_CODES = frozenset({"PermanentRedirect", "TemporaryRedirect", "Redirect"})
#: 501 Not Implemented and 505 HTTP Version Not Supported: the same request never succeeds
_NEVER_RETRIED_5XX = frozenset({501, 505})


def classify(status: int, code: str | None = None, *, url_expired: bool = False) -> Verdict:
    """The meaning of one answer: its S3 error code first, else its status.

    `url_expired` says whether the presigned URL was past its `X-Amz-Expires` when
    the store answered: S3 reports that as a plain AccessDenied.
    """
    if 200 <= status < 300:
        return Verdict.OK
    if code in _THROTTLE_CODES or status in (429, 503):
        return Verdict.THROTTLED
    if code in _EXPIRED_CODES:
        return Verdict.EXPIRED
    if code in _REDIRECT_CODES or status in (301, 302, 303, 307, 308):
        return Verdict.REDIRECT
    if code in _NOT_FOUND_CODES or status == 404:
        return Verdict.NOT_FOUND
    if code in _CHANGED_CODES or status in (412, 416):
        return Verdict.CHANGED
    if code in _DENIED_CODES or status in (401, 403, 407):
        return Verdict.EXPIRED if url_expired else Verdict.DENIED
    if code in _RETRY_CODES or status == 408 or (status >= 500 and status not in _NEVER_RETRIED_5XX):
        return Verdict.RETRY
    return Verdict.INVALID


def missing_object(status: int, code: str | None = None) -> bool:
    """A missing key, not a missing bucket: a manifest that is not there, which is no error."""
    return code != "NoSuchBucket" and classify(status, code) is Verdict.NOT_FOUND


# -- backoff --------------------------------------------------------------------------


class RetryLimits(Protocol):
    """The three settings a retry schedule is made from (`modelsync.config.Settings` has them)."""

    @property
    def retry_budget_s(self) -> float: ...
    @property
    def part_attempts(self) -> int: ...
    @property
    def backoff_floor_s(self) -> float: ...


class RetryPolicy(NamedTuple):
    """How long a part keeps trying, and how it spaces its attempts.

    A part gives up when it has made no progress for `budget_s`, or after
    `attempts` consecutive failures that were neither throttling nor progress
    (a store that answers "slow down" for minutes is busy, not broken).
    """

    #: total time a part keeps retrying without progress
    budget_s: float = 600.0
    #: consecutive failures (not throttling) without a byte of progress before giving up
    attempts: int = 5
    #: the shortest wait after a throttled answer; plus jitter that doubles per failure up to
    #: `throttle_cap_s`. Short: the shared `SendGate` is what slows the process down, and a part
    #: asleep for long after the store has room again leaves its egress idle
    throttle_floor_s: float = 1.0
    throttle_cap_s: float = 2.0
    #: a Retry-After longer than this is clipped (a misconfigured store must not park a pull for hours)
    retry_after_cap_s: float = 60.0
    #: the first wait after a non-throttling failure; doubles up to `error_cap_s`
    error_base_s: float = 0.1
    error_cap_s: float = 5.0
    #: the factor `scaled` applied to the waits; a `SendGate` of the same store takes it too
    time_scale: float = 1.0

    @classmethod
    def of(cls, limits: RetryLimits) -> RetryPolicy:
        """The schedule both planes follow for these limits (budget, attempts, throttling floor)."""
        return cls(budget_s=limits.retry_budget_s, attempts=limits.part_attempts).scaled(
            limits.backoff_floor_s / cls().throttle_floor_s
        )

    def scaled(self, factor: float) -> RetryPolicy:
        """The same shape with every wait of its own multiplied by `factor`: how tests keep backoff short.

        What the store asks for (Retry-After, up to its cap) is not scaled.
        """
        return RetryPolicy(
            budget_s=self.budget_s,
            attempts=self.attempts,
            throttle_floor_s=self.throttle_floor_s * factor,
            throttle_cap_s=self.throttle_cap_s * factor,
            retry_after_cap_s=self.retry_after_cap_s,
            error_base_s=self.error_base_s * factor,
            error_cap_s=self.error_cap_s * factor,
            time_scale=self.time_scale * factor,
        )


def backoff_s(
    policy: RetryPolicy,
    failures: int,
    *,
    throttled: bool,
    retry_after_s: float | None = None,
    jitter: float = 0.5,
) -> float:
    """The wait before attempt `failures + 1`, given `failures` >= 1 so far.

    `jitter` in [0, 1) comes from the caller's random source. A throttled part
    waits at least the floor and at most floor + the doubled ceiling; any other
    failure waits a "full jitter" share of its doubled ceiling. A `Retry-After`
    from the store is a lower bound on either.
    """
    if failures < 1:
        raise ValueError("backoff_s is for after a failure")
    if not 0.0 <= jitter < 1.0:
        raise ValueError("jitter must be in [0, 1)")
    exponent = min(failures - 1, 30)
    if throttled:
        spread = min(policy.throttle_cap_s, policy.throttle_floor_s * 2.0**exponent)
        wait = policy.throttle_floor_s + jitter * spread
    else:
        wait = jitter * min(policy.error_cap_s, policy.error_base_s * 2.0 ** (exponent + 1))
    if retry_after_s is not None and retry_after_s > 0:
        wait = max(wait, min(retry_after_s, policy.retry_after_cap_s))
    return wait


@dataclass(slots=True)
class PartRetries:
    """The retry state of one part: its failures since it last made progress.

    A byte of progress starts the count afresh: a transfer that keeps breaking
    but keeps advancing is not failing.
    """

    policy: RetryPolicy
    failures: int = 0
    throttles: int = 0
    stuck_since: float | None = None

    def failed(self, now: float, *, progressed: bool, throttled: bool) -> None:
        if progressed:
            self.failures = self.throttles = 0
            self.stuck_since = None
        if self.stuck_since is None:
            self.stuck_since = now
        if throttled:
            self.throttles += 1
        else:
            self.failures += 1

    def stuck_s(self, now: float) -> float:
        return 0.0 if self.stuck_since is None else now - self.stuck_since

    def exhausted(self, now: float) -> bool:
        """Too many failures that were not throttling, or the budget spent without progress."""
        return self.failures >= self.policy.attempts or self.stuck_s(now) >= self.policy.budget_s

    def wait_s(self, now: float, *, throttled: bool, retry_after_s: float | None, jitter: float) -> float:
        """The wait before the next attempt, never past the end of the budget."""
        count = self.throttles if throttled else self.failures
        wait = backoff_s(self.policy, count, throttled=throttled, retry_after_s=retry_after_s, jitter=jitter)
        return min(wait, max(0.0, self.policy.budget_s - self.stuck_s(now)))


# -- presigned URLs ------------------------------------------------------------------


@functools.lru_cache(maxsize=4096)
def presigned_expiry(url: str) -> float | None:
    """When a SigV4-presigned URL stops being valid (epoch seconds), from its own query.

    None when the URL carries no parseable `X-Amz-Date` / `X-Amz-Expires`. Cached: every part
    of a file asks about the same URL, and parsing its date each time (`strptime`) was one of
    the per-part costs that hold the interpreter lock.
    """
    query = parse_qs(urlsplit(url).query)
    dates, lifetimes = query.get("X-Amz-Date"), query.get("X-Amz-Expires")
    if not dates or not lifetimes or not lifetimes[0].isdigit():
        return None
    signed = _amz_date(dates[0])
    return None if signed is None else signed + int(lifetimes[0])


def _amz_date(text: str) -> float | None:
    """`YYYYMMDDTHHMMSSZ` as epoch seconds; read by hand, as `time.strptime` would cost a cold
    pull the import of `_strptime`, `calendar` and `locale` for one date."""
    digits = text[:8] + text[9:15]
    if len(text) != 16 or text[8] != "T" or text[15] != "Z" or not (digits.isascii() and digits.isdigit()):
        return None
    try:
        return dt.datetime(int(text[0:4]), int(text[4:6]), int(text[6:8]), int(text[9:11]),
                           int(text[11:13]), int(text[13:15]), tzinfo=dt.UTC).timestamp()
    except ValueError:
        return None
