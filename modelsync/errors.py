"""One error tree for modelsync, with the exit code of each branch.

Every error a user can cause or fix derives from `ModelsyncError`; the CLI prints
it as a single `error: ...` line and exits with its code. Anything else that
escapes is a bug: the CLI lets it show its traceback and exits 1.

    ModelsyncError
    ├── UsageError (2)              bad arguments
    │   ├── ConfigError             a bad setting, config file or AWS profile
    │   │   └── CaBundleError       AWS_CA_BUNDLE holds no usable certificate
    │   ├── ScheduleError           the schedule file is unreadable or invalid
    │   ├── WrongEndpointError      the store redirects: wrong endpoint or region
    │   └── NestedModelError        the source holds a ready model, or lies inside one
    ├── NotFoundError (3)           bucket, prefix, key, cache or cached model does not exist
    │   └── BucketNotFoundError     the bucket itself does not exist
    ├── AccessDeniedError (4)       credentials rejected or not allowed
    │   └── PresignedUrlExpiredError a presigned URL or its credentials expired: presign again
    ├── IntegrityError (5)
    │   ├── ChecksumMismatchError   bytes do not match the recorded digest or ETag
    │   ├── ObjectChangedError      the object was overwritten during the pull
    │   ├── UnsafeKeyError          a key would escape or alias inside the cache
    │   ├── ManifestError           modelsync.manifest.json is malformed
    │   ├── MalformedModelError     a safetensors header or shard index does not add up
    │   ├── SizeMismatchError       the store holds another size than the manifest says
    │   ├── IncompleteModelError    a publish in progress or cut short, or no manifest where one is required
    │   └── SignatureError          the model's OpenSSF signature does not vouch for it
    │       ├── UnsignedModelError      a signature is required and there is none
    │       ├── UntrustedSignatureError the signature or its signer is not trusted
    │       └── SignedContentError      a file is not listed in the signature or does not match
    ├── LocalStorageError (6)
    │   ├── DiskFullError           not enough space for the model
    │   └── DaemonBusyError         the node daemon holds as many connections as it serves: retry
    ├── RemoteUnavailableError (7)  endpoint unreachable or failing after retries
    │   └── UnexpectedResponseError the endpoint answered, but not with the range asked for
    ├── SourceNotAllowedError (8)   the node daemon does not serve this source to tenants
    └── PullCancelledError (130)    the caller cancelled the pull; its journal keeps the parts

    TransientFetchError             not a user error: a ranged GET worth retrying, and how
                                    far it got; the pull retries it and never lets it out
    UnreadableFileError             not a user error: what is at a model's path cannot be read
                                    as its file; the check that met it reports it as a problem
    NotARegularFileError,           not user errors: an input file (settings, CA bundle, schedule)
    FileTooLargeError               is not a regular file, or longer than its reader's limit;
                                    each reader turns them into its own one-line error

Only adapters translate foreign exceptions (botocore, aiohttp, OSError) into
these; the core raises them directly.

Every class has its own `code`. An error that crosses a process boundary (the
daemon's socket sends `code`, message and exit code) is rebuilt as its class by
`error_from_code`, so `except NotFoundError` catches a daemon's "not found" too.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Process exit codes; the README's table is this enum."""

    OK = 0
    INTERNAL = 1
    USAGE = 2
    NOT_FOUND = 3
    ACCESS_DENIED = 4
    INTEGRITY = 5
    LOCAL_STORAGE = 6
    REMOTE_UNAVAILABLE = 7
    NOT_ALLOWED = 8
    #: stopped by SIGINT (Ctrl-C) or SIGTERM: 128 + the signal's number; the next run resumes
    INTERRUPTED = 130
    TERMINATED = 143


class ModelsyncError(Exception):
    """A condition the user can act on; its message says what to do next."""

    exit_code: ExitCode = ExitCode.INTERNAL
    #: machine-readable code used in structured logs and metrics
    code: str = "internal"


