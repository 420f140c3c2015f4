"""The operator on a real cluster: a Broker becomes Ready, clients produce and consume through
its Service, a ConsumerGroup reports lag in status and on /metrics, and a scale-down waits for
consumers to drain the leaving broker. The tests run in order and share one Broker."""

import json
import os

from kube import apply, condition, get, wait_for
from scenario import metric_samples, operator_metrics

BROKER = "qb"
GROUP = "billing"


def broker_manifest(replicas):
    return {
        "apiVersion": "quiver.io/v1alpha1",
        "kind": "Broker",
        "metadata": {"name": BROKER},
        "spec": {
            "replicas": replicas,
            "image": os.environ["QUIVER_BROKER_IMAGE"],
            "storage": {"size": "1Gi", "retentionPolicy": "Delete"},
            "topics": [{"name": "orders", "queues": 4}],
        },
    }


def consume(toolbox, count):
    """Consumes `count` messages of `orders` as group billing and returns how many arrived."""
    out = toolbox("consume", "-t", "orders", "-g", GROUP, "--from", "first", "--mode", "count",
                  "--max", str(count), "--idle-timeout-secs", "30", timeout=180)
    return int(out.strip().split()[-1])


def test_broker_becomes_ready(namespace, operator):
    apply(namespace, broker_manifest(2))
    broker = wait_for("Broker Ready", lambda: (b := get(namespace, "broker", BROKER))
                      and condition(b, "Ready") == "True" and b, 420)
    assert broker["status"]["readyReplicas"] == 2
    assert [b["name"] for b in broker["status"]["brokers"]] == ["qb-0", "qb-1"]
    sts = get(namespace, "statefulset", BROKER)
    assert sts["spec"]["replicas"] == 2
    assert sts["metadata"]["ownerReferences"][0]["kind"] == "Broker"
    for name in ("qb", "qb-headless"):
        assert get(namespace, "service", name) is not None
    assert get(namespace, "poddisruptionbudget", BROKER) is not None


def test_produce_and_consume_through_the_client_service(namespace, operator, toolbox):
    apply(namespace, {
        "apiVersion": "quiver.io/v1alpha1",
        "kind": "ConsumerGroup",
        "metadata": {"name": GROUP},
        "spec": {"brokerRef": BROKER, "topics": ["orders"], "lagThresholds": {"messages": 10}},
    })
    toolbox("produce", "-t", "orders", "--repeat", "100", "--quiet", "first-batch")
    assert consume(toolbox, 100) == 100


def test_lag_in_status_and_metrics(namespace, operator, toolbox):
    toolbox("produce", "-t", "orders", "--repeat", "30", "--quiet", "second-batch")
    group = wait_for("ConsumerGroup lag of 30", lambda: (g := get(namespace, "consumergroup", GROUP))
                     and (g.get("status") or {}).get("totalLag") == 30 and g, 120)
    assert condition(group, "Ready") == "True"
    assert condition(group, "Lagging") == "True", json.dumps(group["status"])
    assert group["status"]["lagSeconds"] >= 0
    series = {"namespace": namespace, "cluster": BROKER, "consumer_group": GROUP}
    wait_for("lag of 30 on the operator's /metrics",
             lambda: metric_samples(operator_metrics(namespace, operator),
                                    "rocketmq_consumer_lag_messages", topic="orders", **series)
             == [30.0], 60,
             state=lambda: [line for line in operator_metrics(namespace, operator).splitlines()
                            if GROUP in line])
    text = operator_metrics(namespace, operator)
    latency = metric_samples(text, "rocketmq_consumer_lag_latency", topic="orders", **series)
    assert len(latency) == 1, f"one latency series per namespace, Broker, group and topic: {latency}"
    polled = metric_samples(text, "quiver_lag_poll_success", **series)
    assert polled == [1.0], f"the last lag poll succeeded: {polled}"
    assert metric_samples(text, "quiver_reconcile_total", controller="broker"), (
        "reconciles of the broker controller are counted")


def test_scale_down_waits_for_the_drain(namespace, operator, toolbox):
    lag_on_leaving = [q for q in get(namespace, "consumergroup", GROUP)["status"].get("topQueues", [])
                      if q["broker"] == "qb-1"]
    apply(namespace, broker_manifest(1))
    if lag_on_leaving:
        broker = wait_for("the drain in status", lambda: (b := get(namespace, "broker", BROKER))
                          and (b.get("status") or {}).get("drain") and b, 60)
        assert broker["status"]["drain"]["brokers"] == ["qb-1"]
        assert broker["status"]["drain"]["remainingMessages"] > 0
        assert get(namespace, "statefulset", BROKER)["spec"]["replicas"] == 2, "kept until drained"
    assert consume(toolbox, 30) == 30, "every message of the leaving broker is still consumable"
    wait_for("StatefulSet scaled to 1", lambda: get(namespace, "statefulset", BROKER)["spec"]["replicas"] == 1, 180)
    broker = wait_for("Broker Ready at 1 replica", lambda: (b := get(namespace, "broker", BROKER))
                      and condition(b, "Ready") == "True" and not b["status"].get("drain") and b, 420)
    assert broker["status"]["currentReplicas"] == 1
