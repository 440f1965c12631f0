"""Scaling curves of `modelsync pull` on the local nginx endpoint, tmpfs destination.

Why a separate script: `scripts/bench` answers "how does modelsync compare with its
peers on three fixed scenarios"; this one answers "how does modelsync's throughput move
when one thing changes", which is what a default or a deployment is chosen from:

* concurrency: `--concurrency` 1 .. 32 on the model-shaped set (8 x 512 MiB + 20 small);
* processes: N independent `modelsync pull` processes, each pulling its own bucket of
  8/N shards (hard links to the model set's shards), against one process pulling all
  8. modelsync has no worker-process option: its workers are threads, which is the
  concurrency axis above. This curve asks whether splitting a model over several
  processes (what an operator could script) buys anything over one process; the total
  number of ranged GETs in flight is held at the default concurrency (each process gets
  default / N, at least 1) so only the process count changes;
* file size: one object of 64 MiB, 256 MiB, 1 GiB, 4 GiB (s5cmd alongside as the
  reference, at the same settings as in scripts/bench);
* files per second on 2,000 x 64 KiB files, modelsync against s5cmd;
* signature: the same model set pulled unsigned (signatures off) and signed (an OpenSSF
  `model.sig` over its files, pulled under `MODELSYNC_SIGNATURE=required`), so the cost of
  hashing every byte with SHA-256 as it lands, and of verifying the bundle, shows as the
  ratio of the two medians.

Every point is a whole process measured by the harness (scripts/benchmark.py `measure`:
spawn to exit, CPU of the process tree from wait4, peak RSS of its largest process);
points of one curve are interleaved round by round and the tables show medians. Every
run is checked (sizes; xxh3-128 in the first round). Data lives in the harness's cache
folder and is kept: the curves reuse `scripts/bench --keep-data`'s sets.

    .venv/bin/python scripts/bench_curves.py [--small] [--rounds 3] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import shlex
import statistics
import sys
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_data
import benchmark
from bench_data import DataSet, GiB, KiB, MiB, Prepared
from benchmark import BenchError, Contender, Measured
from nginx_endpoint import NginxEndpoint

from modelsync.config import Settings

CURVES = ("concurrency", "processes", "size", "small-files", "signature")
CONCURRENCY = (1, 2, 4, 8, 16, 32)
PROCESSES = (1, 2, 4, 8)  # divisors of the 8 shards
SIZES_FULL = (64 * MiB, 256 * MiB, GiB, 4 * GiB)
SIZES_SMALL = (4 * MiB, 16 * MiB, 32 * MiB, 64 * MiB)
DEFAULT_CONCURRENCY = Settings().concurrency


def size_label(n: int) -> str:
    return f"{n // GiB} GiB" if n >= GiB else f"{n // MiB} MiB"


# --------------------------------------------------------------------------- points


@dataclass(frozen=True, slots=True)
class Point:
    """One x value of a curve for one contender: how to run it and what to check after."""

    curve: str
    label: str  # the x value as shown in the table
    contender: str
    argv: list[str]
    env: dict[str, str]
    checks: tuple[tuple[Path, Prepared], ...]  # (files root, what must be there)
    total_bytes: int
    files: int
    dest: Path  # emptied before and after each run


@dataclass
class PointRun:
    curve: str
    label: str
    contender: str
    round: int
    wall_s: float
    cpu_s: float
    maxrss_mib: float
    error: str | None


@dataclass
class PointSummary:
    curve: str
    label: str
    contender: str
    files: int
    bytes: int
    ok_runs: int
    runs: int
    median_wall_s: float | None = None
    gib_per_s: float | None = None
    files_per_s: float | None = None
    cpu_s_per_gib: float | None = None
    peak_rss_mib: float | None = None


def harness_args(concurrency: int | None) -> argparse.Namespace:
    """The few fields of scripts/bench's options that `benchmark.invocation` reads."""
    return argparse.Namespace(concurrency=concurrency, part_size=None,
                              contenders=["modelsync", "s5cmd"])