class UsageError(ModelsyncError):
    exit_code = ExitCode.USAGE
    code = "usage"


class ConfigError(UsageError):
    """A setting that cannot work; its code tells a misconfigured node from a bug in the daemon's logs."""

    code = "bad_config"


class CaBundleError(ConfigError):
    """AWS_CA_BUNDLE names a file that holds no usable certificate: a configuration problem."""

    code = "bad_ca_bundle"


class ScheduleError(UsageError):
    """A schedule that does not load; its code tells it from a bad request in the daemon's logs."""

    code = "bad_schedule"


class WrongEndpointError(UsageError):
    """The store answered with a redirect: the endpoint or region in the settings is wrong."""

    code = "wrong_endpoint"

    @classmethod
    def redirect(
        cls, what: str, answer: str, *, to: str | None = None, region: str | None = None
    ) -> WrongEndpointError:
        """The one wording of a redirect, from the SDK or the data plane: what was asked, the
        store's `answer` (status or code), where it points, and what to set to fix it."""
        pieces = [f"{what}: the store redirects ({answer})"]
        if to:
            pieces.append(f"to {to}")
        if region:
            pieces.append(f"(the bucket is in region {region})")
        return cls(
            " ".join(pieces) + "; the endpoint or region is wrong: set AWS_ENDPOINT_URL (--endpoint-url) "
            "and AWS_REGION (--region) to where the bucket lives"
        )


class NestedModelError(UsageError):
    """A model's prefix would contain a ready model, or lie inside one: each would hold the other's files."""

    code = "nested_model"


class NotFoundError(ModelsyncError):
    exit_code = ExitCode.NOT_FOUND
    code = "not_found"


class BucketNotFoundError(NotFoundError):
    code = "no_such_bucket"


class AccessDeniedError(ModelsyncError):
    exit_code = ExitCode.ACCESS_DENIED
    code = "access_denied"


class IntegrityError(ModelsyncError):
    exit_code = ExitCode.INTEGRITY
    code = "integrity"


class ChecksumMismatchError(IntegrityError):
    code = "checksum_mismatch"


class ObjectChangedError(IntegrityError):
    code = "object_changed"


class UnsafeKeyError(IntegrityError):
    code = "unsafe_key"


class ManifestError(IntegrityError):
    code = "bad_manifest"


class MalformedModelError(IntegrityError):
    code = "malformed_model"


class IncompleteModelError(IntegrityError):
    """The prefix is not a whole published model: its publish has not finished, a manifest the
    policy requires is missing, or its shard index names a shard it lacks."""

    code = "incomplete_model"


class SignatureError(IntegrityError):
    code = "bad_signature"


class UnsignedModelError(SignatureError):
    code = "unsigned_model"


class UntrustedSignatureError(SignatureError):
    code = "untrusted_signature"


class SignedContentError(SignatureError):
    code = "signed_content_mismatch"


class SizeMismatchError(IntegrityError):
    """The store holds an object of another size than the manifest (or listing) says: republish.

    Never an outage: the store answered, and told the truth. ``store_bytes`` is the
    size the store gave (None when only its ETag showed the size is wrong).
    """

    code = "size_mismatch"

    def __init__(self, message: str, *, store_bytes: int | None = None) -> None:
        super().__init__(message)
        self.store_bytes = store_bytes


class LocalStorageError(ModelsyncError):
    exit_code = ExitCode.LOCAL_STORAGE
    code = "local_storage"


class DiskFullError(LocalStorageError):
    code = "disk_full"


class DaemonBusyError(LocalStorageError):
    """The node daemon refused a connection: its caller's uid, or all callers, hold as many as it serves."""

    code = "daemon_busy"


class RemoteUnavailableError(ModelsyncError):
    exit_code = ExitCode.REMOTE_UNAVAILABLE
    code = "remote_unavailable"


class UnexpectedResponseError(RemoteUnavailableError):
    """The endpoint answered, but not with the range asked for; retrying won't fix it."""

    code = "unexpected_response"


