"""Where a cold pull's start-up goes, and what fetching the manifest on the data plane saves.

A cold `modelsync pull` used to spend most of its time before the first ranged GET importing
the S3 control plane (aiobotocore, aiohttp, botocore) and creating its client, only to GET one
small manifest. This entry point times, in fresh processes interleaved round by round, the
milestones from spawn to "manifest in hand" three ways:

* `control-plane`: a pull through the SDK's store (adapters/store/sdk.py), as every pull ran before
  the data-plane store and as one still runs without static keys: import the engine, open
  the aiobotocore client, GET the manifest through it;
* `pull`: what a pull does now: import the engine, open the backends a pull opens
  (backends.s3_backends, whose store is adapters/store/data_plane.py with static keys) and
  GET the manifest through its store;
* `data-plane`: the floor: import only the warm path and the ranged-GET client, presign the
  manifest's URL with core.sigv4 and GET it with http.client.

Milestones are epoch times printed by the child and compared with the launcher's spawn time;
CPU is the child's (wait4). The data-plane variant is a measurement, not the engine's code.

    scripts/bench startup [--rounds 10]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

VARIANTS = ("control-plane", "pull", "data-plane")


def child(variant: str, url: str, bucket: str, key: str) -> dict[str, float]:
    """Run one variant in this fresh process; epoch seconds at each milestone."""
    marks: dict[str, float] = {}
    if variant == "control-plane":
        import asyncio

        from modelsync.adapters.store.sdk import open_s3
        from modelsync.config import Settings
        from modelsync.core.refs import parse_source
        from modelsync.engine import pull  # noqa: F401 - what a cold pull imports

        marks["imported"] = time.time()

        async def fetch() -> bytes | None:
            async with open_s3(Settings(endpoint_url=url)) as s3:
                marks["client"] = time.time()
                ref = parse_source(f"s3://{bucket}/{key.rpartition('/')[0]}/")
                return await s3.get_manifest(ref, key.rpartition("/")[2])

        data = asyncio.run(fetch())
    elif variant == "pull":
        import asyncio
        import importlib

        from modelsync.backends import s3_backends
        from modelsync.config import Settings
        from modelsync.core.refs import parse_source

        for module in ("modelsync.plain_pull", "modelsync.engine.ensure", "modelsync.engine.pull"):
            importlib.import_module(module)  # what a cold pull imports
        marks["imported"] = time.time()

        async def fetch_as_a_pull() -> bytes | None:
            async with s3_backends(Settings(endpoint_url=url))() as backends:
                marks["client"] = time.time()
                ref = parse_source(f"s3://{bucket}/{key.rpartition('/')[0]}/")
                return await backends.store.get_manifest(ref, key.rpartition("/")[2])

        data = asyncio.run(fetch_as_a_pull())
    else:
        import datetime as dt
        import http.client
        import importlib
        from urllib.parse import urlsplit

        from modelsync.core.sigv4 import Credentials, QuerySigner, quote_key

        for module in ("modelsync.plain_pull", "modelsync.adapters.http.client"):  # what a lean start loads
            importlib.import_module(module)
        marks["imported"] = time.time()
        creds = Credentials(os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"],
                            os.environ.get("AWS_SESSION_TOKEN"))
        signed = QuerySigner(os.environ.get("AWS_REGION", "us-east-1")).presign_get(
            f"{url}/{bucket}/{quote_key(key)}", creds, dt.datetime.now(dt.UTC), 600)
        marks["client"] = time.time()
        parts = urlsplit(signed)
        conn = http.client.HTTPConnection(parts.netloc, timeout=30)
        conn.request("GET", f"{parts.path}?{parts.query}")
        response = conn.getresponse()
        data = response.read() if response.status == 200 else None
        conn.close()
    marks["manifest"] = time.time()
    if not data:
        raise SystemExit(f"{variant}: no manifest at {bucket}/{key}")
    return marks


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="scripts/bench startup", description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=10, help="fresh processes per variant, interleaved")
    ap.add_argument("--child", nargs=4, metavar=("VARIANT", "URL", "BUCKET", "KEY"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(*args.child)))
        return 0
    return run(args)


def run(args: argparse.Namespace) -> int:
    import contextlib
    import tempfile
    from pathlib import Path

    from bench import REPO, data
    from bench.contenders import contender_env
    from bench.harness import compile_modelsync, measure, run_main
    from bench.nginx import NginxEndpoint
    from modelsync.core.manifest import MANIFEST_NAME

    def body(_stack: contextlib.ExitStack) -> int:
        compile_modelsync()
        root = Path(_stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-startup-")))
        prep = data.prepare(data.datasets(small=True)["cold-64m"], root, log=lambda _line: None)
        ds = prep.dataset
        marks: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
        cpu: dict[str, list[float]] = {v: [] for v in VARIANTS}
        with NginxEndpoint(root) as ep, tempfile.TemporaryDirectory() as work:
            env = {**contender_env(ep.url), "PYTHONPATH": str(REPO)}
            for _ in range(args.rounds):
                for v in VARIANTS:
                    argv = [sys.executable, "-m", "bench", "startup", "--child", v, ep.url, ds.bucket,
                            f"{data.PREFIX}/{MANIFEST_NAME}"]
                    m = measure(argv, env, timeout=120, flush=None, work=Path(work))
                    if m.returncode != 0:
                        print(f"{v}: exit {m.returncode}: {m.stderr_tail[-300:]}", file=sys.stderr)
                        return 1
                    marks[v].append({k: t - m.spawned_at for k, t in json.loads(m.stdout).items()})
                    cpu[v].append(m.user_s + m.sys_s)
        print(f"from spawn, median of {args.rounds} fresh processes (min-max); load {os.getloadavg()[0]:.1f}")
        for v in VARIANTS:
            cells = []
            for k in ("imported", "client", "manifest"):
                xs = [x[k] for x in marks[v]]
                cells.append(f"{k} {statistics.median(xs):.3f} s ({min(xs):.3f}-{max(xs):.3f})")
            print(f"  {v:13s} " + "  ".join(cells) + f"  cpu {statistics.median(cpu[v]):.3f} s")
        return 0

    return run_main("bench startup", body)
