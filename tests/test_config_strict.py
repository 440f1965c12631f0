"""Every setting is checked as a type, a range and an encoding before use, and only where it is used.

The mistakes table (test_cli_errors.py) runs one mistake of each class through the
real CLI; this file holds the rules themselves: empty means "not given" for every
variable, the bounds of each number, the settings file read as hostile input, and
a bad setting that a command does not use never stopping it.
"""

from __future__ import annotations

import math
import os
import subprocess
from dataclasses import fields
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.cli import MODELSYNC, run_cli
from support.s3env import S3Env

from modelsync.config import CACHE_SETTINGS, Settings, load_settings, receive_buffer_bytes
from modelsync.config_file import MAX_NESTING, check_text
from modelsync.errors import CaBundleError, ConfigError

ENVIRONMENT = [f.metadata["env"] for f in fields(Settings)]


@pytest.mark.parametrize("empty", ["", "  "])
def test_an_empty_variable_means_not_given_for_every_setting(empty: str) -> None:
    assert load_settings({}, dict.fromkeys(ENVIRONMENT, empty)) == Settings()
    assert load_settings({}, {"AWS_REGION": empty, "AWS_DEFAULT_REGION": "eu-1"}).region == "eu-1"


def test_an_empty_variable_leaves_the_value_to_the_settings_file(tmp_path: Path) -> None:
    config = tmp_path / "modelsync.toml"
    config.write_text(f'cache_dir = "{tmp_path / "cache"}"\nregion = ""\n')
    s = load_settings({}, {"MODELSYNC_CACHE_DIR": "", "AWS_REGION": ""}, config)
    assert s.cache_dir == tmp_path / "cache"
    assert s.region == Settings().region


@pytest.mark.parametrize(
    ("variable", "text"),
    [
        ("MODELSYNC_CONCURRENCY", "257"),
        ("MODELSYNC_CONCURRENCY", "nan"),
        ("MODELSYNC_PART_ATTEMPTS", "0"),
        ("MODELSYNC_CONNECT_TIMEOUT", "0"),
        ("MODELSYNC_READ_TIMEOUT", "0.000001"),
        ("MODELSYNC_BACKOFF_FLOOR", "0.001"),
        ("MODELSYNC_CONNECT_TIMEOUT", "-inf"),
        ("MODELSYNC_CONNECT_TIMEOUT", "301"),
        ("MODELSYNC_READ_TIMEOUT", "NaN"),
        ("MODELSYNC_BACKOFF_FLOOR", "61"),
        ("MODELSYNC_RETRY_BUDGET", "8d"),
        ("MODELSYNC_PRESIGN_EXPIRY", "0"),
        ("MODELSYNC_PRESIGN_EXPIRY", "7d1s"),
        ("MODELSYNC_READ_CHUNK", "1k"),
        ("MODELSYNC_READ_CHUNK", "65Mi"),
        ("MODELSYNC_MAX_BANDWIDTH", "100/s"),
        ("MODELSYNC_MAX_BANDWIDTH", "2Ti/s"),
        ("MODELSYNC_IN_USE_GRACE", "366d"),
        ("MODELSYNC_CACHE_HIGH_WATERMARK", "inf"),
        ("MODELSYNC_CACHE_MAX_BYTES", "nan%"),
    ],
)
def test_a_number_out_of_its_bounds_or_not_finite_is_refused_naming_the_variable(
    variable: str, text: str
) -> None:
    with pytest.raises(ConfigError, match=f"environment variable {variable}: bad value"):
        load_settings({}, {variable: text})


