"""The command-line contract, checked on the real CLI in a child process.

Each user mistake in MISTAKES prints exactly one line on stderr, starting `error: `,
exits with the documented code (modelsync.errors.ExitCode), never shows a traceback
or a secret, and leaves nothing behind in the cache (a command refused before it
starts does not even create one). On success the last line of stdout of `pull` is
the absolute ready path, and a warm pull needs neither the network nor the S3 stack.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest
from botocore.client import BaseClient
from support.cli import run_cli
from support.faultproxy import FaultProxy
from support.motoserver import SubprocessMoto
from support.s3env import S3Env
from test_warm import make_ready

from modelsync.adapters.cache import Cache
from modelsync.adapters.digest import xxh3_of
from modelsync.core.refs import parse_source
from modelsync.core.units import format_bytes
from modelsync.errors import ExitCode

MiB = 1024 * 1024
PREFIX = "org/model/rev1/"
WRONG_ACCESS_KEY = "AKIAWRONGKEY00000000"
WRONG_SECRET = "wr0ng-S3cret-must-never-be-printed-7f3a"

# Runs the CLI like the console script, then reports on stderr whether the S3 stack
# was imported; the extra line comes after the CLI's own output.
REPORT_IMPORTS = (
    "import sys\n"
    "from modelsync.__main__ import main\n"
    "try:\n"
    "    main()\n"
    "finally:\n"
    "    sys.stderr.write('aiobotocore imported: %s\\n' % ('aiobotocore' in sys.modules))\n"
)
# Runs the CLI with posix_fallocate failing with ENOSPC, as on a full volume.
NO_SPACE = (
    "import errno, os\n"
    "def no_space(*args):\n"
    "    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))\n"
    "os.posix_fallocate = no_space\n"
    "from modelsync.__main__ import main\n"
    "main()\n"
)


def assert_user_error(
    done: subprocess.CompletedProcess[str], code: ExitCode, *mentions: str, stdout: bool = False
) -> str:
    """Exactly one `error: ` line on stderr, the documented code, no traceback.

    stdout stays empty unless the command prints a partial result before refusing (`stdout`).
    """
    lines = done.stderr.splitlines()
    assert done.returncode == int(code), done.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert "Traceback" not in done.stderr + done.stdout
    if not stdout:
        assert done.stdout == ""
    for text in mentions:
        assert text in lines[0]
    return lines[0]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "cache"


#: what a failed command may leave in a cache: the empty layout, the index and lock files
_LAYOUT_OK = {"layout", "index.sqlite", "index.sqlite-wal", "index.sqlite-shm", "locks"}


def left_behind(cache: Path, known: tuple[str, ...] = ()) -> list[str]:
    """Everything a failed command left in the cache beyond its empty layout: models, staging, markers.

    `known` names state subdirectories the failure keeps on purpose (a journal to resume from).
    """
    if not cache.exists():
        return []
    found = []
    for path in sorted(cache.rglob("*")):
        relative = path.relative_to(cache)
        if relative.parts[0] != ".modelsync":
            found.append(str(relative))  # a ready model, or anything else outside the state dir
        elif len(relative.parts) > 2 and relative.parts[1] not in {*_LAYOUT_OK, *known}:
            found.append(str(relative))  # staging, a journal, a record, a marker, a reservation...
    return found


# ---- success and warm pulls --------------------------------------------------------------


def test_cli_pull_prints_the_ready_path_last_and_a_warm_pull_needs_no_network_nor_the_s3_stack(
    tmp_path: Path, cache: Path, s3_env: S3Env, s3_client: BaseClient, bucket: str
) -> None:
    data = os.urandom(2 * MiB + 3)
    s3_client.put_object(Bucket=bucket, Key=PREFIX + "weights.bin", Body=data)
    s3_client.put_object(Bucket=bucket, Key=PREFIX + "config.json", Body=b"{}")
    args = ["pull", f"s3://{bucket}/{PREFIX}", "--cache-dir", str(cache), "--part-size", "1Mi"]

    cold = run_cli(s3_env.subprocess_env(), *args)

    assert cold.returncode == 0, cold.stderr
    ready = cache / parse_source(f"s3://{bucket}/{PREFIX}").cache_path
    assert cold.stdout.splitlines()[-1] == str(ready)
    assert Path(cold.stdout.splitlines()[-1]).is_absolute()
    assert (ready / "weights.bin").read_bytes() == data
    assert "Traceback" not in cold.stderr

    dead = s3_env.via("http://127.0.0.1:9").subprocess_env()
    started = time.monotonic()
    warm = run_cli(dead, *args, "--endpoint-url", "http://127.0.0.1:9", code=REPORT_IMPORTS)
    warm_s = time.monotonic() - started

    assert warm.returncode == 0, warm.stderr
    assert warm.stdout.splitlines() == [str(ready)]
    assert warm.stderr.splitlines()[-1] == "aiobotocore imported: False"
    assert warm_s < 10  # interpreter start included; the pull itself does no I/O


# ---- the table of user mistakes -----------------------------------------------------------

SCHEDULE = """\
version: 1
timezone: UTC
models:
  - name: deepseek-v3
    source: s3://models/deepseek-ai/DeepSeek-V3/2025-03-24/
    pools: [b300-serving]
    windows: [always]
  - name: qwen3
    source: s3://models/Qwen/Qwen3-32B/2025-05-01/
    pools: [b300-serving, h200-batch]
    windows: [always]
