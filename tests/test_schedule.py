"""The schedule file: located one-line errors at load, the JSON Schema, and the desired set."""

from __future__ import annotations

import json
import re
import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path

import jsonschema
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from modelsync.core.desired import DesiredModel, SchedulePhase, desired_models, protected
from modelsync.core.refs import parse_source
from modelsync.core.schedule import (
    DEFAULT_KEEP_S,
    DEFAULT_LEAD_S,
    DEFAULT_PRIORITY,
    MAX_SCHEDULE_BYTES,
    Schedule,
    ScheduledModel,
    load_schedule,
)
from modelsync.core.signature import Mode, SignatureRule, Trust
from modelsync.core.windows import ALWAYS, CronWindow, Window, current_or_next
from modelsync.errors import ExitCode, ScheduleError, UsageError

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = json.loads((ROOT / "modelsync/schema/schedule.schema.json").read_text())

EXAMPLE = """\
version: 1
timezone: Asia/Seoul          # default for windows
defaults: {lead: 30m, keep: 2h, priority: 50}
models:
  - name: deepseek-v3
    source: s3://models/deepseek-ai/DeepSeek-V3/2025-03-24/
    pools: [b300-serving]
    priority: 90
    lead: 45m
    keep: 1h
    windows:
      - cron: "0 8 * * mon-fri"
        duration: 12h
        timezone: Asia/Seoul
  - source: s3://models/Qwen/Qwen3-0.6B/2025-04-29/
    pools: [spark-serving]
    windows: [always]
"""

MINIMAL = """\
version: 1
models:
  - source: s3://models/org/m/1/
    pools: [p]
    windows: [always]
"""

NIGHTLY = """\
version: 1
timezone: Europe/Berlin
models:
  - name: batch
    source: s3://models/org/batch/2026-01-01/
    pools: [a100-batch, h100-batch]
    lead: 1h30m
    keep: 0
    windows:
      - {cron: "0 22 * * *", duration: 8h}
      - {cron: "@hourly", duration: 10m, timezone: UTC}
"""


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, tzinfo=UTC)


def load_error(text: str, known_pools: frozenset[str] | None = None) -> str:
    with pytest.raises(ScheduleError) as caught:
        load_schedule(text, "schedule.yaml", known_pools)
    message = str(caught.value)
    assert "\n" not in message, message
    assert isinstance(caught.value, UsageError) and caught.value.exit_code == ExitCode.USAGE
    assert caught.value.code == "bad_schedule"
    return message


# --- loading ------------------------------------------------------------------------------


def test_the_example_schedule_loads_into_frozen_values() -> None:
    schedule = load_schedule(EXAMPLE, "schedule.yaml")
    deepseek, qwen = schedule.models
    assert schedule.version == 1
    assert schedule.timezone == "Asia/Seoul"
    assert deepseek == ScheduledModel(
        source=parse_source("s3://models/deepseek-ai/DeepSeek-V3/2025-03-24/"),
        name="deepseek-v3",
        pools=("b300-serving",),
        priority=90,
        lead_s=45 * 60.0,
        keep_s=3600.0,
        windows=(CronWindow("0 8 * * mon-fri", 12 * 3600.0, "Asia/Seoul"),),
        line=5,
    )
    assert (qwen.name, qwen.priority, qwen.lead_s, qwen.keep_s) == (None, 50, 1800.0, 7200.0)
    assert qwen.windows == (ALWAYS,)
    assert qwen.label == "s3://models/Qwen/Qwen3-0.6B/2025-04-29/"
    with pytest.raises(AttributeError):
        schedule.models[0].priority = 1  # type: ignore[misc]


def test_built_in_defaults_apply_when_the_file_gives_none() -> None:
    (model,) = load_schedule(MINIMAL, "s.yaml").models
    assert (model.lead_s, model.keep_s, model.priority) == (
        DEFAULT_LEAD_S,
        DEFAULT_KEEP_S,
        DEFAULT_PRIORITY,
    )


def test_windows_inherit_the_top_level_time_zone_unless_they_override_it() -> None:
    (model,) = load_schedule(NIGHTLY, "s.yaml").models
    assert model.windows == (
        CronWindow("0 22 * * *", 8 * 3600.0, "Europe/Berlin"),
        CronWindow("@hourly", 600.0, "UTC"),
    )
    assert model.keep_s == 0.0
    assert load_schedule(NIGHTLY, "s.yaml").for_pool("h100-batch") == (model,)
    assert load_schedule(NIGHTLY, "s.yaml").for_pool("other") == ()


