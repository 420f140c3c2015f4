"""A real Prometheus scrapes a real quiver-broker whose disk is above its high water: it is
started with --disk-high-water-ratio 0.01, which any file system holding a temp dir exceeds, so
it starts read-only. Its disk metrics arrive as docs/METRICS.md says, and the shipped disk alerts
(with a short `for:`) behave: QuiverBrokerDiskAboveHighWater and QuiverBrokerWritesRefused (with
the refusal reason) fire, the early warning QuiverStoreDiskNearlyFull stays silent."""

import pathlib

import pytest
import yaml
from processes import Broker, Prometheus, broker_binary
from quiver_e2e import wait_until

HERE = pathlib.Path(__file__).resolve().parent
SHIPPED_RULES = HERE.parents[1] / "charts" / "quiver-operator" / "alerts" / "quiver-alerts.rules.yaml"
CLUSTER = "quiver-disk-e2e"
HIGH_WATER = 0.01
DISK_ALERTS = ("QuiverStoreDiskNearlyFull", "QuiverBrokerDiskAboveHighWater", "QuiverBrokerWritesRefused")


def derive_test_rules(path: pathlib.Path) -> None:
    """The shipped rules with the disk alerts' `for:` shortened for the test."""
    rules = yaml.safe_load(SHIPPED_RULES.read_text())
    found = set()
    for group in rules["groups"]:
        for rule in group["rules"]:
            if rule["alert"] in DISK_ALERTS:
                rule["for"] = "2s"
                found.add(rule["alert"])
    assert found == set(DISK_ALERTS)
    path.write_text(yaml.safe_dump(rules))


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    work = tmp_path_factory.mktemp("prometheus-disk-e2e")
    rules = work / "rules.yaml"
    derive_test_rules(rules)
    broker = Broker(broker_binary(), work, CLUSTER, ("--disk-high-water-ratio", str(HIGH_WATER)))
    try:
        prometheus = Prometheus(work, rules, broker.http_port)
        try:
            wait_until(lambda: prometheus.query('up{job="quiver-broker"} == 1'), 30, "the first broker scrape")
            yield broker, prometheus
        finally:
            prometheus.stop()
    finally:
        broker.stop()


def scraped(prometheus, promql):
    return [(series["metric"], float(series["value"][1])) for series in prometheus.query(promql)]


def alerts(prometheus, state):
    return {
        a["labels"]["alertname"]: a
        for a in prometheus.alerts()
        if a["state"] == state and a["labels"]["alertname"] in DISK_ALERTS
    }


def test_disk_metrics_of_a_broker_above_high_water(stack):
    _, prometheus = stack
    wait_until(lambda: scraped(prometheus, "quiver_store_writable"), 30, "the store metrics scraped")
    ((labels, used),) = scraped(prometheus, "quiver_store_disk_used_ratio")
    assert labels["cluster"] == CLUSTER
    assert HIGH_WATER <= used <= 1, used
    assert [v for _, v in scraped(prometheus, "quiver_store_disk_high_water_ratio")] == [HIGH_WATER]
    assert [v for _, v in scraped(prometheus, "quiver_store_disk_free_bytes")][0] > 0
    assert [v for _, v in scraped(prometheus, "quiver_store_writable")] == [0]
    ((refusal, value),) = scraped(prometheus, "quiver_store_write_refusal")
    assert (refusal["reason"], value) == ("disk-high-water", 1)


def test_the_high_water_and_refusal_alerts_fire_and_the_early_warning_does_not(stack):
    _, prometheus = stack
    def both_firing():
        firing = alerts(prometheus, "firing")
        return firing if {"QuiverBrokerDiskAboveHighWater", "QuiverBrokerWritesRefused"} <= set(firing) else None

    firing = wait_until(both_firing, 60, "both disk alerts to fire")
    refused = firing["QuiverBrokerWritesRefused"]
    assert refused["labels"]["reason"] == "disk-high-water"
    assert refused["labels"]["severity"] == "critical"
    assert refused["annotations"]["summary"].endswith("refuses sends (disk-high-water)")
    above = firing["QuiverBrokerDiskAboveHighWater"]
    assert above["labels"]["cluster"] == CLUSTER and above["labels"]["severity"] == "critical"
    assert "refuses sends" in above["annotations"]["summary"]
    assert "QuiverStoreDiskNearlyFull" not in alerts(prometheus, "firing")
    assert "QuiverStoreDiskNearlyFull" not in alerts(prometheus, "pending")
