"""Drains and dead letters, and a replicated Broker's drain: a `%DLQ%` topic on the leaving broker
is reported in `status.drain.deadLetters` and does not hold the scale-down (no force annotation);
with `spec.drain.waitForDeadLetters: true` the drain waits for it like any topic, naming it in
`status.drain.waitingFor`; a replicated broker group being removed is counted once (its master's
figures), not once per member.

The dead letters are made by the broker's own dead-letter path: the group's
`maxReconsumeTimes: 0` reaches the brokers as its `retryMaxTimes`, and a message sent to
`%RETRY%<group>` (what a client does when it cannot send a failed message back) with no
reconsume left is stored in `%DLQ%<group>` on the broker that received it."""

from kube import (apply, condition_details, events_about, get, has_condition, holds_for, wait_for,
                  wait_for_event, wait_for_object)
from scenario import (FORCE_SCALE_DOWN_ANNOTATION, STEP_S, broker_manifest, describe_broker,
                      group_manifest, scale_broker, status, wait_broker_ready, wait_group_ready)

HELD_S = 20  # how long a blocked drain is watched to keep the leaving brokers
DRAIN_S = 300


def retry_topic(group):
    return f"%RETRY%{group}"


def dead_letter_topic(group):
    return f"%DLQ%{group}"


def wait_drain(namespace, broker, what, check):
    """Waits until status.drain exists and `check(drain)` holds; returns the drain."""
    found = wait_for_object(namespace, "broker", broker, f"status.drain {what}",
                            lambda b: status(b).get("drain") and check(status(b)["drain"]), STEP_S,
                            context=lambda: describe_broker(namespace, broker))
    return found["status"]["drain"]


def waits_of(drain, topic):
    """The entries of status.drain.waitingFor about `topic`."""
    return [wait for wait in drain.get("waitingFor") or [] if wait["topic"] == topic]


def wait_route_names(cli, broker, topic, names, timeout_s=120):
    """Waits until the route of `topic` names exactly these broker names."""
    wait_for(f"route of {topic} on {names}", lambda: cli.route_brokers(broker, topic) == names,
             timeout_s, state=lambda: cli.route_brokers(broker, topic))


def dead_letter(cli, broker, group, count):
    """Sends `count` messages to the group's retry topic with no reconsume left: the brokers
    store them in its `%DLQ%` topic, on both brokers. Returns how many the leaving broker
    (ordinal 1) holds there."""
    cli.produce(broker, retry_topic(group), count, "failed-every-time")
    dlq = dead_letter_topic(group)
    wait_route_names(cli, broker, dlq, [f"{broker}-0", f"{broker}-1"])
    on_leaving = cli.stored_on(broker, dlq, f"{broker}-1")
    on_kept = cli.stored_on(broker, dlq, f"{broker}-0")
    assert on_leaving > 0 and on_leaving + on_kept == count, (
        f"the {count} sends to {retry_topic(group)} were dead-lettered on both brokers: "
        f"{on_leaving} on {broker}-1, {on_kept} on {broker}-0")
    # Nothing stays in the retry topic: every send went to the dead-letter topic.
    assert cli.stored_on(broker, retry_topic(group), f"{broker}-1") == 0
    return on_leaving


def lag_on(cli, broker, group, topic, broker_name):
    rows = cli.lag_rows(broker, group, topic)
    return sum(r["lag_messages"] or 0 for r in rows if r["broker"] == broker_name), rows


def no_forced_scale_down(namespace, found):
    annotations = found["metadata"].get("annotations") or {}
    assert FORCE_SCALE_DOWN_ANNOTATION not in annotations, annotations
    forced = [e for e in events_about(namespace, found) if e["reason"] == "ForcedScaleDown"]
    assert forced == [], f"the drain was not forced: {forced}"


