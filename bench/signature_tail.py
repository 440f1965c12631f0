"""Where a signed pull's extra time goes: in-process pulls of the benchmark's model set, unsigned
and signed, interleaved, each reporting wall time, CPU time and the tail after the last byte
landed (hashing that had not caught up with the download).

A diagnostic beside `scripts/bench signature` (which times whole processes and
gives the medians): it needs that run's data (`--cache-dir`, default `.bench-cache`), and shows
whether SHA-256 overlaps the transfer or queues behind it on this machine at this moment.

    scripts/bench signature-tail [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from bench import REPO
from bench.contenders import s3env
from bench.harness import clear
from bench.nginx import NginxEndpoint
from modelsync.backends import s3_backends
from modelsync.config import Settings
from modelsync.core.refs import parse_source
from modelsync.core.signature import Mode
from modelsync.engine.ensure import ensure_ready
from modelsync.engine.events import NoEvents
from modelsync.engine.rules import pull_rules


class LastByte(NoEvents):
    """Remembers when the last bytes were written."""

    def __init__(self) -> None:
        self.at = 0.0

    def fetched(self, n_bytes: int) -> None:
        self.at = time.monotonic()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="scripts/bench signature-tail", description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cache-dir", type=Path, default=REPO / ".bench-cache")
    ap.add_argument("--tmpfs-dir", type=Path, default=Path("/dev/shm"))
    args = ap.parse_args(argv)
    data_root = args.cache_dir / "data" / "full"
    public_key = data_root / "model-set-signed.pub.pem"
    if not public_key.exists():
        print("error: run scripts/bench signature first (it makes the signed set)")
        return 2
    with NginxEndpoint(data_root) as endpoint:
        os.environ.update(s3env(endpoint.url).subprocess_env())
        for rnd in range(1, args.rounds + 1):
            for bucket, signed in (("model-set", False), ("model-set-signed", True)):
                dest = Path(tempfile.mkdtemp(prefix="signature-tail-", dir=args.tmpfs_dir))
                try:
                    settings = Settings(cache_dir=dest, endpoint_url=endpoint.url)
                    if signed:
                        settings = replace(settings, signature=Mode.REQUIRED,
                                           signature_public_keys=(str(public_key),))
                    events = LastByte()
                    wall, cpu = time.monotonic(), time.process_time()
                    ref = parse_source(f"s3://{bucket}/model/")
                    ensure_ready(pull_rules(settings, ref), backends=s3_backends(settings), events=events)
                    end = time.monotonic()
                    print(f"round {rnd} {'signed  ' if signed else 'unsigned'} wall {end - wall:6.2f} s  "
                          f"cpu {time.process_time() - cpu:5.2f} s  "
                          f"tail after the last byte {end - events.at:5.2f} s  "
                          f"load {os.getloadavg()[0]:.1f}", flush=True)
                finally:
                    clear(dest)
    return 0

