"""The serial ceiling of one pull process: interpreter-lock seconds per GiB (or per file).

No number of cores makes a Python process faster than 1 / (the time per GiB during which one
of its threads holds the interpreter lock). `py-spy record --gil` samples only the thread that
holds it, so its sample count divided by the rate is that time. Each shape is pulled at two
sizes in the same round and the difference is divided by the difference in size: start-up
(imports, the manifest, the first connection) cancels, and is reported apart. A difference of
two noisy measures is noisier than either (single rounds of one run ranged 0.025-0.236 s/GiB),
so the big pull alone is reported beside it: its lock-held seconds over its size, start-up in,
an upper bound of the steady figure that moves less from round to round.

Shapes (every pull from the local nginx endpoint, the source in the page cache):

* `tmpfs-unsigned`, `tmpfs-signed`, `xfs-unsigned`, `xfs-signed`: 12 x 512 MiB shards with a
  model's side files against 4 of those shards with the same side files (6 GiB against 2 GiB);
  signed pulls verify an OpenSSF signature (SHA-256 of every byte) as well as xxh3;
* `small-files`: 2,000 x 64 KiB files against 500 of them, to tmpfs: lock-held ms per file.

The load average at each run is kept: lock-held time is CPU time of one thread and grows on a
busy machine (caches, frequency), so compare shapes and trees measured in the same run.

    scripts/bench ceiling [--shapes NAME,...] [--rounds 3] [--variant main=/work/main ...]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import statistics
import subprocess
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NamedTuple

from bench import data, fsinfo, options
from bench.contenders import contender_env, modelsync_binary
from bench.data import DataSet, GiB
from bench.harness import BenchError, clear, compile_modelsync, ensure_tools, run_main, run_timeout
from bench.nginx import NginxEndpoint
from bench.report import render_table, write_record

SHAPES = ("tmpfs-unsigned", "tmpfs-signed", "xfs-unsigned", "xfs-signed", "small-files")
RATE_HZ = 200
#: once-a-pull work that does not scale with the model: its samples count as start-up, not in the
#: slope. The signature bundle's check held the lock 0.4-0.9 s a pull, landing unevenly in the two
#: pulls of a round; in the slope it read as 7-24 ms per GiB that no GiB costs.
PER_PULL_FRAMES = frozenset({"adapters.oms.verify_bundle"})
#: the measured pull's niceness when the bench runs as root (see `measure`)
PRIORITY_NICE = -15
#: a py-spy raw line: `frame;frame;...;frame COUNT`, frames as `name (file:line)`
_RAW_LINE = re.compile(r"^(?P<stack>.*) (?P<count>\d+)$")
_FRAME = re.compile(r"^(?P<name>.+?) \((?P<file>[^()]*?)(?::\d+)?\)$")


@dataclass(frozen=True, slots=True)
class Sample:
    """One measured pull: its lock-held seconds, wall time, and the deepest modelsync frames."""

    variant: str
    shape: str
    size: str
    round: int
    lock_s: float
    wall_s: float
    load_1m: float
    frames: dict[str, int]
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Pair:
    """A shape's two data sets: `units` is GiB for the model sets and files for small files."""

    big: DataSet
    small: DataSet
    units_big: float
    units_small: float
    #: the public key that verifies each signed data set, by name; empty for unsigned pulls
    keys: dict[str, Path] = field(default_factory=dict)


def py_spy() -> Path:
    path = Path(modelsync_binary()).parent / "py-spy"
    if not path.exists():
        raise BenchError(f"{path} not found: pip install py-spy into the venv (the bench extra has it)")
    return path


def deepest_modelsync_frame(stack: str) -> str:
    """The innermost frame in modelsync's own code: where the lock time is spent, by our names."""
    for frame in reversed(stack.split(";")):
        match = _FRAME.match(frame)
        if match and "modelsync/" in match["file"]:
            module = match["file"].rsplit("modelsync/", 1)[1].removesuffix(".py").replace("/", ".")
            return f"{module}.{match['name']}"
    return "(outside modelsync: interpreter start-up, imports, libraries)"


