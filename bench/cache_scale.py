"""How long `modelsync ls` and an eviction plan take on a cache of many entries.

Builds a cache of N ready models (default 10,000) the way a pull leaves them:
a ready directory with one small read-only file, its completion record
(`render_record`, written atomically), and a last-used marker with a spread of
ages. Then times whole CLI processes, as an operator would run them:

    scripts/bench cache-scale [--entries 10000] [--keep DIR]

The first `ls` builds the index from the records; the later ones read it.
Prints one line per measurement; nothing is asserted (it is a measurement,
not a test).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import xxhash

from modelsync.adapters import fs
from modelsync.adapters.cache import Cache
from modelsync.core.manifest import FileEntry
from modelsync.core.record import CompletionRecord, render_record
from modelsync.core.refs import parse_source

BUCKET = "scale"


def build(root: Path, entries: int) -> None:
    cache = Cache(root)
    cache.ensure()
    now = time.time()
    for i in range(entries):
        ref = parse_source(f"s3://{BUCKET}/org/model-{i:05d}/rev1/")
        data = f"{i}\n".encode()
        ready = cache.ready_path(ref)
        ready.mkdir(parents=True)
        path = ready / "weights.bin"
        path.write_bytes(data)
        os.chmod(path, fs.READY_FILE_MODE)
        record = CompletionRecord(
            source=ref.uri,
            completed_at=now - entries + i,
            verified_by="manifest",
            files=(FileEntry("weights.bin", len(data), xxhash.xxh3_128(data).hexdigest(), None),),
        )
        fs.write_atomic(cache.record_path(ref), render_record(record), fsync=False)
        cache.touch(ref, at=now - 3600 * (i % 500) - 60)
        if i % 100 == 0:
            cache.pin(ref, True)


def timed(args: list[str], root: Path) -> tuple[float, int, str]:
    """Wall time of one whole CLI process, its exit code and its output."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MODELSYNC_")}
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "modelsync", *args, "--cache-dir", str(root)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    elapsed = time.perf_counter() - started
    if result.returncode not in (0, 2):  # 2: a plan that pinned models keep from being satisfied
        raise SystemExit(f"modelsync {' '.join(args)} failed ({result.returncode}): {result.stderr}")
    return elapsed, result.returncode, result.stdout + result.stderr


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/bench cache-scale", description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=10_000)
    parser.add_argument("--keep", type=Path, help="build the cache here and keep it")
    args = parser.parse_args(argv)
    root = args.keep or Path(tempfile.mkdtemp(prefix="modelsync-scale-")) / "cache"
    try:
        started = time.perf_counter()
        build(root, args.entries)
        print(f"built {args.entries} entries in {time.perf_counter() - started:.1f} s at {root}")
        for label, command in (
            ("ls (first: builds the index)", ["ls"]),
            ("ls", ["ls"]),
            ("ls --json", ["ls", "--json"]),
            ("evict --to-size 5000 --dry-run", ["evict", "--to-size", "5000", "--dry-run"]),
            ("evict --to-size 0 --dry-run", ["evict", "--to-size", "0", "--dry-run"]),
            ("evict --unused-for 7d --dry-run", ["evict", "--unused-for", "7d", "--dry-run"]),
        ):
            elapsed, code, out = timed(command, root)
            lines = out.splitlines() or [""]
            summary = lines[-1] if command == ["ls"] else lines[0]
            print(f"{label}: {elapsed:.2f} s, exit {code}  [{summary[:110]}]")
    finally:
        if args.keep is None:
            shutil.rmtree(root.parent, ignore_errors=True)
    return 0

