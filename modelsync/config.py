"""Settings: read once at the edge into one frozen value, then passed down.

Precedence for every field: command-line flag > environment variable > config
file (TOML, `--config` / `MODELSYNC_CONFIG`) > default. Credentials are not
settings: they come from the standard AWS chain (environment, shared files,
web-identity token files) and are never printed.

Memory bound of a pull: about 32 MiB of body buffers (`receive_buffer_bytes`; more only at a
concurrency above 32, or with `read_chunk_bytes` set), 1 MiB per thread that hashes
(adapters/digest.py) and a fixed overhead; it does not grow with the model's size. The page
cache it holds on disk is bounded too: at most `2 × concurrency × part_size_bytes` fetched and
not yet hashed (engine/backlog.py), the rest written behind and dropped.
"""

from __future__ import annotations

import binascii
import os
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from modelsync.config_file import check_text, file_text, read_config_file, read_regular_file
from modelsync.config_values import (
    DAY_S,
    MAX_CONCURRENCY,
    MAX_RATE_BYTES_PER_S,
    WEEK_S,
    CacheBudget,
    KiB,
    MiB,
    bounded_count,
    bounded_duration,
    bounded_rate,
    bounded_seconds,
    bounded_size,
    check_part_bytes,
    parse_addressing_style,
    parse_bool,
    parse_budget,
    parse_endpoint_url,
    parse_ratio,
    parse_signature_name,
    parse_string_list,
)
from modelsync.core.completeness import (
    ManifestMode,
    ManifestRule,
    parse_manifest_mode,
    parse_manifest_rules,
)
from modelsync.core.signature import (
    DEFAULT_SIGNATURE_NAME,
    Mode,
    SignatureRule,
    parse_mode,
    parse_rules,
)
from modelsync.core.units import MIN_RATE_CAP_BYTES_PER_S, parse_size
from modelsync.errors import CaBundleError, ConfigError, UsageError