@pytest.mark.parametrize(
    ("variable", "text", "name", "value"),
    [
        ("MODELSYNC_CONCURRENCY", "256", "concurrency", 256),
        ("MODELSYNC_PART_ATTEMPTS", "100", "part_attempts", 100),
        ("MODELSYNC_READ_TIMEOUT", "3600", "read_timeout_s", 3600.0),
        ("MODELSYNC_READ_TIMEOUT", "0.1", "read_timeout_s", 0.1),
        ("MODELSYNC_BACKOFF_FLOOR", "0.02", "backoff_floor_s", 0.02),
        ("MODELSYNC_PRESIGN_EXPIRY", "7d", "presign_expiry_s", 7 * 86400.0),
        ("MODELSYNC_READ_CHUNK", "64Mi", "read_chunk_bytes", 64 * 1024 * 1024),
        ("MODELSYNC_MAX_BANDWIDTH", "0", "max_bandwidth_bytes_per_s", 0),
        ("MODELSYNC_MAX_BANDWIDTH", "1Ti/s", "max_bandwidth_bytes_per_s", 1024**4),
    ],
)
def test_the_bounds_themselves_are_accepted(variable: str, text: str, name: str, value: float) -> None:
    assert getattr(load_settings({}, {variable: text}), name) == value


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ('cache_dir = ["a"]\n', "cache_dir: an array where a string belongs"),
        ("cache_dir = {a = 1}\n", "cache_dir: a table where a string belongs"),
        ("cache_dir = 1.5\n", "cache_dir: a float where a string belongs"),
        ("endpoint_url = 1979-05-27\n", "endpoint_url: a date or time where"),
        ('concurrency = [8]\n', "concurrency: an array where"),
        ("insecure = 1\n", "insecure: an integer where a boolean or string belongs"),
        ("connect_timeout_s = nan\n", "connect_timeout_s: 'nan' is not a finite number"),
        ("read_timeout_s = inf\n", "read_timeout_s: 'inf' is not a finite number"),
        ('ca_bundle = "/etc/\\u0000ca.crt"\n', "ca_bundle: contains a NUL character"),
        ("signature_identities = " + "[" * 50 + "]" * 50 + "\n", "nested more than"),
        ('[[signature_rules]]\nscope = "s3://m/"\nidentities = ' + "[" * 20 + "]" * 20, "nested"),
    ],
)
def test_a_file_value_of_the_wrong_type_or_shape_is_refused_naming_the_file_and_setting(
    tmp_path: Path, content: str, says: str
) -> None:
    config = tmp_path / "modelsync.toml"
    config.write_text(content)
    with pytest.raises(ConfigError, match=f"config file {config}: bad value for ") as refused:
        load_settings({}, {}, config)
    assert says in str(refused.value)


def test_typed_file_values_that_fit_their_setting_are_read(tmp_path: Path) -> None:
    config = tmp_path / "modelsync.toml"
    config.write_text(
        "concurrency = 3\nconnect_timeout_s = 2.5\ninsecure = false\n"
        'signature_identities = ["a@example.com"]\ncache_budget = "90%"\n'
    )
    s = load_settings({}, {}, config)
    assert (s.concurrency, s.connect_timeout_s, s.insecure) == (3, 2.5, False)
    assert s.signature_identities == ("a@example.com",)
    assert s.cache_budget is not None and s.cache_budget.share == 0.9


@pytest.mark.parametrize(
    "text",
    [
        '[{"scope": "*", "mode": "off", "identities": ["[[[[[[[[[[[["]}]',  # brackets in a string
        '["\\"[[[[[[[[[[[[[[\\""]',  # an escaped quote does not end the string
        "[" * MAX_NESTING + "]" * MAX_NESTING,
    ],
)
def test_nesting_is_counted_outside_strings_only(text: str) -> None:
    check_text(text)


@pytest.mark.parametrize("text", ["[" * (MAX_NESTING + 1), "{" * 100_000, '{"a": ' * 9 + "1" + "}" * 9])
def test_text_nested_too_deeply_is_refused_before_any_parser_sees_it(text: str) -> None:
    with pytest.raises(ValueError, match="nested more than"):
        check_text(text)


def test_a_value_nested_too_deeply_stops_only_the_commands_that_use_its_setting(tmp_path: Path) -> None:
    config = tmp_path / "modelsync.toml"
    config.write_text(
        f'cache_dir = "{tmp_path}"\n'
        '[[signature_rules]]\nscope = "s3://models/"\nmode = "off"\n'
        "public_keys = " + "[" * 3000 + "]" * 3000 + "\n"
    )
    deep = "[" * 3000 + "]" * 3000
    s = load_settings({}, {"MODELSYNC_SIGNATURE_IDENTITIES": deep}, config, CACHE_SETTINGS)
    assert (s.cache_dir, s.signature_rules, s.signature_identities) == (tmp_path, (), ())
    with pytest.raises(ConfigError, match="signature_rules: nested more than 8 levels"):
        load_settings({}, {}, config)


def test_a_named_pipe_as_the_settings_file_is_refused_without_waiting(tmp_path: Path) -> None:
    fifo = tmp_path / "modelsync.toml"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="is a named pipe, not a regular file"):
        load_settings({}, {}, fifo)


def test_a_named_pipe_as_the_ca_bundle_is_refused_without_waiting(tmp_path: Path) -> None:
    fifo = tmp_path / "ca.crt"
    os.mkfifo(fifo)
    with pytest.raises(CaBundleError, match="is a named pipe, not a regular file"):
        load_settings({}, {"AWS_CA_BUNDLE": str(fifo)})


def test_a_non_finite_number_never_reaches_settings() -> None:
    for f in fields(Settings):
        value = getattr(load_settings({}, {}), f.name)
        assert not (isinstance(value, float) and not math.isfinite(value))


_NUMBERS = st.one_of(
    st.integers(min_value=-(10**400), max_value=10**400).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["nan", "-inf", "1e400", "9" * 5000, "1_0", "0x10", "１２", "1" + "0" * 30 + "Ei"]),
)
_UNITS = st.sampled_from(["", "%", "d", "s", "Mi", "Ei", "Ei/s", "/s", "h30m"])


