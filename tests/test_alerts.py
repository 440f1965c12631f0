"""The alerting rules as Prometheus runs them: `promtool check rules` and `promtool test rules`.

The rules are taken out of the PrometheusRule that `kubectl kustomize` renders for
the datacenter cluster, so what is tested is what Argo CD applies. The unit tests
live in tests/alerts/modelsync.test.yaml (promtool's format, runnable by hand); every
alert of the rendered rules must have one there that fires, after its `for:`, and one
where healthy series (a daemon restart included) keep it quiet.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.prometheus import alert_rules, promtool, promtool_binary, write_rules

from modelsync.core.units import parse_duration

UNIT_TESTS = Path(__file__).parent / "alerts" / "modelsync.test.yaml"

pytestmark = pytest.mark.skipif(
    promtool_binary() is None, reason="promtool is not installed (scripts/setup installs Debian's prometheus)"
)


def unit_tests() -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = yaml.safe_load(UNIT_TESTS.read_text())["tests"]
    return groups


def for_s(rule: dict[str, Any]) -> float:
    return parse_duration(rule.get("for", "0"))


def test_the_rendered_rules_pass_promtool_check_rules(tmp_path: Path) -> None:
    rules = write_rules(tmp_path)
    done = promtool("check", "rules", str(rules))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in done.stdout


def test_every_alert_fires_after_its_for_and_stays_quiet_on_healthy_series(tmp_path: Path) -> None:
    write_rules(tmp_path)
    shutil.copy(UNIT_TESTS, tmp_path / UNIT_TESTS.name)
    done = promtool("test", "rules", UNIT_TESTS.name, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_every_alert_of_the_rendered_rules_has_a_firing_and_a_quiet_unit_test() -> None:
    """A new alert without its unit tests fails here, naming what it lacks."""
    missing = []
    for rule in alert_rules():
        name, wait_s = rule["alert"], for_s(rule)
        evals = [
            (group["name"], parse_duration(e["eval_time"]), bool(e.get("exp_alerts")))
            for group in unit_tests()
            for e in group.get("alert_rule_test", [])
            if e["alertname"] == name
        ]
        firing_groups = {g for g, _, fires in evals if fires}
        if not firing_groups:
            missing.append(f"{name}: no test where it fires")
        # with a for:, the group where it fires also shows it quiet less than `for` earlier
        waited = any(
            g == fired_in and not fires and fired_at - wait_s < t < fired_at
            for fired_in, fired_at, firing in evals if firing
            for g, t, fires in evals
        )
        if wait_s and not waited:
            missing.append(f"{name}: quiet nowhere less than its for: {rule['for']} before it fires")
        if not any(g not in firing_groups and t >= wait_s for g, t, _ in evals):
            missing.append(f"{name}: no test of healthy series that stays quiet past its for:")
    assert not missing, "tests/alerts/modelsync.test.yaml lacks:\n" + "\n".join(missing)
