"""Summaries of measured runs, their tables (terminal or markdown) and the JSON record."""

from __future__ import annotations

import datetime as dt
import json
import statistics
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench.contenders import is_modelsync
from bench.data import GiB
from bench.harness import Point, Run, machine_info

#: when this benchmark process started (the record is written at the end)
STARTED = dt.datetime.now(dt.UTC)


@dataclass
class Summary:
    case: str
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
    #: this contender's median ÷ modelsync's (the first variant's) in the same case and label
    time_vs_modelsync: float | None = None
    #: slowest round ÷ fastest: how stable the contender is here
    max_min: float | None = None
    rounds_s: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def summarise(points: Sequence[Point], runs: Sequence[Run]) -> list[Summary]:
    """One row per point: medians over its successful rounds, max/min and every round."""
    rows = []
    for pt in points:
        key = (pt.case, pt.label, pt.contender)
        mine = [r for r in runs if (r.case, r.label, r.contender) == key]
        ok = [r for r in mine if r.error is None]
        s = Summary(*key, pt.files, pt.total_bytes, len(ok), len(mine),
                    errors=[r.error for r in mine if r.error])
        if ok:
            s.rounds_s = [round(r.wall_s, 2) for r in ok]
            s.max_min = max(s.rounds_s) / min(s.rounds_s)
            s.median_wall_s = statistics.median(r.wall_s for r in ok)
            s.gib_per_s = pt.total_bytes / GiB / s.median_wall_s
            s.files_per_s = pt.files / s.median_wall_s
            s.cpu_s_per_gib = statistics.median(r.cpu_s for r in ok) / (pt.total_bytes / GiB)
            s.peak_rss_mib = max(r.maxrss_mib for r in ok)
        rows.append(s)
    for s in rows:
        # the first modelsync row (the first source tree measured) is the ratios' base
        base = next((b.median_wall_s for b in rows if (b.case, b.label) == (s.case, s.label)
                     and is_modelsync(b.contender)), None)
        if base and s.median_wall_s:
            s.time_vs_modelsync = s.median_wall_s / base
    return rows


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def summary_table(title: str, rows: list[Summary], md: bool, x_name: str | None = None) -> list[str]:
    """The rows of one table; with `x_name`, a first column holds each row's label (a curve)."""
    by_files = all(s.files >= 100 for s in rows)
    rate = "files/s" if by_files else "GiB/s"
    peers = len({s.contender for s in rows}) > 1  # else the ratio is 1.00 throughout
    head = [*([x_name] if x_name else []), "contender", "wall s", rate, "CPU s/GiB",
            "peak RSS MiB", *(["time ÷ modelsync's"] if peers else []), "max/min", "rounds s"]
    body = []
    for s in rows:
        speed = s.files_per_s if by_files else s.gib_per_s
        body.append([
            *([s.label] if x_name else []),
            s.contender + ("" if s.ok_runs == s.runs else f" ({s.runs - s.ok_runs} failed)"),
            _fmt(s.median_wall_s, ".2f"), _fmt(speed, ".0f" if by_files else ".2f"),
            _fmt(s.cpu_s_per_gib, ".2f"), _fmt(s.peak_rss_mib, ".0f"),
            *([_fmt(s.time_vs_modelsync, ".2f")] if peers else []), _fmt(s.max_min, ".2f"),
            " / ".join(f"{x:.2f}" for x in s.rounds_s) or "-",
        ])
    errors = [f"{s.contender} {s.label}".strip() + f": {e}" for s in rows for e in sorted(set(s.errors))]
    return render_table(title, head, body, errors, md)


def render_table(title: str, head: list[str], body: list[list[str]], errors: list[str],
                 md: bool) -> list[str]:
    """One table as text lines: aligned columns for the terminal, or a markdown section."""
    if md:
        lines = [f"### {title}", "", "| " + " | ".join(head) + " |",
                 "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(row) + " |" for row in body]
        return [*lines, "", *(f"- error: {e}" for e in errors), *([""] if errors else [])]
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]

    def fmt(row: list[str]) -> str:
        cells = zip(row, widths, strict=True)
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(cells))

    listed = ("errors:", *(f"  {e}" for e in errors)) if errors else ()
    return [title, fmt(head), *map(fmt, body), *listed, ""]


def write_record(results_dir: Path, kind: str, doc: dict[str, object], markdown_path: Path | None,
                 markdown: list[str]) -> dict[str, object]:
    """`<results_dir>/<kind>-<timestamp>.json` (with the command and the machine) and the markdown."""
    now = dt.datetime.now(dt.UTC)
    command = f"scripts/bench {' '.join(sys.argv[1:])}".strip()
    record = {"started_utc": STARTED.isoformat(timespec="seconds"),
              "ended_utc": now.isoformat(timespec="seconds"), "command": command,
              "machine": machine_info(), **doc}
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / f"{kind}-{STARTED.strftime('%Y%m%dT%H%M%SZ')}.json"
    path.write_text(json.dumps(record, indent=1, default=_jsonable) + "\n")
    print(f"\nresults: {path}")
    if markdown_path:
        markdown_path.write_text("\n".join([f"Reproduce: `{command}`", "", *markdown]))
        print(f"markdown: {markdown_path}")
    return record


def _jsonable(value: object) -> object:
    if hasattr(value, "__dataclass_fields__"):
        return asdict(value)  # type: ignore[call-overload]
    return str(value)
