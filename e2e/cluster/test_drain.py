"""Scale-down drains the leaving broker: it waits for unconsumed messages of every topic,
including a topic no group consumes, and the force-scale-down annotation lets a blocked drain
proceed with a Warning event."""

from kube import annotate, apply, get, has_condition, holds_for, wait_for_event, wait_for_object
from scenario import (FORCE_SCALE_DOWN_ANNOTATION, STEP_S, broker_manifest, describe_broker,
                      group_manifest, scale_broker, status, wait_broker_ready, wait_group_ready)

HELD_S = 20  # how long a blocked drain is watched to keep both brokers
DRAIN_S = 300


def statefulset_replicas(namespace, broker):
    return get(namespace, "statefulset", broker)["spec"]["replicas"]


def wait_drain(namespace, broker, what, check):
    """Waits until status.drain exists and `check(drain)` holds; returns the drain."""
    found = wait_for_object(namespace, "broker", broker, f"status.drain {what}",
                            lambda b: status(b).get("drain") and check(status(b)["drain"]), STEP_S)
    return found["status"]["drain"]


def pending_groups(drain):
    return drain.get("pendingGroups") or []


def pending_topics(drain):
    """Topics with messages in queues no group has committed on."""
    return drain.get("pendingTopics") or []


def keeps_both_brokers(namespace, broker):
    holds_for("the StatefulSet keeping 2 replicas while the drain is pending",
              lambda: statefulset_replicas(namespace, broker) == 2
              and status(get(namespace, "broker", broker)).get("drain"),
              HELD_S, state=lambda: describe_broker(namespace, broker))


def wait_scaled_to_one(namespace, broker):
    wait_for_object(namespace, "statefulset", broker, "scaled to 1 replica",
                    lambda sts: sts["spec"]["replicas"] == 1, DRAIN_S)
    found = wait_broker_ready(namespace, broker, 1)
    assert not status(found).get("drain"), f"drain cleared: {status(found)}"
    return found


def commit_then_leave_lag(namespace, cli, broker, topic, group, behind):
    """The group commits on both brokers, then `behind` more messages are produced; returns how
    many of them wait on the leaving broker (ordinal 1)."""
    cli.wait_route(broker, topic, 2)
    cli.produce(broker, topic, 20, "committed")
    assert cli.consume(broker, topic, group, 20) == 20, "the first batch is consumed"
    cli.produce(broker, topic, behind, "behind")
    rows = cli.lag_rows(broker, group, topic)
    on_leaving = sum(r["lag_messages"] or 0 for r in rows if r["broker"] == f"{broker}-1")
    assert on_leaving > 0, f"round-robin sends left lag on {broker}-1: {rows}"
    return on_leaving


def test_scale_down_waits_for_every_topic_including_one_without_a_group(namespace, brokers, cli):
    broker, group = "drain", "drain-billing"
    brokers(broker_manifest(broker, 2, topics=[("orders", 4), ("audit", 4)]))
    wait_broker_ready(namespace, broker, 2)
    apply(namespace, group_manifest(group, broker, ["orders"]))
    wait_group_ready(namespace, group)
    commit_then_leave_lag(namespace, cli, broker, "orders", group, 40)
    cli.wait_route(broker, "audit", 2)
    cli.produce(broker, "audit", 40, "nobody-reads-this-yet")
    audit_on_leaving = cli.stored_on(broker, "audit", f"{broker}-1")
    assert audit_on_leaving > 0, "round-robin sends stored audit messages on the leaving broker"

    scale_broker(namespace, broker, 1)
    drain = wait_drain(namespace, broker, f"for {broker}-1 with the group and the topic without one",
                       lambda d: d.get("brokers") == [f"{broker}-1"]
                       and group in pending_groups(d) and "audit" in pending_topics(d))
    assert drain["remainingMessages"] > 0, drain
    assert (drain.get("messagesWithoutGroup") or 0) >= audit_on_leaving, (
        f"the {audit_on_leaving} audit messages stored on {broker}-1 are counted: {drain}")
    keeps_both_brokers(namespace, broker)

    assert cli.consume(broker, "orders", group, 40) == 40, "the leaving broker's messages are read"
    drain = wait_drain(namespace, broker, "waiting only for the topic without a group",
                       lambda d: group not in pending_groups(d) and "audit" in pending_topics(d))
    assert statefulset_replicas(namespace, broker) == 2, (
        f"messages no group consumed keep the broker: {drain}")

    assert cli.consume(broker, "audit", "drain-audit-reader", 40) == 40, "audit read at last"
    found = wait_scaled_to_one(namespace, broker)
    assert found["status"]["currentReplicas"] == 1, status(found)
    wait_for_event(namespace, found, "Drained",
                   lambda e: e["type"] == "Normal" and e["reason"] == "Drained", 60)


def test_forced_scale_down_proceeds_with_a_warning(namespace, brokers, cli):
    broker, group = "forced", "forced-billing"
    brokers(broker_manifest(broker, 2, topics=[("orders", 4)]))
    wait_broker_ready(namespace, broker, 2)
    apply(namespace, group_manifest(group, broker, ["orders"]))
    wait_group_ready(namespace, group)
    commit_then_leave_lag(namespace, cli, broker, "orders", group, 40)

    scale_broker(namespace, broker, 1)
    wait_drain(namespace, broker, f"blocked by {group}", lambda d: group in pending_groups(d))
    keeps_both_brokers(namespace, broker)

    annotate(namespace, "broker", broker, FORCE_SCALE_DOWN_ANNOTATION, "true")
    found = wait_scaled_to_one(namespace, broker)
    event = wait_for_event(namespace, found, "Warning ForcedScaleDown",
                           lambda e: e["type"] == "Warning" and e["reason"] == "ForcedScaleDown",
                           60)
    assert f"{broker}-1" in event["message"] and group in event["message"], (
        f"the event says what was dropped: {event}")
    assert has_condition(found, "Ready", "True"), status(found)
