"""How the cost of learning and planning a pull grows with the number of files (10 .. 100,000).

Why: a pull does three things before its first byte moves: read the manifest, plan
the ranged GETs, and (for a model without a manifest, or one whose manifest lacks
ETags) list the prefix. Each is linear in the file count on paper; this measures the
constants, in time and in memory, so a 100,000-file model holds no surprise.

Stages, each run on N files:

* manifest: `modelsync.core.manifest.parse_manifest` of a rendered manifest of N entries;
* plan:     `modelsync.core.parts.plan_pull` of N `RemoteFile`s (1 MiB files, so one
            16 MiB part each: the part count equals the file count);
* listing:  `modelsync.adapters.store.sdk.S3.list_model` (aiobotocore, the code a pull uses)
            against the nginx endpoint of scripts/nginx_endpoint.py, which serves a
            static ListObjectsV2 document. nginx serves all N keys as ONE page; real S3
            pages at 1,000 keys, so against S3 add one round trip per 1,000 keys.

Every (stage, N) runs in a fresh child process, several times (median time). The child
loads its input first (the manifest's bytes, the file list, a connected client), then
resets its RSS high-water mark (`/proc/self/clear_refs` = 5) and runs the stage alone:
"peak MiB" is the high-water mark reached during the stage minus the RSS before it,
i.e. what the stage itself needed on top of the interpreter and its input.

    scripts/bench scale [--max 100000] [--rounds 3] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from bench import REPO
from bench.data import MiB
from bench.nginx import NginxEndpoint
from modelsync.core.manifest import FileEntry, render_manifest
from modelsync.core.parts import RemoteFile

COUNTS = (10, 100, 1_000, 10_000, 100_000)
STAGES = ("manifest", "plan", "listing")
FILE_BYTES = 1 * MiB
PART_BYTES = 16 * MiB


def file_path(i: int) -> str:
    """Model-like nested paths, so path checks see directories too."""
    return f"shard-{i // 1000:03d}/file-{i:06d}.bin"


# --------------------------------------------------------------------------- child side


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)


def child(stage: str, n: int, arg: str) -> dict[str, float]:
    """Run one stage on n files in this (fresh) process; returns time and memory."""
    if stage == "manifest":
        from modelsync.core.manifest import parse_manifest

        data = Path(arg).read_bytes()

        def op() -> object:
            return parse_manifest(data, "bench")
        return _timed(op)
    if stage == "plan":
        from modelsync.core.parts import plan_pull

        files = [RemoteFile(f"model/{file_path(i)}", file_path(i), FILE_BYTES, f"etag-{i}",
                            f"{i:032x}") for i in range(n)]

        def op() -> object:
            return plan_pull(files, PART_BYTES, {})
        return _timed(op)
    if stage == "listing":
        return asyncio.run(_listing(n, arg))
    raise ValueError(stage)


def _timed(op: Callable[[], object]) -> dict[str, float]:
    before = _status_kib("VmRSS")
    _reset_peak()
    start = time.perf_counter()
    result = op()
    seconds = time.perf_counter() - start
    peak = _status_kib("VmHWM")
    del result
    return {"seconds": seconds, "peak_kib": peak - before, "rss_before_kib": before}


async def _listing(n: int, url: str) -> dict[str, float]:
    from modelsync.adapters.store.sdk import open_s3
    from modelsync.config import Settings
    from modelsync.core.refs import parse_source

    settings = Settings(endpoint_url=url)
    ref = parse_source(f"s3://list-{n}/model/")
    async with open_s3(settings) as s3:
        await s3.head(f"list-{n}", f"model/{file_path(0)}")  # connect and warm the client
        before = _status_kib("VmRSS")
        _reset_peak()
        start = time.perf_counter()
        objects = await s3.list_model(ref)
        seconds = time.perf_counter() - start
        peak = _status_kib("VmHWM")
    if len(objects) != n:
        raise RuntimeError(f"listed {len(objects)} objects, expected {n}")
    return {"seconds": seconds, "peak_kib": peak - before, "rss_before_kib": before}


# --------------------------------------------------------------------------- parent side


@dataclass
class Row:
    stage: str
    files: int
    input_bytes: int
    median_s: float
    min_s: float
    max_s: float
    peak_mib: float  # largest over the rounds
    rss_before_mib: float
    us_per_file: float


def make_inputs(counts: list[int], work: Path, list_root: Path) -> dict[tuple[str, int], str]:
    """Manifests into `work`; empty objects for the listings under `list_root` (kept)."""
    args: dict[tuple[str, int], str] = {}
    for n in counts:
        manifest = work / f"manifest-{n}.json"
        manifest.write_bytes(render_manifest(
            FileEntry(file_path(i), FILE_BYTES, f"{i:032x}", f"{i:08x}-{FILE_BYTES:x}")
            for i in range(n)))
        args[("manifest", n)] = str(manifest)
        args[("plan", n)] = ""
        bucket = list_root / f"list-{n}" / "model"
        done = list_root / f"list-{n}.complete"
        if not done.exists():  # sizes do not matter to a listing: empty files, made once
            for i in range(n):
                path = bucket / file_path(i)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.touch()
            done.touch()
    return args


def listing_bytes(url: str, n: int) -> int:
    """Size of the ListObjectsV2 document nginx serves for list-<n> (the listing's input)."""
    with urllib.request.urlopen(f"{url}/list-{n}?list-type=2", timeout=60) as resp:
        return len(resp.read())


def measure(stage: str, n: int, arg: str, rounds: int, env: dict[str, str]) -> list[dict[str, float]]:
    out = []
    for _ in range(rounds):
        done = subprocess.run(
            [sys.executable, "-m", "bench", "scale", "--child", stage, str(n), arg], cwd=REPO,
            capture_output=True, text=True, check=False, env=env, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"{stage} {n}: {done.stderr.strip().splitlines()[-1:]}")
        out.append(json.loads(done.stdout))
    return out


def summarise(stage: str, n: int, input_bytes: int, results: list[dict[str, float]]) -> Row:
    times = [r["seconds"] for r in results]
    med = statistics.median(times)
    return Row(stage, n, input_bytes, med, min(times), max(times),
               max(r["peak_kib"] for r in results) / 1024,
               statistics.median(r["rss_before_kib"] for r in results) / 1024,
               med / n * 1e6)


def size_text(n: int) -> str:
    if not n:
        return "-"
    return f"{n / MiB:.1f} MiB" if n >= MiB else f"{n / 1024:.1f} KiB"


def table(rows: list[Row], md: bool) -> list[str]:
    head = ["stage", "files", "input", "median ms", "µs per file", "peak MiB (stage)",
            "RSS before MiB"]
    body = [[r.stage, f"{r.files:,}",
             size_text(r.input_bytes),
             f"{r.median_s * 1000:.2f}", f"{r.us_per_file:.1f}", f"{r.peak_mib:.1f}",
             f"{r.rss_before_mib:.0f}"] for r in rows]
    from bench.report import render_table

    return render_table(
        "cost of learning and planning a pull against the number of files "
        "(fresh process per run, median time, largest peak)", head, body, [], md)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="scripts/bench scale", description=__doc__.split("\n")[0])
    ap.add_argument("--max", type=int, default=COUNTS[-1], help="largest file count to run")
    ap.add_argument("--rounds", type=int, default=3, help="fresh processes per point")
    ap.add_argument("--cache-dir", type=Path, default=REPO / ".bench-cache",
                    help="the listing objects are made once under <cache-dir>/plan-scale")
    ap.add_argument("--results-dir", type=Path, default=REPO / "bench-results")
    ap.add_argument("--markdown", type=Path, metavar="FILE")
    ap.add_argument("--child", nargs=3, metavar=("STAGE", "N", "ARG"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        stage, n, arg = args.child
        print(json.dumps(child(stage, int(n), arg)))
        return 0

    # The parent side's imports (boto3 among them) stay out of the children, whose "RSS
    # before" is the interpreter, modelsync and the stage's input only.
    from bench.contenders import s3env
    from bench.report import write_record

    counts = [n for n in COUNTS if n <= args.max]
    list_root = args.cache_dir / "plan-scale"
    rows: list[Row] = []
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="plan-scale-")))
        inputs = make_inputs(counts, work, list_root)
        ep = stack.enter_context(NginxEndpoint(list_root))
        env = s3env(ep.url).subprocess_env()
        for stage in STAGES:
            for n in counts:
                arg = ep.url if stage == "listing" else inputs[(stage, n)]
                size = listing_bytes(ep.url, n) if stage == "listing" else (
                    Path(arg).stat().st_size if stage == "manifest" else 0)
                row = summarise(stage, n, size, measure(stage, n, arg, args.rounds, env))
                print(f"  {stage:8s} {n:>7,} files  {row.median_s * 1000:9.2f} ms  "
                      f"peak {row.peak_mib:7.1f} MiB", flush=True)
                rows.append(row)
    print("\n" + "\n".join(table(rows, md=False)))
    write_record(args.results_dir, "plan-scale", {
        "file_bytes": FILE_BYTES, "part_bytes": PART_BYTES,
        "listing": "nginx static ListObjectsV2, one page", "rows": [asdict(r) for r in rows],
    }, args.markdown, table(rows, md=True))
    return 0