def test_dead_letters_are_reported_and_do_not_hold_the_drain(namespace, brokers, cli):
    broker, group = "dlq", "dlq-billing"
    brokers(broker_manifest(broker, 2, topics=[("orders", 4), (retry_topic(group), 4)]))
    wait_broker_ready(namespace, broker, 2)
    apply(namespace, group_manifest(group, broker, ["orders"], maxReconsumeTimes=0))
    wait_group_ready(namespace, group)
    cli.wait_route(broker, retry_topic(group), 2)
    dead_on_leaving = dead_letter(cli, broker, group, 40)

    # The group also leaves unread orders on the leaving broker, so the drain is observed while
    # it waits; the dead letters must be reported beside them and not waited for.
    cli.wait_route(broker, "orders", 2)
    cli.produce(broker, "orders", 20, "committed")
    assert cli.consume(broker, "orders", group, 20) == 20, "the first batch is consumed"
    cli.produce(broker, "orders", 40, "behind")
    orders_on_leaving, rows = lag_on(cli, broker, group, "orders", f"{broker}-1")
    assert orders_on_leaving > 0, f"round-robin sends left lag on {broker}-1: {rows}"

    scale_broker(namespace, broker, 1)
    dlq = dead_letter_topic(group)
    drain = wait_drain(namespace, broker, f"reporting {dlq} while waiting for {group}",
                       lambda d: d.get("deadLetters") and waits_of(d, "orders"))
    assert drain["brokers"] == [f"{broker}-1"], drain
    assert drain["deadLetters"] == [{"topic": dlq, "messages": dead_on_leaving}], drain
    assert drain["deadLetterMessages"] == dead_on_leaving, drain
    assert waits_of(drain, dlq) == [], f"the dead letters are not waited for: {drain}"
    assert dlq not in (drain.get("pendingTopics") or []), drain
    assert waits_of(drain, "orders") == [
        {"topic": "orders", "group": group, "unread": orders_on_leaving}], drain
    progressing = condition_details(get(namespace, "broker", broker), "Progressing")
    assert progressing.get("reason") == "Draining", progressing
    assert f"{dead_on_leaving} dead-lettered messages in {dlq}" in progressing.get("message", ""), (
        progressing)

    # The group reads the leaving broker: nothing is waited for any more, and the broker goes
    # with its dead letters, without the force annotation.
    assert cli.consume(broker, "orders", group, 40) == 40, "the leaving broker's orders are read"
    wait_for_object(namespace, "statefulset", broker, "scaled to 1 replica",
                    lambda sts: sts["spec"]["replicas"] == 1, DRAIN_S,
                    context=lambda: describe_broker(namespace, broker))
    found = wait_broker_ready(namespace, broker, 1)
    assert not status(found).get("drain"), f"drain cleared: {status(found)}"
    event = wait_for_event(namespace, found, "Normal Drained",
                           lambda e: e["type"] == "Normal" and e["reason"] == "Drained", 60)
    assert (f"{dead_on_leaving} dead-lettered messages in {dlq}, dropped with the brokers"
            in event["message"]), f"the event names the dropped dead letters: {event}"
    no_forced_scale_down(namespace, found)