def test_a_signature_policy_applies_to_its_model_alone_and_defaults_to_the_defaults() -> None:
    text = (
        "version: 1\n"
        "defaults: {signature: if-present}\n"
        "models:\n"
        "  - {source: s3://models/a/1/, pools: [p], windows: [always]}\n"
        "  - source: s3://models/b/1/\n"
        "    pools: [p]\n"
        "    windows: [always]\n"
        "    signature: {mode: required, public_keys: [/trust/b.pem], identities: [ops@example.com]}\n"
    )
    assert schema_errors(text) == []
    a, b = load_schedule(text, "s.yaml").models
    assert a.signature == SignatureRule("models/a/1/", Mode.IF_PRESENT)
    assert b.signature == SignatureRule(
        "models/b/1/", Mode.REQUIRED, Trust(("/trust/b.pem",), (), ("ops@example.com",))
    )
    assert load_schedule(MINIMAL, "s.yaml").models[0].signature is None


def test_known_pools_accept_a_schedule_that_names_only_them() -> None:
    load_schedule(EXAMPLE, "s.yaml", frozenset({"b300-serving", "spark-serving"}))


def test_an_empty_models_list_is_a_valid_schedule() -> None:
    assert load_schedule("version: 1\nmodels: []\n", "s.yaml").models == ()


def test_anchors_and_a_few_aliases_are_fine() -> None:
    text = textwrap.dedent("""\
        version: 1
        models:
          - source: s3://models/a/1/
            pools: &serving [p1, p2]
            windows: &office [{cron: "0 8 * * 1-5", duration: 10h}]
          - source: s3://models/b/1/
            pools: *serving
            windows: *office
        """)
    first, second = load_schedule(text, "s.yaml").models
    assert first.pools == second.pools == ("p1", "p2")


