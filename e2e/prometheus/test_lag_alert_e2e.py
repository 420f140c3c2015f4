"""A real Prometheus scrapes a real quiver-broker. A consumer group commits and stops, a producer
sends more messages: rocketmq_consumer_lag_messages shows the exact lag and the lag alert (the
shipped rule with a short `for:` and a small threshold) fires; once the consumer is back and has
caught up, the lag is 0 and the alert resolves."""

import json
import pathlib
import re
import threading

import pytest
import yaml
from processes import Broker, Prometheus, broker_binary
from quiver_e2e import wait_until
from rocketmq.client import Message, Producer, PushConsumer, SendStatus

HERE = pathlib.Path(__file__).resolve().parent
SHIPPED_RULES = HERE.parents[1] / "charts" / "quiver-operator" / "alerts" / "quiver-alerts.rules.yaml"
DASHBOARD = HERE.parents[1] / "charts" / "quiver-operator" / "dashboards" / "quiver.json"
CLUSTER = "quiver-e2e"
TOPIC = "LagTopic"
GROUP = "LagGroup"
QUEUES = 8  # default queue count of an auto-created topic
CAUGHT_UP = 10  # messages consumed before the consumer stops
BACKLOG = 7  # messages sent while it is stopped
ALERT_THRESHOLD = 5
LAG_ALERT = "QuiverConsumerLagHigh"


def derive_test_rules(path: pathlib.Path) -> None:
    """The shipped rules file with the lag alert's threshold and `for:` shortened for the test."""
    rules = yaml.safe_load(SHIPPED_RULES.read_text())
    (lag_rule,) = [r for g in rules["groups"] for r in g["rules"] if r["alert"] == LAG_ALERT]
    lag_rule["expr"], replaced = re.subn(r"> \d+$", f"> {ALERT_THRESHOLD}", lag_rule["expr"])
    assert replaced == 1, lag_rule["expr"]
    lag_rule["for"] = "2s"
    path.write_text(yaml.safe_dump(rules))