@settings(max_examples=300, deadline=None)
@given(
    name=st.sampled_from(ENVIRONMENT),
    text=st.one_of(st.text(max_size=40), st.builds(lambda n, u: n + u, _NUMBERS, _UNITS)),
)
def test_any_text_in_any_variable_is_a_value_or_one_config_error_never_a_crash(name: str, text: str) -> None:
    if "\x00" in text:
        text = text.replace("\x00", "")  # the environment cannot hold one
    try:
        load_settings({}, {name: text})
    except ConfigError as exc:
        assert "\n" not in str(exc) or "\n" in text


# ---- through the real CLI ------------------------------------------------------------------


def _env(cache: Path | None = None, **extra: str) -> dict[str, str]:
    env = {**S3Env("http://127.0.0.1:9").subprocess_env(), **extra}
    if cache is not None:
        env["MODELSYNC_CACHE_DIR"] = str(cache)
    return env


def test_cli_an_empty_cache_dir_variable_never_means_the_current_directory(tmp_path: Path) -> None:
    """`MODELSYNC_CACHE_DIR=` (an unset variable in a manifest) falls back to the settings file."""
    cache, workdir = tmp_path / "cache", tmp_path / "workdir"
    workdir.mkdir()
    config = tmp_path / "modelsync.toml"
    config.write_text(f'cache_dir = "{cache}"\n')
    # a pull creates the cache it names: it must be the file's, not the working directory
    pulled = subprocess.run(
        [*MODELSYNC, "pull", "s3://models/org/m/", "--config", str(config), "-q"],
        env=_env(MODELSYNC_CACHE_DIR=""), cwd=workdir, capture_output=True, text=True, timeout=90,
        check=False,
    )
    assert pulled.returncode == 7, pulled.stderr  # the store is not there; the cache is
    assert (cache / ".modelsync").is_dir()
    assert os.listdir(workdir) == []


def test_cli_a_deeply_nested_rule_does_not_stop_ls(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    (cache / ".modelsync").mkdir(parents=True)
    deep = "[" * 5000 + "]" * 5000
    listed = run_cli(_env(cache, MODELSYNC_SIGNATURE_RULES=deep), "ls")
    assert listed.returncode == 0, listed.stderr
    assert "Traceback" not in listed.stderr
    pulled = run_cli(_env(cache, MODELSYNC_SIGNATURE_RULES=deep), "pull", "s3://models/org/m/", "-q")
    assert pulled.returncode == 2
    assert pulled.stderr.splitlines() == [
        "error: environment variable MODELSYNC_SIGNATURE_RULES: bad value for signature_rules: "
        "nested more than 8 levels deep (at least 5000); a setting needs at most 3"
    ]



def test_cli_plan_is_not_stopped_by_a_signature_policy_it_does_not_use(tmp_path: Path) -> None:
    schedule = tmp_path / "schedule.yaml"
    schedule.write_text(
        "version: 1\nmodels:\n  - source: s3://models/org/m/1/\n    pools: [p]\n    windows: [always]\n"
    )
    glob = '[{"scope": "s3://models/org/*", "mode": "required"}]'
    planned = run_cli(
        _env(tmp_path / "cache", MODELSYNC_SIGNATURE_RULES=glob),
        "plan", "--schedule", str(schedule), "--pool", "p", "--offline",
    )
    assert planned.returncode == 0, planned.stderr
    assert "pool p at " in planned.stdout


MiB = 1024 * 1024


@pytest.mark.parametrize(
    ("concurrency", "read_chunk", "buffer"),
    [
        (1, None, 4 * MiB),
        (8, None, 4 * MiB),  # the defaults: 32 MiB of buffers
        (16, None, 2 * MiB),
        (32, None, 1 * MiB),
        (256, None, 1 * MiB),  # never below 1 MiB: the lock time per GiB would climb
        (64, 8 * MiB, 8 * MiB),  # a value given is taken as given
        (8, 64 * 1024, 64 * 1024),
    ],
)
def test_the_receive_buffer_keeps_a_pulls_buffers_within_32_mib_unless_told_otherwise(
    concurrency: int, read_chunk: int | None, buffer: int
) -> None:
    assert receive_buffer_bytes(Settings(concurrency=concurrency, read_chunk_bytes=read_chunk)) == buffer


@given(st.integers(1, 256))
def test_a_pulls_receive_buffers_take_32_mib_or_one_mib_a_connection_at_most(concurrency: int) -> None:
    buffer = receive_buffer_bytes(Settings(concurrency=concurrency))
    assert MiB <= buffer <= 4 * MiB
    assert concurrency * buffer <= max(32 * MiB, concurrency * MiB)
