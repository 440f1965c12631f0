"""Scaling curves of `modelsync pull` on the local nginx endpoint, tmpfs destination.

Why a separate entry point: `scripts/bench` answers "how does modelsync compare with its
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
  reference, at the same settings as in `scripts/bench`);
* files per second on 2,000 x 64 KiB files, modelsync against s5cmd.

The cost of a signature check has its own entry point, `scripts/bench signature`.

Every point is a whole process measured by the harness (bench.harness: spawn to exit, CPU
of the process tree from wait4, peak RSS of its largest process);
points of one curve are interleaved round by round and the tables show medians. Every
run is checked (sizes; xxh3-128 in the first round). Data lives in the harness's cache
folder and is kept: the curves reuse `scripts/bench --keep-data`'s sets.

    scripts/bench curves [--small] [--rounds 3] [--only CURVE,...] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import shlex
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from bench import data, fsinfo, options
from bench.contenders import Contender, make_contenders, versions
from bench.data import DataSet, GiB, KiB, MiB, Prepared
from bench.harness import Point, clear, compile_modelsync, ensure_tools, run_main, run_points
from bench.nginx import NginxEndpoint
from bench.report import summarise, summary_table, write_record
from modelsync.config import Settings

CURVES = ("concurrency", "processes", "size", "small-files")
CONCURRENCY = (1, 2, 4, 8, 16, 32)
PROCESSES = (1, 2, 4, 8)  # divisors of the 8 shards
SIZES_FULL = (64 * MiB, 256 * MiB, GiB, 4 * GiB)
SIZES_SMALL = (4 * MiB, 16 * MiB, 32 * MiB, 64 * MiB)
DEFAULT_CONCURRENCY = Settings().concurrency


def size_label(n: int) -> str:
    return f"{n // GiB} GiB" if n >= GiB else f"{n // MiB} MiB"


def with_concurrency(c: Contender, n: int) -> Contender:
    return replace(c, extra=("--concurrency", str(n)))


def fan_out(points: list[Point], label: str) -> Point:
    """One point that is len(points) modelsync processes at once, one per data set, one cache.

    They start from one `sh`, which waits for each and exits non-zero if any failed, so
    the harness's wait4 sees the whole tree: wall = until the last one ends, CPU = all
    of them, peak RSS = the largest single process.
    """
    script = "".join(f"{shlex.join(pt.argv)} & p{i}=$!\n" for i, pt in enumerate(points))
    script += "rc=0\n" + "".join(f"wait $p{i} || rc=$?\n" for i in range(len(points)))
    script += "exit $rc\n"
    return replace(points[0], label=label, argv=["sh", "-c", script],
                   checks=tuple(check for pt in points for check in pt.checks))


@dataclass(frozen=True, slots=True)
class CurveSpec:
    name: str
    title: str
    x_name: str
    points: list[Point]


def build_curves(args: argparse.Namespace, scratch: Path, url: str, work: Path,
                 preps: dict[str, Prepared]) -> list[CurveSpec]:
    ms, s5 = make_contenders(["modelsync", "s5cmd"])
    specs = []
    med = f"median of {args.rounds}"
    if "concurrency" in args.only:
        model = preps["model-set"]
        specs.append(CurveSpec(
            "concurrency", f"modelsync --concurrency on the model set ({model.dataset.count} files, "
            f"{model.dataset.total_bytes / GiB:.2f} GiB), tmpfs, {med}", "concurrency",
            [with_concurrency(ms, n).point("concurrency", str(n), model, scratch / "ms", url, work)
             for n in CONCURRENCY]))
    if "processes" in args.only:
        pts = []
        for n in PROCESSES:
            group = [preps[f"shards-{n}p-{i}"] for i in range(n)]
            per = with_concurrency(ms, max(1, DEFAULT_CONCURRENCY // n))
            pts.append(fan_out([per.point("processes", "", p, scratch / "ms", url, work) for p in group],
                               f"{n} x {per.extra[1]}"))
        specs.append(CurveSpec(
            "processes", f"N modelsync processes x concurrency each, 8 shards "
            f"({pts[-1].total_bytes / GiB:.2f} GiB) split evenly, one cache, tmpfs, {med}",
            "processes x conc.", pts))
    if "size" in args.only:
        pts = [c.point("size", size_label(size), preps[f"size-{size}"], scratch / c.name, url, work)
               for size in args.sizes for c in (ms, s5) if not c.missing]
        specs.append(CurveSpec("size", f"one object of each size, defaults, tmpfs, {med}", "object", pts))
    if "small-files" in args.only:
        prep = preps["small-files"]
        specs.append(CurveSpec(
            "small-files", f"{prep.dataset.count} x {prep.dataset.files[0][1] // KiB} KiB files, "
            f"defaults, tmpfs, {med}", "set",
            [c.point("small-files", "small", prep, scratch / c.name, url, work)
             for c in (ms, s5) if not c.missing]))
    return specs


def size_sets(args: argparse.Namespace) -> list[DataSet]:
    """One object per size; the 4 GiB point is `scripts/bench`'s own object-4g set."""
    sets = data.datasets(args.small)
    return [sets["object-4g"] if size == sets["object-4g"].total_bytes
            else DataSet(f"object-{size // MiB}m", (("object.bin", size),)) for size in args.sizes]


