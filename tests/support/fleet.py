"""A pool of nodes on one machine: N caches, each filled by its own `modelsync pull` process.

When a window opens, every node of a pool pulls the same model at once and the
store throttles. Here each node is a separate cache directory and a separate
process (its own retry state and backoff, as on separate machines), all started
together against one endpoint, typically a throttling `FaultProxy`. What a
closing note quotes comes out as `FleetFigures`.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from support.faultproxy import FaultProxy

#: a node process: import what a cold pull imports (the S3 SDK included), say so (argv[1]),
#: wait for stdin to close, then pull as the `modelsync` command does; it notes (time.monotonic(),
#: in argv[1] with `.marks`) when its last part was read and written, when the model was made
#: ready, and when it ran its exit handlers
_AT_THE_BARRIER = """
import atexit, json, os, sys, time
from pathlib import Path
import modelsync.adapters.http.client, modelsync.adapters.store.data_plane, modelsync.adapters.store.sdk
import modelsync.backends, modelsync.engine.ensure, modelsync.engine.pull, modelsync.foreground_pull
import modelsync.plain_pull, modelsync.progress
import aiobotocore.client, aiobotocore.endpoint, aiobotocore.httpsession, aiobotocore.parsers
import aiobotocore.signers, aiohttp, xml.etree.ElementTree
from modelsync.__main__ import run_and_exit
from modelsync.adapters.cache import Cache
from modelsync.engine.part_transfer import PartTransfer
marks, barrier = {}, Path(sys.argv[1])
def marking(name, call):
    def marked(*args, **kwargs):
        try:
            return call(*args, **kwargs)
        finally:
            marks[name] = time.monotonic()
    return marked
PartTransfer.into_file = marking("last_byte_in", PartTransfer.into_file)
Cache.make_ready = marking("ready", Cache.make_ready)
def note_marks():
    barrier.with_suffix(".marks").write_text(json.dumps({**marks, "exiting": time.monotonic()}))
atexit.register(note_marks)
barrier.touch()
sys.stdin.buffer.read()
os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
sys.argv = ["modelsync", *sys.argv[2:]]
run_and_exit()
"""


@dataclass(frozen=True, slots=True)
class NodeResult:
    node: int
    cache: Path
    #: None when it was still running at the deadline (then killed)
    returncode: int | None
    #: seconds from the barrier's release until this pull exited
    finished_s: float
    #: time.monotonic() when it exited
    finished_at: float
    stdout: str
    stderr: str
    #: time.monotonic() of `last_byte_in`, `ready` and `exiting` (see _AT_THE_BARRIER); empty if it died
    marks: dict[str, float]


@dataclass(frozen=True, slots=True)
class FleetFigures:
    """The figures of one fleet run, from the nodes' exits and the proxy's log."""

    nodes: int
    model_bytes: int
    requests_per_s_budget: int
    first_done_s: float
    last_done_s: float
    failed: int
    requests: int
    throttled: int
    bytes_served: int

    @property
    def spread_s(self) -> float:
        """Between the first and the last node having the model."""
        return self.last_done_s - self.first_done_s

    def lines(self) -> list[str]:
        return [
            f"fleet: {self.nodes} nodes x {self.model_bytes} bytes through a store admitting "
            f"{self.requests_per_s_budget} requests/s",
            f"  failed pulls:       {self.failed}",
            f"  first node done:    {self.first_done_s:.1f} s",
            f"  last node done:     {self.last_done_s:.1f} s",
            f"  completion spread:  {self.spread_s:.1f} s",
            f"  requests seen:      {self.requests}",
            f"  503 SlowDown sent:  {self.throttled}",
            f"  admitted:           {self.requests - self.throttled} "
            f"({(self.requests - self.throttled) / max(self.last_done_s, 1e-9):.1f}/s over the run)",
            f"  body bytes served:  {self.bytes_served} "
            f"({self.bytes_served / max(self.nodes * self.model_bytes, 1):.3f} x nodes x model)",
        ]


def run_fleet(
    env: dict[str, str] | Sequence[dict[str, str]],
    uri: str,
    caches: Sequence[Path],
    *extra: str,
    timeout_s: float = 600,
) -> list[NodeResult]:
    """Start one `modelsync pull URI` per cache at once and wait for all (killing any past the deadline).

    `env` is every node's environment, or one per node (each its own endpoint, say).
    Every process first imports what a pull needs and waits at a barrier; the clock
    (`finished_s`) starts when all are released together, as when a window opens on
    running daemons: on a small shared machine N Python start-ups take seconds, and
    would spread the starts by as much.
    Output goes to files beside each cache, never pipes: N undrained pipes could
    block the pulls they are meant to observe.
    """
    envs = [env] * len(caches) if isinstance(env, dict) else list(env)
    running = []
    for cache, node_env in zip(caches, envs, strict=True):
        cache.parent.mkdir(parents=True, exist_ok=True)
        out, err = cache.with_suffix(".out").open("w"), cache.with_suffix(".err").open("w")
        process = subprocess.Popen(
            [sys.executable, "-c", _AT_THE_BARRIER, str(cache.with_suffix(".ready")),
             "pull", uri, "--cache-dir", str(cache), "--quiet", *extra],
            env=node_env, stdin=subprocess.PIPE, stdout=out, stderr=err,
        )  # fmt: skip
        running.append((process, out, err))
    ready = [cache.with_suffix(".ready") for cache in caches]
    deadline = time.monotonic() + timeout_s
    while not all(r.exists() or p.poll() is not None for r, (p, _o, _e) in zip(ready, running, strict=True)):
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    started = time.monotonic()
    for process, _out, _err in running:
        assert process.stdin is not None
        with contextlib.suppress(OSError):  # one that died at start-up reports through its exit
            process.stdin.close()
    finished: dict[int, float] = {}
    deadline = started + timeout_s
    try:
        while len(finished) < len(running) and time.monotonic() < deadline:
            for index, (process, _out, _err) in enumerate(running):
                if index not in finished and process.poll() is not None:
                    finished[index] = time.monotonic() - started
            time.sleep(0.05)
    finally:
        for process, out, err in running:
            if process.poll() is None:
                process.kill()
            process.wait()
            out.close()
            err.close()
    return [
        NodeResult(
            node=index,
            cache=cache,
            returncode=process.returncode if index in finished else None,
            finished_s=finished.get(index, timeout_s),
            finished_at=started + finished.get(index, timeout_s),
            stdout=cache.with_suffix(".out").read_text(),
            stderr=cache.with_suffix(".err").read_text(),
            marks=_marks(cache.with_suffix(".marks")),
        )
        for index, (cache, (process, _out, _err)) in enumerate(zip(caches, running, strict=True))
    ]


def _marks(path: Path) -> dict[str, float]:
    marks: dict[str, float] = json.loads(path.read_text()) if path.exists() else {}
    return marks


def fleet_figures(
    results: Sequence[NodeResult], proxy: FaultProxy, model_bytes: int, requests_per_s_budget: int
) -> FleetFigures:
    done = [r.finished_s for r in results]
    seen = proxy.requests()
    return FleetFigures(
        nodes=len(results),
        model_bytes=model_bytes,
        requests_per_s_budget=requests_per_s_budget,
        first_done_s=min(done),
        last_done_s=max(done),
        failed=sum(1 for r in results if r.returncode != 0),
        requests=len(seen),
        throttled=sum(1 for r in seen if r.status == 503),
        bytes_served=sum(r.body_bytes_sent for r in seen if r.method == "GET"),
    )