def single(c: Contender, curve: str, label: str, prep: Prepared, dest: Path, url: str,
           work: Path, concurrency: int | None = None) -> Point:
    """A point that is one contender process pulling one data set."""
    ds = prep.dataset
    inv = benchmark.invocation(c, ds, dest, url, harness_args(concurrency), work)
    assert inv.files_root is not None
    return Point(curve, label, c.name, inv.argv, inv.env, ((inv.files_root, prep),),
                 ds.total_bytes, ds.count, dest)


def fan_out(c: Contender, label: str, preps: list[Prepared], dest: Path, url: str,
            work: Path, concurrency: int) -> Point:
    """A point that is len(preps) modelsync processes at once, one per data set, one cache.

    They start from one `sh`, which waits for each and exits non-zero if any failed, so
    the harness's wait4 sees the whole tree: wall = until the last one ends, CPU = all
    of them, peak RSS = the largest single process.
    """
    invs = [benchmark.invocation(c, p.dataset, dest, url, harness_args(concurrency), work)
            for p in preps]
    script = "".join(f"{shlex.join(inv.argv)} & p{i}=$!\n" for i, inv in enumerate(invs))
    script += "rc=0\n" + "".join(f"wait $p{i} || rc=$?\n" for i in range(len(invs)))
    script += "exit $rc\n"
    checks = []
    for inv, prep in zip(invs, preps, strict=True):
        assert inv.files_root is not None
        checks.append((inv.files_root, prep))
    return Point("processes", label, c.name, ["sh", "-c", script], invs[0].env, tuple(checks),
                 sum(p.dataset.total_bytes for p in preps),
                 sum(p.dataset.count for p in preps), dest)


def run_point(pt: Point, rnd: int, timeout: float, work: Path) -> PointRun:
    benchmark.clear(pt.dest)
    pt.dest.mkdir(parents=True)
    m: Measured = benchmark.measure(pt.argv, pt.env, timeout=timeout, flush=None, work=work)
    error = None
    if m.returncode != 0:
        error = f"exit {m.returncode}: {(m.stderr_tail.splitlines() or ['no stderr'])[-1]}"
    else:
        for root, prep in pt.checks:
            if error := bench_data.check_files(root, prep.entries, full=rnd == 1):
                break
    benchmark.clear(pt.dest)
    return PointRun(pt.curve, pt.label, pt.contender, rnd, m.wall_s, m.user_s + m.sys_s,
                    m.maxrss_mib, error)


def run_curve(points: list[Point], rounds: int, work: Path) -> list[PointRun]:
    """All points of one curve, interleaved round by round so drift hits all of them alike."""
    timeout = 60 + max(p.total_bytes for p in points) / (20 * MiB)
    runs = []
    for rnd in range(1, rounds + 1):
        for pt in points:
            r = run_point(pt, rnd, timeout, work)
            rate = (f"{pt.files / r.wall_s:7.0f} files/s" if pt.curve == "small-files"
                    else f"{pt.total_bytes / GiB / r.wall_s:5.2f} GiB/s")
            print(f"  {pt.curve} {pt.label:>8} {pt.contender:9s} round {rnd}/{rounds} "
                  f"{r.wall_s:6.2f} s {rate}  cpu {r.cpu_s:5.2f} s  rss {r.maxrss_mib:4.0f} MiB"
                  f"  {r.error or 'ok'}", flush=True)
            runs.append(r)
    return runs


