"""Benchmark `modelsync pull` against s5cmd, rclone, boto3 download_file and curl (the loopback
ceiling) on local S3 endpoints: nginx (static files, no signature checks) and SeaweedFS (a real
S3 server).

Scenarios: object-4g (one 4 GiB object), model-set (8 x 512 MiB shards + 20 small files),
model-set-6g (12 x 512 MiB + 20 small: past the machine's dirty-page limits), small-files
(2,000 x 64 KiB), each into tmpfs and into disk destinations with a final sync (a directory in
--cache-dir, and fresh loop-mounted XFS and ext4 file systems made by the harness when run as
root); cold-64m (a 64 MiB model into tmpfs: whole processes, plus modelsync's time from spawn
to its first request and first ranged GET from nginx's access log); cold-64m-bare (the same
model without a manifest, as other tools upload it: the pull lists the prefix); warm-pull (a second pull
of a ready 100-file model: median of 10 whole processes, and proof via nginx's access log that
it made no request). curl writes to /dev/null and runs on tmpfs scenarios only. Contenders run
interleaved round by round; tables show medians, max/min across rounds and every round. How
each run is measured: bench/harness.py. Other entry points: `scripts/bench
curves|scale|cache-scale|startup|signature-tail --help`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench import REPO, data, fsinfo, options
from bench.contenders import NAMES, Contender, make_contenders, versions, with_variants
from bench.data import GiB, MiB, Prepared
from bench.harness import Run, clear, compile_modelsync, ensure_tools, measure, run_main, run_points, verify
from bench.nginx import NginxEndpoint
from bench.report import Summary, summarise, summary_table, write_record
from bench.servers import UploadedEndpoint

SCENARIOS = ("object-4g", "model-set", "model-set-6g", "small-files", "cold-64m", "cold-64m-bare",
             "warm-pull")
#: disk: a directory in --cache-dir (whatever file system that is); xfs and ext4: fresh
#: loop-mounted file systems the harness makes itself (root only), like the nodes' cache
DESTS = ("tmpfs", "disk", "xfs", "ext4")
LOOP_FS = ("xfs", "ext4")
ENDPOINTS = ("nginx", "seaweedfs", "moto")
#: scenarios measured on tmpfs only: the start-up of a whole process, not the disk
TMPFS_ONLY = ("cold-64m", "cold-64m-bare")
WARM_RUNS = 10
STARTUP_RUNS = 5
DEST_TEXT = {"tmpfs": "tmpfs", "disk": "disk (--cache-dir), including the final sync",
             "xfs": "XFS (loop device, direct I/O), including the final sync",
             "ext4": "ext4 (loop device, direct I/O), including the final sync"}


@dataclass
class WarmPull:
    median_ms: float | None = None
    min_ms: float | None = None
    max_ms: float | None = None
    requests: int | None = None
    error: str | None = None

    def line(self, files: int) -> str:
        head = f"warm pull of a ready {files}-file model (whole process, median of {WARM_RUNS}): "
        if self.median_ms is None:
            return head + f"ERROR: {self.error}"
        return head + (f"{self.median_ms:.0f} ms (min {self.min_ms:.0f}, max {self.max_ms:.0f}), "
                       f"S3 requests: {self.requests}") + (f"; ERROR: {self.error}" if self.error else "")


def warm_pull(ms: Contender, prep: Prepared, data_root: Path, scratch: Path) -> WarmPull:
    """Pull a 100-file model once, then time whole `modelsync pull` processes that find it ready.

    A dedicated nginx logs every request, so "no S3 request" is checked, not assumed.
    """
    with NginxEndpoint(data_root, access_log=True) as ep:
        pt = ms.point("warm-pull", "", prep, scratch / "warm-cache", ep.url, scratch)
        pt.dest.mkdir(parents=True, exist_ok=True)
        cold = measure(pt.argv, pt.env, timeout=120, flush=None, work=scratch)
        if error := verify(pt, cold, full=True):
            return WarmPull(error=f"cold pull failed: {error}")
        before = ep.settled_request_count()
        times = []
        for _ in range(WARM_RUNS):
            m = measure(pt.argv, pt.env, timeout=60, flush=None, work=scratch)
            if m.returncode != 0:
                return WarmPull(error=f"warm pull exit {m.returncode}: {m.stderr_tail[-300:]}")
            times.append(m.wall_s * 1000)
        requests = ep.settled_request_count() - before
    clear(pt.dest)
    return WarmPull(statistics.median(times), min(times), max(times), requests,
                    None if requests == 0 else f"{WARM_RUNS} warm pulls made {requests} S3 requests")


@dataclass
class Startup:
    """How long a cold `modelsync pull` process takes to its first request and first ranged GET."""

    first_request_s: list[float] = field(default_factory=list)
    first_range_s: list[float] = field(default_factory=list)
    error: str | None = None

    def line(self) -> str:
        if self.error:
            return f"cold pull start-up: ERROR: {self.error}"
        return (f"cold pull start-up (cold-64m, {len(self.first_range_s)} whole processes, "
                "nginx access log vs spawn): first request after "
                f"{statistics.median(self.first_request_s):.3f} s, first ranged GET after "
                f"{statistics.median(self.first_range_s):.3f} s (median; min "
                f"{min(self.first_range_s):.3f}, max {max(self.first_range_s):.3f})")


def startup_probe(ms: Contender, prep: Prepared, data_root: Path, scratch: Path) -> Startup:
    """Time from spawning a cold `modelsync pull` to its first request and first ranged GET.

    A dedicated nginx logs every request with its time ($msec); the launcher records the
    spawn time on the same clock. The cache is emptied before each run.
    """
    out = Startup()
    with NginxEndpoint(data_root, access_log=True) as ep:
        pt = ms.point("cold-64m", "start-up", prep, scratch / "startup-cache", ep.url, scratch)
        for _ in range(STARTUP_RUNS):
            clear(pt.dest)
            pt.dest.mkdir(parents=True)
            seen = len(ep.requests())
            m = measure(pt.argv, pt.env, timeout=120, flush=None, work=scratch)
            if error := verify(pt, m, full=False):
                out.error = error
                break
            deadline = time.monotonic() + 2  # nginx logs a request as it finalises it
            while not any(r for *_, r in ep.requests()[seen:]) and time.monotonic() < deadline:
                time.sleep(0.02)
            mine = ep.requests()[seen:]
            ranged = [t for t, _, is_range in mine if is_range]
            if not ranged:
                out.error = "no ranged GET in nginx's access log"
                break
            out.first_request_s.append(mine[0][0] - m.spawned_at)
            out.first_range_s.append(ranged[0] - m.spawned_at)
    clear(pt.dest)
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = options.parser("scripts/bench", "only", SCENARIOS, __doc__)
    ap.add_argument("--contenders", default=",".join(NAMES), metavar="NAME[,...]",
                    help=f"contenders to run, from {', '.join(NAMES)}")
    ap.add_argument("--dest", default="tmpfs,xfs,ext4", metavar="KIND[,...]",
                    help=f"destinations, from {', '.join(DESTS)} (xfs and ext4 are loop-mounted "
                    "by the harness and need root; without root they are skipped with a note)")
    ap.add_argument("--endpoint", default="nginx,seaweedfs", metavar="KIND[,...]",
                    help=f"endpoints, from {', '.join(ENDPOINTS)}; moto re-reads whole objects "
                    "per ranged GET: only with --small")
    ap.add_argument("--concurrency", type=int, help="passed to modelsync pull as --concurrency")
    ap.add_argument("--part-size", help="passed to modelsync pull as --part-size (e.g. 16M)")
    ap.add_argument("--variant", action="append", metavar="NAME=TREE",
                    help="a modelsync source tree (the parent of modelsync/) to measure as the row "
                    "modelsync@NAME, interleaved with the others; repeat it to A/B trees (ratios are "
                    "to the first; start-up and warm pull measure the first). Default: this checkout")
    ap.add_argument("--keep-data", action="store_true",
                    help="keep the generated data for the next run (otherwise it is deleted at "
                    "exit); a complete data set found there is always reused")
    args = ap.parse_args(argv)
    for opt, allowed in (("only", SCENARIOS), ("contenders", NAMES), ("dest", DESTS),
                         ("endpoint", ENDPOINTS)):
        setattr(args, opt, options.choose(ap, opt, getattr(args, opt), allowed))
    options.check(ap, args)
    args.variant = options.variants(args.variant) if args.variant else []
    if "moto" in args.endpoint and not args.small:
        ap.error("--endpoint moto reads whole objects per ranged GET; use it with --small only")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_main("bench", lambda stack: run(args, stack))


def run(args: argparse.Namespace, stack: contextlib.ExitStack) -> int:
    extra = (*(("--concurrency", str(args.concurrency)) if args.concurrency else ()),
             *(("--part-size", args.part_size) if args.part_size else ()))
    need = {n for n in args.contenders if n in ("rclone", "curl")}
    if "nginx" in args.endpoint or {"warm-pull", "cold-64m"} & set(args.only):
        need.add("nginx")
    ensure_tools(need)
    compile_modelsync([REPO, *(tree for _name, tree in args.variant)])
    # after installing: gaps may be filled
    contenders = with_variants(make_contenders(args.contenders, extra), args.variant)
    all_sets = data.datasets(args.small)
    throughput = [all_sets[s] for s in args.only if s != "warm-pull"]
    wanted = throughput + ([all_sets["warm-100"]] if "warm-pull" in args.only else [])

    root = options.data_root(args)
    if not args.keep_data:
        stack.callback(shutil.rmtree, root, True)
    largest = max((ds.total_bytes for ds in wanted), default=0)
    to_write = sum(data.missing_bytes(ds, root) for ds in wanted)
    on_disk = sum(1 for d in args.dest if d != "tmpfs")
    fsinfo.need_space(args.cache_dir, to_write + largest * on_disk + GiB, "data and disk destinations")
    if "tmpfs" in args.dest or "warm-pull" in args.only:
        fsinfo.need_space(args.tmpfs_dir, largest + 256 * MiB, "tmpfs destination")

    scratch = Path(tempfile.mkdtemp(prefix="modelsync-bench-", dir=args.tmpfs_dir))
    stack.callback(clear, scratch)
    bases: dict[str, Path] = {"tmpfs": scratch, "disk": args.cache_dir / f"dest-{os.getpid()}"}
    stack.callback(clear, bases["disk"])
    for kind in (d for d in args.dest if d in LOOP_FS):
        if reason := fsinfo.why_not(kind):
            print(f"destination {kind} skipped: {reason}")
            continue
        mount = stack.enter_context(fsinfo.loop_mount(kind, 2 * largest + 4 * GiB, args.cache_dir))
        bases[kind] = mount / "dest"
        print(f"destination {kind}: a fresh loop-mounted {kind} at {mount}")
    dests = [d for d in args.dest if d in bases]
    work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-work-")))

    prepared = {ds.name: data.prepare(ds, root) for ds in wanted}
    print("contenders:")
    for c in contenders:
        print(f"  {c.row:9s} {(c.missing and f'skipped: {c.missing}') or c.settings}")
    runnable = [c for c in contenders if not c.missing]

    runs: list[Run] = []
    summaries: list[Summary] = []
    markdown: list[str] = []
    for endpoint_kind in args.endpoint:
        endpoint: NginxEndpoint | UploadedEndpoint
        if endpoint_kind == "nginx":
            endpoint = NginxEndpoint(root)
        else:
            state = args.cache_dir / f"{endpoint_kind}-{os.getpid()}"
            stack.callback(shutil.rmtree, state, True)
            endpoint = UploadedEndpoint(endpoint_kind, [prepared[ds.name] for ds in throughput],
                                        root, state)
        with endpoint:
            print(f"endpoint: {endpoint_kind} at {endpoint.url}, data in {root}\n", flush=True)
            for ds in throughput:
                data.warm_page_cache(ds, root)
                for dest_kind in dests:
                    if ds.name in TMPFS_ONLY and dest_kind != "tmpfs":
                        continue
                    case = f"{ds.name} {endpoint_kind} {dest_kind}"
                    points = [c.point(case, "", prepared[ds.name], bases[dest_kind] / c.row,
                                      endpoint.url, work, flush=dest_kind != "tmpfs")
                              for c in runnable if dest_kind == "tmpfs" or c.disk_too]
                    these = list(run_points(points, args.rounds, work, args.quiet_wait))
                    rows = summarise(points, these)
                    title = (f"{ds.name} → {DEST_TEXT[dest_kind]}, {endpoint_kind} endpoint: "
                             f"{ds.count} files, {ds.total_bytes / GiB:.2f} GiB, median of {args.rounds}")
                    print("\n" + "\n".join(summary_table(title, rows, md=False)), flush=True)
                    markdown += summary_table(title, rows, md=True)
                    runs += these
                    summaries += rows

    ms = next((c for c in runnable if c.name == "modelsync"), None)
    notes: list[str] = []
    startup = warm = None
    if "cold-64m" in args.only and ms is not None:
        startup = startup_probe(ms, prepared["cold-64m"], root, scratch)
        notes.append(startup.line())
    if "warm-pull" in args.only and ms is not None:
        print(f"warm pull: 1 cold pull, then {WARM_RUNS} timed warm pulls ...", flush=True)
        warm = warm_pull(ms, prepared["warm-100"], root, scratch)
        notes.append(warm.line(prepared["warm-100"].dataset.count))
    if {"cold-64m", "warm-pull"} & set(args.only) and ms is None:
        notes.append("start-up and warm pull skipped: modelsync is not among the runnable contenders")
    for line in notes:
        print(line)
    markdown += [*(f"- {line}" for line in notes), *([""] if notes else [])]

    write_record(args.results_dir, "compare", {
        "small": args.small, "endpoints": args.endpoint, "rounds": args.rounds,
        "versions": versions(contenders),
        "settings": {c.row: (c.missing and f"skipped: {c.missing}") or c.settings for c in contenders},
        "measures": "wall_s: spawn to exit (+ sync -f for disk); cpu_s: user+sys of the "
                    "contender and its reaped descendants (os.wait4); maxrss_mib: largest single "
                    "process of the tree (ru_maxrss; floor ~10 MiB, the launcher's); load_1m and "
                    "other_cpu_s: the machine around the run",
        "summary": [asdict(s) for s in summaries], "runs": [asdict(r) for r in runs],
        "warm_pull": warm and asdict(warm), "startup": startup and asdict(startup),
    }, args.markdown, markdown)
    failed = (any(r.error for r in runs) or (warm is not None and warm.error is not None)
              or (startup is not None and startup.error is not None))
    if failed:
        print("some runs failed: see the errors above", flush=True)
    return 1 if failed else 0

