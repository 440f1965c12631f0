"""`modelsync plan` through the real CLI: a bad schedule is one located line and exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from modelsync.core.schedule import MAX_SCHEDULE_BYTES

GOOD = """\
version: 1
timezone: Asia/Seoul
models:
  - name: deepseek-v3
    source: s3://models/deepseek-ai/DeepSeek-V3/2025-03-24/
    pools: [b300-serving]
    lead: 45m
    windows: [{cron: "0 8 * * mon-fri", duration: 12h}]
"""
MODEL = "  - source: s3://models/org/m/1/\n    pools: [b300-serving]\n    windows: [always]\n"
BOMB = "version: 1\na: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
    for p, c in zip("abcdefg", "bcdefgh", strict=True)
) + "models: []\n"


def plan(tmp_path: Path, text: str, *args: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "schedule.yaml"
    path.write_text(text)
    return subprocess.run(
        [sys.executable, "-m", "modelsync", "plan", "--schedule", str(path), "--offline",
         "--cache-dir", str(tmp_path / "cache"), *args],
        capture_output=True, text=True, timeout=60,
    )


@pytest.mark.parametrize(
    ("text", "args", "expected"),
    [
        ("version: 1\nmodels: [\n", (), "schedule.yaml:3: malformed YAML"),
        (GOOD.replace("lead:", "prefetch:"), (), "schedule.yaml:7: models[0].prefetch: unknown key"),
        (GOOD.replace("0 8 * * mon-fri", "0 25 * * *"), (), "yaml:8: models[0].windows[0].cron: invalid"),
        (GOOD.replace("Asia/Seoul", "Mars/Olympus"), (), "yaml:2: timezone: unknown time zone 'Mars/"),
        (GOOD, ("--pool", "b300-servng"), "unknown pool 'b300-servng': no model of"),
        ("version: 1\nmodels:\n" + MODEL + MODEL, (), "schedule.yaml:6: models[1].source: duplicate"),
        ("", (), "schedule.yaml:1: the schedule is empty"),
        ("#" * (MAX_SCHEDULE_BYTES + 10), (), "schedule.yaml:1: the schedule is"),
        (BOMB, (), "YAML refused: aliases expand it beyond"),
        (GOOD, ("--at", "next tuesday"), "invalid time 'next tuesday'"),
        (GOOD.replace("version: 1", "version: 2"), (), "schedule.yaml:1: version: unsupported version 2"),
    ],
    ids=["malformed", "unknown-key", "bad-cron", "bad-tz", "unknown-pool", "duplicate", "empty", "oversized",
         "alias-bomb", "bad-at", "version"],
)
def test_plan_refuses_a_bad_schedule_with_one_located_line_and_exit_2(
    tmp_path: Path, text: str, args: tuple[str, ...], expected: str
) -> None:
    pool = () if "--pool" in args else ("--pool", "b300-serving")
    result = plan(tmp_path, text, *pool, *args)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: ") and expected in lines[0], lines[0]
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_plan_prints_the_table_and_json_for_an_instant_in_the_schedule_time_zone(tmp_path: Path) -> None:
    table = plan(tmp_path, GOOD, "--pool", "b300-serving", "--at", "2026-05-04T07:30")
    assert table.returncode == 0, table.stderr
    assert "pool b300-serving at 2026-05-04T07:30:00+09:00" in table.stdout
    assert "fetch   deepseek-v3  prefetch" in table.stdout
    as_json = plan(tmp_path, GOOD, "--pool", "b300-serving", "--at", "2026-05-04T07:30", "--json")
    data = json.loads(as_json.stdout)
    assert data["fetch"] == ["models/deepseek-ai/DeepSeek-V3/2025-03-24"]
    assert data["models"][0]["window_start"] == "2026-05-03T23:00:00Z"
    assert data["fits"] is True


def test_plan_warns_once_per_model_whose_size_s3_cannot_tell(
    tmp_path: Path, child_env: dict[str, str]
) -> None:
    missing = "".join(
        f"  - source: s3://no-such-bucket/org/{name}/1/\n    pools: [b300-serving]\n    windows: [always]\n"
        for name in ("a", "b")
    )
    path = tmp_path / "schedule.yaml"
    path.write_text("version: 1\nmodels:\n" + missing)
    result = subprocess.run(
        [sys.executable, "-m", "modelsync", "plan", "--schedule", str(path), "--pool", "b300-serving",
         "--cache-dir", str(tmp_path / "cache")],
        capture_output=True, text=True, timeout=60, env=child_env,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stderr.strip().splitlines()
    assert [line.split(" unknown: ")[0] for line in lines] == [
        "warning: size of no-such-bucket/org/a/1",
        "warning: size of no-such-bucket/org/b/1",
    ], lines
    assert "(2 of unknown size not counted)" in result.stdout