# Each row: a schedule and the exact error line it must produce.
BAD_SCHEDULES: list[tuple[str, str, str]] = [
    ("empty file", "", "schedule.yaml:1: the schedule is empty"),
    ("only comments", "# nothing\n", "schedule.yaml:1: the schedule is empty"),
    (
        "malformed YAML",
        "version: 1\nmodels: [\n  - a\n",
        "schedule.yaml:3: malformed YAML:",
    ),
    (
        "tab indentation",
        "version: 1\nmodels:\n\t- x\n",
        "schedule.yaml:3: malformed YAML:",
    ),
    ("two documents", "version: 1\n---\nversion: 1\n", "schedule.yaml:2: malformed YAML:"),
    ("top level is a list", "- version: 1\n", "schedule.yaml:1: expected a mapping, got a list"),
    ("missing version", "models: []\n", "schedule.yaml:1: version: missing; add 'version: 1'"),
    (
        "unsupported version",
        "version: 2\nmodels: []\n",
        "schedule.yaml:1: version: unsupported version 2; this modelsync reads version 1",
    ),
    (
        "version as a string",
        "version: '1'\nmodels: []\n",
        "schedule.yaml:1: version: expected an integer, got a string",
    ),
    ("missing models", "version: 1\n", "schedule.yaml:1: models: missing"),
    (
        "unknown top-level key",
        "version: 1\nmodel: []\n",
        "schedule.yaml:2: model: unknown key 'model'; expected one of version, timezone, defaults, models",
    ),
    (
        "unknown key in defaults",
        "version: 1\ndefaults: {lead: 1m, prio: 3}\nmodels: []\n",
        "schedule.yaml:2: defaults.prio: unknown key 'prio'",
    ),
    (
        "unknown key in a model",
        MINIMAL + "    prefetch: 10m\n",
        "schedule.yaml:6: models[0].prefetch: unknown key 'prefetch'; expected one of name, "
        "source, pools, priority, lead, keep, windows",
    ),
    (
        "unknown key in a window",
        MINIMAL.replace("[always]", '[{cron: "0 8 * * *", duration: 1h, tz: UTC}]'),
        "schedule.yaml:5: models[0].windows[0].tz: unknown key 'tz'; expected one of cron, "
        "duration, timezone",
    ),
    (
        "duplicate key",
        "version: 1\nversion: 1\nmodels: []\n",
        "schedule.yaml:2: version: duplicate key (first at line 1)",
    ),
    (
        "merge key",
        "version: 1\nmodels:\n  - <<: {pools: [p]}\n",
        "schedule.yaml:3: models[0]: merge keys (<<) are not supported",
    ),
    (
        "missing source",
        "version: 1\nmodels:\n  - pools: [p]\n    windows: [always]\n",
        "schedule.yaml:3: models[0]: missing required key 'source'",
    ),
    (
        "models is a mapping",
        "version: 1\nmodels: {a: 1}\n",
        "schedule.yaml:2: models: expected a list, got a mapping",
    ),
    (
        "pools is a string",
        MINIMAL.replace("[p]", "p"),
        "schedule.yaml:4: models[0].pools: expected a list, got a string",
    ),
    (
        "pool read as a boolean",
        MINIMAL.replace("[p]", "[on]"),
        "schedule.yaml:4: models[0].pools[0]: expected a string, got a boolean; quote it",
    ),
    ("empty pools", MINIMAL.replace("[p]", "[]"), "schedule.yaml:4: models[0].pools: empty"),
    (
        "duplicate pool",
        MINIMAL.replace("[p]", "[p, p]"),
        "schedule.yaml:4: models[0].pools[1]: duplicate pool 'p'",
    ),
    (
        "invalid pool name",
        MINIMAL.replace("[p]", "['-p']"),
        "schedule.yaml:4: models[0].pools[0]: invalid name '-p'",
    ),
    (
        "priority is a string",
        MINIMAL + "    priority: high\n",
        "schedule.yaml:6: models[0].priority: expected an integer, got a string",
    ),
    (
        "priority out of range",
        MINIMAL + "    priority: 5000\n",
        "schedule.yaml:6: models[0].priority: priority 5000 is outside 0-1000",
    ),
    (
        "bad lead duration",
        MINIMAL + "    lead: 30 minutes\n",
        "schedule.yaml:6: models[0].lead: invalid duration '30 minutes'",
    ),
    (
        "bare number duration",
        MINIMAL + "    keep: 90\n",
        "schedule.yaml:6: models[0].keep: invalid duration '90'",
    ),
    (
        "sexagesimal duration",
        MINIMAL + "    keep: 1:30\n",
        "schedule.yaml:6: models[0].keep: invalid duration '1:30'",
    ),
    (
        "null duration",
        MINIMAL + "    keep:\n",
        "schedule.yaml:6: models[0].keep: expected a duration such as 30m, got null",
    ),
    (
        "zero window duration",
        MINIMAL.replace("[always]", '[{cron: "0 8 * * *", duration: 0s}]'),
        "schedule.yaml:5: models[0].windows[0].duration: must be longer than 0s",
    ),
    (
        "missing window duration",
        MINIMAL.replace("[always]", '[{cron: "0 8 * * *"}]'),
        "schedule.yaml:5: models[0].windows[0]: missing required key 'duration'",
    ),
    (
        "invalid cron",
        MINIMAL.replace("[always]", '\n      - cron: "0 25 * * *"\n        duration: 1h'),
        "schedule.yaml:6: models[0].windows[0].cron: invalid cron expression '0 25 * * *' "
        "(hour must be 0-23)",
    ),
    (
        "cron that never fires",
        MINIMAL.replace("[always]", '[{cron: "0 0 30 2 *", duration: 1h}]'),
        "schedule.yaml:5: models[0].windows[0].cron: invalid cron expression '0 0 30 2 *' (it never fires)",
    ),
    (
        "window that is neither always nor a mapping",
        MINIMAL.replace("[always]", "[sometimes]"),
        "schedule.yaml:5: models[0].windows[0]: expected 'always' or a mapping",
    ),
    ("no windows", MINIMAL.replace("[always]", "[]"), "schedule.yaml:5: models[0].windows: empty"),
    (
        "unknown time zone at the top",
        "version: 1\ntimezone: Mars/Olympus\nmodels: []\n",
        "schedule.yaml:2: timezone: unknown time zone 'Mars/Olympus'",
    ),
    (
        "unknown time zone in a window",
        MINIMAL.replace("[always]", '[{cron: "0 8 * * *", duration: 1h, timezone: Asia/Seul}]'),
        "schedule.yaml:5: models[0].windows[0].timezone: unknown time zone 'Asia/Seul'",
    ),
    (
        "source that is not s3",
        MINIMAL.replace("s3://models/org/m/1/", "https://models/org/m/1/"),
        "schedule.yaml:3: models[0].source: source 'https://models/org/m/1/' is not an s3:// URI",
    ),
    (
        "source that is a whole bucket",
        MINIMAL.replace("s3://models/org/m/1/", "s3://models/"),
        "schedule.yaml:3: models[0].source: source 's3://models/' names a whole bucket",
    ),
    (
        "source with a bad bucket",
        MINIMAL.replace("s3://models/org/m/1/", "s3://Models_X/a/"),
        "schedule.yaml:3: models[0].source: source 's3://Models_X/a/': 'Models_X' is not a valid bucket name",
    ),
    (
        "source that escapes its prefix",
        MINIMAL.replace("s3://models/org/m/1/", "s3://models/org/../x/"),
        "schedule.yaml:3: models[0].source: source 's3://models/org/../x/': unsafe prefix",
    ),
    (
        "duplicate source",
        MINIMAL + MINIMAL.split("models:\n")[1].replace("[p]", "[q]"),
        "schedule.yaml:6: models[1].source: duplicate model s3://models/org/m/1/; already listed "
        "as models[0] (line 3)",
    ),
    (
        "duplicate source spelled without the trailing slash",
        MINIMAL + MINIMAL.split("models:\n")[1].replace("m/1/", "m/1"),
        "schedule.yaml:6: models[1].source: duplicate model s3://models/org/m/1/",
    ),
    (
        "duplicate source in the middle of an entry",
        MINIMAL + "  - pools: [q]\n    source: s3://models/org/m/1/\n    windows: [always]\n",
        "schedule.yaml:7: models[1].source: duplicate model s3://models/org/m/1/",
    ),
    (
        "duplicate name",
        "version: 1\nmodels:\n"
        "  - {name: x, source: s3://models/a/1/, pools: [p], windows: [always]}\n"
        "  - {name: x, source: s3://models/b/1/, pools: [p], windows: [always]}\n",
        "schedule.yaml:4: models[1].name: duplicate name 'x'; already used by models[0] (line 3)",
    ),
    (
        "unknown signature mode",
        MINIMAL + "    signature: sometimes\n",
        "schedule.yaml:6: models[0].signature: signature policy 'sometimes' is not one of required",
    ),
    (
        "signature mapping without a mode",
        MINIMAL + "    signature: {public_keys: [/k.pem]}\n",
        "schedule.yaml:6: models[0].signature: missing required key 'mode'",
    ),
    (
        "signature keys that are not a list",
        MINIMAL + "    signature: {mode: required, public_keys: /k.pem}\n",
        "schedule.yaml:6: models[0].signature.public_keys: expected a list",
    ),
    (
        "non-printable character",
        "version: 1\nmodels: []\n# \x07\n",
        "schedule.yaml:3: malformed YAML:",
    ),
]