@dataclass(frozen=True, slots=True)
class Settings:
    #: root of the node cache; ready models appear at <cache_dir>/<bucket>/<prefix>
    cache_dir: Path = field(default=Path("/model-cache"), metadata={"env": "MODELSYNC_CACHE_DIR"})
    #: S3 endpoint, e.g. https://aistor.example:9000; None uses the SDK default
    endpoint_url: str | None = field(default=None, metadata={"env": "AWS_ENDPOINT_URL"})
    region: str = field(default="us-east-1", metadata={"env": "AWS_REGION"})
    #: "path" (AIStor/MinIO), "virtual" or "auto"
    addressing_style: str = field(default="path", metadata={"env": "MODELSYNC_ADDRESSING_STYLE"})
    #: PEM bundle of CAs to trust for TLS to the endpoint
    ca_bundle: str | None = field(default=None, metadata={"env": "AWS_CA_BUNDLE"})
    #: skip TLS verification (warns on every run); never the default
    insecure: bool = field(default=False, metadata={"env": "MODELSYNC_INSECURE"})
    #: ranged GETs in flight at once, across all files of a pull
    concurrency: int = field(default=8, metadata={"env": "MODELSYNC_CONCURRENCY"})
    #: size of one ranged GET, bytes, between MIN_PART_BYTES and MAX_PART_BYTES; a resumed
    #: pull keeps the part size its journal was written with for the files it had started
    part_size_bytes: int = field(
        default=32 * MiB, metadata={"env": "MODELSYNC_PART_SIZE"}
    )
    #: cap on the pull's download rate, bytes per second; 0 means no cap
    max_bandwidth_bytes_per_s: int = field(default=0, metadata={"env": "MODELSYNC_MAX_BANDWIDTH"})
    #: seconds to wait for a TCP/TLS connection
    connect_timeout_s: float = field(default=5.0, metadata={"env": "MODELSYNC_CONNECT_TIMEOUT"})
    #: seconds a response may stay silent before the request is retried
    read_timeout_s: float = field(default=30.0, metadata={"env": "MODELSYNC_READ_TIMEOUT"})
    #: consecutive failures of a part without progress (first try included) before the pull gives up;
    #: throttling ("slow down") does not count, it is bounded by retry_budget_s
    part_attempts: int = field(default=5, metadata={"env": "MODELSYNC_PART_ATTEMPTS"})
    #: seconds a part keeps retrying without progress (throttling included) before the pull gives up
    retry_budget_s: float = field(default=600.0, metadata={"env": "MODELSYNC_RETRY_BUDGET"})
    #: shortest wait after a throttled answer, seconds; the whole retry schedule scales with it
    backoff_floor_s: float = field(default=1.0, metadata={"env": "MODELSYNC_BACKOFF_FLOOR"})
    #: lifetime of a presigned GET URL, seconds; a URL is signed again before it runs out
    presign_expiry_s: float = field(default=900.0, metadata={"env": "MODELSYNC_PRESIGN_EXPIRY"})
    #: bytes read from a response body per chunk, the unit of the memory bound; None: chosen by
    #: `receive_buffer_bytes`
    read_chunk_bytes: int | None = field(default=None, metadata={"env": "MODELSYNC_READ_CHUNK"})
    #: cache size budget (e.g. 500Gi, or 90% of the filesystem); None: only the disk's free space
    cache_budget: CacheBudget | None = field(default=None, metadata={"env": "MODELSYNC_CACHE_MAX_BYTES"})
    #: eviction starts when a pull would take the cache above high × budget ...
    high_watermark: float = field(default=0.95, metadata={"env": "MODELSYNC_CACHE_HIGH_WATERMARK"})
    #: ... and then evicts down to low × budget, so the next pulls do not each evict again
    low_watermark: float = field(default=0.85, metadata={"env": "MODELSYNC_CACHE_LOW_WATERMARK"})
    #: a model pulled or touched within this many seconds is in use and is not evicted to make room
    in_use_grace_s: float = field(default=600.0, metadata={"env": "MODELSYNC_IN_USE_GRACE"})
    #: OpenSSF model signatures for every source no rule covers: required, if-present or off
    signature: Mode = field(default=Mode.OFF, metadata={"env": "MODELSYNC_SIGNATURE"})
    #: PEM public keys trusted to sign models (comma-separated in the environment)
    signature_public_keys: tuple[str, ...] = field(
        default=(), metadata={"env": "MODELSYNC_SIGNATURE_PUBLIC_KEYS"}
    )
    #: PEM certificates a signing certificate must chain to (comma-separated in the environment)
    signature_certificate_chain: tuple[str, ...] = field(
        default=(), metadata={"env": "MODELSYNC_SIGNATURE_CERTIFICATE_CHAIN"}
    )
    #: allowed signers (certificate SAN or CN, key `sha256:<hex>`); empty: whoever the trust vouches for
    signature_identities: tuple[str, ...] = field(
        default=(), metadata={"env": "MODELSYNC_SIGNATURE_IDENTITIES"}
    )
    #: per bucket or prefix: `[[signature_rules]]` tables in the config file, a JSON list in the environment
    signature_rules: tuple[SignatureRule, ...] = field(
        default=(), metadata={"env": "MODELSYNC_SIGNATURE_RULES"}
    )
    #: the signature's object name under a model's prefix
    signature_name: str = field(default=DEFAULT_SIGNATURE_NAME, metadata={"env": "MODELSYNC_SIGNATURE_NAME"})
    #: the node's pool (its accelerator.pool label): the schedule's models `plan` and the daemon stage
    pool: str | None = field(default=None, metadata={"env": "MODELSYNC_POOL"})
    #: this node's name, which spreads the daemon's start jitter; None: the host name
    node_name: str | None = field(default=None, metadata={"env": "MODELSYNC_NODE_NAME"})
    #: s3:// prefixes whose sources the daemon serves besides the schedule's (comma-separated in the
    #: environment); each is checked where the daemon starts
    allowed_prefixes: tuple[str, ...] = field(default=(), metadata={"env": "MODELSYNC_ALLOWED_PREFIXES"})
    #: seconds a pull that does not fit now waits for models in use, leased or being pulled to
    #: become evictable, when that is forecast to make room; 0 fails at once, at most a day
    room_wait_s: float = field(default=600.0, metadata={"env": "MODELSYNC_ROOM_WAIT"})
    #: whether a source must have a modelsync.manifest.json, where no rule says: required or if-present
    manifest: ManifestMode = field(default=ManifestMode.IF_PRESENT, metadata={"env": "MODELSYNC_MANIFEST"})
    #: per bucket or prefix: `[[manifest_rules]]` tables in the config file, a JSON list in the environment
    manifest_rules: tuple[ManifestRule, ...] = field(default=(), metadata={"env": "MODELSYNC_MANIFEST_RULES"})


#: receive buffer per connection, unless the pull's buffers would pass RECEIVE_BUFFERS_BYTES. Each
#: buffer costs a receive, a write and a hash call, each taking the interpreter lock again: at
#: 4 MiB a pull held the lock 0.07-0.09 s a GiB against 0.17-0.22 at 1 MiB, and spent a quarter
#: less CPU (BENCHMARKS.md, "Issue 18: the receive buffer")
RECEIVE_BUFFER_BYTES = 4 * MiB
#: what a pull's receive buffers take together at most, unless `read_chunk_bytes` says otherwise:
#: a pod's memory limit sized for the default concurrency holds at any concurrency
RECEIVE_BUFFERS_BYTES = 32 * MiB
#: ... but never less than this a buffer: below it the lock time per GiB climbs (see above)
MIN_RECEIVE_BUFFER_BYTES = 1 * MiB


