"""Commands that move models: `pull` (into the cache), `publish` (a directory up to the store), `demo`.

`pull` makes a model ready and prints its path; a warm one never imports the S3
stack, and where the cache is read-only (a tenant pod) the node daemon stages it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from modelsync.adapters.cache import Cache
from modelsync.cli.options import (
    CacheDir,
    Concurrency,
    ConfigFile,
    EndpointUrl,
    Insecure,
    MaxBandwidth,
    PartSize,
    Quiet,
    Region,
    RoomWait,
    SettingFlags,
    build_settings,
)
from modelsync.config import S3_SETTINGS, Settings
from modelsync.core.refs import parse_source
from modelsync.core.units import parse_duration
from modelsync.engine.rules import PullRules, pull_rules
from modelsync.errors import LocalStorageError, UsageError
from modelsync.foreground_pull import foreground_pull, read_only


def pull(
    source: Annotated[
        str,
        typer.Argument(
            metavar="SOURCE",
            help="s3://bucket/prefix/ of one model revision, or a model name of the node daemon's "
            "schedule (the variant for this node's pool).",
        ),
    ],
    cache_dir: CacheDir = None,
    endpoint_url: EndpointUrl = None,
    region: Region = None,
    config: ConfigFile = None,
    concurrency: Concurrency = None,
    part_size: PartSize = None,
    max_bandwidth: MaxBandwidth = None,
    insecure: Insecure = False,
    verify: Annotated[
        bool, typer.Option("--verify", help="Re-hash a cached model against its record.")
    ] = False,
    lease: Annotated[
        str | None,
        typer.Option(
            "--lease",
            metavar="DURATION",
            help="Hold the model in use this long (e.g. 8h): making room skips it. [default: none]",
        ),
    ] = None,
    room_wait: RoomWait = None,
    quiet: Quiet = False,
) -> None:
    """Make a model ready in the cache and print its path (last line of stdout).

    Where the cache is mounted read-only (a tenant pod), the node daemon stages
    the model and records the lease; this process needs no S3 credentials.
    """
    by_name = "/" not in source and not source.startswith("s3:")
    ref = None if by_name else parse_source(source)
    lease_s = parse_duration(lease) if lease is not None else None
    settings = build_settings(
        SettingFlags(
            cache_dir=cache_dir,
            endpoint_url=endpoint_url,
            region=region,
            config=config,
            concurrency=concurrency,
            part_size=part_size,
            max_bandwidth=max_bandwidth,
            insecure=insecure,
            room_wait=room_wait,
        )
    )
    if ref is None:
        if verify:
            raise UsageError(f"--verify needs the s3:// source, not the name {source!r}")
        typer.echo(str(_pull_by_name(settings, source, lease_s)))
        return
    rules = pull_rules(settings, ref, lease_s=lease_s)
    if read_only(settings.cache_dir):
        if verify:
            raise UsageError("--verify needs a writable cache; run `modelsync verify` where the cache is")
        typer.echo(str(_tenant_pull(rules)))
        return
    from modelsync.engine.ensure import ReadyOptions

    typer.echo(str(foreground_pull(rules, quiet, ReadyOptions(verify=verify)).path))


def _pull_by_name(settings: Settings, name: str, lease_s: float | None) -> Path:
    """The node daemon picks the variant of `name` for its pool, stages it and records the use."""
    from modelsync.core.refs import parse_model_name
    from modelsync.local_api import client, protocol

    model_id = client.pull_name_via_daemon(settings.cache_dir, name, lease_s)
    if model_id is None:
        raise LocalStorageError(
            f"no modelsync daemon answers on {protocol.socket_path(settings.cache_dir)}, and a model name "
            "is resolved by the node's daemon; check the node's daemon pod, or give the s3:// source"
        )
    return Cache(settings.cache_dir).ready_path(parse_model_name(model_id))


def _tenant_pull(rules: PullRules) -> Path:
    from modelsync.engine.ready import warm_path
    from modelsync.local_api import client, protocol

    ref, cache_dir = rules.source, rules.settings.cache_dir
    if client.pull_via_daemon(cache_dir, ref, rules.lease_s) is not None:
        # The daemon's path is in its own mount; print it as this pod sees the cache.
        return Cache(cache_dir).ready_path(ref)
    path = warm_path(cache_dir, ref, rules.signed_only)
    if path is None:
        raise LocalStorageError(
            f"the cache {cache_dir} is read-only here and no modelsync daemon answers on "
            f"{protocol.socket_path(cache_dir)}; check the node's daemon pod"
        )
    typer.echo(f"warning: no daemon answers; {ref.model_id} is ready but this use is not recorded", err=True)
    return path


def publish(
    directory: Annotated[Path, typer.Argument(metavar="DIRECTORY", help="Local model directory.")],
    source: Annotated[
        str,
        typer.Argument(metavar="DEST", help="Destination s3://bucket/prefix/; the bucket must exist."),
    ],
    endpoint_url: EndpointUrl = None,
    region: Region = None,
    config: ConfigFile = None,
    concurrency: Concurrency = None,
    part_size: PartSize = None,
    insecure: Insecure = False,
    quiet: Quiet = False,
    sign_key: Annotated[
        Path | None,
        typer.Option(
            "--sign-key",
            metavar="KEY",
            help="Sign with this PEM EC private key (OpenSSF model signature). [default: unsigned]",
        ),
    ] = None,
    sign_cert: Annotated[
        Path | None,
        typer.Option(
            "--sign-cert",
            metavar="CERT",
            help="With --sign-key: the key's signing certificate (PEM). [default: none]",
        ),
    ] = None,
    sign_chain: Annotated[
        list[Path] | None,
        typer.Option(
            "--sign-chain",
            metavar="CERT",
            help="With --sign-cert: a chain certificate (repeatable). [default: none]",
        ),
    ] = None,
) -> None:
    """Upload a model directory to an existing bucket; its modelsync.manifest.json is written last.

    Until then the prefix holds modelsync.publishing, and pulls refuse it. Run
    again after an interruption, it sends only the files not there yet.

    With --sign-key, an OpenSSF model signature (model.sig, verifiable with the
    model_signing command) is written beside the manifest.
    """
    import asyncio

    from modelsync.backends import s3_writer
    from modelsync.core.units import format_bytes
    from modelsync.engine.upload import SigningKey, upload
    from modelsync.progress import StderrProgress

    ref = parse_source(source)
    if sign_key is None and (sign_cert is not None or sign_chain):
        raise UsageError("--sign-cert and --sign-chain need --sign-key (the certificate's private key)")
    if sign_cert is not None and not sign_chain:
        raise UsageError("--sign-cert needs --sign-chain: the CA certificate(s) that issued it")
    settings = build_settings(
        SettingFlags(
            endpoint_url=endpoint_url,
            region=region,
            config=config,
            concurrency=concurrency,
            part_size=part_size,
            insecure=insecure,
        ),
        needed=S3_SETTINGS | {"concurrency", "part_size_bytes", "signature_name"},
    )
    signing = None
    if sign_key is not None:
        signing = SigningKey(sign_key, sign_cert, tuple(sign_chain or ()), settings.signature_name)
    progress = StderrProgress(ref.uri, quiet=quiet, verb="upload")
    try:
        result = asyncio.run(upload(settings, directory, ref, progress, signing, writer=s3_writer(settings)))
    finally:
        progress.close()
    if not quiet:
        noun = "file" if result.files == 1 else "files"
        signed = f", signed as {result.signature_key}" if result.signature_key else ""
        kept = ""
        if result.skipped_files:
            kept = (f"; {result.skipped_files} already there ({format_bytes(result.skipped_bytes)}), "
                    "not sent again")
        size = format_bytes(result.total_bytes)
        typer.echo(f"published {result.files} {noun} ({size}) to {ref.uri}{signed}{kept}", err=True)
    typer.echo(ref.uri)


def demo(
    keep: Annotated[
        bool,
        typer.Option("--keep", help="Keep the generated model and the cache, and print where they are."),
    ] = False,
) -> None:
    """Run the whole job on an embedded S3 server: generate, publish, pull cold, pull warm."""
    from modelsync.demo import run_demo

    run_demo(keep=keep)