def summarise(points: list[Point], runs: list[PointRun]) -> list[PointSummary]:
    out = []
    for pt in points:
        mine = [r for r in runs if (r.label, r.contender) == (pt.label, pt.contender)]
        ok = [r for r in mine if r.error is None]
        s = PointSummary(pt.curve, pt.label, pt.contender, pt.files, pt.total_bytes, len(ok),
                         len(mine))
        if ok:
            s.median_wall_s = statistics.median(r.wall_s for r in ok)
            s.gib_per_s = pt.total_bytes / GiB / s.median_wall_s
            s.files_per_s = pt.files / s.median_wall_s
            s.cpu_s_per_gib = statistics.median(r.cpu_s for r in ok) / (pt.total_bytes / GiB)
            s.peak_rss_mib = max(r.maxrss_mib for r in ok)
        out.append(s)
    return out


def _f(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def curve_table(title: str, x_name: str, rows: list[PointSummary], runs: list[PointRun],
                md: bool) -> list[str]:
    """Rows of one curve; the rate column is files/s for the small-file curve, else GiB/s."""
    files = rows[0].curve == "small-files"
    head = [x_name, "contender", "wall s", "files/s" if files else "GiB/s", "CPU s/GiB",
            "peak RSS MiB"]
    body = [[s.label, s.contender + ("" if s.ok_runs == s.runs else
                                     f" ({s.runs - s.ok_runs} failed)"),
             _f(s.median_wall_s, ".2f"),
             _f(s.files_per_s, ".0f") if files else _f(s.gib_per_s, ".2f"),
             _f(s.cpu_s_per_gib, ".2f"), _f(s.peak_rss_mib, ".0f")] for s in rows]
    errors = sorted({f"{r.contender} {r.label}: {r.error}" for r in runs if r.error})
    return benchmark.render_table(title, head, body, errors, md)


# --------------------------------------------------------------------------- the curves


@dataclass(frozen=True, slots=True)
class CurveSpec:
    name: str
    title: str
    x_name: str
    points: list[Point]


def build_curves(args: argparse.Namespace, scratch: Path, url: str, work: Path,
                 preps: dict[str, Prepared]) -> list[CurveSpec]:
    ms, s5 = benchmark.make_contenders(harness_args(None))
    specs = []
    if "concurrency" in args.only:
        model = preps["model-set"]
        gib = model.dataset.total_bytes / GiB
        specs.append(CurveSpec(
            "concurrency",
            f"modelsync --concurrency on the model set ({model.dataset.count} files, "
            f"{gib:.2f} GiB), tmpfs, median of {args.rounds}", "concurrency",
            [single(ms, "concurrency", str(n), model, scratch / "ms", url, work, n)
             for n in CONCURRENCY]))
    if "processes" in args.only:
        pts = []
        for n in PROCESSES:
            group = [preps[f"shards-{n}p-{i}"] for i in range(n)]
            per = max(1, DEFAULT_CONCURRENCY // n)
            pts.append(fan_out(ms, f"{n} x {per}", group, scratch / "ms", url, work, per))
        total = sum(p.dataset.total_bytes for p in group) / GiB
        specs.append(CurveSpec(
            "processes",
            f"N modelsync processes x concurrency each, 8 shards ({total:.2f} GiB) split "
            f"evenly, one cache, tmpfs, median of {args.rounds}", "processes x conc.", pts))
    if "size" in args.only:
        pts = []
        for size in args.sizes:
            prep = preps[f"size-{size}"]
            pts += [single(c, "size", size_label(size), prep, scratch / c.name, url, work)
                    for c in (ms, s5) if not c.missing]
        specs.append(CurveSpec(
            "size", f"one object of each size, defaults, tmpfs, median of {args.rounds}",
            "object", pts))
    if "signature" in args.only:
        unsigned, signed = preps["model-set"], preps["model-set-signed"]
        signed_point = single(ms, "signature", "signed", signed, scratch / "ms", url, work)
        env = {**signed_point.env, "MODELSYNC_SIGNATURE": "required",
               "MODELSYNC_SIGNATURE_PUBLIC_KEYS": str(args.signature_public_key)}
        specs.append(CurveSpec(
            "signature",
            f"modelsync on the model set ({unsigned.dataset.count} files, "
            f"{unsigned.dataset.total_bytes / GiB:.2f} GiB) unsigned and signed (SHA-256 of every "
            f"byte, verified before ready), defaults, tmpfs, median of {args.rounds}", "model set",
            [single(ms, "signature", "unsigned", unsigned, scratch / "ms", url, work),
             replace(signed_point, env=env)]))
    if "small-files" in args.only:
        prep = preps["small-files"]
        specs.append(CurveSpec(
            "small-files",
            f"{prep.dataset.count} x {prep.dataset.files[0][1] // KiB} KiB files, defaults, "
            f"tmpfs, median of {args.rounds}", "set",
            [single(c, "small-files", "small", prep, scratch / c.name, url, work)
             for c in (ms, s5) if not c.missing]))
    return specs


def size_sets(args: argparse.Namespace) -> list[DataSet]:
    """One object per size; the 4 GiB point is scripts/bench's own object-4g set."""
    sets = bench_data.datasets(args.small)
    out = []
    for size in args.sizes:
        if size == sets["object-4g"].total_bytes:
            out.append(sets["object-4g"])
        else:
            out.append(DataSet(f"object-{size // MiB}m", (("object.bin", size),)))
    return out


def prepare_all(args: argparse.Namespace, data_root: Path) -> dict[str, Prepared]:
    """Generate (once) or reuse every set the chosen curves need; keys name the roles."""
    sets = bench_data.datasets(args.small)
    preps: dict[str, Prepared] = {}
    if {"concurrency", "processes", "signature"} & set(args.only):
        preps["model-set"] = bench_data.prepare(sets["model-set"], data_root)
    if "signature" in args.only:
        ds, args.signature_public_key = bench_data.signed_copy(
            sets["model-set"], "model-set-signed", data_root
        )
        preps["model-set-signed"] = bench_data.prepare(ds, data_root)
    if "processes" in args.only:
        shards = [p for p, _ in sets["model-set"].files if p.endswith(".safetensors")]
        for n in PROCESSES:
            each = len(shards) // n
            for i in range(n):
                ds = bench_data.link_subset(sets["model-set"], f"shards-{n}p-{i}",
                                            shards[i * each:(i + 1) * each], data_root)
                preps[ds.name] = bench_data.prepare(ds, data_root)
    if "size" in args.only:
        for size, ds in zip(args.sizes, size_sets(args), strict=True):
            preps[f"size-{size}"] = bench_data.prepare(ds, data_root)
    if "small-files" in args.only:
        preps["small-files"] = bench_data.prepare(sets["small-files"], data_root)
    return preps


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="scripts/bench_curves.py",
        description="Scaling curves of modelsync pull on a local nginx endpoint, tmpfs "
        "destination: throughput against --concurrency, against the number of processes, "
        "against object size, and files per second on the small-file set.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    ap.add_argument("--only", default=",".join(CURVES), metavar="CURVE[,...]",
                    help=f"curves to run, from {', '.join(CURVES)}")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians")
    ap.add_argument("--small", action="store_true",
                    help="quick smoke run on scripts/bench --small's sets and 4-64 MiB objects")
    ap.add_argument("--cache-dir", type=Path, default=benchmark.REPO / ".bench-cache",
                    help="generated data (kept, shared with scripts/bench --keep-data)")
    ap.add_argument("--tmpfs-dir", type=Path, default=Path("/dev/shm"))
    ap.add_argument("--results-dir", type=Path, default=benchmark.REPO / "bench-results",
                    help="where curves-<timestamp>.json is written")
    ap.add_argument("--markdown", type=Path, metavar="FILE",
                    help="also write the tables as markdown to FILE")
    args = ap.parse_args(argv)
    chosen = [x.strip() for x in args.only.split(",") if x.strip()]
    if not chosen or any(x not in CURVES for x in chosen):
        ap.error(f"--only: choose from {', '.join(CURVES)}")
    args.only = [x for x in CURVES if x in chosen]
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    args.sizes = SIZES_SMALL if args.small else SIZES_FULL
    return args


def main(argv: list[str] | None = None) -> int:
    return benchmark.run_main("bench_curves", parse_args(argv), run)


def run(args: argparse.Namespace, stack: contextlib.ExitStack) -> int:
    benchmark.ensure_tools({"nginx"})
    data_root = args.cache_dir / "data" / ("small" if args.small else "full")
    data_root.mkdir(parents=True, exist_ok=True)
    if benchmark.fs_type(args.tmpfs_dir) != "tmpfs":
        raise BenchError(f"{args.tmpfs_dir} is not a tmpfs; pass --tmpfs-dir")
    preps = prepare_all(args, data_root)
    largest = max(p.dataset.total_bytes for p in preps.values())
    benchmark.need_space(args.tmpfs_dir, largest + 256 * MiB, "tmpfs destination")
    scratch = Path(tempfile.mkdtemp(prefix="modelsync-curves-", dir=args.tmpfs_dir))
    stack.callback(benchmark.clear, scratch)
    work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-curves-")))
    endpoint = stack.enter_context(NginxEndpoint(data_root))
    print(f"endpoint: nginx at {endpoint.url}, data in {data_root}; modelsync default "
          f"concurrency {DEFAULT_CONCURRENCY}\n", flush=True)

    specs = build_curves(args, scratch, endpoint.url, work, preps)
    report: list[dict[str, object]] = []
    markdown: list[str] = []
    failed = False
    warmed: set[str] = set()
    for spec in specs:
        for prep in (prep for pt in spec.points for _root, prep in pt.checks):
            if prep.dataset.name not in warmed:  # served from the page cache, as in scripts/bench
                bench_data.warm_page_cache(prep.dataset, data_root)
                warmed.add(prep.dataset.name)
        print(f"{spec.name}: {len(spec.points)} points x {args.rounds} rounds", flush=True)
        runs = run_curve(spec.points, args.rounds, work)
        rows = summarise(spec.points, runs)
        print("\n" + "\n".join(curve_table(spec.title, spec.x_name, rows, runs, md=False)),
              flush=True)
        markdown += curve_table(spec.title, spec.x_name, rows, runs, md=True)
        failed = failed or any(r.error for r in runs)
        report.append({"curve": spec.name, "title": spec.title,
                       "summary": [asdict(s) for s in rows], "runs": [asdict(r) for r in runs]})
    write_outputs(args, report, markdown)
    return 1 if failed else 0


def write_outputs(args: argparse.Namespace, report: list[dict[str, object]],
                  markdown: list[str]) -> None:
    now = dt.datetime.now(dt.UTC)
    command = "scripts/bench_curves.py " + " ".join(sys.argv[1:])
    contenders = benchmark.make_contenders(harness_args(None))
    doc = {
        "started_utc": now.isoformat(timespec="seconds"), "command": command,
        "small": args.small, "rounds": args.rounds, "machine": benchmark.machine_info(),
        "versions": benchmark.versions(contenders),
        "settings": {c.name: c.settings for c in contenders},
        "modelsync_default_concurrency": DEFAULT_CONCURRENCY,
        # a shared machine: other jobs' load at the end of the run, for the reader to judge
        "loadavg_at_end": Path("/proc/loadavg").read_text().split()[:3],
        "curves": report,
    }
    args.results_dir.mkdir(parents=True, exist_ok=True)
    path = args.results_dir / f"curves-{now.strftime('%Y%m%dT%H%M%SZ')}.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"results: {path}")
    if args.markdown:
        args.markdown.write_text("\n".join([f"Reproduce: `{command}`", "", *markdown]))
        print(f"markdown: {args.markdown}")


if __name__ == "__main__":
    sys.exit(main())