def receive_buffer_bytes(settings: Settings) -> int:
    """Each connection's receive buffer: `read_chunk_bytes` when set, else 4 MiB while the pull's
    buffers stay within 32 MiB (concurrency 8, the default), less beyond, 1 MiB at least."""
    if settings.read_chunk_bytes is not None:
        return settings.read_chunk_bytes
    share = RECEIVE_BUFFERS_BYTES // settings.concurrency
    return max(MIN_RECEIVE_BUFFER_BYTES, min(RECEIVE_BUFFER_BYTES, share))


#: the system bundle is about 220 KiB
MAX_CA_BUNDLE_BYTES = 16 * MiB
_PEM_BEGIN, _PEM_END = b"-----BEGIN CERTIFICATE-----", b"-----END CERTIFICATE-----"


def _ca_bundle(text: str) -> str | None:
    """When settings are read, a quick look (no TLS library, ~0.1 ms) for one PEM certificate.

    So a placeholder left in the CA ConfigMap fails every command, and the daemon's
    start, with one line and exit 2, while a warm pull (which opens no connection) does
    not pay for loading the bundle; `adapters/http/tls.check_ca_bundle` loads it where TLS is set up.
    """
    if not text:
        return None
    try:
        pem = read_regular_file(text, MAX_CA_BUNDLE_BYTES)
    except FileNotFoundError:
        raise CaBundleError(missing_ca_bundle(text)) from None
    except OSError as exc:
        raise CaBundleError(f"{text} cannot be read: {exc.strerror}") from None
    except ValueError as exc:  # a named pipe, a directory, or far too large to be a CA bundle
        raise CaBundleError(f"{text} {exc}; mount the object store's CA there") from None
    begin = pem.find(_PEM_BEGIN)
    end = pem.find(_PEM_END, begin)
    try:
        der = binascii.a2b_base64(pem[begin + len(_PEM_BEGIN) : end]) if 0 <= begin < end else b""
    except binascii.Error:
        der = b""
    if not der.startswith(b"\x30"):  # a DER certificate is an ASN.1 SEQUENCE
        raise CaBundleError(no_pem_certificate(text))
    return text


def missing_ca_bundle(path: str) -> str:
    """The refusal of a CA bundle path with no file, here and where TLS is set up alike."""
    return f"{path} does not exist; mount the object store's CA there"


def no_pem_certificate(path: str) -> str:
    """The refusal of a CA bundle that holds no certificate, here and where TLS is set up alike."""
    return (f"{path} holds no PEM certificate; put the object store's CA "
            "(-----BEGIN CERTIFICATE----- ...) there")


_PARSERS: dict[str, Callable[[str], Any]] = {
    "cache_dir": lambda t: Path(t).expanduser().absolute(),
    "endpoint_url": parse_endpoint_url,
    "region": str,
    "addressing_style": parse_addressing_style,
    "ca_bundle": _ca_bundle,
    "insecure": parse_bool,
    "concurrency": bounded_count(1, MAX_CONCURRENCY),
    "part_size_bytes": lambda t: check_part_bytes(parse_size(t)),
    "max_bandwidth_bytes_per_s": bounded_rate(MIN_RATE_CAP_BYTES_PER_S, MAX_RATE_BYTES_PER_S),
    "connect_timeout_s": bounded_seconds(0.1, 300),
    "read_timeout_s": bounded_seconds(0.1, 3600),
    "part_attempts": bounded_count(1, 100),
    "retry_budget_s": bounded_duration(0, WEEK_S),
    "backoff_floor_s": bounded_seconds(0.01, 60),
    "presign_expiry_s": bounded_duration(1, WEEK_S),  # SigV4 signs for at most a week
    "read_chunk_bytes": bounded_size(4 * KiB, 64 * MiB),
    "cache_budget": parse_budget,
    "high_watermark": parse_ratio,
    "low_watermark": parse_ratio,
    "in_use_grace_s": bounded_duration(0, 365 * DAY_S),
    "signature": parse_mode,
    "signature_public_keys": parse_string_list,
    "signature_certificate_chain": parse_string_list,
    "signature_identities": parse_string_list,
    "signature_rules": parse_rules,
    "signature_name": parse_signature_name,
    "pool": str,
    "node_name": str,
    "allowed_prefixes": lambda t: parse_string_list(t if t.lstrip().startswith("[") else t.replace(" ", ",")),
    "room_wait_s": bounded_duration(0, DAY_S),  # a day covers any lease worth waiting out
    "manifest": parse_manifest_mode,
    "manifest_rules": parse_manifest_rules,
}