def read_raw(path: Path) -> tuple[int, Counter[str]]:
    """Samples in a py-spy raw file, and their count by deepest modelsync frame."""
    total, frames = 0, Counter[str]()
    for line in path.read_text().splitlines():
        match = _RAW_LINE.match(line)
        if match is None:
            continue
        count = int(match["count"])
        total += count
        frames[deepest_modelsync_frame(match["stack"])] += count
    return total, frames


def printed_path(stdout: str) -> Path | None:
    """The last line the pull printed: py-spy writes its own notes (`py-spy> ...`) to the same
    stdout, before and after the pull's."""
    printed = [line for line in stdout.splitlines() if line.strip() and not line.startswith("py-spy>")]
    return Path(printed[-1]) if printed else None


def measure(argv: list[str], env: dict[str, str], work: Path, timeout_s: float,
            dest: Path) -> tuple[float, float, Counter[str], str | None]:
    """One pull under `py-spy record --gil`: (lock-held s, wall s, frames, error).

    py-spy exits 0 whatever the pull did, so a pull counts only if it printed its ready model's
    path (`--quiet` prints nothing else) and that is a directory in `dest`.
    """
    raw = work / "spy.txt"
    raw.unlink(missing_ok=True)
    spy = [str(py_spy()), "record", "--gil", "--rate", str(RATE_HZ), "--format", "raw", "--nonblocking",
           "-o", str(raw), "--"]
    # As root, the pull runs at a high priority: on a shared machine a thread preempted while it
    # holds the lock still counts as holding it, so other jobs' load would be measured as ours.
    boost = ["nice", "-n", str(PRIORITY_NICE)] if os.geteuid() == 0 else []
    start = time.monotonic()
    done = subprocess.run([*boost, *spy, *argv], env=env, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=timeout_s)
    wall_s = time.monotonic() - start
    if done.returncode != 0 or not raw.exists():
        return 0.0, wall_s, Counter(), f"exit {done.returncode}: {done.stderr.strip()[-300:]}"
    ready = printed_path(done.stdout)
    if ready is None or not ready.is_dir() or dest not in ready.parents:
        return 0.0, wall_s, Counter(), f"no ready model: {done.stderr.strip()[-300:]}"
    samples, frames = read_raw(raw)
    return samples / RATE_HZ, wall_s, frames, None


def pairs(root: Path) -> dict[str, Pair]:
    """The data sets of every shape, generated once and hard-linked into their subsets."""
    sets = data.datasets(small=False)
    big = data.prepare(sets["model-set-6g"], root).dataset
    shards = [p for p, _ in big.files if p.endswith(".safetensors") and "-of-" in p]
    side = [p for p, _ in big.files if p not in shards]
    # without the shard index, which names all twelve shards: a pull refuses a model whose
    # index maps tensors to shards it lacks (after downloading everything)
    side_small = [p for p in side if not p.endswith(".index.json")]
    small = data.link_subset(big, "ceiling-2g-4shards", shards[:4] + side_small, root)
    data.prepare(small, root)
    big_signed, big_key = data.signed_copy(big, "ceiling-6g-signed", root)
    small_signed, small_key = data.signed_copy(small, "ceiling-2g-4shards-signed", root)
    # with their manifests, as `modelsync publish --sign-key` leaves a model: without one, the
    # 2 GiB subset is refused (its shard index names all twelve shards)
    data.prepare(big_signed, root)
    data.prepare(small_signed, root)
    files = data.prepare(sets["small-files"], root).dataset
    files_small = data.link_subset(files, "ceiling-files-500", [p for p, _ in files.files[:500]], root)
    data.prepare(files_small, root)
    model = Pair(big, small, big.total_bytes / GiB, small.total_bytes / GiB)
    signed = Pair(big_signed, small_signed, big_signed.total_bytes / GiB, small_signed.total_bytes / GiB,
                  {big_signed.name: big_key, small_signed.name: small_key})
    return {
        "tmpfs-unsigned": model, "xfs-unsigned": model, "tmpfs-signed": signed, "xfs-signed": signed,
        "small-files": Pair(files, files_small, files.count, files_small.count),
    }