def prepare_all(args: argparse.Namespace, root: Path) -> dict[str, Prepared]:
    """Generate (once) or reuse every set the chosen curves need; keys name the roles."""
    sets = data.datasets(args.small)
    preps: dict[str, Prepared] = {}
    if {"concurrency", "processes"} & set(args.only):
        preps["model-set"] = data.prepare(sets["model-set"], root)
    if "processes" in args.only:
        shards = [p for p, _ in sets["model-set"].files if p.endswith(".safetensors")]
        for n in PROCESSES:
            each = len(shards) // n
            for i in range(n):
                ds = data.link_subset(sets["model-set"], f"shards-{n}p-{i}",
                                      shards[i * each:(i + 1) * each], root)
                preps[ds.name] = data.prepare(ds, root)
    if "size" in args.only:
        for size, ds in zip(args.sizes, size_sets(args), strict=True):
            preps[f"size-{size}"] = data.prepare(ds, root)
    if "small-files" in args.only:
        preps["small-files"] = data.prepare(sets["small-files"], root)
    return preps


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = options.parser("scripts/bench curves", "only", CURVES, __doc__)
    args = ap.parse_args(argv)
    args.only = options.choose(ap, "only", args.only, CURVES)
    options.check(ap, args)
    args.sizes = SIZES_SMALL if args.small else SIZES_FULL
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_main("bench curves", lambda stack: run(args, stack))


def run(args: argparse.Namespace, stack: contextlib.ExitStack) -> int:
    ensure_tools({"nginx"})
    compile_modelsync()
    root = options.data_root(args)
    preps = prepare_all(args, root)
    fsinfo.need_space(args.tmpfs_dir, max(p.dataset.total_bytes for p in preps.values()) + 256 * MiB,
               "tmpfs destination")
    scratch = Path(tempfile.mkdtemp(prefix="modelsync-curves-", dir=args.tmpfs_dir))
    stack.callback(clear, scratch)
    work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-curves-")))
    endpoint = stack.enter_context(NginxEndpoint(root))
    print(f"endpoint: nginx at {endpoint.url}, data in {root}; modelsync default "
          f"concurrency {DEFAULT_CONCURRENCY}\n", flush=True)

    report: list[dict[str, object]] = []
    markdown: list[str] = []
    failed = False
    warmed: set[str] = set()
    for spec in build_curves(args, scratch, endpoint.url, work, preps):
        for prep in (prep for pt in spec.points for _root, prep in pt.checks):
            if prep.dataset.name not in warmed:  # served from the page cache, as in scripts/bench
                data.warm_page_cache(prep.dataset, root)
                warmed.add(prep.dataset.name)
        print(f"{spec.name}: {len(spec.points)} points x {args.rounds} rounds", flush=True)
        runs = list(run_points(spec.points, args.rounds, work, args.quiet_wait))
        rows = summarise(spec.points, runs)
        print("\n" + "\n".join(summary_table(spec.title, rows, md=False, x_name=spec.x_name)), flush=True)
        markdown += summary_table(spec.title, rows, md=True, x_name=spec.x_name)
        failed = failed or any(r.error for r in runs)
        report.append({"curve": spec.name, "title": spec.title,
                       "summary": [asdict(s) for s in rows], "runs": [asdict(r) for r in runs]})
    contenders = make_contenders(["modelsync", "s5cmd"])
    write_record(args.results_dir, "curves", {
        "small": args.small, "rounds": args.rounds, "versions": versions(contenders),
        "settings": {c.name: c.settings for c in contenders},
        "modelsync_default_concurrency": DEFAULT_CONCURRENCY, "curves": report,
    }, args.markdown, markdown)
    return 1 if failed else 0
