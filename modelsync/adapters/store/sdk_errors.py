"""Translate the S3 SDK's failures into modelsync errors: one point, decided on codes.

Every botocore/aiohttp exception of the control plane becomes a modelsync
error here, by its S3 error code and status through the same classification as
the data plane (``modelsync.core.retry.classify``), never by message text; and
no message ever includes a credential.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import Iterator

import aiohttp
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    NoCredentialsError,
    PartialCredentialsError,
    SSLError,
)
from botocore.exceptions import (
    ConnectionError as BotoConnectionError,
)

from modelsync.core.retry import Verdict, classify, missing_object
from modelsync.errors import (
    AccessDeniedError,
    BucketNotFoundError,
    ConfigError,
    ModelsyncError,
    NotFoundError,
    ObjectChangedError,
    RemoteUnavailableError,
    UsageError,
    WrongEndpointError,
)

#: attempts botocore makes for one control-plane call (first try included)
CONTROL_ATTEMPTS = 4
#: OpenSSL's reasons when the other side answered the TLS hello in plain text (an http:// server)
_PLAIN_TEXT_REPLIES = {
    "WRONG_VERSION_NUMBER",
    "RECORD_LAYER_FAILURE",
    "PACKET_LENGTH_TOO_LONG",
    "UNKNOWN_PROTOCOL",
}


@contextlib.contextmanager
def s3_errors(what: str, bucket: str) -> Iterator[None]:
    """Translate SDK failures of `what` (e.g. "listing s3://b/p/") into modelsync errors."""
    try:
        yield
    except ClientError as exc:
        raise _client_error(exc, what, bucket) from None
    except (NoCredentialsError, PartialCredentialsError):
        raise AccessDeniedError(
            f"no usable S3 credentials for {what}; set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "
            "AWS_PROFILE or AWS_WEB_IDENTITY_TOKEN_FILE"
        ) from None
    except SSLError as exc:
        if _plain_text_reply(exc):
            raise ConfigError(
                f"the endpoint speaks plain HTTP, not TLS ({what}); write its URL with http:// "
                "in --endpoint-url or AWS_ENDPOINT_URL"
            ) from None
        raise UsageError(
            f"TLS verification failed for {what} ({_first_line(exc)}); "
            "set AWS_CA_BUNDLE to the endpoint's CA, or --insecure to skip the check"
        ) from None
    except (BotoConnectionError, aiohttp.ClientError, TimeoutError) as exc:
        raise RemoteUnavailableError(
            f"S3 endpoint unavailable for {what} after {CONTROL_ATTEMPTS} attempts "
            f"({_first_line(exc)}); check AWS_ENDPOINT_URL and the network path"
        ) from None
    except BotoCoreError as exc:
        raise RemoteUnavailableError(f"S3 request failed for {what}: {_first_line(exc)}") from None


def _plain_text_reply(exc: SSLError) -> bool:
    """The TLS handshake failed because the server answered in plain text, not on trust."""
    cause = exc.kwargs.get("error")
    os_error = getattr(cause, "os_error", cause)
    return isinstance(os_error, ssl.SSLError) and os_error.reason in _PLAIN_TEXT_REPLIES


def _first_line(exc: BaseException) -> str:
    return (str(exc) or type(exc).__name__).splitlines()[0][:300]


def strip_etag(etag: str) -> str:
    """An ETag as the SDK gives it, without its quotes."""
    return etag.strip('"')


def code_and_status(exc: ClientError) -> tuple[str, int]:
    code = str(exc.response.get("Error", {}).get("Code", ""))
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return code, int(status) if isinstance(status, int) else 0


def _client_error(exc: ClientError, what: str, bucket: str) -> ModelsyncError:
    code, status = code_and_status(exc)
    verdict = classify(status, code or None)
    if code == "NoSuchBucket":
        return BucketNotFoundError(f"bucket {bucket!r} does not exist ({what}); check the source URI")
    if verdict is Verdict.NOT_FOUND:
        return NotFoundError(f"not found: {what}; check the source URI")
    if verdict in (Verdict.DENIED, Verdict.EXPIRED):
        return AccessDeniedError(
            f"access denied ({code or status}) for {what}; check the credentials and the "
            "bucket policy for this identity"
        )
    if verdict is Verdict.CHANGED:
        return ObjectChangedError(f"object changed during {what}; pull again")
    if verdict is Verdict.REDIRECT:
        region = exc.response.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("x-amz-bucket-region")
        return WrongEndpointError.redirect(what, code or str(status), region=region)
    return RemoteUnavailableError(
        f"S3 error {code or status} for {what} after {CONTROL_ATTEMPTS} attempts; retry later"
    )


def is_missing_key(exc: ClientError) -> bool:
    """A missing object (not a missing bucket): decided on S3's error code, not on the message."""
    code, status = code_and_status(exc)
    return missing_object(status, code or None)
