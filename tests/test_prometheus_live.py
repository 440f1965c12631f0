"""The dashboard and the alerts evaluated by a real Prometheus that scrapes a real daemon.

One daemon (a child process, against moto in its own process) runs a schedule of a
model it stages and one it cannot find, so every metric has data: a pull that
succeeded before its window, failures counted by code, plans and budgets. Debian's
Prometheus scrapes it every second with the labels the PodMonitor adds (`node`,
`pool`) and loads the rules of the rendered PrometheusRule. Then every dashboard
query, with its variables resolved as Grafana resolves them, and every alert
expression go through Prometheus' HTTP API: each returns series, and each series
carries the labels its legend, grouping or annotations name. The checker itself is
shown to catch a metric or a label the daemon does not export.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from support.daemon import POOL, Daemon, schedule_text
from support.motoserver import SubprocessMoto
from support.objects import payload, upload
from support.prometheus import Prometheus, alert_rules, dashboard, prometheus_binary, write_rules
from support.s3env import S3Env
from support.waiting import wait_for

NODE = "gpu-node-1"
STAGED = "s3://models/org/live/r1/"
MISSING = "s3://models/org/absent/r1/"

pytestmark = [
    pytest.mark.skipif(
        prometheus_binary() is None,
        reason="prometheus is not installed (scripts/setup installs Debian's prometheus)",
    ),
    pytest.mark.xdist_group("prometheus-live"),
]


class Live:
    def __init__(self, prometheus: Prometheus, daemon: Daemon) -> None:
        self.prometheus = prometheus
        self.daemon = daemon

    def exported(self) -> set[str]:
        """The metric names Prometheus has scraped from the daemon."""
        names: list[str] = self.prometheus.api("label/__name__/values", **{"match[]": '{job=~"modelsync.*"}'})
        return {n for n in names if n.startswith("modelsync_")}

    def variables(self) -> dict[str, list[str]]:
        """The dashboard's query variables, each resolved in order as Grafana does (`label_values`)."""
        resolved: dict[str, list[str]] = {}
        for variable in dashboard()["templating"]["list"]:
            if variable["type"] != "query":
                continue
            match = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", variable["query"])
            assert match, f"variable {variable['name']}: {variable['query']}"
            selector, label = substitute(match.group(1), resolved), match.group(2)
            resolved[variable["name"]] = self.prometheus.label_values(label, selector)
        return resolved

    def problems(self, expr: str, named_labels: set[str]) -> list[str]:
        """Why `expr` does not show the daemon's data: no series, an unknown metric, a missing label."""
        found = []
        unknown = set(re.findall(r"\bmodelsync_\w+", expr)) - self.exported()
        if unknown:
            found.append(f"names metrics the daemon does not export: {sorted(unknown)}")
        series = self.prometheus.query(expr)
        if not series:
            found.append("returns no series")
        # a label some series lack is fine (Prometheus drops empty ones); one that none has is not
        lacking = named_labels - {k for s in series for k, v in s["metric"].items() if v}
        if series and lacking:
            found.append(f"no series has the labels {sorted(lacking)}")
        return found


def substitute(expr: str, variables: dict[str, list[str]]) -> str:
    """`$name` as Grafana writes a multi-value variable into a regex matcher: (a|b)."""
    for name, values in sorted(variables.items(), key=lambda item: -len(item[0])):
        expr = expr.replace(f"${name}", "(" + "|".join(promql_regex(v) for v in values) + ")")
    return expr


def promql_regex(value: str) -> str:
    """A literal inside a PromQL regex string: metacharacters get a backslash, itself escaped."""
    return "".join("\\\\" + c if c in r"\.+*?^$()[]{}|" else c for c in value)


def labels_named(text: str) -> set[str]:
    """Labels an expression groups by, or a legend or an annotation prints."""
    named = {label for group in re.findall(r"\bby\s*\(([^)]*)\)", text) for label in group.split(",")}
    named |= set(re.findall(r"\{\{\s*(\w+)\s*\}\}", text))
    named |= set(re.findall(r"\$labels\.(\w+)", text))
    return {label.strip() for label in named if label.strip()}


