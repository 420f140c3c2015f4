"""Alert rules and dashboard: the plain rules file is the chart's PrometheusRule, promtool accepts
both, every alert is documented, and every query uses only metrics from docs/METRICS.md."""

import json
import re
import shutil
import subprocess

import pytest
import yaml
from chartlib import (
    ALL_FEATURES_VALUES,
    CHART_DIR,
    DASHBOARD_FILE,
    METRICS_DOC,
    RULES_FILE,
    load_values,
    rendered_alert_groups,
)

REQUIRED_ALERTS = {
    "QuiverConsumerLagHigh",
    "QuiverConsumerTimeLagHigh",
    "QuiverConsumerGroupStalled",
    "QuiverConsumerQueueStalled",
    "QuiverConsumerGroupLagUnknown",
    "QuiverBrokerDown",
    "QuiverBrokerNotReady",
    "QuiverStoreDiskNearlyFull",
    "QuiverBrokerDiskAboveHighWater",
    "QuiverBrokerWritesRefused",
    "QuiverReplicationLagHigh",
    "QuiverReplicationBelowMinInSync",
    "QuiverOperatorReconcileErrors",
    "QuiverOperatorDown",
}
PROMQL_NON_METRICS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "max",
    "min",
    "sum",
    "avg",
    "count",
    "rate",
    "irate",
    "increase",
    "changes",
    "deriv",
    "delta",
    "histogram_quantile",
    "le",
    "namespace",
    "status",
    "cluster",
    "consumer_group",
    "topic",
    "controller",
    "error",
    "instance",
    "job",
    "queue_id",
    "broker",
    "reason",
    "replica_id",
    "role",
}
PROMETHEUS_BUILTIN_METRICS = {"up"}


def documented_metrics():
    """Metric names in the tables of docs/METRICS.md (histograms expand to their series)."""
    names = set()
    for name, kind in re.findall(r"^\| `([a-z_]+)` \| (\w+) \|", METRICS_DOC.read_text(), re.MULTILINE):
        names.add(name)
        if kind == "histogram":
            names.update({f"{name}_bucket", f"{name}_sum", f"{name}_count"})
    assert "rocketmq_consumer_lag_messages" in names and "quiver_reconcile_duration_seconds_bucket" in names
    return names


def metrics_in(expr):
    expr = re.sub(r'"[^"]*"', '""', expr)  # label values
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # range selectors
    expr = re.sub(r"\$\w+", "", expr)  # Grafana variables
    return {w for w in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr) if w not in PROMQL_NON_METRICS}


def all_rules(groups):
    return [rule for group in groups["groups"] for rule in group["rules"]]


def dashboard_exprs():
    dashboard = json.loads(DASHBOARD_FILE.read_text())
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def promtool():
    path = shutil.which("promtool")
    assert path, "promtool missing: apt-get install prometheus (listed in e2e/chart/apt.txt)"
    return path


def test_plain_rules_file_is_the_chart_prometheus_rule_with_default_values():
    shipped = yaml.safe_load(RULES_FILE.read_text())
    assert shipped == rendered_alert_groups(), "stale rules file; run: python e2e/chart/sync_generated.py"


def test_every_required_alert_exists_with_severity_and_annotations():
    rules = all_rules(yaml.safe_load(RULES_FILE.read_text()))
    assert {r["alert"] for r in rules} == REQUIRED_ALERTS
    for rule in rules:
        assert rule["labels"]["severity"] in ("warning", "critical"), rule
        assert set(rule["annotations"]) == {"summary", "description", "runbook_url"}, rule
        anchor = rule["annotations"]["runbook_url"].split("#")[1]
        assert anchor == rule["alert"].lower()


def test_every_alert_has_a_runbook_section_in_the_chart_readme():
    readme = (CHART_DIR / "README.md").read_text()
    for alert in REQUIRED_ALERTS:
        assert re.search(rf"^#### {alert}$", readme, re.MULTILINE), f"README has no runbook heading for {alert}"


@pytest.mark.parametrize("values_name", ["defaults", "all-features"])
def test_promtool_accepts_the_rendered_rules(values_name, tmp_path):
    values = load_values(ALL_FEATURES_VALUES) if values_name == "all-features" else None
    rules_file = tmp_path / "rules.yaml"
    rules_file.write_text(yaml.safe_dump(rendered_alert_groups(values)))
    result = subprocess.run(
        [promtool(), "check", "rules", str(rules_file)], check=False, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(REQUIRED_ALERTS)} rules found" in result.stdout