def run(args: argparse.Namespace, stack: contextlib.ExitStack) -> int:
    ensure_tools({"nginx"})
    root = options.data_root(args)
    shapes = pairs(root)
    compile_modelsync([tree for _name, tree in args.variant])
    endpoint = stack.enter_context(NginxEndpoint(root))
    tmpfs = Path(tempfile.mkdtemp(prefix="modelsync-ceiling-", dir=args.tmpfs_dir))
    stack.callback(clear, tmpfs)
    xfs = None
    if any(s.startswith("xfs") for s in args.shapes):
        xfs = stack.enter_context(fsinfo.loop_mount("xfs", 8 * GiB, args.cache_dir))
    work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ceiling-work-")))
    samples: list[Sample] = []
    for rnd in range(1, args.rounds + 1):
        for shape in args.shapes:
            pair = shapes[shape]
            for name, tree in args.variant:
                for size, ds in (("big", pair.big), ("small", pair.small)):
                    dest = (xfs if shape.startswith("xfs") and xfs is not None else tmpfs) / "cache"
                    clear(dest)
                    dest.mkdir(parents=True)
                    data.warm_page_cache(ds, root)
                    env = {**contender_env(endpoint.url), "PYTHONPATH": str(tree),
                           "MODELSYNC_SIGNATURE": "required" if pair.keys else "off"}
                    if pair.keys:
                        env["MODELSYNC_SIGNATURE_PUBLIC_KEYS"] = str(pair.keys[ds.name])
                    argv = [str(modelsync_binary()), "pull", ds.uri, "--cache-dir", str(dest),
                            "--endpoint-url", endpoint.url, "--quiet"]
                    load = os.getloadavg()[0]
                    lock_s, wall_s, frames, error = measure(argv, env, work, run_timeout(ds.total_bytes) * 3,
                                                              dest)
                    samples.append(Sample(name, shape, size, rnd, lock_s, wall_s, load, dict(frames), error))
                    print(f"  {name:8s} {shape:15s} {size:5s} round {rnd}  lock {lock_s:6.2f} s  wall "
                          f"{wall_s:6.2f} s  load {load:4.1f}  {error or ''}", flush=True)
                    clear(dest)
    tables = report(samples, shapes, args, md=False)
    print("\n" + "\n".join(tables))
    write_record(args.results_dir, "ceiling", {
        "variants": {n: str(t) for n, t in args.variant}, "rate_hz": RATE_HZ,
        "samples": [asdict(s) for s in samples],
    }, args.markdown, report(samples, shapes, args, md=True))
    return 1 if any(s.error for s in samples) else 0


class Slope(NamedTuple):
    """One round of one shape, from its big and small pulls."""

    #: lock-held seconds per unit (GiB or file) in the steady state: the slope between the two pulls
    per_unit: float
    #: lock-held seconds of start-up, what the slope leaves of the small pull
    startup_s: float
    load: float
    #: the big pull's lock-held seconds over its size, start-up included: one measure where the
    #: slope is the difference of two, so steadier from round to round, and never below the slope
    #: by more than start-up's share
    big_alone: float


def slopes(samples: list[Sample], variant: str, shape: str, pair: Pair) -> list[Slope]:
    """Per round: the steady lock-held time per unit, start-up, load, and the big pull alone."""
    out = []
    for rnd in sorted({s.round for s in samples}):
        by = {s.size: s for s in samples
              if (s.variant, s.shape, s.round) == (variant, shape, rnd) and s.error is None}
        if len(by) == 2:
            steady = {size: s.lock_s - per_pull_lock_s(s) for size, s in by.items()}
            per_unit = (steady["big"] - steady["small"]) / (pair.units_big - pair.units_small)
            startup = by["small"].lock_s - per_unit * pair.units_small
            out.append(Slope(per_unit, startup, max(by["big"].load_1m, by["small"].load_1m),
                             by["big"].lock_s / pair.units_big))
    return out


