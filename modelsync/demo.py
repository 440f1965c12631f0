"""`modelsync demo`: the whole job on an embedded S3 server, as a new user would first try it.

Starts moto in server mode on a free loopback port, generates a small
safetensors-shaped model, publishes it, pulls it cold into a temporary cache,
pulls it again warm (in a fresh process, as an init container would), and
prints what happened with timings.

Without `--keep` everything is deleted at the end, and the last line says so;
with it, the ready path is printed last on stdout (like `modelsync pull`) and
stays, with the cache, for trying the operator commands on.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from modelsync.config import Settings
from modelsync.core.refs import parse_source
from modelsync.core.units import format_bytes
from modelsync.errors import UsageError

MiB = 1024 * 1024
DEMO_SOURCE = "s3://models/demo/tiny-llm/2026-11-30/"
#: (file name, tensor bytes): one shard spans several 8 MiB parts
SHARDS = (
    ("model-00001-of-00003.safetensors", 40 * MiB),
    ("model-00002-of-00003.safetensors", 12 * MiB),
    ("model-00003-of-00003.safetensors", 3 * MiB),
)


def write_safetensors(path: Path, tensor_bytes: int, seed: int) -> None:
    """A file in the safetensors layout: 8-byte header length, JSON header, raw tensor data."""
    rows = tensor_bytes // (2 * 1024)
    header = {
        "__metadata__": {"format": "pt"},
        "weight": {"dtype": "BF16", "shape": [rows, 1024], "data_offsets": [0, rows * 2048]},
    }
    blob = json.dumps(header).encode()
    block = os.urandom(MiB)
    with path.open("wb") as fh:
        fh.write(struct.pack("<Q", len(blob)) + blob)
        remaining = rows * 2048
        while remaining:
            n = min(len(block), remaining)
            fh.write(bytes([seed]) + block[1:n] if n > 1 else block[:n])
            remaining -= n


def generate_model(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for i, (name, size) in enumerate(SHARDS):
        write_safetensors(directory / name, size, seed=i)
    (directory / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "hidden_size": 1024,
                "num_hidden_layers": 4,
                "torch_dtype": "bfloat16",
                "vocab_size": 32000,
            },
            indent=2,
        )
    )
    (directory / "generation_config.json").write_text(json.dumps({"temperature": 0.7}))
    (directory / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 4096}))
    vocab = {f"tok{i}": i for i in range(32000)}
    (directory / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"vocab": vocab}}))


def run_demo(keep: bool) -> None:
    try:
        from moto.server import ThreadedMotoServer
    except ImportError:
        raise UsageError(
            "the demo needs an embedded S3 server: pip install 'modelsync[demo]' (scripts/demo does)"
        ) from None

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise

    from modelsync.backends import s3_backends, s3_writer
    from modelsync.engine.ensure import ensure_ready
    from modelsync.engine.rules import pull_rules
    from modelsync.engine.upload import upload

    for name, value in (
        ("AWS_ACCESS_KEY_ID", "demo"),
        ("AWS_SECRET_ACCESS_KEY", "demo-secret"),
        ("AWS_EC2_METADATA_DISABLED", "true"),
    ):
        os.environ.setdefault(name, value)
    work = Path(tempfile.mkdtemp(prefix="modelsync-demo-"))
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        settings = Settings(
            cache_dir=work / "cache", endpoint_url=endpoint, part_size_bytes=8 * MiB, concurrency=8
        )
        ref = parse_source(DEMO_SOURCE)
        say(f"embedded S3 server (moto) at {endpoint}")

        t = time.monotonic()
        generate_model(work / "model")
        size = sum(p.stat().st_size for p in (work / "model").iterdir())
        say(f"generated a {format_bytes(size)} model in {work / 'model'} ({elapsed(t)})")

        t = time.monotonic()
        asyncio.run(_create_bucket(settings, ref.bucket))
        result = asyncio.run(upload(settings, work / "model", ref, writer=s3_writer(settings)))
        say(f"published {result.files} files to {ref.uri} with a manifest ({elapsed(t)})")

        cold = ensure_ready(pull_rules(settings, ref), backends=s3_backends(settings))
        rate = cold.fetched_bytes / max(cold.elapsed_s, 1e-9)
        say(
            f"cold pull: {cold.files} files, {format_bytes(cold.fetched_bytes)} fetched, verified "
            f"and published in {cold.elapsed_s:.2f}s ({format_bytes(int(rate))}/s)"
        )

        t = time.monotonic()
        warm = subprocess.run(
            [
                sys.executable,
                "-m",
                "modelsync",
                "pull",
                ref.uri,
                "--cache-dir",
                str(settings.cache_dir),
                "--endpoint-url",
                "http://127.0.0.1:9",
            ],  # a dead endpoint: a warm pull must not need it
            capture_output=True,
            text=True,
            check=True,
        )
        say(
            f"warm pull (a fresh process, S3 unreachable): {elapsed(t)}, "
            f"ready path {warm.stdout.strip().splitlines()[-1]}"
        )
        say(f"files in the ready path: {', '.join(sorted(os.listdir(cold.path)))}")
    finally:
        server.stop()
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    if keep:
        say(f"kept the model and the cache in {work}; try: modelsync ls --cache-dir {settings.cache_dir}")
        print(cold.path)
    else:
        say(f"removed {work} (run `modelsync demo --keep` to keep the cache and try the operator commands)")


async def _create_bucket(settings: Settings, bucket: str) -> None:
    from modelsync.adapters.store.sdk import open_s3

    async with open_s3(replace(settings)) as s3:
        await s3.ensure_bucket(bucket)


def say(line: str) -> None:
    print(f"demo: {line}", file=sys.stderr, flush=True)


def elapsed(since: float) -> str:
    return f"{(time.monotonic() - since) * 1000:.0f} ms"