def conditions(expr: str) -> list[str]:
    """The series an alert expression compares: itself without its final comparison, or both
    sides of an `unless` (which is empty while the daemon is there, by design)."""
    sides = re.split(r"\s+unless(?:\s+on\s*\([^)]*\))?\s+", expr, maxsplit=1)
    if len(sides) == 2:
        return sides
    match = re.search(r"\s(==|!=|>=|<=|>|<)\s*-?[\d.]+\s*$", expr)
    return [expr[: match.start()] if match else expr]


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    root = tmp_path_factory.mktemp("prometheus-live")
    with SubprocessMoto(log_dir=root) as moto:
        env = S3Env(moto.endpoint_url)
        upload(env, "models", "org/live/r1/", {"config.json": b"{}", "weights.bin": payload(1024 * 1024, 3)})
        schedule = root / "schedule.yaml"
        # the staged model is the variant of its name for POOL, so the variant label has data too
        text = schedule_text([("live", STAGED, "soon"), ("absent", MISSING, "soon")])
        variants = f"    variants:\n      - {{pools: [{POOL}], source: {STAGED}, variant: bf16}}\n"
        variants += "      - {pools: [a100-serving], source: s3://models/org/live/fp8/}\n"
        schedule.write_text(text.replace(f"    source: {STAGED}\n    pools: [{POOL}]\n", variants))
        (root / "node").mkdir()
        # a budget, so the panel of the cache against its budget has data too
        daemon_env = {**env.subprocess_env(), "MODELSYNC_CACHE_MAX_BYTES": "1Gi"}
        daemon = Daemon(root / "node" / "cache", schedule, daemon_env)
        try:
            with Prometheus(root / "prometheus", [(daemon.url, {"node": NODE, "pool": POOL})],
                            write_rules(root)) as prometheus:
                state = Live(prometheus, daemon)
                wait_for(
                    lambda: prometheus.query("modelsync_ready_before_window_seconds")
                    and prometheus.query("increase(modelsync_pull_failures_total[1m]) > 0"),
                    what="Prometheus has scraped a staged model and rising pull failures",
                    timeout_s=60,
                    proc=daemon.process,
                )
                yield state
        finally:
            daemon.stop()


def test_the_dashboard_variables_resolve_to_the_daemons_pool_node_and_models(live: Live) -> None:
    assert live.variables() == {"pool": [POOL], "node": [NODE], "model": ["absent", "live"]}


def test_every_dashboard_panel_returns_series_with_the_labels_its_legend_names(live: Live) -> None:
    variables = live.variables()
    problems = []
    for panel in dashboard()["panels"]:
        for target in panel.get("targets", []):
            expr = substitute(target["expr"], variables)
            named = labels_named(target["expr"] + " " + target.get("legendFormat", ""))
            problems += [f"{panel['title']}: {expr}: {p}" for p in live.problems(expr, named)]
    assert not problems, "\n".join(problems)


def test_every_alert_expression_evaluates_and_compares_series_with_the_labels_it_names(live: Live) -> None:
    problems = []
    for rule in alert_rules():
        live.prometheus.query(rule["expr"])  # a query Prometheus refuses fails here
        annotations = " ".join(rule.get("annotations", {}).values())
        named = labels_named(rule["expr"] + " " + annotations)
        for compared in conditions(rule["expr"]):
            problems += [f"{rule['alert']}: {p}" for p in live.problems(compared, named)]
    assert not problems, "\n".join(problems)
    loaded = {r["name"] for g in live.prometheus.api("rules")["groups"] for r in g["rules"]}
    assert loaded == {r["alert"] for r in alert_rules()}


@pytest.mark.parametrize(
    ("expr", "named", "problem"),
    [
        ("modelsync_cache_use_bytes", set(), "names metrics the daemon does not export"),
        ('modelsync_cache_used_bytes{zone="a"}', set(), "returns no series"),
        ("sum by (zone) (modelsync_cache_used_bytes)", {"zone"}, "no series has the labels ['zone']"),
        ("modelsync_model_staged", {"model", "tenant"}, "no series has the labels ['tenant']"),
    ],
)
def test_a_query_naming_a_metric_or_label_the_daemon_does_not_export_is_caught(
    live: Live, expr: str, named: set[str], problem: str
) -> None:
    assert any(problem in p for p in live.problems(expr, named | labels_named(expr)))