class Received:
    """Keys a push consumer received (callbacks run on the client's threads)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.keys = set()

    def __call__(self, msg):
        key = msg.keys.decode() if isinstance(msg.keys, bytes) else msg.keys
        with self.lock:
            self.keys.add(key)

    def count(self):
        with self.lock:
            return len(self.keys)


def produce(namesrv, keys):
    producer = Producer("LagProducer")
    producer.set_namesrv_addr(namesrv)
    producer.start()
    try:
        for i in keys:
            msg = Message(TOPIC)
            msg.set_keys(f"k-{i}")
            msg.set_body(f"body-{i}")
            assert producer.send_sync(msg).status == SendStatus.OK
    finally:
        producer.shutdown()


def start_consumer(namesrv, received):
    consumer = PushConsumer(GROUP)
    consumer.set_namesrv_addr(namesrv)
    consumer.subscribe(TOPIC, received)
    consumer.start()
    return consumer


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    work = tmp_path_factory.mktemp("prometheus-e2e")
    rules = work / "rules.yaml"
    derive_test_rules(rules)
    broker = Broker(broker_binary(), work, CLUSTER)
    try:
        prometheus = Prometheus(work, rules, broker.http_port)
        try:
            wait_until(lambda: prometheus.query('up{job="quiver-broker"} == 1'), 30, "the first broker scrape")
            yield broker, prometheus
        finally:
            prometheus.stop()
    finally:
        broker.stop()


def lag_in_prometheus(prometheus):
    result = prometheus.query(f'rocketmq_consumer_lag_messages{{consumer_group="{GROUP}",topic="{TOPIC}"}}')
    return [(series["metric"], float(series["value"][1])) for series in result]


def time_lag_in_prometheus(prometheus):
    result = prometheus.query(f'rocketmq_consumer_lag_latency{{consumer_group="{GROUP}",topic="{TOPIC}"}}')
    return [float(series["value"][1]) for series in result]


def lag_alerts(prometheus, state):
    return [a for a in prometheus.alerts() if a["labels"]["alertname"] == LAG_ALERT and a["state"] == state]


def test_lag_series_and_alert_fire_while_the_consumer_is_stopped_and_resolve_after_catch_up(stack):
    broker, prometheus = stack
    namesrv = broker.addr
    committed = {"consumer_group": GROUP, "topic": TOPIC}

    # The group consumes and commits everything, then stops.
    first = Received()
    consumer = start_consumer(namesrv, first)
    try:
        wait_until(lambda: (broker.metric("quiver_parked_pulls") or 0) >= QUEUES + 1, 60, "pulls parked on every queue")
        produce(namesrv, range(CAUGHT_UP))
        wait_until(lambda: first.count() == CAUGHT_UP, 60, "the first messages consumed")
        wait_until(lambda: broker.metric("quiver_consumer_committed_offset", **committed) == CAUGHT_UP, 60, "commits")
    finally:
        consumer.shutdown()
    wait_until(lambda: lag_in_prometheus(prometheus) and lag_in_prometheus(prometheus)[0][1] == 0, 30, "lag 0 scraped")
    assert lag_alerts(prometheus, "firing") == []

    # A backlog builds up while nobody consumes.
    produce(namesrv, range(CAUGHT_UP, CAUGHT_UP + BACKLOG))
    wait_until(lambda: lag_in_prometheus(prometheus)[0][1] == BACKLOG, 30, f"lag {BACKLOG} scraped")
    ((labels, value),) = lag_in_prometheus(prometheus)
    assert value == BACKLOG
    assert labels["cluster"] == CLUSTER and labels["job"] == "quiver-broker"
    # The oldest unconsumed message has a store time, so the time lag (ms) is positive too.
    wait_until(
        lambda: time_lag_in_prometheus(prometheus) and time_lag_in_prometheus(prometheus)[0] > 0, 30, "time lag > 0"
    )

    (alert,) = wait_until(lambda: lag_alerts(prometheus, "firing"), 60, "the lag alert to fire")
    assert alert["labels"] == {
        "alertname": LAG_ALERT,
        "cluster": CLUSTER,
        "consumer_group": GROUP,
        "topic": TOPIC,
        "severity": "warning",
    }
    assert alert["annotations"]["summary"] == f"Consumer group {GROUP} is {BACKLOG} messages behind on topic {TOPIC}"
    firing = {a["labels"]["alertname"] for a in prometheus.alerts() if a["state"] == "firing"}
    assert firing == {LAG_ALERT}

    # The consumer comes back, catches up and commits: lag 0, the alert resolves.
    second = Received()
    consumer = start_consumer(namesrv, second)
    try:
        wait_until(lambda: second.count() == BACKLOG, 60, "the backlog consumed")
        wait_until(
            lambda: broker.metric("quiver_consumer_committed_offset", **committed) == CAUGHT_UP + BACKLOG,
            60,
            "commits after catch-up",
        )
        wait_until(lambda: lag_in_prometheus(prometheus)[0][1] == 0, 30, "lag 0 scraped after catch-up")
        wait_until(lambda: time_lag_in_prometheus(prometheus) == [0], 30, "time lag 0 after catch-up")
        wait_until(
            lambda: not lag_alerts(prometheus, "firing") and not lag_alerts(prometheus, "pending"), 30, "resolution"
        )
    finally:
        consumer.shutdown()
    assert second.keys == {f"k-{i}" for i in range(CAUGHT_UP, CAUGHT_UP + BACKLOG)}


def test_every_shipped_rule_loads_in_prometheus(stack):
    _, prometheus = stack

    def rules_health():
        return {rule["name"]: rule["health"] for group in prometheus.api("rules")["groups"] for rule in group["rules"]}

    shipped = yaml.safe_load(SHIPPED_RULES.read_text())
    assert set(rules_health()) == {r["alert"] for g in shipped["groups"] for r in g["rules"]}
    # Health is "unknown" until the first evaluation, "err" if evaluating failed.
    wait_until(lambda: set(rules_health().values()) == {"ok"}, 30, "every rule evaluated without error")


def test_every_dashboard_query_is_valid_promql(stack):
    _, prometheus = stack
    dashboard = json.loads(DASHBOARD.read_text())
    substitutions = {"$__rate_interval": "1m", "$namespace": ".*", "$cluster": ".*", "$consumer_group": ".*"}
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for variable, value in substitutions.items():
                expr = expr.replace(variable, value)
            assert "$" not in expr, expr
            prometheus.query(expr)  # raises unless Prometheus parsed and evaluated it