@pytest.mark.parametrize(
    ("text", "expected"),
    [pytest.param(text, expected, id=case) for case, text, expected in BAD_SCHEDULES],
)
def test_each_bad_schedule_is_one_located_usage_error(text: str, expected: str) -> None:
    assert load_error(text).startswith(expected)


def test_an_unknown_pool_is_refused_when_the_pools_are_known() -> None:
    message = load_error(EXAMPLE, frozenset({"b300-serving", "gb200-serving"}))
    assert message == (
        "schedule.yaml:16: models[1].pools[0]: unknown pool 'spark-serving'; "
        "known: b300-serving, gb200-serving"
    )


def test_an_oversized_file_is_refused_before_parsing() -> None:
    # not even valid YAML: the size check must come first
    text = "version: [\n" + "#" * MAX_SCHEDULE_BYTES
    message = load_error(text)
    assert message.startswith("schedule.yaml:1: the schedule is ")
    assert f"over the limit of {MAX_SCHEDULE_BYTES}" in message


def test_an_alias_bomb_is_refused_without_expanding_it() -> None:
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for level in range(1, 10):
        refs = ", ".join([f"*a{level - 1}"] * 10)
        levels.append(f"a{level}: &a{level} [{refs}]")
    text = "version: 1\nmodels: []\nbomb:\n" + "\n".join(f"  {line}" for line in levels) + "\n"
    assert "YAML refused: aliases expand it beyond" in load_error(text)


