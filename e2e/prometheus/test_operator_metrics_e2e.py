"""A real Prometheus scrapes what the operator exports (operator-metrics.txt, which a Rust test
keeps equal to the output of the operator's Metrics) with the shipped rules: two ConsumerGroups
named billing in two namespaces stay two series and only the lagging one alerts, the one with a
stalled queue fires QuiverConsumerQueueStalled, and a group whose lag poll fails fires
QuiverConsumerGroupLagUnknown with no lag series left."""

import http.server
import pathlib
import threading

import pytest
import yaml
from processes import Prometheus
from quiver_e2e import wait_until

HERE = pathlib.Path(__file__).resolve().parent
SHIPPED_RULES = HERE.parents[1] / "charts" / "quiver-operator" / "alerts" / "quiver-alerts.rules.yaml"
EXPOSITION = HERE / "operator-metrics.txt"
SHORTENED = {"QuiverConsumerLagHigh", "QuiverConsumerQueueStalled", "QuiverConsumerGroupLagUnknown"}


def derive_test_rules(path: pathlib.Path) -> None:
    """The shipped rules with a 2s `for:` on the alerts under test."""
    rules = yaml.safe_load(SHIPPED_RULES.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if rule["alert"] in SHORTENED:
                rule["for"] = "2s"
    path.write_text(yaml.safe_dump(rules))


class OperatorMetrics(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - the http.server hook name
        body = EXPOSITION.read_bytes()
        self.send_response(200)
        # What the operator's /metrics answers.
        self.send_header("Content-Type", "application/openmetrics-text; version=1.0.0; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    work = tmp_path_factory.mktemp("operator-metrics-e2e")
    rules = work / "rules.yaml"
    derive_test_rules(rules)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), OperatorMetrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        prometheus = Prometheus(work, rules, operator_http_port=server.server_address[1])
        try:
            wait_until(lambda: prometheus.query('up{job="quiver-operator"} == 1'), 30, "the first operator scrape")
            yield prometheus
        finally:
            prometheus.stop()
    finally:
        server.shutdown()


def firing(prometheus, alertname):
    return [a["labels"] for a in prometheus.alerts() if a["labels"]["alertname"] == alertname and a["state"] == "firing"]


def test_same_named_groups_in_two_namespaces_stay_apart(prometheus):
    result = prometheus.query('rocketmq_consumer_lag_messages{consumer_group="billing",topic="orders"}')
    lag = {series["metric"]["namespace"]: float(series["value"][1]) for series in result}
    assert lag == {"team-a": 10, "team-b": 3000}
    (alert,) = wait_until(lambda: firing(prometheus, "QuiverConsumerLagHigh"), 30, "the lag alert to fire")
    assert alert == {
        "alertname": "QuiverConsumerLagHigh",
        "namespace": "team-b",
        "cluster": "qb",
        "consumer_group": "billing",
        "topic": "orders",
        "severity": "warning",
    }
    statuses = prometheus.query("quiver_consumer_group_status == 1")
    assert {(s["metric"]["namespace"], s["metric"]["status"]) for s in statuses} == {
        ("team-a", "ok"),
        ("team-b", "warning"),
    }


def test_a_stalled_queue_fires_the_queue_alert_for_its_group_only(prometheus):
    (alert,) = wait_until(
        lambda: firing(prometheus, "QuiverConsumerQueueStalled"), 30, "the stalled-queue alert to fire"
    )
    assert alert == {
        "alertname": "QuiverConsumerQueueStalled",
        "namespace": "team-b",
        "cluster": "qb",
        "consumer_group": "billing",
        "severity": "warning",
    }
    since = prometheus.query("quiver_consumer_queue_stalled_since_timestamp_seconds")
    assert [
        (s["metric"]["namespace"], s["metric"]["topic"], s["metric"]["broker"], s["metric"]["queue_id"], s["value"][1])
        for s in since
    ] == [("team-b", "orders", "qb-1", "3", "1700000000")]


def test_a_failed_poll_fires_lag_unknown_and_leaves_no_lag_series(prometheus):
    (alert,) = wait_until(
        lambda: firing(prometheus, "QuiverConsumerGroupLagUnknown"), 30, "the lag-unknown alert to fire"
    )
    assert alert == {
        "alertname": "QuiverConsumerGroupLagUnknown",
        "namespace": "team-c",
        "cluster": "qb",
        "consumer_group": "audit",
        "severity": "warning",
    }
    assert prometheus.query('rocketmq_consumer_lag_messages{consumer_group="audit"}') == []
    assert prometheus.query('quiver_consumer_group_status{consumer_group="audit"}') == []
    success = prometheus.query("quiver_lag_poll_success")
    assert {(s["metric"]["namespace"], s["metric"]["consumer_group"], s["value"][1]) for s in success} == {
        ("team-a", "billing", "1"),
        ("team-b", "billing", "1"),
        ("team-c", "audit", "0"),
    }