class PresignedUrlExpiredError(AccessDeniedError):
    """The presigned URL, or the credentials that signed it, expired: presign again, then retry.

    ``token_expired`` is set when the store said the credentials themselves expired
    (``ExpiredToken``): the credential chain must be resolved afresh first.
    """

    code = "presign_expired"

    def __init__(self, message: str, *, token_expired: bool = False) -> None:
        super().__init__(message)
        self.token_expired = token_expired


class PullCancelledError(ModelsyncError):
    """The caller set the pull's cancel event; the journal keeps what was written, so a later pull resumes."""

    exit_code = ExitCode.INTERRUPTED
    code = "cancelled"


class TransientFetchError(Exception):
    """A failure worth retrying; ``bytes_written`` bytes of the range are on disk.

    Not a `ModelsyncError`: the pull retries it and, when retries run out, raises
    a `RemoteUnavailableError` in its place. The caller resumes with
    ``start + bytes_written``. ``reason`` is the S3 error code when the server
    sent one (``SlowDown``, ``InternalError``) or one of ``connect``, ``reset``,
    ``truncated``, ``timeout``, ``http-<status>``. ``throttled`` says the store
    asked for less load (503, 429, ``SlowDown``).
    """

    def __init__(
        self,
        message: str,
        *,
        bytes_written: int,
        reason: str,
        status: int | None = None,
        retry_after_s: float | None = None,
        throttled: bool = False,
    ) -> None:
        super().__init__(message)
        self.bytes_written = bytes_written
        self.reason = reason
        self.status = status
        self.retry_after_s = retry_after_s
        self.throttled = throttled


class UnreadableFileError(Exception):
    """What is at a model's path cannot be read as its file: gone, a link, not a regular file, or unreadable.

    Not a `ModelsyncError`: `verify --full` reports it beside bad bytes (the message is
    the reason) and quarantines the model; it never ends a command by itself.
    """


class NotARegularFileError(ValueError):
    """An input file (settings, CA bundle, schedule) is another kind of file: reading it could block
    (a named pipe) or never end. Not a `ModelsyncError`: each reader words its own refusal."""

    def __init__(self, kind: str) -> None:
        super().__init__(f"is {kind}, not a regular file")
        self.kind = kind


class FileTooLargeError(ValueError):
    """The file is longer than its reader's limit; `size` is at least `limit + 1`."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"is larger than {limit // 1024} KiB; is it the right file?")
        self.size = size


class SourceNotAllowedError(ModelsyncError):
    """A request over the daemon's socket for a source neither in the schedule nor in its allowed prefixes.

    Its own exit code: the tenant's pull is refused by policy, which an
    operator fixes in the schedule or the daemon's allow-list, not in the pod.
    """

    exit_code = ExitCode.NOT_ALLOWED
    code = "not_allowed"


def _every_error(base: type[ModelsyncError]) -> list[type[ModelsyncError]]:
    found = [base]
    for sub in base.__subclasses__():
        found += _every_error(sub)
    return found


#: code -> class, for every error above; `tests/test_errors.py` checks that codes are unique
ERRORS_BY_CODE: dict[str, type[ModelsyncError]] = {cls.code: cls for cls in _every_error(ModelsyncError)}


def error_from_code(code: str, message: str, exit_code: int | None = None) -> ModelsyncError:
    """An error that crossed a process boundary, as its own class again.

    A code this version does not know (a newer daemon) still keeps its code and
    exit code, on a plain `ModelsyncError`, so the user sees the same line and status.
    """
    cls = ERRORS_BY_CODE.get(code)
    if cls is not None:
        return cls(message)
    exc = ModelsyncError(message)
    exc.code = code
    try:
        exc.exit_code = ExitCode(exit_code if exit_code is not None else ExitCode.INTERNAL)
    except ValueError:
        exc.exit_code = ExitCode.INTERNAL
    return exc