def test_promtool_rejects_a_broken_rule(tmp_path):
    groups = rendered_alert_groups()
    groups["groups"][0]["rules"][0]["expr"] = "max by (cluster (rocketmq_consumer_lag_messages)"
    rules_file = tmp_path / "rules.yaml"
    rules_file.write_text(yaml.safe_dump(groups))
    result = subprocess.run(
        [promtool(), "check", "rules", str(rules_file)], check=False, capture_output=True, text=True
    )
    assert result.returncode != 0


def test_alert_rules_use_only_documented_metrics():
    documented = documented_metrics() | PROMETHEUS_BUILTIN_METRICS
    for rule in all_rules(yaml.safe_load(RULES_FILE.read_text())):
        assert metrics_in(rule["expr"]) <= documented, (rule["alert"], metrics_in(rule["expr"]) - documented)


def test_dashboard_queries_use_only_documented_metrics_and_cover_the_essentials():
    documented = documented_metrics()
    used = set()
    for expr in dashboard_exprs():
        names = metrics_in(expr)
        assert names, expr
        assert names <= documented, (expr, names - documented)
        used |= names
    for essential in (
        "rocketmq_consumer_lag_messages",
        "rocketmq_consumer_lag_latency",
        "rocketmq_messages_in_total",
        "rocketmq_messages_out_total",
        "quiver_store_commitlog_bytes",
        "quiver_store_disk_used_ratio",
        "quiver_store_disk_high_water_ratio",
        "quiver_store_writable",
        "quiver_reconcile_total",
        "quiver_reconcile_errors_total",
        "quiver_reconcile_duration_seconds_bucket",
    ):
        assert essential in used, essential


def test_dashboard_is_well_formed():
    dashboard = json.loads(DASHBOARD_FILE.read_text())
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert variables == {"datasource", "namespace", "cluster", "consumer_group"}
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"] and panel["title"] and panel["description"]
        grid = panel["gridPos"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24


def test_disk_alert_values_reach_the_rules():
    rules = {r["alert"]: r for r in all_rules(rendered_alert_groups(load_values(ALL_FEATURES_VALUES)))}
    nearly_full = rules["QuiverStoreDiskNearlyFull"]
    assert "quiver_store_disk_used_ratio > 0.7" in nearly_full["expr"]
    assert "more than 0.7 full" in nearly_full["annotations"]["description"]
    assert rules["QuiverBrokerDiskAboveHighWater"]["for"] == "10m"
    assert rules["QuiverBrokerDiskAboveHighWater"]["labels"]["severity"] == "critical"
    assert (rules["QuiverBrokerWritesRefused"]["for"], rules["QuiverBrokerWritesRefused"]["labels"]["severity"]) == (
        "2m",
        "warning",
    )


def test_disk_alerts_follow_the_broker_thresholds():
    """The early warning sits below the broker's default high water (0.90), and the high-water
    alert compares against the broker's own setting, never a copy of it."""
    rules = {r["alert"]: r for r in all_rules(yaml.safe_load(RULES_FILE.read_text()))}
    defaults = load_values(CHART_DIR / "values.yaml")["prometheusRule"]
    assert 0.75 <= defaults["storeDiskFull"]["thresholdRatio"] < 0.90
    assert "unless" in rules["QuiverStoreDiskNearlyFull"]["expr"]
    assert (
        rules["QuiverBrokerDiskAboveHighWater"]["expr"]
        == "quiver_store_disk_used_ratio > quiver_store_disk_high_water_ratio"
    )


def test_queue_stalled_alert_values_reach_the_rule():
    rules = {r["alert"]: r for r in all_rules(rendered_alert_groups(load_values(ALL_FEATURES_VALUES)))}
    queue_stalled = rules["QuiverConsumerQueueStalled"]
    assert queue_stalled["for"] == "15m"
    assert queue_stalled["labels"]["severity"] == "critical"
    assert "and has had such queues for 15m" in queue_stalled["annotations"]["description"]
    defaults = {r["alert"]: r for r in all_rules(yaml.safe_load(RULES_FILE.read_text()))}
    assert (defaults["QuiverConsumerQueueStalled"]["for"], defaults["QuiverConsumerQueueStalled"]["labels"]["severity"]) == (
        "5m",
        "warning",
    )
    # One alert per group, whatever per-queue or per-scrape labels the series carries.
    assert queue_stalled["expr"] == (
        "max by (namespace, cluster, consumer_group) (quiver_consumer_group_stalled_queues) > 0"
    )
