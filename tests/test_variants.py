"""One model name, a source per set of pools: the schedule's `variants`, end to end.

The loader and the schema are checked on text; the rest runs the real CLI against a
real daemon (a child process, moto in its own process): `modelsync pull NAME` asks
the daemon for this node's pool's variant and prints its ready path, a name with
nothing for the pool is one line and exit 8, and `plan`, `ls` and the metrics say
which variant a model is.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import jsonschema
import pytest
import yaml
from support.cli import one_error_line, run_cli
from support.daemon import POOL, Daemon
from support.objects import payload, upload
from support.s3env import S3Env
from support.waiting import wait_for

from modelsync.core.plan import plan_node
from modelsync.core.plan_view import plan_json, render_plan
from modelsync.core.schedule import load_schedule
from modelsync.core.schedule_variants import variant_for
from modelsync.errors import ExitCode, ScheduleError, SourceNotAllowedError

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = json.loads((ROOT / "modelsync/schema/schedule.schema.json").read_text())
NVFP4 = "s3://models/org/qwen3/nvfp4/"
FP8 = "s3://models/org/qwen3/fp8/"

VARIANTS = f"""\
version: 1
models:
  - name: qwen3
    variants:
      - pools: [{POOL}, spark-serving]
        source: {NVFP4}
      - pools: [a100-serving]
        source: {FP8}
    windows: [always]
  - name: a100-only
    variants:
      - {{pools: [a100-serving], source: s3://models/org/small/bf16/, variant: bf16}}
    windows: [always]
"""


def load_error(text: str) -> str:
    with pytest.raises(ScheduleError) as caught:
        load_schedule(text, "schedule.yaml")
    return str(caught.value)


def schema_errors(text: str) -> list[str]:
    return [e.message for e in jsonschema.Draft202012Validator(SCHEMA).iter_errors(yaml.safe_load(text))]


# --- the format ----------------------------------------------------------------------------


def test_each_variant_is_a_model_of_its_own_under_the_entrys_name_and_fields() -> None:
    schedule = load_schedule(VARIANTS, "schedule.yaml")
    nvfp4, fp8, bf16 = schedule.models
    assert (nvfp4.name, nvfp4.source.uri, nvfp4.pools, nvfp4.variant) == (
        "qwen3", NVFP4, (POOL, "spark-serving"), "nvfp4"
    )
    assert (fp8.name, fp8.source.uri, fp8.pools, fp8.variant) == ("qwen3", FP8, ("a100-serving",), "fp8")
    assert fp8.line == 7, "a variant's messages point at its own line"
    assert bf16.variant == "bf16" and bf16.windows == nvfp4.windows
    assert [m.source.uri for m in schedule.for_pool("a100-serving")] == [FP8, "s3://models/org/small/bf16/"]
    assert schema_errors(VARIANTS) == []


def test_each_pool_gets_its_own_variant_and_a_pool_without_one_is_refused_naming_the_pools() -> None:
    schedule = load_schedule(VARIANTS, "schedule.yaml")
    assert variant_for(schedule, "qwen3", "spark-serving").source.uri == NVFP4
    assert variant_for(schedule, "qwen3", "a100-serving").source.uri == FP8
    refusal = "'a100-only' has no variant for this node's pool spark-serving; it serves the pools a100"
    with pytest.raises(SourceNotAllowedError, match=refusal):
        variant_for(schedule, "a100-only", "spark-serving")
    with pytest.raises(SourceNotAllowedError, match="no model named 'qwen4'; its names are a100-only, qwen3"):
        variant_for(schedule, "qwen4", "spark-serving")


BAD_VARIANTS = [
    (
        "a pool in two variants",
        VARIANTS.replace("pools: [a100-serving]\n", "pools: [a100-serving, spark-serving]\n"),
        "schedule.yaml:7: models[0].variants[1].pools: pool 'spark-serving' is already in "
        "models[0].variants[0] (line 5); a pool gets one variant of 'qwen3'",
    ),
    (
        "variants beside a source",
        VARIANTS.replace("    variants:\n", f"    source: {FP8}\n    variants:\n", 1),
        "schedule.yaml:4: models[0].source: give either source and pools, or variants",
    ),
    (
        "variants without a name",
        VARIANTS.replace("  - name: qwen3\n    variants:", "  - variants:"),
        "schedule.yaml:3: models[0].variants: variants need the entry's name; add name:",
    ),
    (
        "two variants that would share a name",
        VARIANTS.replace(FP8, "s3://models/org/qwen3-fp8/nvfp4/"),
        "schedule.yaml:7: models[0].variants[1].variant: variant 'nvfp4' already names models[0].variants[0]",
    ),
    (
        "a variant without a source",
        VARIANTS.replace(f"        source: {FP8}\n", ""),
        "schedule.yaml:7: models[0].variants[1]: missing required key 'source'",
    ),
    (
        "no variants",
        VARIANTS.replace(VARIANTS[VARIANTS.index("      - pools: [test"):VARIANTS.index("    windows")], "")
        .replace("variants:\n", "variants: []\n", 1),
        "schedule.yaml:4: models[0].variants: empty",
    ),
    (
        "a variant's source listed again by another entry",
        VARIANTS.replace("s3://models/org/small/bf16/", FP8),
        f"schedule.yaml:12: models[1].variants[0].source: duplicate model {FP8}; already listed as models[0]",
    ),
    (
        "the name of a variant entry used again",
        VARIANTS.replace("name: a100-only", "name: qwen3"),
        "schedule.yaml:10: models[1].name: duplicate name 'qwen3'; already used by models[0]",
    ),
]


@pytest.mark.parametrize(("text", "expected"), [pytest.param(t, e, id=c) for c, t, e in BAD_VARIANTS])
def test_a_bad_variants_entry_is_one_located_error(text: str, expected: str) -> None:
    assert load_error(text).startswith(expected)


@pytest.mark.parametrize("case", ["variants beside a source", "variants without a name", "no variants",
                                  "a variant without a source"])
def test_the_schema_refuses_the_structural_variant_errors_the_loader_refuses(case: str) -> None:
    (text,) = [t for c, t, _ in BAD_VARIANTS if c == case]
    assert schema_errors(text)


def test_the_plan_shows_the_variant_a_pool_gets_in_its_table_and_json() -> None:
    schedule = load_schedule(VARIANTS, "schedule.yaml")
    plan = plan_node(schedule, "a100-serving", datetime(2026, 5, 4, tzinfo=UTC), (), None, None)
    table = "\n".join(render_plan(plan))
    assert "qwen3 [fp8]" in table and "a100-only [bf16]" in table and "nvfp4" not in table
    (qwen3,) = [m for m in plan_json(plan)["models"] if m["label"] == "qwen3"]  # type: ignore[attr-defined]
    assert (qwen3["model"], qwen3["variant"]) == ("models/org/qwen3/fp8", "fp8")


# --- through the CLI and a daemon --------------------------------------------------------------


@pytest.fixture
def daemon(tmp_path: Path, moto_subprocess_s3_env: S3Env, start_daemon: Callable[..., Daemon]) -> Daemon:
    """A daemon of POOL whose schedule gives qwen3 an NVFP4 variant for it and an FP8 one for a100."""
    for prefix, seed in (("org/qwen3/nvfp4/", 1), ("org/qwen3/fp8/", 2)):
        upload(moto_subprocess_s3_env, "models", prefix, {"weights.bin": payload(1024 * 1024, seed)})
    schedule = tmp_path / "schedule.yaml"
    schedule.write_text(VARIANTS.replace("windows: [always]", "windows: [{cron: '0 0 1 1 *', duration: 1h}]"))
    return start_daemon(schedule, moto_subprocess_s3_env.subprocess_env())


def test_pull_by_name_gets_this_pools_variant_from_the_daemon_and_ls_and_metrics_name_it(
    tmp_path: Path, daemon: Daemon, moto_subprocess_s3_env: S3Env
) -> None:
    env = moto_subprocess_s3_env.subprocess_env()
    cache = tmp_path / "cache"
    wait_for(lambda: daemon.get("/readyz")[0] == 200, what="the daemon is ready")
    done = run_cli(env, "pull", "qwen3", cache_dir=cache)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == str(cache / "models/org/qwen3/nvfp4")
    assert (cache / "models/org/qwen3/nvfp4/weights.bin").read_bytes() == payload(1024 * 1024, 1)
    assert not (cache / "models/org/qwen3/fp8").exists()

    staged = {"model": "models/org/qwen3/nvfp4", "name": "qwen3", "variant": "nvfp4"}
    wait_for(lambda: daemon.metric("modelsync_model_staged", **staged) == 1, what="the gauge has the variant")
    listed = run_cli(env, "ls", cache_dir=cache)
    assert listed.returncode == 0, listed.stderr
    header, row = listed.stdout.splitlines()[:2]
    assert header.split()[:3] == ["MODEL", "NAME", "STATE"]
    assert row.split()[:4] == ["models/org/qwen3/nvfp4", "qwen3", "[nvfp4]", "ready"]
    as_json = json.loads(run_cli(env, "ls", "--json", cache_dir=cache).stdout)
    assert (as_json["models"][0]["name"], as_json["models"][0]["variant"]) == ("qwen3", "nvfp4")


def test_pull_by_a_name_with_no_variant_for_this_pool_is_one_line_and_exit_8_naming_its_pools(
    tmp_path: Path, daemon: Daemon, moto_subprocess_s3_env: S3Env
) -> None:
    env = moto_subprocess_s3_env.subprocess_env()
    wait_for(lambda: daemon.get("/readyz")[0] == 200, what="the daemon is ready")
    done = run_cli(env, "pull", "a100-only", cache_dir=tmp_path / "cache")
    assert done.returncode == ExitCode.NOT_ALLOWED
    assert one_error_line(done.stderr) == (
        f"error: 'a100-only' has no variant for this node's pool {POOL}; it serves the pools a100-serving"
    )
    unknown = run_cli(env, "pull", "qwen4", cache_dir=tmp_path / "cache")
    assert unknown.returncode == ExitCode.NOT_ALLOWED
    assert "its names are a100-only, qwen3" in one_error_line(unknown.stderr)


def test_pull_by_name_without_a_daemon_says_the_name_needs_one(
    tmp_path: Path, moto_subprocess_s3_env: S3Env
) -> None:
    done = run_cli(moto_subprocess_s3_env.subprocess_env(), "pull", "qwen3", cache_dir=tmp_path / "cache")
    assert done.returncode == ExitCode.LOCAL_STORAGE
    assert "a model name is resolved by the node's daemon" in one_error_line(done.stderr)