def test_too_many_aliases_are_refused_even_when_small() -> None:
    aliases = ", ".join(["*p"] * 101)
    text = f"version: 1\nmodels: []\nx: &p 1\ny: [{aliases}]\n"
    assert load_error(text) == "schedule.yaml:4: YAML refused: more than 100 aliases"


def test_a_recursive_alias_is_refused() -> None:
    text = "version: 1\nmodels: &m\n  - *m\n"
    assert load_error(text) == ("schedule.yaml:3: YAML refused: an alias refers to the node that contains it")


def test_python_tags_are_never_constructed() -> None:
    text = "version: 1\nmodels: []\ntimezone: !!python/name:os.system\n"
    assert load_error(text) == (
        "schedule.yaml:3: timezone: unreadable value: could not determine a constructor "
        "for the tag 'tag:yaml.org,2002:python/name:os.system'"
    )


# --- the JSON Schema ------------------------------------------------------------------------


def schema_errors(text: str) -> list[str]:
    validator = jsonschema.Draft202012Validator(SCHEMA)
    return [error.message for error in validator.iter_errors(yaml.safe_load(text))]


def test_the_schema_is_valid_draft_2020_12() -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


def documented_examples() -> list[str]:
    markdown = (ROOT / "docs/schedule.md").read_text()
    return re.findall(r"```yaml\n(.*?)```", markdown, flags=re.DOTALL)


@pytest.mark.parametrize("text", [EXAMPLE, MINIMAL, NIGHTLY, "version: 1\nmodels: []\n"])
def test_example_schedules_pass_both_the_schema_and_the_loader(text: str) -> None:
    assert schema_errors(text) == []
    load_schedule(text, "s.yaml")


def test_every_example_in_the_documentation_passes_the_schema_and_the_loader() -> None:
    examples = documented_examples()
    assert examples
    for text in examples:
        assert schema_errors(text) == []
        load_schedule(text, "docs/schedule.md")


STRUCTURAL_CASES = [
    "missing version",
    "unsupported version",
    "version as a string",
    "missing models",
    "unknown top-level key",
    "unknown key in defaults",
    "unknown key in a model",
    "unknown key in a window",
    "missing source",
    "models is a mapping",
    "pools is a string",
    "pool read as a boolean",
    "empty pools",
    "duplicate pool",
    "invalid pool name",
    "priority is a string",
    "priority out of range",
    "bad lead duration",
    "bare number duration",
    "sexagesimal duration",
    "null duration",
    "zero window duration",
    "missing window duration",
    "window that is neither always nor a mapping",
    "no windows",
    "source that is not s3",
    "source that is a whole bucket",
    "source with a bad bucket",
    "top level is a list",
    "unknown signature mode",
    "signature mapping without a mode",
    "signature keys that are not a list",
]


@pytest.mark.parametrize("case", STRUCTURAL_CASES)
def test_the_schema_and_the_loader_agree_on_structural_errors(case: str) -> None:
    (text,) = [text for name, text, _ in BAD_SCHEDULES if name == case]
    assert schema_errors(text), f"the schema accepts {case}"
    load_error(text)


# --- the desired set --------------------------------------------------------------------------


def model(
    source: str,
    windows: tuple[Window, ...],
    *,
    pools: tuple[str, ...] = ("p",),
    priority: int = 50,
    lead_s: float = 1800.0,
    keep_s: float = 3600.0,
) -> ScheduledModel:
    return ScheduledModel(
        source=parse_source(source),
        name=None,
        pools=pools,
        priority=priority,
        lead_s=lead_s,
        keep_s=keep_s,
        windows=windows,
        line=1,
    )


DAILY_8_TO_20 = CronWindow("0 8 * * *", 12 * 3600.0, "UTC")