def test_wait_for_dead_letters_holds_the_drain_until_they_are_read(namespace, brokers, cli):
    broker, group = "dlqwait", "dlqwait-billing"
    brokers(broker_manifest(broker, 2, topics=[("orders", 4), (retry_topic(group), 4)],
                            drain={"waitForDeadLetters": True}))
    wait_broker_ready(namespace, broker, 2)
    apply(namespace, group_manifest(group, broker, ["orders"], maxReconsumeTimes=0))
    wait_group_ready(namespace, group)
    cli.wait_route(broker, retry_topic(group), 2)
    dead_on_leaving = dead_letter(cli, broker, group, 40)

    scale_broker(namespace, broker, 1)
    dlq = dead_letter_topic(group)
    drain = wait_drain(namespace, broker, f"waiting for {dlq}", lambda d: waits_of(d, dlq))
    assert drain["brokers"] == [f"{broker}-1"], drain
    assert waits_of(drain, dlq) == [{"topic": dlq, "unread": dead_on_leaving}], (
        f"no group committed on the dead letters, so the entry has none: {drain}")
    assert dlq in drain.get("pendingTopics", []), drain
    assert not drain.get("deadLetters"), f"waited for, so not only reported: {drain}"
    holds_for("the StatefulSet keeping 2 replicas while the dead letters are unread",
              lambda: get(namespace, "statefulset", broker)["spec"]["replicas"] == 2
              and waits_of(status(get(namespace, "broker", broker)).get("drain") or {}, dlq),
              HELD_S, state=lambda: describe_broker(namespace, broker))

    # A reader of the dead-letter topic commits to its end on both brokers: the broker goes.
    assert cli.consume(broker, dlq, "dlqwait-dlq-reader", 40) == 40, "every dead letter is read"
    wait_for_object(namespace, "statefulset", broker, "scaled to 1 replica",
                    lambda sts: sts["spec"]["replicas"] == 1, DRAIN_S,
                    context=lambda: describe_broker(namespace, broker))
    found = wait_broker_ready(namespace, broker, 1)
    assert not status(found).get("drain"), f"drain cleared: {status(found)}"
    wait_for_event(namespace, found, "Normal Drained",
                   lambda e: e["type"] == "Normal" and e["reason"] == "Drained", 60)
    no_forced_scale_down(namespace, found)


def test_a_replicated_group_is_counted_once_on_its_master(namespace, brokers, cli):
    """Two broker groups of two members scaled to one group: the leaving group's backlog is
    what its master holds, as `quiver lag` reads it, not that times the members."""
    broker, group = "drainrep", "drainrep-billing"
    leaving_group = f"{broker}-g1"
    brokers(broker_manifest(broker, 2, topics=[("orders", 4)],
                            replication={"replicas": 2, "mode": "Async", "minInSyncReplicas": 1}))
    wait_broker_ready(namespace, broker, 4)
    apply(namespace, group_manifest(group, broker, ["orders"]))
    wait_group_ready(namespace, group)
    wait_route_names(cli, broker, "orders", [f"{broker}-g0", leaving_group])
    cli.produce(broker, "orders", 20, "committed")
    assert cli.consume(broker, "orders", group, 20) == 20, "the first batch is consumed"
    cli.produce(broker, "orders", 40, "behind")
    on_leaving, rows = lag_on(cli, broker, group, "orders", leaving_group)
    assert on_leaving > 0, f"round-robin sends left lag on {leaving_group}: {rows}"

    scale_broker(namespace, broker, 1)
    drain = wait_drain(namespace, broker, f"measuring {leaving_group}",
                       lambda d: waits_of(d, "orders"))
    assert drain["brokers"] == [f"{broker}-2", f"{broker}-3"], f"both members leave: {drain}"
    assert (drain["remainingMessages"], waits_of(drain, "orders")) == (
        on_leaving, [{"topic": "orders", "group": group, "unread": on_leaving}]), (
        f"the leaving group's {on_leaving} unread messages (its master's figures) once, "
        f"not once per member: {drain}")
    assert drain.get("pendingGroups") == [group], drain
    holds_for("the StatefulSet keeping both groups while the drain is pending",
              lambda: get(namespace, "statefulset", broker)["spec"]["replicas"] == 4
              and status(get(namespace, "broker", broker)).get("drain"),
              HELD_S, state=lambda: describe_broker(namespace, broker))

    assert cli.consume(broker, "orders", group, 40) == 40, "the leaving group's messages are read"
    wait_for_object(namespace, "statefulset", broker, "scaled to one group (2 pods)",
                    lambda sts: sts["spec"]["replicas"] == 2, DRAIN_S,
                    context=lambda: describe_broker(namespace, broker))
    found = wait_broker_ready(namespace, broker, 2)
    assert not status(found).get("drain"), f"drain cleared: {status(found)}"
    assert has_condition(found, "Ready", "True"), status(found)
    wait_for_event(namespace, found, "Normal Drained",
                   lambda e: e["type"] == "Normal" and e["reason"] == "Drained", 60)
    no_forced_scale_down(namespace, found)
