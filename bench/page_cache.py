"""How much page cache a pull and a `verify --full` take: the memory a DGX Spark's GPU shares.

On unified memory (128 GB shared by the CPU and the GPU) every cached page of a model is memory
vLLM cannot use. For each run: clean caches are dropped, the source is read back in (as nginx
would serve it), and `Cached` in /proc/meminfo is sampled every 20 ms from the start of the
command to its end; the figure is the peak growth over the value at the start. The pull writes
the 6 GiB model set into a fresh loop-mounted file system; `verify --full` then reads it back.

The bound to hold is the window (about 256 MiB, 512 MiB at most), whatever the model's size.
`Cached` is machine-wide: other work on a shared machine adds to it, so take the medians; the
model's own pages left cached at the end (fincore) are the command's alone.

    scripts/bench page-cache [--dest ext4|xfs] [--rounds 3] [--variant main=/work/main ...]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from bench import data, fsinfo, options
from bench.contenders import contender_env, modelsync_binary
from bench.data import DataSet, GiB
from bench.harness import BenchError, clear, compile_modelsync, ensure_tools, run_main, run_timeout
from bench.nginx import NginxEndpoint
from bench.report import render_table, write_record
from bench.signature_probe import Sampler

COMMANDS = ("pull", "verify")


@dataclass(frozen=True, slots=True)
class Growth:
    variant: str
    command: str
    round: int
    cache_peak_mib: float
    wall_s: float
    load_1m: float
    resident_mib: float
    error: str | None = None


def drop_clean_caches(dest: Path) -> None:
    subprocess.run(["sync", "-f", str(dest)], check=True)
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError as exc:
        raise BenchError(f"cannot drop the page cache ({exc}): run as root") from exc


def resident_mib(dest: Path) -> float:
    """MiB of the cache's files in the page cache (util-linux fincore): this command's own share of
    `Cached`, which other work on a shared machine does not add to."""
    resident = fsinfo.resident_bytes([p for p in dest.rglob("*") if p.is_file() and not p.is_symlink()])
    if resident is None:
        raise BenchError("fincore (util-linux) is missing: apt-get install -y util-linux")
    return resident / 2**20


def measure(argv: list[str], env: dict[str, str], timeout_s: float) -> tuple[float, float, str | None]:
    """(peak growth of Cached in MiB, wall s, error) of one command."""
    start = time.monotonic()
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    sampler = Sampler(proc.pid)
    sampler.start()
    try:
        _, err = proc.communicate(timeout=timeout_s)
    finally:
        proc.kill()
        sampler.stop.set()
        sampler.join()
    error = None if proc.returncode == 0 else f"exit {proc.returncode}: {err.strip()[-300:]}"
    return sampler.cache_peak_kib / 1024, time.monotonic() - start, error


def run(args: argparse.Namespace, stack: contextlib.ExitStack) -> int:
    ensure_tools({"nginx"})
    compile_modelsync([tree for _name, tree in args.variant])
    root = options.data_root(args)
    ds: DataSet = data.prepare(data.datasets(small=False)["model-set-6g"], root).dataset
    endpoint = stack.enter_context(NginxEndpoint(root))
    mount = stack.enter_context(fsinfo.loop_mount(args.dest, ds.total_bytes + 4 * GiB, args.cache_dir))
    timeout_s = run_timeout(ds.total_bytes) * 3
    results: list[Growth] = []
    for rnd in range(1, args.rounds + 1):
        for name, tree in args.variant:
            env = {**contender_env(endpoint.url), "PYTHONPATH": str(tree), "MODELSYNC_SIGNATURE": "off"}
            dest = mount / "cache"
            clear(dest)
            dest.mkdir()
            argvs = {
                "pull": [str(modelsync_binary()), "pull", ds.uri, "--cache-dir", str(dest),
                         "--endpoint-url", endpoint.url, "--quiet"],
                "verify": [str(modelsync_binary()), "verify", "--full", "--cache-dir", str(dest)],
            }
            for command in COMMANDS:
                drop_clean_caches(dest)
                data.warm_page_cache(ds, root)
                load = os.getloadavg()[0]
                peak, wall_s, error = measure(argvs[command], env, timeout_s)
                left = resident_mib(dest)
                results.append(Growth(name, command, rnd, peak, wall_s, load, left, error))
                print(f"  {name:8s} {command:6s} round {rnd}  page cache +{peak:7.0f} MiB  model's pages "
                      f"left {left:6.0f} MiB  wall {wall_s:6.2f} s  load {load:4.1f}  {error or ''}",
                      flush=True)
            clear(dest)
    tables = report(results, ds, args, md=False)
    print("\n" + "\n".join(tables))
    write_record(args.results_dir, "page-cache", {
        "dest": args.dest, "variants": {n: str(t) for n, t in args.variant},
        "results": [asdict(r) for r in results],
    }, args.markdown, report(results, ds, args, md=True))
    return 1 if any(r.error for r in results) else 0


def report(results: list[Growth], ds: DataSet, args: argparse.Namespace, md: bool) -> list[str]:
    head = ["variant", "command", "page cache growth (median)", "per round MiB", "model's pages left MiB",
            "wall s", "load"]
    body = []
    for name, _tree in args.variant:
        for command in COMMANDS:
            ok = [r for r in results if (r.variant, r.command) == (name, command) and r.error is None]
            if ok:
                body.append([
                    name, command, f"+{statistics.median(r.cache_peak_mib for r in ok):.0f} MiB",
                    " / ".join(f"{r.cache_peak_mib:.0f}" for r in ok),
                    f"{statistics.median(r.resident_mib for r in ok):.0f}",
                    f"{statistics.median(r.wall_s for r in ok):.2f}",
                    f"{min(r.load_1m for r in ok):.1f}-{max(r.load_1m for r in ok):.1f}",
                ])
    errors = sorted({f"{r.variant} {r.command}: {r.error}" for r in results if r.error})
    return render_table(f"page cache taken by a pull and a verify --full of {ds.total_bytes / GiB:.2f} GiB "
                        f"on {args.dest}, Cached sampled every 20 ms", head, body, errors, md)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = options.parser("scripts/bench page-cache", "dest", ("ext4", "xfs"), __doc__)
    options.add_variants(ap)
    ap.set_defaults(dest="ext4")
    args = ap.parse_args(argv)
    dests = options.choose(ap, "dest", args.dest, ("ext4", "xfs"))
    if len(dests) != 1:
        ap.error("--dest: choose one file system")
    args.dest = dests[0]
    args.variant = options.variants(args.variant)
    options.check(ap, args)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_main("bench page-cache", lambda stack: run(args, stack))
