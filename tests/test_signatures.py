"""OpenSSF model signatures end to end against a real S3 server (moto): sign on publish, verify
before ready, refuse what the signature does not vouch for, and interoperate with the
`model_signing` command both ways. Also the safetensors scrub in the pull and in `verify --full`.

Pulls that must fail run the real CLI, so each refusal is checked as the user sees it:
exit 5, one `error:` line naming the file or the signer, nothing published.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import xxhash
from botocore.client import BaseClient
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from support.cli import run_cli
from support.engine import pull
from support.s3env import S3Env
from support.safetensors import header_bytes, safetensors_file
from test_cli_errors import assert_user_error

from modelsync.adapters.cache import Cache
from modelsync.backends import s3_writer
from modelsync.config import Settings
from modelsync.core.manifest import MANIFEST_NAME, parse_manifest, render_manifest
from modelsync.core.refs import ModelRef, parse_source
from modelsync.core.signature import DEFAULT_SIGNATURE_NAME as SIG
from modelsync.core.signature import Mode
from modelsync.engine.events import NoEvents
from modelsync.engine.upload import SigningKey, upload
from modelsync.errors import ExitCode, PullCancelledError

PREFIX = "org/llm/rev1/"
MiB = 1024 * 1024
MODEL_SIGNING = Path(sys.executable).with_name("model_signing")
SHARD_INDEX = "model.safetensors.index.json"


# ---- keys and certificates ----------------------------------------------------------------


@dataclass(frozen=True)
class KeyPair:
    private: Path
    public: Path


def _write_key(directory: Path, name: str) -> tuple[KeyPair, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    directory.mkdir(parents=True, exist_ok=True)
    private = directory / f"{name}.key.pem"
    public = directory / f"{name}.pub.pem"
    private.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return KeyPair(private, public), key


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, KeyPair]:
    """A trusted signing key and an untrusted one (an attacker's)."""
    directory = tmp_path_factory.mktemp("keys")
    return {name: _write_key(directory, name)[0] for name in ("release", "attacker")}


@dataclass(frozen=True)
class CertSet:
    key: Path
    cert: Path
    ca: Path


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CertSet:
    """A CA and a code-signing leaf certificate for release@example.com."""
    directory = tmp_path_factory.mktemp("certs")
    _, ca_key = _write_key(directory, "ca")
    leaf_pair, leaf_key = _write_key(directory, "leaf")
    now = datetime.datetime.now(datetime.UTC)
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "modelsync test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(1)
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        .sign(ca_key, hashes.SHA256())
    )
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "release signer")]))
        .issuer_name(ca_name)
        .public_key(leaf_key.public_key())
        .serial_number(2)
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.SubjectAlternativeName([x509.RFC822Name("release@example.com")]), critical=False)
        .add_extension(
            x509.KeyUsage(True, False, False, False, False, False, False, False, False), critical=True
        )
        .sign(ca_key, hashes.SHA256())
    )
    (directory / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (directory / "leaf.pem").write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    return CertSet(leaf_pair.private, directory / "leaf.pem", directory / "ca.pem")


# ---- the model, publishing and pulling ----------------------------------------------------


def model_files() -> dict[str, bytes]:
    """A small sharded safetensors model: two shards, their index, a config."""
    first = safetensors_file([("a", "BF16", [512, 1024]), ("b", "F32", [1024])])
    second = safetensors_file([("c", "U8", [3 * MiB])])
    index = {
        "metadata": {"total_size": 512 * 1024 * 2 + 1024 * 4 + 3 * MiB},
        "weight_map": {
            "a": "model-00001-of-00002.safetensors",
            "b": "model-00001-of-00002.safetensors",
            "c": "model-00002-of-00002.safetensors",
        },
    }
    return {
        "config.json": b'{"layers": 2}',
        "model-00001-of-00002.safetensors": first,
        "model-00002-of-00002.safetensors": second,
        SHARD_INDEX: json.dumps(index).encode(),
    }


def write_dir(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


@pytest.fixture
def ref(bucket: str) -> ModelRef:
    return parse_source(f"s3://{bucket}/{PREFIX}")


@pytest.fixture
def publish_dir(
    tmp_path: Path, s3_env: S3Env, aws_credentials: S3Env, ref: ModelRef, keys: dict[str, KeyPair]
) -> Callable[..., None]:
    """Publish with the engine (as `modelsync publish` does): `files` (default: the model) written
    to a source directory, or that directory as it is; signed with the release key unless
    `signed=False`."""

    def run(files: dict[str, bytes] | None = None, signed: bool = True) -> None:
        directory = tmp_path / "src"
        if files is not None or not directory.exists():
            write_dir(directory, model_files() if files is None else files)
        settings = Settings(endpoint_url=s3_env.endpoint_url, part_size_bytes=5 * MiB, concurrency=4)
        signing = SigningKey(keys["release"].private) if signed else None
        asyncio.run(upload(settings, directory, ref, signing=signing, writer=s3_writer(settings)))

    return run


def rewrite_manifest(s3_client: BaseClient, ref: ModelRef, changes: dict[str, bytes]) -> None:
    """Put objects and a manifest that vouches for them: what someone with write access can do."""
    manifest_key = ref.prefix + MANIFEST_NAME
    body = s3_client.get_object(Bucket=ref.bucket, Key=manifest_key)["Body"].read()
    entries = {e.path: e for e in parse_manifest(body, "test").files}
    for name, data in changes.items():
        etag = s3_client.put_object(Bucket=ref.bucket, Key=ref.prefix + name, Body=data)["ETag"].strip('"')
        entries[name] = type(next(iter(entries.values())))(
            name, len(data), xxhash.xxh3_128_hexdigest(data), etag
        )
    s3_client.put_object(Bucket=ref.bucket, Key=manifest_key, Body=render_manifest(entries.values()))


def model_signing(*args: str) -> subprocess.CompletedProcess[str]:
    """The reference `model_signing` command, unchanged."""
    return subprocess.run([str(MODEL_SIGNING), *args], capture_output=True, text=True, timeout=60)


def signed_env(
    child_env: dict[str, str], cache: Path, public_key: Path, mode: str = "required"
) -> dict[str, str]:
    return {
        **child_env,
        "MODELSYNC_CACHE_DIR": str(cache),
        "MODELSYNC_SIGNATURE": mode,
        "MODELSYNC_SIGNATURE_PUBLIC_KEYS": str(public_key),
    }


def assert_refused(done: subprocess.CompletedProcess[str], cache: Path, ref: ModelRef, *mentions: str) -> str:
    """Exit 5, one `error:` line naming what is wrong, no traceback, nothing published."""
    line = assert_user_error(done, ExitCode.INTEGRITY, *mentions)
    assert not (cache / ref.cache_path).exists()
    assert not Cache(cache).record_path(ref).exists()
    return line


def record_of(cache: Path, ref: ModelRef) -> dict[str, object]:
    doc: dict[str, object] = json.loads(Cache(cache).record_path(ref).read_bytes())
    return doc


# ---- verify before ready -------------------------------------------------------------------


def test_a_model_signed_on_publish_verifies_is_published_and_ls_names_its_signer(
    tmp_path: Path,
    publish_dir: Callable[..., None],
    keys: dict[str, KeyPair],
    ref: ModelRef,
    child_env: dict[str, str],
) -> None:
    files = model_files()
    publish_dir(files)
    cache = tmp_path / "cache"
    env = signed_env(child_env, cache, keys["release"].public)

    done = run_cli(env, "pull", ref.uri, "--quiet")

    assert done.returncode == 0, done.stderr
    ready = cache / ref.cache_path
    assert done.stdout.splitlines()[-1] == str(ready)
    for name, data in files.items():
        assert (ready / name).read_bytes() == data
    assert (ready / SIG).is_file(), "the signature is kept beside the model for re-checks"
    signer = record_of(cache, ref)["signer"]
    assert isinstance(signer, str) and signer.startswith("key release.pub.pem (sha256:")
    listing = run_cli(env, "ls")
    assert listing.returncode == 0 and "SIGNED BY" in listing.stdout and signer in listing.stdout
    as_json = json.loads(run_cli(env, "ls", "--json").stdout)
    assert as_json["models"][0]["signer"] == signer
    verified = run_cli(env, "verify", "--full", ref.model_id)
    assert verified.returncode == 0 and f"ok    {ref.model_id}" in verified.stdout, verified.stderr


def test_the_model_signing_command_verifies_what_publish_signed_both_in_the_cache_and_in_the_bucket(
    tmp_path: Path,
    keys: dict[str, KeyPair],
    ref: ModelRef,
    child_env: dict[str, str],
    s3_client: BaseClient,
) -> None:
    src = write_dir(tmp_path / "src", model_files())
    done = run_cli(child_env, "publish", str(src), ref.uri, "--sign-key", str(keys["release"].private))
    assert done.returncode == 0, done.stderr
    assert f"signed as {ref.prefix}{SIG}" in done.stderr
    cache = tmp_path / "cache"
    assert (
        run_cli(signed_env(child_env, cache, keys["release"].public), "pull", ref.uri, "-q").returncode == 0
    )
    # A plain copy of the prefix, as any S3 tool would download it (manifest included).
    copy = tmp_path / "copy"
    for item in s3_client.list_objects_v2(Bucket=ref.bucket, Prefix=ref.prefix)["Contents"]:
        target = copy / item["Key"][len(ref.prefix) :]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(s3_client.get_object(Bucket=ref.bucket, Key=item["Key"])["Body"].read())
    assert (copy / MANIFEST_NAME).exists()

    for model in (cache / ref.cache_path, copy):
        checked = model_signing(
            "verify",
            "key",
            str(model),
            "--signature",
            str(model / SIG),
            "--public_key",
            str(keys["release"].public),
        )
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert "Verification succeeded" in checked.stdout
    wrong_key = model_signing(
        "verify",
        "key",
        str(copy),
        "--signature",
        str(copy / SIG),
        "--public_key",
        str(keys["attacker"].public),
    )
    assert wrong_key.returncode != 0, "the reference verifier must refuse another key"


def test_publish_with_an_unusable_key_fails_in_one_line_before_uploading_anything(
    tmp_path: Path, keys: dict[str, KeyPair], ref: ModelRef, child_env: dict[str, str], s3_client: BaseClient
) -> None:
    src = write_dir(tmp_path / "src", model_files())

    done = run_cli(child_env, "publish", str(src), ref.uri, "--sign-key", str(keys["release"].public))

    assert_user_error(done, ExitCode.USAGE, f"error: cannot sign with {keys['release'].public}: ")
    assert s3_client.list_objects_v2(Bucket=ref.bucket).get("KeyCount") == 0


def test_a_model_signed_by_the_model_signing_command_is_verified_by_pull(
    tmp_path: Path,
    publish_dir: Callable[..., None],
    keys: dict[str, KeyPair],
    ref: ModelRef,
    child_env: dict[str, str],
) -> None:
    src = write_dir(tmp_path / "src", model_files())
    signed = model_signing(
        "sign", "key", str(src), "--private_key", str(keys["release"].private), "--signature", str(src / SIG)
    )
    assert signed.returncode == 0, signed.stdout + signed.stderr
    publish_dir(signed=False)  # unsigned publish: the existing model.sig is uploaded as it is
    cache = tmp_path / "cache"

    done = run_cli(signed_env(child_env, cache, keys["release"].public), "pull", ref.uri, "-q")

    assert done.returncode == 0, done.stderr
    assert str(record_of(cache, ref)["signer"]).startswith("key release.pub.pem")


def test_certificate_signing_verifies_against_the_chain_and_the_allowed_identity(
    tmp_path: Path,
    ref: ModelRef,
    child_env: dict[str, str],
    certs: CertSet,
) -> None:
    src = write_dir(tmp_path / "src", model_files())
    done = run_cli(
        child_env,
        "publish",
        str(src),
        ref.uri,
        "--sign-key",
        str(certs.key),
        "--sign-cert",
        str(certs.cert),
        "--sign-chain",
        str(certs.ca),
    )
    assert done.returncode == 0, done.stderr
    base = {
        **child_env,
        "MODELSYNC_SIGNATURE": "required",
        "MODELSYNC_SIGNATURE_CERTIFICATE_CHAIN": str(certs.ca),
    }

    other = tmp_path / "other-cache"
    refused = run_cli(
        {**base, "MODELSYNC_CACHE_DIR": str(other), "MODELSYNC_SIGNATURE_IDENTITIES": "ops@example.com"},
        "pull",
        ref.uri,
        "-q",
    )
    assert_refused(refused, other, ref, "release@example.com", "not an allowed identity")

    cache = tmp_path / "cache"
    done = run_cli(
        {**base, "MODELSYNC_CACHE_DIR": str(cache), "MODELSYNC_SIGNATURE_IDENTITIES": "release@example.com"},
        "pull",
        ref.uri,
        "-q",
    )
    assert done.returncode == 0, done.stderr
    assert record_of(cache, ref)["signer"] == "certificate release@example.com"
    ready = cache / ref.cache_path
    checked = model_signing(
        "verify",
        "certificate",
        str(ready),
        "--signature",
        str(ready / SIG),
        "--certificate_chain",
        str(certs.ca),
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


# ---- refusals under `required` -------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "mentions"),
    [
        pytest.param(
            {"config.json": b'{"layers": 3}'},
            ("config.json", "does not match the signature by key release.pub.pem"),
            id="a tampered file",
        ),
        pytest.param(
            {"extra/tokenizer.json": b"{}"},
            ("extra/tokenizer.json", "is not listed in the signature"),
            id="an extra unlisted file",
        ),
    ],
)
def test_a_file_the_signature_does_not_vouch_for_is_refused_naming_it_even_with_a_manifest_to_match(
    tmp_path: Path,
    publish_dir: Callable[..., None],
    keys: dict[str, KeyPair],
    ref: ModelRef,
    child_env: dict[str, str],
    s3_client: BaseClient,
    changes: dict[str, bytes],
    mentions: tuple[str, ...],
) -> None:
    publish_dir()
    rewrite_manifest(s3_client, ref, changes)
    cache = tmp_path / "cache"

    done = run_cli(signed_env(child_env, cache, keys["release"].public), "pull", ref.uri, "-q")

    assert_refused(done, cache, ref, *mentions)


@pytest.mark.parametrize("swap", ["signed by an untrusted key", "a trusted signature of another model"])
def test_a_swapped_signature_is_refused(
    tmp_path: Path,
    publish_dir: Callable[..., None],
    keys: dict[str, KeyPair],
    ref: ModelRef,
    child_env: dict[str, str],
    s3_client: BaseClient,
    swap: str,
) -> None:
    files = model_files()
    publish_dir(files)
    other = dict(files, **{"config.json": b'{"layers": 99}'})
    signer = keys["attacker"] if swap.startswith("signed by") else keys["release"]
    publish_other = tmp_path / "other"
    write_dir(publish_other, other)
    other_sig = publish_other / SIG
    assert (
        model_signing(
            "sign",
            "key",
            str(publish_other),
            "--private_key",
            str(signer.private),
            "--signature",
            str(other_sig),
        ).returncode
        == 0
    )
    rewrite_manifest(s3_client, ref, {SIG: (publish_other / SIG).read_bytes()})
    cache = tmp_path / "cache"

    done = run_cli(signed_env(child_env, cache, keys["release"].public), "pull", ref.uri, "-q")

    if swap.startswith("signed by"):
        assert_refused(done, cache, ref, f"{ref.uri}{SIG}", "is not signed by a trusted key")
    else:
        assert_refused(done, cache, ref, "config.json", "does not match the signature")


def test_an_unsigned_model_under_required_is_refused_before_any_download(
    tmp_path: Path,
    publish_dir: Callable[..., None],
    keys: dict[str, KeyPair],
    ref: ModelRef,
    child_env: dict[str, str],
) -> None:
    publish_dir(signed=False)
    cache = tmp_path / "cache"

    done = run_cli(signed_env(child_env, cache, keys["release"].public), "pull", ref.uri, "-q")

    assert_refused(done, cache, ref, f"{ref.uri} is unsigned", SIG)
    staging = Cache(cache).staging_dir
    assert not staging.exists() or not any(staging.iterdir()), "nothing was fetched"


def test_if_present_pulls_an_unsigned_model_and_records_no_signer(
    tmp_path: Path,
    publish_dir: Callable[..., None],
    keys: dict[str, KeyPair],
    ref: ModelRef,
    child_env: dict[str, str],
) -> None:
    publish_dir(signed=False)
    cache = tmp_path / "cache"

    done = run_cli(signed_env(child_env, cache, keys["release"].public, "if-present"), "pull", ref.uri, "-q")

    assert done.returncode == 0, done.stderr
    assert "signer" not in record_of(cache, ref)


def test_a_rule_for_a_prefix_overrides_the_global_policy(
    tmp_path: Path,
    publish_dir: Callable[..., None],
    keys: dict[str, KeyPair],
    ref: ModelRef,
    child_env: dict[str, str],
) -> None:
    publish_dir(signed=False)
    cache = tmp_path / "cache"
    config = tmp_path / "modelsync.toml"
    config.write_text(
        'signature = "off"\n'
        f'signature_public_keys = ["{keys["release"].public}"]\n'
        "[[signature_rules]]\n"
        f'scope = "s3://{ref.bucket}/org/"\n'
        'mode = "required"\n'
    )
    env = {**child_env, "MODELSYNC_CACHE_DIR": str(cache), "MODELSYNC_CONFIG": str(config)}

    assert_refused(run_cli(env, "pull", ref.uri, "-q"), cache, ref, "is unsigned")


def test_a_trusted_key_that_cannot_be_read_is_a_usage_error_naming_it(
    tmp_path: Path, publish_dir: Callable[..., None], ref: ModelRef, child_env: dict[str, str]
) -> None:
    publish_dir()
    cache = tmp_path / "cache"
    missing = tmp_path / "nowhere.pub.pem"

    done = run_cli(signed_env(child_env, cache, missing), "pull", ref.uri, "-q")

    assert_user_error(done, ExitCode.USAGE, f"cannot read {missing}")
    assert not (cache / ref.cache_path).exists()


def test_a_required_signature_without_the_sign_extra_is_one_line_before_any_download(
    tmp_path: Path,
    publish_dir: Callable[..., None],
    keys: dict[str, KeyPair],
    ref: ModelRef,
    child_env: dict[str, str],
) -> None:
    publish_dir()
    cache = tmp_path / "cache"
    hide_library = (
        "import sys\nsys.modules['model_signing'] = None\nfrom modelsync.__main__ import main\nmain()\n"
    )

    done = run_cli(
        signed_env(child_env, cache, keys["release"].public), "pull", ref.uri, "-q", code=hide_library
    )

    assert assert_user_error(done, ExitCode.USAGE) == (
        "error: verifying or making model signatures needs the model-signing library: "
        "pip install 'modelsync[sign]'"
    )
    assert not (cache / ref.cache_path).exists()


def test_a_pull_with_signatures_off_never_imports_model_signing(
    tmp_path: Path,
    publish_dir: Callable[..., None],
    ref: ModelRef,
    child_env: dict[str, str],
) -> None:
    publish_dir()
    report = (
        "import sys\nfrom modelsync.__main__ import main\ntry:\n    main()\nfinally:\n"
        "    sys.stderr.write('model_signing imported: %s\\n' % ('model_signing' in sys.modules))\n"
    )
    done = run_cli(
        {**child_env, "MODELSYNC_CACHE_DIR": str(tmp_path / "cache")}, "pull", ref.uri, "-q", code=report
    )
    assert done.returncode == 0, done.stderr
    assert "model_signing imported: False" in done.stderr


def test_a_model_cached_before_the_policy_required_signatures_is_checked_before_it_is_served(
    tmp_path: Path,
    publish_dir: Callable[..., None],
    keys: dict[str, KeyPair],
    ref: ModelRef,
    child_env: dict[str, str],
) -> None:
    publish_dir()
    cache = tmp_path / "cache"
    assert run_cli({**child_env, "MODELSYNC_CACHE_DIR": str(cache)}, "pull", ref.uri, "-q").returncode == 0
    assert "signer" not in record_of(cache, ref)
    shard = cache / ref.cache_path / "model-00002-of-00002.safetensors"
    inode = shard.stat().st_ino

    done = run_cli(signed_env(child_env, cache, keys["release"].public), "pull", ref.uri, "-q")

    assert done.returncode == 0, done.stderr
    assert str(record_of(cache, ref)["signer"]).startswith("key release.pub.pem")
    assert shard.stat().st_ino == inode, "the cached files were reused, not fetched again"


def test_an_unsigned_model_cached_before_the_policy_is_not_served_under_required(
    tmp_path: Path,
    publish_dir: Callable[..., None],
    keys: dict[str, KeyPair],
    ref: ModelRef,
    child_env: dict[str, str],
) -> None:
    publish_dir(signed=False)
    cache = tmp_path / "cache"
    assert run_cli({**child_env, "MODELSYNC_CACHE_DIR": str(cache)}, "pull", ref.uri, "-q").returncode == 0

    done = run_cli(signed_env(child_env, cache, keys["release"].public), "pull", ref.uri, "-q")

    assert_user_error(done, ExitCode.INTEGRITY, f"{ref.uri} is unsigned")


class CancelAfterVerifying(NoEvents):
    """Cancels the pull once `count` files are verified: an interrupted pull to resume."""

    def __init__(self, cancel: threading.Event, count: int) -> None:
        self.cancel, self.left = cancel, count

    def verifying(self, path: str) -> None:
        self.left -= 1
        if self.left <= 0:
            self.cancel.set()


def test_a_signed_pull_journals_each_verified_files_sha256_and_still_verifies_when_resumed(
    tmp_path: Path,
    publish_dir: Callable[..., None],
    keys: dict[str, KeyPair],
    ref: ModelRef,
    s3_env: S3Env,
    aws_credentials: S3Env,
) -> None:
    publish_dir()
    settings = Settings(
        cache_dir=tmp_path / "cache",
        endpoint_url=s3_env.endpoint_url,
        concurrency=2,
        max_bandwidth_bytes_per_s=2 * MiB,
        signature=Mode.REQUIRED,
        signature_public_keys=(str(keys["release"].public),),
    )
    cancel = threading.Event()
    with pytest.raises(PullCancelledError):
        pull(settings, ref, CancelAfterVerifying(cancel, 2), cancel=cancel)
    journal = Cache(settings.cache_dir).staging(ref).journal.path.read_text().splitlines()
    assert any('"sha256"' in line for line in journal), journal

    result = pull(replace(settings, max_bandwidth_bytes_per_s=0), ref, NoEvents())

    assert result.fetched_bytes < result.total_bytes, "the resume kept what was fetched"
    assert str(record_of(settings.cache_dir, ref)["signer"]).startswith("key release.pub.pem")


# ---- verify --full re-checks the signature --------------------------------------------------


def test_verify_full_quarantines_a_cached_model_whose_bytes_and_record_were_both_changed(
    tmp_path: Path,
    publish_dir: Callable[..., None],
    keys: dict[str, KeyPair],
    ref: ModelRef,
    child_env: dict[str, str],
) -> None:
    publish_dir()
    cache = tmp_path / "cache"
    env = signed_env(child_env, cache, keys["release"].public)
    assert run_cli(env, "pull", ref.uri, "-q").returncode == 0
    # Someone with write access to the cache swaps a file and fixes the record to match.
    ready = cache / ref.cache_path
    changed = b'{"layers": 7}'
    (ready / "config.json").chmod(0o644)
    (ready / "config.json").write_bytes(changed)
    record = record_of(cache, ref)
    for entry in record["files"]:  # type: ignore[attr-defined]
        if entry["path"] == "config.json":
            entry.update(size=len(changed), xxh3_128=xxhash.xxh3_128_hexdigest(changed))
    Cache(cache).record_path(ref).write_text(json.dumps(record))

    done = run_cli(env, "verify", "--full", ref.model_id)

    assert done.returncode == int(ExitCode.INTEGRITY)
    assert f"bad   {ref.model_id}/{SIG}: config.json does not match the signature" in done.stdout
    assert not ready.exists(), "quarantined: no longer served"


def test_a_bad_signature_policy_stops_verify_full_but_not_a_quick_verify(
    tmp_path: Path, publish_dir: Callable[..., None], ref: ModelRef, child_env: dict[str, str]
) -> None:
    publish_dir(signed=False)
    env = {**child_env, "MODELSYNC_CACHE_DIR": str(tmp_path / "cache")}
    assert run_cli(env, "pull", ref.uri, "-q").returncode == 0
    env["MODELSYNC_SIGNATURE"] = "sometimes"

    assert run_cli(env, "verify", ref.model_id).returncode == 0
    done = run_cli(env, "verify", "--full", ref.model_id)

    assert_user_error(done, ExitCode.USAGE, "MODELSYNC_SIGNATURE", "'sometimes' is not one of required")


# ---- the safetensors scrub ------------------------------------------------------------------


def test_a_shard_with_a_corrupted_header_is_caught_by_the_pull_naming_the_file(
    tmp_path: Path,
    publish_dir: Callable[..., None],
    ref: ModelRef,
    child_env: dict[str, str],
) -> None:
    files = model_files()
    broken = bytearray(files["model-00002-of-00002.safetensors"])
    broken[8:12] = b"{{{{"  # the JSON header no longer parses
    files["model-00002-of-00002.safetensors"] = bytes(broken)
    publish_dir(files, signed=False)  # a consistent manifest for a broken file
    cache = tmp_path / "cache"

    done = run_cli({**child_env, "MODELSYNC_CACHE_DIR": str(cache)}, "pull", ref.uri, "-q")

    assert_refused(done, cache, ref, "model-00002-of-00002.safetensors", "header is not valid JSON")


def test_a_shard_truncated_at_a_tensor_boundary_with_its_manifest_rewritten_is_caught_naming_the_tensor(
    tmp_path: Path,
    publish_dir: Callable[..., None],
    ref: ModelRef,
    child_env: dict[str, str],
    s3_client: BaseClient,
) -> None:
    files = model_files()
    publish_dir(files, signed=False)
    first = files["model-00001-of-00002.safetensors"]
    head, _ = header_bytes([("a", "BF16", [512, 1024]), ("b", "F32", [1024])])
    truncated = first[: len(head) + 512 * 1024 * 2]  # tensor "b" is gone, the header still names it
    rewrite_manifest(s3_client, ref, {"model-00001-of-00002.safetensors": truncated})
    cache = tmp_path / "cache"

    done = run_cli({**child_env, "MODELSYNC_CACHE_DIR": str(cache)}, "pull", ref.uri, "-q")

    assert_refused(done, cache, ref, "model-00001-of-00002.safetensors", "tensor 'b'", "truncated")


def test_verify_full_scrubs_headers_and_quarantines_a_model_published_broken_before_the_scrub(
    tmp_path: Path,
    publish_dir: Callable[..., None],
    ref: ModelRef,
    child_env: dict[str, str],
) -> None:
    files = model_files()
    publish_dir(files, signed=False)
    cache = tmp_path / "cache"
    env = {**child_env, "MODELSYNC_CACHE_DIR": str(cache)}
    assert run_cli(env, "pull", ref.uri, "-q").returncode == 0
    # The index now claims a shard the model lacks; the record is made to match, as if the
    # model had been pulled broken by a modelsync without the scrub.
    index = json.loads(files[SHARD_INDEX])
    index["weight_map"]["d"] = "model-00003-of-00002.safetensors"
    data = json.dumps(index).encode()
    ready = cache / ref.cache_path
    (ready / SHARD_INDEX).chmod(0o644)
    (ready / SHARD_INDEX).write_bytes(data)
    record = record_of(cache, ref)
    for entry in record["files"]:  # type: ignore[attr-defined]
        if entry["path"] == SHARD_INDEX:
            entry.update(size=len(data), xxh3_128=xxhash.xxh3_128_hexdigest(data))
    Cache(cache).record_path(ref).write_text(json.dumps(record))

    done = run_cli(env, "verify", "--full", ref.model_id)

    assert done.returncode == int(ExitCode.INTEGRITY)
    assert f"bad   {ref.model_id}/{SHARD_INDEX}: tensor 'd' maps to" in done.stdout
    assert not ready.exists()