def per_pull_lock_s(sample: Sample) -> float:
    """Lock-held seconds of the pull's once-a-pull frames (`PER_PULL_FRAMES`)."""
    return sum(sample.frames.get(frame, 0) for frame in PER_PULL_FRAMES) / RATE_HZ


def report(samples: list[Sample], shapes: dict[str, Pair], args: argparse.Namespace, md: bool) -> list[str]:
    head = ["variant", "shape", "lock-held (median)", "ceiling", "start-up lock s", "per round",
            "big pull alone", "load"]
    body = []
    for name, _tree in args.variant:
        for shape in args.shapes:
            rows = slopes(samples, name, shape, shapes[shape])
            if not rows:
                continue
            per_unit = statistics.median(r.per_unit for r in rows)
            startup = statistics.median(r.startup_s for r in rows)
            scale, unit = (1000, "ms/file") if shape == "small-files" else (1, "s/GiB")
            rounds = " / ".join(f"{r.per_unit * scale:.3f}" for r in rows)
            if shape == "small-files":
                ceiling = f"{1 / per_unit:,.0f} files/s" if per_unit > 0 else "unbounded"
            else:
                ceiling = f"{1 / per_unit:.1f} GiB/s" if per_unit > 0 else "unbounded"
            alone = statistics.median(r.big_alone for r in rows) * scale
            loads = "-".join(f"{x:.1f}" for x in (min(r.load for r in rows), max(r.load for r in rows)))
            body.append([name, shape, f"{per_unit * scale:.3f} {unit}", ceiling, f"{startup:.2f}", rounds,
                         f"{alone:.3f} {unit}", loads])
    errors = sorted({f"{s.variant} {s.shape} {s.size}: {s.error}" for s in samples if s.error})
    out = render_table(f"serial ceiling: interpreter-lock seconds, py-spy --gil at {RATE_HZ} Hz, "
                       f"medians of {args.rounds}", head, body, errors, md)
    out += frame_table(samples, shapes, args, md)
    return out


def frame_table(samples: list[Sample], shapes: dict[str, Pair], args: argparse.Namespace,
                md: bool) -> list[str]:
    """Where the steady-state lock time goes: big minus small pulls, per unit, by deepest frame."""
    out: list[str] = []
    for name, _tree in args.variant:
        for shape in args.shapes:
            pair = shapes[shape]
            diff: Counter[str] = Counter()
            rounds = 0
            for rnd in sorted({s.round for s in samples}):
                by = {s.size: s for s in samples
                      if (s.variant, s.shape, s.round) == (name, shape, rnd) and s.error is None}
                if len(by) == 2:
                    rounds += 1
                    diff.update(by["big"].frames)
                    diff.subtract(by["small"].frames)
            if not rounds:
                continue
            # per file in microseconds: a small file's share is a fraction of a millisecond
            unit, per_s = ("us/file", 1e6) if shape == "small-files" else ("ms/GiB", 1e3)
            scale = per_s / RATE_HZ / rounds / (pair.units_big - pair.units_small)
            body = [[frame, f"{count * scale:.1f}"] for frame, count in diff.most_common(12)
                    if count > 0 and frame not in PER_PULL_FRAMES]
            out += render_table(f"{name} {shape}: lock-held {unit} by deepest modelsync frame",
                                ["frame", unit], body, [], md)
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = options.parser("scripts/bench ceiling", "shapes", SHAPES, __doc__)
    options.add_variants(ap)
    args = ap.parse_args(argv)
    args.shapes = options.choose(ap, "shapes", args.shapes, SHAPES)
    args.variant = options.variants(args.variant)
    options.check(ap, args)
    if args.small:
        ap.error("--small: the ceiling needs the full sets (their difference is what is measured)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_main("bench ceiling", lambda stack: run(args, stack))

