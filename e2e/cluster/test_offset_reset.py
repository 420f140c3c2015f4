"""Offset reset: spec.offsetReset moves the group's committed offsets on the brokers once per id,
records status.appliedOffsetReset and emits an OffsetsReset event."""

from kube import apply, get, holds_for, merge_patch, wait_for, wait_for_event, wait_for_object
from scenario import (STEP_S, broker_manifest, group_manifest, status, wait_broker_ready,
                      wait_group_ready)

BROKER, GROUP, TOPIC = "reset", "reset-billing", "payments"
MESSAGES = 20
HELD_S = 20  # four lag polls at the suite's 5 s interval


def committed(cli):
    """Sum of the group's committed offsets over the topic's queues (None counts as 0)."""
    return sum(row["consumer_offset"] or 0 for row in cli.lag_rows(BROKER, GROUP, TOPIC))


def stored(cli):
    return sum(row["broker_offset"] for row in cli.lag_rows(BROKER, GROUP, TOPIC))


def wait_committed(cli, total):
    return wait_for(f"committed offsets summing to {total}", lambda: committed(cli) == total, 30,
                    state=lambda: cli.lag_rows(BROKER, GROUP, TOPIC))


def request_reset(namespace, request_id, to):
    merge_patch(namespace, "consumergroup", GROUP,
                {"spec": {"offsetReset": {"id": request_id, "to": to}}})


def wait_applied(namespace, request_id, to):
    found = wait_for_object(namespace, "consumergroup", GROUP, f"appliedOffsetReset {request_id}",
                            lambda g: (status(g).get("appliedOffsetReset") or {}).get("id")
                            == request_id, STEP_S)
    applied = found["status"]["appliedOffsetReset"]
    assert applied["to"] == to and applied.get("appliedAt"), applied
    return found


def wait_total_lag(namespace, lag):
    return wait_for_object(namespace, "consumergroup", GROUP, f"totalLag {lag}",
                           lambda g: status(g).get("totalLag") == lag, STEP_S)


def test_offset_reset_moves_committed_offsets_once_per_id(namespace, brokers, cli):
    brokers(broker_manifest(BROKER, 1, topics=[(TOPIC, 2)]))
    wait_broker_ready(namespace, BROKER, 1)
    apply(namespace, group_manifest(GROUP, BROKER, [TOPIC]))
    wait_group_ready(namespace, GROUP)
    cli.produce(BROKER, TOPIC, MESSAGES, "paid")
    assert cli.consume(BROKER, TOPIC, GROUP, MESSAGES) == MESSAGES, "the first read"
    wait_committed(cli, MESSAGES)
    wait_total_lag(namespace, 0)

    request_reset(namespace, "rewind-1", "Earliest")
    group = wait_applied(namespace, "rewind-1", "Earliest")
    wait_for_event(namespace, group, "OffsetsReset",
                   lambda e: e["type"] == "Normal" and e["reason"] == "OffsetsReset"
                   and "rewind-1" in e["message"], 60)
    wait_committed(cli, 0)
    wait_total_lag(namespace, MESSAGES)
    assert cli.consume(BROKER, TOPIC, GROUP, MESSAGES) == MESSAGES, "every message read again"
    wait_committed(cli, MESSAGES)
    wait_total_lag(namespace, 0)
    holds_for("the applied request not repeated on later polls",
              lambda: committed(cli) == MESSAGES, HELD_S,
              state=lambda: cli.lag_rows(BROKER, GROUP, TOPIC))

    cli.produce(BROKER, TOPIC, 5, "skipped")
    request_reset(namespace, "skip-2", "Latest")
    wait_applied(namespace, "skip-2", "Latest")
    wait_committed(cli, MESSAGES + 5)
    assert stored(cli) == MESSAGES + 5, cli.lag_rows(BROKER, GROUP, TOPIC)
    found = wait_total_lag(namespace, 0)
    assert get(namespace, "consumergroup", GROUP)["status"]["appliedOffsetReset"]["id"] == "skip-2", (
        status(found))