@pytest.mark.parametrize(
    ("now", "state", "keep_until"),
    [
        (utc(2026, 5, 1, 6, 0), SchedulePhase.UPCOMING, utc(2026, 5, 1, 21)),
        (utc(2026, 5, 1, 7, 29), SchedulePhase.UPCOMING, utc(2026, 5, 1, 21)),
        (utc(2026, 5, 1, 7, 30), SchedulePhase.PREFETCH, utc(2026, 5, 1, 21)),
        (utc(2026, 5, 1, 8, 0), SchedulePhase.ACTIVE, utc(2026, 5, 1, 21)),
        (utc(2026, 5, 1, 19, 59), SchedulePhase.ACTIVE, utc(2026, 5, 1, 21)),
        (utc(2026, 5, 1, 20, 0), SchedulePhase.COOLDOWN, utc(2026, 5, 1, 21)),
        (utc(2026, 5, 1, 20, 59), SchedulePhase.COOLDOWN, utc(2026, 5, 1, 21)),
        (utc(2026, 5, 1, 21, 0), SchedulePhase.UPCOMING, utc(2026, 5, 2, 21)),
    ],
)
def test_a_daily_window_moves_through_its_states(
    now: datetime, state: SchedulePhase, keep_until: datetime
) -> None:
    schedule = Schedule(1, "UTC", (model("s3://models/a/1/", (DAILY_8_TO_20,)),))
    (entry,) = desired_models(schedule, "p", now)
    assert entry.phase is state
    assert entry.keep_until == keep_until
    protected_phases = {SchedulePhase.ACTIVE, SchedulePhase.PREFETCH, SchedulePhase.COOLDOWN}
    assert entry.protected is (state in protected_phases)


def test_an_always_model_is_active_forever_and_first_in_line() -> None:
    always = model("s3://models/always/1/", (ALWAYS,), priority=0)
    daily = model("s3://models/daily/1/", (DAILY_8_TO_20,), priority=1000)
    schedule = Schedule(1, "UTC", (daily, always))
    first, second = desired_models(schedule, "p", utc(2026, 5, 1, 9))
    assert first == DesiredModel(always, SchedulePhase.ACTIVE, first.window, None, None)
    assert second.model is daily


def test_a_model_with_a_keep_time_overlapping_its_next_lead_is_prefetched() -> None:
    short_gap = CronWindow("0 * * * *", 1800.0, "UTC")
    schedule = Schedule(1, "UTC", (model("s3://models/a/1/", (short_gap,), lead_s=600, keep_s=3600),))
    (entry,) = desired_models(schedule, "p", utc(2026, 5, 1, 9, 55))
    assert entry.phase is SchedulePhase.PREFETCH
    assert entry.prefetch_at == utc(2026, 5, 1, 9, 50)


def test_a_model_with_several_windows_reports_the_open_one() -> None:
    windows = (DAILY_8_TO_20, CronWindow("0 22 * * *", 3600.0, "UTC"))
    schedule = Schedule(1, "UTC", (model("s3://models/a/1/", windows),))
    (entry,) = desired_models(schedule, "p", utc(2026, 5, 1, 22, 30))
    assert entry.phase is SchedulePhase.ACTIVE
    assert entry.window is not None
    assert entry.window.start == utc(2026, 5, 1, 22)


def test_a_daemon_that_slept_through_the_window_start_sees_the_model_active() -> None:
    schedule = load_schedule(EXAMPLE, "s.yaml")
    # Monday 2026-03-02 08:00 KST = 2026-03-01 23:00 UTC; asked at 10:00 KST
    (entry,) = desired_models(schedule, "b300-serving", utc(2026, 3, 2, 1))
    assert entry.phase is SchedulePhase.ACTIVE
    assert entry.prefetch_at == utc(2026, 3, 1, 22, 15)
    assert entry.keep_until == utc(2026, 3, 2, 12)


def test_ordering_is_by_window_start_then_higher_priority() -> None:
    schedule = Schedule(
        1,
        "UTC",
        (
            model("s3://models/late/1/", (CronWindow("0 12 * * *", 3600.0, "UTC"),), priority=99),
            model("s3://models/low/1/", (DAILY_8_TO_20,), priority=10),
            model("s3://models/high/1/", (DAILY_8_TO_20,), priority=90),
        ),
    )
    order = [e.model.source.uri for e in desired_models(schedule, "p", utc(2026, 5, 1, 6))]
    assert order == ["s3://models/high/1/", "s3://models/low/1/", "s3://models/late/1/"]


def test_protected_lists_the_sources_eviction_must_leave_alone() -> None:
    schedule = Schedule(
        1,
        "UTC",
        (
            model("s3://models/active/1/", (ALWAYS,)),
            model("s3://models/idle/1/", (CronWindow("0 23 * * *", 60.0, "UTC"),), keep_s=0),
        ),
    )
    assert protected(desired_models(schedule, "p", utc(2026, 5, 1, 12))) == {
        parse_source("s3://models/active/1/")
    }


def test_a_naive_instant_is_refused() -> None:
    with pytest.raises(ValueError, match="aware"):
        desired_models(Schedule(1, "UTC", ()), "p", datetime(2026, 1, 1))


