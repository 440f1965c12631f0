"""What a ranged GET's refusal means: one modelsync error per condition, from status and S3 code.

Pure: the socket loop of ``adapters/http/client.py`` hands over the answer's
status, head and (small) body, and ``now``. Every answer is classified once, by
``modelsync.core.retry.classify`` (status and S3 error code, never message
text). Permanent conditions become ``modelsync.errors`` types; everything worth
retrying becomes ``TransientFetchError``.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping

from modelsync.core.retry import Verdict, classify, presigned_expiry
from modelsync.errors import (
    AccessDeniedError,
    NotFoundError,
    ObjectChangedError,
    PresignedUrlExpiredError,
    TransientFetchError,
    UnexpectedResponseError,
    WrongEndpointError,
)

#: Seconds of clock difference tolerated when deciding that a presigned URL had expired.
EXPIRY_SLACK_S = 5.0
_XML_CODE = re.compile(rb"<Code>([^<]{1,128})</Code>")
_XML_MESSAGE = re.compile(rb"<Message>([^<]{0,512})</Message>")
_XML_ENDPOINT = re.compile(rb"<Endpoint>([^<]{1,256})</Endpoint>")


def error_for_answer(
    status: int,
    headers: Mapping[str, str],
    body: bytes,
    *,
    url: str,
    where: str,
    proxy_netloc: str | None,
    now: float,
) -> Exception:
    """The error a non-2xx answer to a GET of ``url`` stands for; ``where`` names the range in messages."""
    code, message = s3_error_fields(body)
    detail = f"{status} {code or ''} {message or ''}".strip()
    verdict = classify(status, code, url_expired=url_expired(url, headers.get("date"), now))
    if verdict in (Verdict.THROTTLED, Verdict.RETRY):
        return TransientFetchError(
            f"{where}: {detail}",
            bytes_written=0,
            reason=code or f"http-{status}",
            status=status,
            retry_after_s=retry_after_s(headers.get("retry-after")),
            throttled=verdict is Verdict.THROTTLED,
        )
    if verdict is Verdict.EXPIRED:
        return PresignedUrlExpiredError(
            f"{where}: {detail}; presign the URL again",
            token_expired=classify(status, code) is Verdict.EXPIRED,
        )
    if verdict is Verdict.DENIED and proxy_netloc is not None and status in (401, 407):
        return AccessDeniedError(
            f"{where}: proxy {proxy_netloc} refused the request ({status}); put the proxy's "
            "user and password in the proxy URL (HTTP_PROXY / HTTPS_PROXY)"
        )
    if verdict is Verdict.DENIED:
        return AccessDeniedError(
            f"{where}: {detail}; check the credentials and the bucket policy for this identity"
        )
    if verdict is Verdict.NOT_FOUND:
        return NotFoundError(f"{where}: {detail}")
    if verdict is Verdict.CHANGED:
        return ObjectChangedError(f"{where}: {detail}; the object changed since it was listed, pull again")
    if verdict is Verdict.REDIRECT:
        return WrongEndpointError.redirect(
            where,
            f"{status}{' ' + code if code else ''}",
            to=redirect_target(headers, body),
            region=headers.get("x-amz-bucket-region"),
        )
    return UnexpectedResponseError(f"{where}: unexpected status {detail}")


def s3_error_fields(body: bytes) -> tuple[str | None, str | None]:
    """S3's ``Code`` and ``Message`` from an XML error body, when it has them."""
    code = _XML_CODE.search(body)
    msg = _XML_MESSAGE.search(body)
    return (
        code.group(1).decode("ascii", "replace") if code else None,
        msg.group(1).decode("utf-8", "replace") if msg else None,
    )


def url_expired(url: str, date_header: str | None, now: float) -> bool:
    """Whether the presigned URL was past its own expiry when the store answered.

    The store's ``Date`` is the clock that matters (it is the one that refused);
    without one, ``now`` (this machine's clock) stands in.
    """
    expiry = presigned_expiry(url)
    if expiry is None:
        return False
    if date_header:
        import email.utils  # here: only a refusal needs it, and the email package costs a cold pull ~3 ms

        with contextlib.suppress(TypeError, ValueError, IndexError):
            now = email.utils.parsedate_to_datetime(date_header).timestamp()
    return now + EXPIRY_SLACK_S >= expiry


def redirect_target(headers: Mapping[str, str], body: bytes) -> str | None:
    """Where a redirect points (its Location, else S3's <Endpoint>), so the user can fix the endpoint."""
    endpoint = _XML_ENDPOINT.search(body)
    return headers.get("location") or (endpoint.group(1).decode("ascii", "replace") if endpoint else None)


def retry_after_s(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header given in seconds; None when absent or a date."""
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None
