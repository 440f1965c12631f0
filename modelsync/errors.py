"""One error tree for modelsync, with the exit code of each branch.

Every error a user can cause or fix derives from `ModelsyncError`; the CLI prints
it as a single `error: ...` line and exits with its code. Anything else that
escapes is a bug: the CLI lets it show its traceback and exits 1.

    ModelsyncError
    ├── UsageError (2)              bad arguments
    │   ├── ConfigError             a bad setting, config file or AWS profile
    │   │   └── CaBundleError       AWS_CA_BUNDLE holds no usable certificate
    │   ├── ScheduleError           the schedule file is unreadable or invalid
    │   └── WrongEndpointError      the store redirects: wrong endpoint or region
    ├── NotFoundError (3)           bucket, prefix, key, cache or cached model does not exist
    │   └── BucketNotFoundError     the bucket itself does not exist
    ├── AccessDeniedError (4)       credentials rejected or not allowed
    ├── IntegrityError (5)
    │   ├── ChecksumMismatchError   bytes do not match the recorded digest or ETag
    │   ├── ObjectChangedError      the object was overwritten during the pull
    │   ├── UnsafeKeyError          a key would escape or alias inside the cache
    │   ├── ManifestError           modelsync.manifest.json is malformed
    │   ├── MalformedModelError     a safetensors header or shard index does not add up
    │   └── SignatureError          the model's OpenSSF signature does not vouch for it
    │       ├── UnsignedModelError      a signature is required and there is none
    │       ├── UntrustedSignatureError the signature or its signer is not trusted
    │       └── SignedContentError      a file is not listed in the signature or does not match
    ├── LocalStorageError (6)
    │   └── DiskFullError           not enough space for the model
    ├── RemoteUnavailableError (7)  endpoint unreachable or failing after retries
    └── SourceNotAllowedError (8)   the node daemon does not serve this source to tenants

Only adapters translate foreign exceptions (botocore, aiohttp, OSError) into
these; the core raises them directly.
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


class SignatureError(IntegrityError):
    code = "bad_signature"


class UnsignedModelError(SignatureError):
    code = "unsigned_model"


class UntrustedSignatureError(SignatureError):
    code = "untrusted_signature"


class SignedContentError(SignatureError):
    code = "signed_content_mismatch"


class LocalStorageError(ModelsyncError):
    exit_code = ExitCode.LOCAL_STORAGE
    code = "local_storage"


class DiskFullError(LocalStorageError):
    code = "disk_full"


class RemoteUnavailableError(ModelsyncError):
    exit_code = ExitCode.REMOTE_UNAVAILABLE
    code = "remote_unavailable"


class SourceNotAllowedError(ModelsyncError):
    """A request over the daemon's socket for a source neither in the schedule nor in its allowed prefixes.

    Its own exit code: the tenant's pull is refused by policy, which an
    operator fixes in the schedule or the daemon's allow-list, not in the pod.
    """

    exit_code = ExitCode.NOT_ALLOWED
    code = "not_allowed"