# --- properties of the desired set ----------------------------------------------------------

window_strategy = st.one_of(
    st.just(ALWAYS),
    st.builds(
        CronWindow,
        cron=st.sampled_from(["0 8 * * *", "30 2 * * *", "0 */6 * * *", "0 8 * * mon-fri"]),
        duration_s=st.sampled_from([600.0, 3600.0, 8 * 3600.0, 30 * 3600.0]),
        timezone=st.sampled_from(["UTC", "Europe/Berlin", "America/New_York", "Asia/Seoul"]),
    ),
)
model_strategy = st.builds(
    model,
    source=st.integers(0, 10_000).map(lambda n: f"s3://models/m{n}/rev/"),
    windows=st.lists(window_strategy, min_size=1, max_size=3).map(tuple),
    pools=st.lists(st.sampled_from(["p", "q", "r"]), min_size=1, max_size=3, unique=True).map(tuple),
    priority=st.integers(0, 1000),
    lead_s=st.sampled_from([0.0, 600.0, 3600.0, 2 * 86400.0]),
    keep_s=st.sampled_from([0.0, 600.0, 7200.0]),
)
schedules = st.lists(model_strategy, max_size=6, unique_by=lambda m: m.source).map(
    lambda models: Schedule(1, "UTC", tuple(models))
)
instants = st.datetimes(
    min_value=datetime(2024, 1, 1), max_value=datetime(2030, 12, 31), timezones=st.just(UTC)
)
PROPERTY_SETTINGS = settings(deadline=None, max_examples=150, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY_SETTINGS
@given(schedule=schedules, pool=st.sampled_from(["p", "q", "r", "s"]), now=instants)
def test_the_desired_set_never_includes_a_model_outside_the_pool(
    schedule: Schedule, pool: str, now: datetime
) -> None:
    desired = desired_models(schedule, pool, now)
    assert all(pool in entry.model.pools for entry in desired)
    assert {entry.model.source for entry in desired} == {m.source for m in schedule.models if pool in m.pools}


@PROPERTY_SETTINGS
@given(schedule=schedules, now=instants)
def test_a_model_inside_its_lead_time_or_active_is_desired_and_protected(
    schedule: Schedule, now: datetime
) -> None:
    desired = {entry.model.source: entry for entry in desired_models(schedule, "p", now)}
    guarded = protected(desired.values())
    lead_or_active = [
        m
        for m in schedule.for_pool("p")
        if any(_open_within(w, now, timedelta(seconds=m.lead_s)) for w in m.windows)
    ]
    for m in lead_or_active:
        assert desired[m.source].phase in {SchedulePhase.ACTIVE, SchedulePhase.PREFETCH}
        assert m.source in guarded


def _open_within(window: Window, now: datetime, lead: timedelta) -> bool:
    """Independent check: is the window open at some instant of [now, now + lead]?"""
    if isinstance(window, CronWindow):
        occurrence = current_or_next(window, now)
        return occurrence is not None and (
            occurrence.is_open(now) or (occurrence.start is not None and occurrence.start <= now + lead)
        )
    return True


@PROPERTY_SETTINGS
@given(schedule=schedules, now=instants)
def test_the_desired_set_is_ordered_by_start_then_higher_priority(schedule: Schedule, now: datetime) -> None:
    desired = desired_models(schedule, "p", now)

    def key(entry: DesiredModel) -> tuple[float, int]:
        assert entry.window is not None
        start = entry.window.start
        return (float("-inf") if start is None else start.timestamp(), -entry.model.priority)

    keys = [key(entry) for entry in desired]
    assert keys == sorted(keys)


@PROPERTY_SETTINGS
@given(schedule=schedules, now=instants)
def test_prefetch_and_keep_bracket_the_reported_window(schedule: Schedule, now: datetime) -> None:
    for entry in desired_models(schedule, "p", now):
        window = entry.window
        assert window is not None
        if window.start is not None:
            assert entry.prefetch_at == window.start - timedelta(seconds=entry.model.lead_s)
        if entry.phase is not SchedulePhase.COOLDOWN and window.end is not None:
            assert entry.keep_until == window.end + timedelta(seconds=entry.model.keep_s)
        if entry.phase is SchedulePhase.COOLDOWN:
            assert entry.keep_until is not None and now < entry.keep_until
