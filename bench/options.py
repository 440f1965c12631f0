"""The command-line options the throughput entry points (compare, curves) share."""

from __future__ import annotations

import argparse
from pathlib import Path

from bench import REPO, fsinfo


def parser(prog: str, list_opt: str, choices: tuple[str, ...], description: str) -> argparse.ArgumentParser:
    """A parser with `--<list_opt>` (a comma-separated subset of `choices`) and the shared options."""
    ap = argparse.ArgumentParser(prog=prog, description=description,
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument(f"--{list_opt}", default=",".join(choices), metavar="NAME[,...]",
                    help=f"what to run, from {', '.join(choices)}")
    ap.add_argument("--rounds", type=int, default=3,
                    help="interleaved rounds; tables show medians")
    ap.add_argument("--small", action="store_true",
                    help="quick smoke run on small data sets (64 MiB object, 8 x 8 MiB shards, "
                    "200 small files)")
    ap.add_argument("--quiet-wait", type=float, default=0.0, metavar="S",
                    help="before each run, wait up to S seconds for the machine to be mostly idle "
                    "(a shared machine's other jobs would otherwise decide a round)")
    ap.add_argument("--cache-dir", type=Path, default=REPO / ".bench-cache",
                    help="generated data and the disk destination live here")
    ap.add_argument("--tmpfs-dir", type=Path, default=Path("/dev/shm"),
                    help="a tmpfs mount for the tmpfs destination")
    ap.add_argument("--results-dir", type=Path, default=REPO / "bench-results",
                    help="where the JSON record of the run is written (named by its start time)")
    ap.add_argument("--markdown", type=Path, metavar="FILE",
                    help="also write the tables as a markdown section to FILE")
    return ap


def check(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    if fsinfo.fs_type(args.tmpfs_dir) != "tmpfs":
        ap.error(f"--tmpfs-dir: {args.tmpfs_dir} is not a tmpfs ({fsinfo.fs_type(args.tmpfs_dir)})")


def choose(ap: argparse.ArgumentParser, opt: str, value: str, allowed: tuple[str, ...]) -> list[str]:
    """A comma-separated option as a list in the canonical order; unknown names are an error."""
    chosen = [x.strip() for x in value.split(",") if x.strip()]
    bad = [x for x in chosen if x not in allowed]
    if bad or not chosen:
        ap.error(f"--{opt}: unknown {', '.join(bad) or 'empty list'}; choose from {', '.join(allowed)}")
    return [x for x in allowed if x in chosen]


def data_root(args: argparse.Namespace) -> Path:
    """Where the generated data sets live (kept between runs with --keep-data)."""
    root: Path = args.cache_dir / "data" / ("small" if args.small else "full")
    root.mkdir(parents=True, exist_ok=True)
    return root


def add_variants(ap: argparse.ArgumentParser) -> None:
    """`--variant NAME=TREE`, repeatable: the modelsync source trees an A/B entry point measures."""
    ap.add_argument("--variant", action="append", metavar="NAME=TREE",
                    help="a modelsync source tree (the parent of modelsync/) to measure; "
                    "default: this checkout")


def variants(given: list[str] | None) -> list[tuple[str, Path]]:
    """The `--variant` values as (name, resolved tree); this checkout when none is given."""
    return [(n, Path(t).resolve()) for n, t in (v.split("=", 1) for v in (given or [f"here={REPO}"]))]
