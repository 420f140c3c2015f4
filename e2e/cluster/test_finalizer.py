"""ConsumerGroup finalizer: with deleteOffsetsOnDelete the group and its offsets leave the brokers
before the object goes away; with its broker down the deletion waits, and completes once the
broker is back.

What the operator does today (operator/src/controller/group.rs, `cleanup`): it deletes the group
on every broker of the Broker and fails the reconcile on the first broker that does not answer;
the finalizer stays, the failure is retried with backoff (5 s doubling to 300 s) and counted in
quiver_reconcile_errors_total{controller="consumergroup",error="finalizer"}. The broker is taken
down by pausing the Broker (so the operator does not scale it back) and scaling its StatefulSet
to 0; its volume is retained, so it comes back with the group's offsets."""

from kube import (annotate, apply, delete, get, has_condition, holds_for, kubectl, summary,
                  wait_for, wait_for_event, wait_for_object, wait_gone)
from scenario import (PAUSE_ANNOTATION, STEP_S, broker_manifest, group_manifest, metric_samples,
                      operator_metrics, wait_broker_ready, wait_group_ready)

TOPIC = "shipments"
DOWN_HELD_S = 40
# After the broker returns: the largest backoff reached while it was down, plus a poll.
BACK_WITHIN_S = 420
FINALIZER = "quiver.io/consumer-group-cleanup"


def finalizer_errors(namespace, operator):
    """Failed ConsumerGroup reconciles (the finalizer wraps every one of them)."""
    samples = metric_samples(operator_metrics(namespace, operator), "quiver_reconcile_errors_total",
                             controller="consumergroup", error="finalizer")
    return sum(samples)


def start_broker(namespace, brokers, broker):
    """One broker whose volume is retained, so a broker taken down comes back with its data."""
    brokers(broker_manifest(broker, 1, topics=[(TOPIC, 2)], volume_policy="Retain"))
    wait_broker_ready(namespace, broker, 1)


def group_with_offsets(namespace, cli, broker, name):
    """A ConsumerGroup that deletes its offsets on delete, with offsets committed."""
    apply(namespace, group_manifest(name, broker, [TOPIC], deleteOffsetsOnDelete=True))
    group = wait_group_ready(namespace, name)
    assert FINALIZER in group["metadata"].get("finalizers", []), group["metadata"]
    cli.produce(broker, TOPIC, 10, name)
    assert cli.consume(broker, TOPIC, name, 10) == 10, f"{name} commits"
    wait_for(f"{name} known to the brokers", lambda: name in cli.known_groups(broker), 30,
             state=lambda: cli.known_groups(broker))
    return group


def wait_group_deleted_event(namespace, group):
    """The Normal GroupDeleted event the cleanup records (it outlives the object)."""
    wait_for_event(namespace, group, "Normal GroupDeleted",
                   lambda e: e["type"] == "Normal" and e["reason"] == "GroupDeleted", 60)


def take_broker_down(namespace, broker):
    """Pauses the Broker so the operator leaves the StatefulSet alone, then scales it to 0."""
    annotate(namespace, "broker", broker, PAUSE_ANNOTATION, "true")
    wait_for_object(namespace, "broker", broker, "Paused=True",
                    lambda b: has_condition(b, "Paused", "True"), STEP_S)
    kubectl(namespace, "scale", "statefulset", broker, "--replicas=0")
    wait_gone(namespace, "pod", f"{broker}-0", STEP_S)


def test_deleting_a_group_removes_it_from_the_brokers(namespace, brokers, cli):
    broker, group = "fin", "fin-billing"
    start_broker(namespace, brokers, broker)
    created = group_with_offsets(namespace, cli, broker, group)

    delete(namespace, "consumergroup", group)
    wait_gone(namespace, "consumergroup", group, STEP_S)
    wait_for(f"{group} gone from the brokers", lambda: group not in cli.known_groups(broker), 60,
             state=lambda: cli.known_groups(broker))
    wait_group_deleted_event(namespace, created)


def test_deleting_a_group_with_its_broker_down_waits_for_the_broker(
        namespace, operator, brokers, cli):
    broker, group = "fin-down", "fin-orphan"
    start_broker(namespace, brokers, broker)
    created = group_with_offsets(namespace, cli, broker, group)
    errors_before = finalizer_errors(namespace, operator)

    take_broker_down(namespace, broker)
    delete(namespace, "consumergroup", group)
    holds_for("the group kept (deleting, finalizer on) while its broker is down",
              lambda: is_waiting_for_cleanup(get(namespace, "consumergroup", group)),
              DOWN_HELD_S, state=lambda: summary(get(namespace, "consumergroup", group)))
    wait_for("the failed cleanup counted on /metrics",
             lambda: finalizer_errors(namespace, operator) > errors_before, 60,
             state=lambda: finalizer_errors(namespace, operator))

    annotate(namespace, "broker", broker, PAUSE_ANNOTATION, None)
    wait_broker_ready(namespace, broker, 1)
    wait_gone(namespace, "consumergroup", group, BACK_WITHIN_S)
    wait_for(f"{group} gone from the broker that came back",
             lambda: group not in cli.known_groups(broker), 60,
             state=lambda: cli.known_groups(broker))
    wait_group_deleted_event(namespace, created)


def is_waiting_for_cleanup(group):
    metadata = (group or {}).get("metadata") or {}
    return bool(metadata.get("deletionTimestamp")) and FINALIZER in (metadata.get("finalizers") or [])