"""


@dataclass(frozen=True)
class World:
    """What a row may refer to: its placeholders, and the S3 state to arrange."""

    tmp_path: Path
    cache: Path
    client: BaseClient | None
    bucket: str
    fault_proxy: FaultProxy | None

    def placeholders(self, endpoint: str) -> dict[str, str]:
        regular = self.tmp_path / "a-file"
        regular.write_text("not a directory")
        schedule = self.tmp_path / "schedule.yaml"
        schedule.write_text(SCHEDULE)
        model_dir = self.tmp_path / "model"
        model_dir.mkdir(exist_ok=True)
        (model_dir / "config.json").write_text("{}")
        return {
            "cache": str(self.cache),
            "bucket": self.bucket,
            "file": str(regular),
            "schedule": str(schedule),
            "dir": str(model_dir),
            "typo": str(self.tmp_path / "typo"),
            "tmp": str(self.tmp_path),
            "tls": endpoint.replace("http://", "https://"),
            "config": str(self.tmp_path / "settings.toml"),
        }


def _objects(*names: str) -> Callable[[World], None]:
    def arrange(world: World) -> None:
        assert world.client is not None
        for name in names:
            world.client.put_object(Bucket=world.bucket, Key=PREFIX + name, Body=b"w" * 1000)

    return arrange


def _bad_manifest(world: World) -> None:
    assert world.client is not None
    _objects("a.bin")(world)
    doc = {"format": "modelsync-manifest", "version": 7, "files": []}
    world.client.put_object(
        Bucket=world.bucket, Key=PREFIX + "modelsync.manifest.json", Body=json.dumps(doc).encode()
    )


def _understated_manifest(world: World) -> None:
    """A manifest that says weights.bin is 100 B (and its first 100 bytes' xxh3); the store holds 1000."""
    assert world.client is not None
    _objects("weights.bin")(world)
    entry = {
        "path": "weights.bin",
        "size": 100,
        "xxh3_128": xxh3_of(b"w" * 100),
        "etag": hashlib.md5(b"w" * 1000).hexdigest(),
    }
    doc = {"format": "modelsync-manifest", "version": 1, "files": [entry]}
    world.client.put_object(
        Bucket=world.bucket, Key=PREFIX + "modelsync.manifest.json", Body=json.dumps(doc).encode()
    )


def _cached_by_hand(how: str) -> Callable[[World], None]:
    """A ready model made on disk without a pull: its record damaged, or its one file a named pipe."""

    def arrange(world: World) -> None:
        cache = Cache(world.cache)
        cache.ensure()
        ref = parse_source("s3://models/org/m/")
        ready = cache.ready_path(ref)
        ready.mkdir(parents=True)
        entry = {"path": "w.bin", "size": 4, "xxh3_128": xxh3_of(b"wwww"), "etag": None}
        record = {"format": "modelsync-record", "version": 1, "source": ref.uri, "completed_at": 1.0}
        record |= {"verified_by": "manifest", "files": [entry]}
        if how == "fifo":
            os.mkfifo(ready / "w.bin")
            cache.record_path(ref).write_text(json.dumps(record))
        else:
            (ready / "w.bin").write_bytes(b"wwww")
            cache.record_path(ref).write_text(json.dumps(record)[:40])

    return arrange


def _faulty(kind: str) -> Callable[[World], None]:
    def arrange(world: World) -> None:
        assert world.client is not None and world.fault_proxy is not None
        world.client.put_object(Bucket=world.bucket, Key=PREFIX + "weights.bin", Body=os.urandom(MiB + 1))
        world.fault_proxy.add_fault(kind, match="weights.bin", arg=10, times=100)

    return arrange


def _flipped_differently(world: World) -> None:
    """Every fetch of weights.bin (two parts) gets other bits flipped: the way, not the store."""
    assert world.client is not None and world.fault_proxy is not None
    world.client.put_object(Bucket=world.bucket, Key=PREFIX + "weights.bin", Body=os.urandom(MiB + 1))
    for offset in range(10, 16):
        world.fault_proxy.add_fault("bitflip", match="weights.bin", arg=offset)


def _empty_cache(world: World) -> None:
    Cache(world.cache).ensure()


def _config(content: str | bytes) -> Callable[[World], None]:
    """A settings file at {config}, written as text (UTF-8) or as these exact bytes."""

    def arrange(world: World) -> None:
        data = content.encode() if isinstance(content, str) else content
        (world.tmp_path / "settings.toml").write_bytes(data)

    return arrange


def _config_fifo(world: World) -> None:
    """{config} is a named pipe no one writes to: reading it would wait forever."""
    os.mkfifo(world.tmp_path / "settings.toml")


def _fifo(world: World) -> None:
    os.mkfifo(world.tmp_path / "schedule.fifo")


def _big_schedule(world: World) -> None:
    (world.tmp_path / "big.yaml").write_text("#" * (3 * MiB) + "\n")


def _publish_in_progress(world: World) -> None:
    _objects("config.json", "modelsync.publishing")(world)


def _shard_missing(world: World) -> None:
    assert world.client is not None
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    _objects("model-00001-of-00002.safetensors")(world)
    world.client.put_object(
        Bucket=world.bucket, Key=PREFIX + "model.safetensors.index.json", Body=json.dumps(index).encode()
    )


def _ready_revision(world: World) -> None:
    """The revision at PREFIX ready in the cache, as a pull leaves it, and objects around it in the store."""
    _objects("weights.bin", "sub/a.bin")(world)
    make_ready(world.cache, SRC.format(bucket=world.bucket))


@dataclass(frozen=True)
class Mistake:
    """One user mistake: the command line (with placeholders), what it must answer, and its setting."""

    id: str
    argv: tuple[str, ...]
    code: ExitCode
    mentions: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    arrange: Callable[[World], None] | None = None
    #: where S3 is: nowhere (the mistake is caught before any request), a closed port the
    #: command tries, moto, moto behind the fault proxy, or a moto that checks signatures
    #: (with wrong credentials)
    s3: Literal["none", "dead", "moto", "proxy", "auth"] = "none"
    #: Python run instead of `-m modelsync` (a full disk)
    python: str | None = None
    #: the command prints a partial result on stdout before refusing
    stdout: bool = False
    #: what the failure keeps on purpose (see left_behind)
    known_leftovers: tuple[str, ...] = ()
    #: paths outside the state directory that `arrange` put there (a ready model)
    arranged: tuple[str, ...] = ()


PULL = ("pull", "s3://models/org/m/", "--cache-dir", "{cache}", "-q")
PLAN = ("plan", "--schedule", "{schedule}", "--pool", "b300-serving", "--offline", "--cache-dir", "{cache}")
SRC = f"s3://{{bucket}}/{PREFIX}"
USAGE, NOT_FOUND, DENIED = ExitCode.USAGE, ExitCode.NOT_FOUND, ExitCode.ACCESS_DENIED
INTEGRITY, STORAGE, REMOTE = ExitCode.INTEGRITY, ExitCode.LOCAL_STORAGE, ExitCode.REMOTE_UNAVAILABLE
#: a pull's foreground marker, and a failed transfer's staging (see left_behind)
#: a transfer that failed after it started keeps its staged parts and journal on purpose:
#: the next run resumes from them (a refused or misdirected pull leaves nothing)
RESUMABLE = ("staging",)


def _verify_finds(name: str, argv: tuple[str, ...], how: str) -> Mistake:
    """`verify` of a model made by hand and damaged `how`: exit 5 in one line, the model quarantined."""
    return Mistake(
        name,
        (*argv, "--cache-dir", "{cache}"),
        INTEGRITY,
        ("1 model damaged and quarantined (models/org/m)", "verify --repair"),
        arrange=_cached_by_hand(how),
        stdout=True,
        known_leftovers=("quarantine",),
    )


MISTAKES = [
    # -- the parser's own mistakes
    Mistake("pull-without-source", ("pull",), USAGE, ("Missing argument 'SOURCE'", "modelsync pull --help")),
    Mistake("unknown-option", (*PULL, "--bogus"), USAGE, ("No such option: --bogus",)),
    Mistake("unknown-command", ("pul", "s3://models/org/m/"), USAGE, ("No such command 'pul'",)),
    Mistake("concurrency-zero", (*PULL, "--concurrency", "0"), USAGE, ("--concurrency",)),
    Mistake(
        "cache-dir-empty",
        ("pull", "s3://models/org/m/", "--cache-dir", "", "-q"),
        USAGE,
        ("Invalid value for '--cache-dir': is empty",),
    ),
    Mistake("ls-cache-dir-empty", ("ls", "--cache-dir", ""), USAGE, ("'--cache-dir': is empty",)),
    Mistake("concurrency-not-a-number", (*PULL, "--concurrency", "lots"), USAGE, ("--concurrency",)),
    # -- sources
    Mistake("whole-bucket", ("pull", "s3://models/", "--cache-dir", "{cache}"), USAGE, ("whole bucket",)),
    Mistake(
        "bucket-without-slash", ("pull", "s3://models", "--cache-dir", "{cache}"), USAGE, ("whole bucket",)
    ),
    Mistake(
        "not-s3", ("pull", "https://models/org/m/", "--cache-dir", "{cache}"), USAGE, ("not an s3:// URI",)
    ),
    Mistake(
        "bad-bucket-name", ("pull", "s3://Bad_Bucket/m/", "--cache-dir", "{cache}"), USAGE, ("bucket name",)
    ),
    Mistake(
        "unsafe-prefix", ("pull", "s3://models/a/../../etc/", "--cache-dir", "{cache}"), USAGE, ("unsafe",)
    ),
    Mistake(
        "name-without-a-daemon",
        ("pull", "qwen3-32b", "--cache-dir", "{cache}"),
        ExitCode.LOCAL_STORAGE,
        ("a model name is resolved by the node's daemon", "give the s3:// source"),
    ),
    # -- settings, from flags, variables and files
    Mistake("part-size-zero", (*PULL, "--part-size", "0"), USAGE, ("--part-size: part size 0 B is under",)),
    Mistake("part-size-not-a-size", (*PULL, "--part-size", "big"), USAGE, ("--part-size", "'big'")),
    Mistake("bandwidth-per-minute", (*PULL, "--max-bandwidth", "500Mi/m"), USAGE, ("--max-bandwidth",)),
    Mistake(
        "bandwidth-variable",
        PULL,
        USAGE,
        ("MODELSYNC_MAX_BANDWIDTH", "'fast'"),
        env={"MODELSYNC_MAX_BANDWIDTH": "fast"},
    ),
    Mistake(
        "concurrency-variable", PULL, USAGE, ("MODELSYNC_CONCURRENCY",), env={"MODELSYNC_CONCURRENCY": "lots"}
    ),
    Mistake(
        "endpoint-flag-without-scheme",
        (*PULL, "--endpoint-url", "127.0.0.1:9000"),
        USAGE,
        ("--endpoint-url", "http://127.0.0.1:9000"),
    ),
    Mistake(
        "endpoint-variable-without-scheme",
        PULL,
        USAGE,
        ("AWS_ENDPOINT_URL", "http://minio.local:9000"),
        env={"AWS_ENDPOINT_URL": "minio.local:9000"},
    ),
    Mistake(
        "endpoint-not-http", (*PULL, "--endpoint-url", "ftp://minio.local/"), USAGE, ("http:// or https://",)
    ),
    Mistake(
        "endpoint-bad-port", (*PULL, "--endpoint-url", "http://minio.local:99999"), USAGE, ("--endpoint-url",)
    ),
    Mistake("missing-config-file", (*PULL, "--config", "{typo}.toml"), USAGE, ("does not exist",)),
    Mistake("lease-not-a-duration", (*PULL, "--lease", "forever"), USAGE, ("'forever'",)),
    Mistake(
        "budget-variable-for-ls",
        ("ls", "--cache-dir", "{cache}"),
        USAGE,
        ("MODELSYNC_CACHE_MAX_BYTES",),
        env={"MODELSYNC_CACHE_MAX_BYTES": "lots"},
        arrange=_empty_cache,
    ),
    Mistake(
        "unknown-aws-profile",
        ("pull", "s3://{bucket}/org/m/", "--cache-dir", "{cache}", "-q"),
        USAGE,
        ("AWS profile 'nosuchprofile'", "AWS_PROFILE"),
        env={"AWS_PROFILE": "nosuchprofile"},
        s3="moto",
    ),
    Mistake(
        "tls-to-plain-http",
        ("pull", SRC, "--cache-dir", "{cache}", "-q", "--endpoint-url", "{tls}"),
        USAGE,
        ("speaks plain HTTP", "http://"),
        s3="moto",
    ),
    # -- signature-rule scopes are prefixes: a glob, a file or a bucket no source has never matches
    Mistake(
        "signature-scope-a-glob-in-the-file",
        (*PULL, "--config", "{config}"),
        USAGE,
        ("config file", "'s3://models/org/*' is a glob", "write s3://models/org/"),
        arrange=_config('[[signature_rules]]\nscope = "s3://models/org/*"\nmode = "required"\n'),
    ),
    Mistake(
        "signature-scope-a-glob-in-the-variable",
        PULL,
        USAGE,
        ("MODELSYNC_SIGNATURE_RULES", "is a glob"),
        env={"MODELSYNC_SIGNATURE_RULES": '[{"scope": "s3://models/org/*", "mode": "required"}]'},
    ),
    Mistake(
        "signature-scope-a-file",
        PULL,
        USAGE,
        ("MODELSYNC_SIGNATURE_RULES", "names a file", "write s3://models/org/m/"),
        env={"MODELSYNC_SIGNATURE_RULES": '[{"scope": "s3://models/org/m/config.json", "mode": "required"}]'},
    ),
    Mistake(
        "signature-scope-never-matches",
        PULL,
        USAGE,
        ("'Models' is not a valid bucket name", "could never match"),
        env={"MODELSYNC_SIGNATURE_RULES": '[{"scope": "s3://Models/org/", "mode": "required"}]'},
    ),
    # -- an endpoint is a scheme, a host and a port
    Mistake(
        "endpoint-with-a-path",
        (*PULL, "--endpoint-url", "http://127.0.0.1:9000/s3"),
        USAGE,
        ("--endpoint-url", "has a path", "write http://127.0.0.1:9000 "),
    ),
    Mistake(
        "publish-to-an-endpoint-with-a-path",
        ("publish", "{dir}", "s3://models/org/m/", "-q"),
        USAGE,
        ("AWS_ENDPOINT_URL", "has a path"),
        env={"AWS_ENDPOINT_URL": "http://127.0.0.1:9000/s3/"},
    ),
    # -- the settings file: a regular UTF-8 file, of bounded size and nesting, values of the right type
    Mistake(
        "config-a-named-pipe",
        ("ls", "--cache-dir", "{cache}", "--config", "{config}"),
        USAGE,
        ("is a named pipe, not a regular file",),
        arrange=_config_fifo,
    ),
    Mistake(
        "config-a-directory",
        ("ls", "--cache-dir", "{cache}", "--config", "{dir}"),
        USAGE,
        ("is a directory, not a regular file",),
    ),
    Mistake(
        "config-not-utf8",
        ("ls", "--cache-dir", "{cache}", "--config", "{config}"),
        USAGE,
        ("is not UTF-8 text", "0xff"),
        arrange=_config(b'region = "caf\xff"\n'),
    ),
    Mistake(
        "config-too-large",
        ("ls", "--cache-dir", "{cache}", "--config", "{config}"),
        USAGE,
        ("is larger than 1024 KiB",),
        arrange=_config("# " + "x" * 1024 * 1024 + "\n"),
    ),
    Mistake(
        "config-nested-too-deep",
        (*PULL, "--config", "{config}"),
        USAGE,
        ("signature_rules", "nested more than 8 levels"),
        arrange=_config("signature_rules = " + "[" * 5000 + "]" * 5000 + "\n"),
    ),
    Mistake(
        "cache-dir-a-list-in-the-file",
        ("ls", "--config", "{config}"),
        USAGE,
        ("cache_dir", "an array where a string belongs"),
        arrange=_config('cache_dir = ["a", "b"]\n'),
    ),
    Mistake(
        "cache-dir-a-number-in-the-file",
        ("ls", "--config", "{config}"),
        USAGE,
        ("cache_dir", "an integer where a string belongs"),
        arrange=_config("cache_dir = 5\n"),
    ),
    Mistake(
        "cache-dir-with-a-nul",
        ("ls", "--config", "{config}"),
        USAGE,
        ("cache_dir", "NUL character"),
        arrange=_config('cache_dir = "/tmp/a\\u0000b"\n'),
    ),
    Mistake(
        "concurrency-a-table-in-the-file",
        (*PULL, "--config", "{config}"),
        USAGE,
        ("concurrency", "a table where"),
        arrange=_config("concurrency = {threads = 8}\n"),
    ),
    # -- numbers are finite and bounded
    Mistake(
        "concurrency-absurd", (*PULL, "--concurrency", "1000000"), USAGE, ("out of range; use 1 to 256",)
    ),
    Mistake(
        "concurrency-infinite",
        PULL,
        USAGE,
        ("MODELSYNC_CONCURRENCY", "'inf'"),
        env={"MODELSYNC_CONCURRENCY": "inf"},
    ),
    Mistake(
        "read-timeout-not-a-number",
        PULL,
        USAGE,
        ("MODELSYNC_READ_TIMEOUT", "'nan' is not a finite number"),
        env={"MODELSYNC_READ_TIMEOUT": "nan"},
    ),
    Mistake(
        "connect-timeout-infinite",
        PULL,
        USAGE,
        ("MODELSYNC_CONNECT_TIMEOUT", "not a finite number"),
        env={"MODELSYNC_CONNECT_TIMEOUT": "1e999"},
    ),
    Mistake(
        "read-timeout-absurd",
        PULL,
        USAGE,
        ("MODELSYNC_READ_TIMEOUT", "use 0.1 s to 3600 s"),
        env={"MODELSYNC_READ_TIMEOUT": "100000000"},
    ),
    Mistake(
        "publish-with-a-read-timeout-no-answer-beats",
        ("publish", "{dir}", "s3://{bucket}/org/m/", "-q"),
        USAGE,
        ("MODELSYNC_READ_TIMEOUT", "1e-06 s is out of range"),
        env={"MODELSYNC_READ_TIMEOUT": "0.000001"},
        s3="moto",
    ),
    Mistake(
        "read-chunk-absurd",
        PULL,
        USAGE,
        ("MODELSYNC_READ_CHUNK", "use 4.0 KiB to 64.0 MiB"),
        env={"MODELSYNC_READ_CHUNK": "100Gi"},
    ),
    Mistake(
        "part-attempts-absurd",
        PULL,
        USAGE,
        ("MODELSYNC_PART_ATTEMPTS", "use 1 to 100"),
        env={"MODELSYNC_PART_ATTEMPTS": "99999999"},
    ),
    Mistake(
        "presign-expiry-over-a-week",
        PULL,
        USAGE,
        ("MODELSYNC_PRESIGN_EXPIRY", "out of range"),
        env={"MODELSYNC_PRESIGN_EXPIRY": "30d"},
    ),
    Mistake(
        "bandwidth-absurd", (*PULL, "--max-bandwidth", "5Ei/s"), USAGE, ("--max-bandwidth", "0 (no cap) or")
    ),
    Mistake(
        "watermark-not-a-number",
        ("ls", "--cache-dir", "{cache}"),
        USAGE,
        ("MODELSYNC_CACHE_HIGH_WATERMARK", "not a finite number"),
        env={"MODELSYNC_CACHE_HIGH_WATERMARK": "nan"},
        arrange=_empty_cache,
    ),
    # -- the cache directory
    Mistake(
        "pull-into-a-regular-file",
        ("pull", "s3://models/org/m/", "--cache-dir", "{file}"),
        STORAGE,
        ("not a directory",),
    ),
    Mistake(
        "pull-under-a-regular-file",
        ("pull", "s3://models/org/m/", "--cache-dir", "{file}/cache"),
        STORAGE,
        ("which is not a directory",),
    ),
    Mistake("ls-of-a-regular-file", ("ls", "--cache-dir", "{file}"), STORAGE, ("not a directory",)),
    Mistake("ls-of-a-typo", ("ls", "--cache-dir", "{typo}"), NOT_FOUND, ("no modelsync cache at",)),
    Mistake("verify-of-a-typo", ("verify", "--cache-dir", "{typo}"), NOT_FOUND, ("no modelsync cache at",)),
    Mistake("gc-of-a-typo", ("gc", "--cache-dir", "{typo}"), NOT_FOUND, ("no modelsync cache at",)),
    Mistake(
        "evict-of-a-typo",
        ("evict", "--to-size", "1G", "--cache-dir", "{typo}"),
        NOT_FOUND,
        ("no modelsync cache at",),
    ),
    Mistake(
        "pin-of-a-typo", ("pin", "models/org/m", "--cache-dir", "{typo}"), NOT_FOUND, ("no modelsync cache",)
    ),
    Mistake(
        "pin-of-a-model-not-cached",
        ("pin", "models/org/m", "--cache-dir", "{cache}"),
        NOT_FOUND,
        ("models/org/m",),
        arrange=_empty_cache,
    ),
    # -- operator commands
    Mistake(
        "evict-without-selection",
        ("evict", "--cache-dir", "{cache}"),
        USAGE,
        ("exactly one of",),
        arrange=_empty_cache,
    ),
    Mistake(
        "evict-two-selections",
        ("evict", "models/org/m", "--to-size", "1G", "--cache-dir", "{cache}"),
        USAGE,
        ("exactly one of",),
        arrange=_empty_cache,
    ),
    Mistake(
        "evict-to-a-bad-size",
        ("evict", "--to-size", "lots", "--cache-dir", "{cache}"),
        USAGE,
        ("invalid size 'lots'",),
        arrange=_empty_cache,
    ),
    Mistake(
        "gc-bad-age",
        ("gc", "--older-than", "soon", "--cache-dir", "{cache}"),
        USAGE,
        ("invalid duration 'soon'",),
        arrange=_empty_cache,
    ),
    _verify_finds("verify-of-a-damaged-record", ("verify",), "damaged-record"),
    _verify_finds("verify-full-of-a-named-pipe", ("verify", "--full"), "fifo"),
    # -- schedule commands
    Mistake(
        "plan-unknown-pool",
        ("plan", "--schedule", "{schedule}", "--pool", "b300-servng", "--offline", "--cache-dir", "{cache}"),
        USAGE,
        ("unknown pool 'b300-servng'", "b300-serving, h200-batch"),
    ),
    Mistake(
        "plan-without-pool",
        ("plan", "--schedule", "{schedule}", "--offline", "--cache-dir", "{cache}"),
        USAGE,
        ("no pool given",),
    ),
    Mistake(
        "plan-missing-schedule",
        ("plan", "--schedule", "{typo}.yaml", "--pool", "p", "--cache-dir", "{cache}"),
        USAGE,
        ("typo.yaml",),
    ),
    Mistake(
        "plan-budget-not-a-size",
        ("plan", "--schedule", "{schedule}", "--pool", "b300-serving", "--offline", "--budget", "half",
         "--cache-dir", "{cache}"),
        USAGE,
        ("--budget", "'half'"),
    ),
    Mistake(
        "plan-absurd-pool",
        ("plan", "--schedule", "{schedule}", "--pool", "b300-serving", "--offline", "--nodes", "10000000",
         "--store-bandwidth", "1", "--cache-dir", "{cache}"),
        USAGE,
        ("invalid --nodes 10000000", "1 to 100000"),
    ),
    Mistake(
        "plan-at-year-1",
        (*PLAN, "--at", "0001-01-01"),
        USAGE,
        ("'0001-01-01' is outside what the planner handles", "1970-01-01 to 9000-01-01"),
    ),
    Mistake(
        "plan-at-past-year-9999",
        (*PLAN, "--at", "9999-12-31T23:59-12:00"),
        USAGE,
        ("outside what the planner handles",),
    ),
    Mistake(
        "plan-schedule-is-a-fifo",
        ("plan", "--schedule", "{tmp}/schedule.fifo", "--pool", "p", "--offline", "--cache-dir", "{cache}"),
        USAGE,
        ("the schedule is a named pipe, not a regular file",),
        arrange=_fifo,
    ),
    Mistake(
        "plan-schedule-too-large",
        ("plan", "--schedule", "{tmp}/big.yaml", "--pool", "p", "--offline", "--cache-dir", "{cache}"),
        USAGE,
        (f"the schedule is {3 * MiB + 1} bytes, over the limit of {MiB}",),
        arrange=_big_schedule,
    ),
    Mistake(
        "plan-schedule-is-a-directory",
        ("plan", "--schedule", "{tmp}", "--pool", "p", "--offline", "--cache-dir", "{cache}"),
        USAGE,
        ("the schedule is a directory, not a regular file",),
    ),
    Mistake(
        "prefetch-unknown-name",
        ("prefetch", "--schedule", "{schedule}", "nosuchname", "--cache-dir", "{cache}"),
        USAGE,
        ("no model named 'nosuchname'", "deepseek-v3, qwen3"),
    ),
    Mistake(
        "daemon-zero-tick",
        ("daemon", "--schedule", "{schedule}", "--pool", "p", "--tick", "0", "--cache-dir", "{cache}"),
        USAGE,
        ("--tick",),
    ),
    Mistake(
        "daemon-bad-listen",
        ("daemon", "--schedule", "{schedule}", "--pool", "p", "--listen", "9477", "--cache-dir", "{cache}"),
        USAGE,
        ("--listen",),
    ),
    Mistake(
        "daemon-allowed-prefix-glob",
        ("daemon", "--schedule", "{schedule}", "--pool", "p", "--cache-dir", "{cache}"),
        USAGE,
        ("allowed prefix 's3://models/org/*' is a glob", "write s3://models/org/"),
        env={"MODELSYNC_ALLOWED_PREFIXES": "s3://models/org/*"},
    ),
    # -- publish
    Mistake(
        "publish-a-file",
        ("publish", "{file}", "s3://{bucket}/org/m/"),
        USAGE,
        ("not a directory",),
        s3="moto",
    ),
    Mistake(
        "publish-to-a-missing-bucket",
        ("publish", "{dir}", "s3://no-such-bucket-cli/org/m/", "-q"),
        NOT_FOUND,
        ("'no-such-bucket-cli' does not exist", "publish needs an existing bucket"),
        s3="moto",
    ),
    Mistake(
        "publish-part-size-zero",
        ("publish", "{dir}", "s3://{bucket}/org/m/", "--part-size", "0"),
        USAGE,
        ("--part-size",),
        s3="moto",
    ),
    # -- what S3 answers
    Mistake(
        "missing-bucket",
        ("pull", "s3://no-such-bucket-cli/org/m/", "--cache-dir", "{cache}", "-q"),
        NOT_FOUND,
        ("no-such-bucket-cli",),
        s3="moto",
    ),
    Mistake(
        "empty-prefix",
        ("pull", SRC, "--cache-dir", "{cache}", "-q"),
        NOT_FOUND,
        (f"/{PREFIX}",),
        s3="moto",
    ),
    Mistake(
        "key-instead-of-prefix",
        ("pull", SRC + "weights.bin", "--cache-dir", "{cache}", "-q"),
        NOT_FOUND,
        ("weights.bin is an object, not a model prefix", f"/{PREFIX}"),
        arrange=_objects("weights.bin"),
        s3="moto",
    ),
    Mistake(
        "unsafe-key",
        ("pull", SRC, "--cache-dir", "{cache}", "-q"),
        INTEGRITY,
        ("../../escape.bin",),
        arrange=_objects("ok.bin", "../../escape.bin"),
        s3="moto",
    ),
    Mistake(
        "malformed-manifest",
        ("pull", SRC, "--cache-dir", "{cache}", "-q"),
        INTEGRITY,
        ("malformed manifest", "unsupported version 7"),
        arrange=_bad_manifest,
        s3="moto",
    ),
    Mistake(
        "manifest-understates-a-size",
        ("pull", SRC, "--cache-dir", "{cache}", "-q"),
        INTEGRITY,
        ("weights.bin", "holds 1000 bytes", "says 100 bytes", "republish"),
        arrange=_understated_manifest,
        s3="moto",
        known_leftovers=RESUMABLE,
    ),
    Mistake(
        "corrupt-on-every-fetch",
        ("pull", SRC, "--cache-dir", "{cache}", "--part-size", "1Mi", "-q"),
        INTEGRITY,
        ("weights.bin", "the store served the same wrong bytes in 2 fetches", "republish the model"),
        arrange=_faulty("bitflip"),
        s3="proxy",
        known_leftovers=RESUMABLE,
    ),
    Mistake(
        "corrupt-differently-on-every-fetch",
        ("pull", SRC, "--cache-dir", "{cache}", "--part-size", "1Mi", "-q"),
        INTEGRITY,
        ("weights.bin", "3 fetches each brought different wrong bytes", "not in the store"),
        arrange=_flipped_differently,
        s3="proxy",
        known_leftovers=RESUMABLE,
    ),
    Mistake("room-wait-over-a-day", (*PULL, "--room-wait", "2d"), USAGE, ("--room-wait", "to 1d")),
    Mistake(
        "room-wait-variable",
        PULL,
        USAGE,
        ("MODELSYNC_ROOM_WAIT", "'forever'"),
        env={"MODELSYNC_ROOM_WAIT": "forever"},
    ),
    Mistake(
        "disk-full",
        ("pull", SRC, "--cache-dir", "{cache}", "-q"),
        STORAGE,
        (f"needs {format_bytes(1000)}", " free"),
        arrange=_objects("weights.bin"),
        s3="moto",
        python=NO_SPACE,
        known_leftovers=RESUMABLE,
    ),
    Mistake(
        "wrong-credentials",
        ("pull", SRC, "--cache-dir", "{cache}", "-q"),
        DENIED,
        ("ccess denied", "credentials"),
        s3="auth",
    ),
    Mistake(
        "data-plane-403",
        ("pull", SRC, "--cache-dir", "{cache}", "-q"),
        DENIED,
        ("credentials",),
        arrange=_faulty("status403"),
        s3="proxy",
        known_leftovers=RESUMABLE,
    ),
    Mistake("unreachable-endpoint", PULL, REMOTE, ("127.0.0.1",), s3="dead"),
    # -- a source that is not a whole model, or would nest
    Mistake(
        "pull-of-a-publish-in-progress",
        ("pull", SRC, "--cache-dir", "{cache}", "-q"),
        INTEGRITY,
        ("modelsync.publishing is there", "run it again"),
        arrange=_publish_in_progress,
        s3="moto",
    ),
    Mistake(
        "manifest-required",
        ("pull", SRC, "--cache-dir", "{cache}", "-q"),
        INTEGRITY,
        ("no modelsync.manifest.json", "manifest policy requires"),
        env={"MODELSYNC_MANIFEST": "required"},
        arrange=_objects("weights.bin"),
        s3="moto",
    ),
    Mistake(
        "manifest-required-by-a-rule",
        ("pull", SRC, "--cache-dir", "{cache}", "-q"),
        INTEGRITY,
        ("manifest policy requires",),
        env={"MODELSYNC_MANIFEST_RULES": '[{"scope": "*", "mode": "required"}]'},
        arrange=_objects("weights.bin"),
        s3="moto",
    ),
    Mistake(
        "manifest-policy-typo",
        PULL,
        USAGE,
        ("MODELSYNC_MANIFEST", "'sometimes' is not one of required, if-present"),
        env={"MODELSYNC_MANIFEST": "sometimes"},
    ),
    Mistake(
        "manifest-rules-not-a-list",
        PULL,
        USAGE,
        ("MODELSYNC_MANIFEST_RULES", "a list of tables"),
        env={"MODELSYNC_MANIFEST_RULES": '{"scope": "*", "mode": "required"}'},
    ),
    Mistake(
        "shard-index-names-a-missing-shard",
        ("pull", SRC, "--cache-dir", "{cache}", "-q"),
        INTEGRITY,
        ("model-00002-of-00002.safetensors, which the prefix lacks",),
        arrange=_shard_missing,
        s3="moto",
    ),
    Mistake(
        "pull-of-a-prefix-holding-published-revisions",
        ("pull", "s3://{bucket}/org/model/", "--cache-dir", "{cache}", "-q"),
        USAGE,
        ("holds the published model s3://{bucket}/org/model/rev1/",),
        arrange=_objects("weights.bin", "modelsync.manifest.json"),
        s3="moto",
    ),
    Mistake(
        "pull-of-a-parent-of-a-ready-model",
        ("pull", "s3://{bucket}/org/model/", "--cache-dir", "{cache}", "-q"),
        USAGE,
        (f"contains the ready model {SRC}", f"evict {{bucket}}/{PREFIX.rstrip('/')}"),
        arrange=_ready_revision,
        s3="moto",
        known_leftovers=("records",),
        arranged=("test-",),
    ),
    Mistake(
        "pull-inside-a-ready-model",
        ("pull", SRC + "sub/", "--cache-dir", "{cache}", "-q"),
        USAGE,
        (f"lies inside the ready model {SRC}",),
        arrange=_ready_revision,
        s3="moto",
        known_leftovers=("records",),
        arranged=("test-",),
    ),
]


@pytest.mark.parametrize("mistake", MISTAKES, ids=[m.id for m in MISTAKES])
def test_a_user_mistake_gives_one_error_line_its_documented_code_and_leaves_nothing_behind(
    mistake: Mistake, tmp_path: Path, cache: Path, request: pytest.FixtureRequest
) -> None:
    client: BaseClient | None = None
    proxy: FaultProxy | None = None
    bucket = "models"
    if mistake.s3 in {"none", "dead"}:
        env = S3Env(f"http://127.0.0.1:{closed_port()}").subprocess_env()
    elif mistake.s3 == "auth":
        auth_env, bucket = request.getfixturevalue("auth_moto")
        wrong = S3Env(auth_env.endpoint_url, access_key_id=WRONG_ACCESS_KEY, secret_access_key=WRONG_SECRET)
        env = wrong.subprocess_env()
    else:
        client, bucket = request.getfixturevalue("s3_client"), request.getfixturevalue("bucket")
        target: S3Env = request.getfixturevalue("s3_env" if mistake.s3 == "moto" else "proxied_s3_env")
        proxy = request.getfixturevalue("fault_proxy") if mistake.s3 == "proxy" else None
        env = target.subprocess_env()
    world = World(tmp_path, cache, client, bucket, proxy)
    values = world.placeholders(env["AWS_ENDPOINT_URL"])
    if mistake.arrange is not None:
        mistake.arrange(world)
    had_cache = cache.exists()

    done = run_cli({**env, **mistake.env}, *[a.format(**values) for a in mistake.argv], code=mistake.python)

    assert_user_error(
        done, mistake.code, *(m.format(**values) for m in mistake.mentions), stdout=mistake.stdout
    )
    assert WRONG_SECRET not in done.stdout + done.stderr
    left = left_behind(cache, mistake.known_leftovers)
    assert [path for path in left if not path.startswith(mistake.arranged)] == []
    if mistake.s3 == "none" and not had_cache:
        assert not cache.exists(), "a command refused before it started created a cache"
    assert not (tmp_path / "typo").exists()


def test_the_table_covers_at_least_forty_mistakes() -> None:
    assert len(MISTAKES) >= 40
    assert len({m.id for m in MISTAKES}) == len(MISTAKES)


def test_cli_pull_from_an_unreachable_endpoint_exits_7_within_a_bounded_time(
    tmp_path: Path, cache: Path, record_property: Callable[[str, object], None]
) -> None:
    env = S3Env(f"http://127.0.0.1:{closed_port()}").subprocess_env()
    started = time.monotonic()
    done = run_cli(env, "pull", "s3://models/org/m/", "--cache-dir", str(cache), "-q")
    elapsed_s = time.monotonic() - started
    record_property("cli_unreachable_s", round(elapsed_s, 2))
    print(f"CLI, unreachable endpoint: exit {done.returncode} after {elapsed_s:.2f} s")
    assert_user_error(done, ExitCode.REMOTE_UNAVAILABLE, "127.0.0.1")
    assert elapsed_s < 60


@pytest.fixture(scope="module")
def auth_moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[S3Env, str]]:
    """A moto that enforces SigV4 after two free calls, which arrange a bucket and an object."""
    log_dir = tmp_path_factory.mktemp("auth-moto")
    with SubprocessMoto(extra_env={"INITIAL_NO_AUTH_ACTION_COUNT": "2"}, log_dir=log_dir) as server:
        env = S3Env(server.endpoint_url)
        bucket = f"auth-{uuid.uuid4().hex[:12]}"
        client = env.boto3_client()
        try:
            client.create_bucket(Bucket=bucket)
            client.put_object(Bucket=bucket, Key=PREFIX + "weights.bin", Body=b"secret weights")
        finally:
            client.close()
        yield env, bucket