#: what the commands that only read or manage the cache use: a bad value of any other
#: setting (say MODELSYNC_MAX_BANDWIDTH) must not stop `ls` or `evict`
CACHE_SETTINGS = frozenset({"cache_dir", "cache_budget", "high_watermark", "low_watermark", "in_use_grace_s"})
#: the signature policy and its trust (pull, and `verify --full`, which re-checks signatures)
SIGNATURE_SETTINGS = frozenset(
    {
        "signature",
        "signature_public_keys",
        "signature_certificate_chain",
        "signature_identities",
        "signature_rules",
        "signature_name",
    }
)
#: what reaching S3 uses (an upload needs these plus concurrency and part size)
S3_SETTINGS = frozenset(
    {
        "endpoint_url",
        "region",
        "addressing_style",
        "ca_bundle",
        "insecure",
        "connect_timeout_s",
        "read_timeout_s",
    }
)


def load_settings(
    flags: Mapping[str, object | None],
    env: Mapping[str, str],
    config_file: Path | None = None,
    needed: Collection[str] | None = None,
) -> Settings:
    """Build Settings from flags, environment and an optional TOML file.

    `flags` holds already-typed values (None means "not given"; `parse_setting`
    types a flag's text); environment and file values are text and go through
    the field's parser. Every bad value of a `needed` setting (default: all) is a
    ConfigError naming where it came from; a bad value of a setting the command
    does not use leaves that setting at its default.
    """
    file_values = read_config_file(config_file) if config_file else {}
    unknown = set(file_values) - {f.name for f in fields(Settings)}
    if unknown:
        raise ConfigError(f"config file {config_file}: unknown setting(s) {', '.join(sorted(unknown))}")
    values: dict[str, Any] = {}
    for f in fields(Settings):
        if flags.get(f.name) is not None:
            values[f.name] = flags[f.name]
            continue
        name = f.metadata["env"]
        if name == "AWS_REGION" and not _given(env.get(name)):
            name = "AWS_DEFAULT_REGION"  # the older name, read when the newer one is not given
        try:
            if _given(env.get(name)):
                values[f.name] = parse_setting(f.name, env[name], f"environment variable {name}")
            elif _given(file_values.get(f.name)):
                values[f.name] = _file_setting(f.name, f.type, file_values[f.name], config_file)
        except ConfigError:
            if needed is None or f.name in needed:
                raise
    low, high = values.get("low_watermark", 0.85), values.get("high_watermark", 0.95)
    if low > high:
        raise ConfigError(f"the low watermark ({low}) must not exceed the high watermark ({high})")
    if values.get("cache_dir") is not None:
        values["cache_dir"] = Path(values["cache_dir"]).expanduser().absolute()
    return Settings(**values)


def parse_setting(name: str, text: str, origin: str) -> Any:
    """One setting's value from text; `origin` (a flag, a variable, a file) is named in the error."""
    try:
        check_text(text)
        return _PARSERS[name](text)
    except (ValueError, UsageError) as exc:
        error = type(exc) if isinstance(exc, ConfigError) else ConfigError  # CaBundleError keeps its code
        # a flag names its setting itself; a variable or a file line needs the setting said
        subject = origin if origin.startswith("--") else f"{origin}: bad value for {name}"
        raise error(f"{subject}: {exc}") from None


def _given(value: object) -> bool:
    """Empty text means "not given", in a variable and in the file alike: `MODELSYNC_CACHE_DIR=`
    (an unset variable in a manifest) falls back to the file or the default, never to the
    current directory."""
    return value is not None and not (isinstance(value, str) and not value.strip())


def _file_setting(name: str, annotation: object, value: object, config_file: Path | None) -> Any:
    """A config-file value of setting `name`, of a TOML type that fits the field's `annotation`."""
    origin = f"config file {config_file}"
    try:
        text = file_text(value, str(annotation))
    except ValueError as exc:
        raise ConfigError(f"{origin}: bad value for {name}: {exc}") from None
    return parse_setting(name, text, origin)


def config_file_from(flag: Path | None, env: Mapping[str, str]) -> Path | None:
    """The config file to read: `--config`, else `MODELSYNC_CONFIG`, else none."""
    if flag is not None:
        return flag
    name = env.get("MODELSYNC_CONFIG")
    return Path(name) if name else None


def environment() -> Mapping[str, str]:
    """The process environment, read at the edge only."""
    return os.environ
