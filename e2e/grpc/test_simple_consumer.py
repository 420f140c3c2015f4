"""The 5.x SimpleConsumer over gRPC (POP): a received message is invisible for the asked time,
comes back with its delivery attempt raised when not acked, can have its invisible time changed,
and never comes back once acked."""

import time

from quiver_e2e import wait_until
from v5 import message, producer, receive_all, receive_nothing, simple_consumer, text


def prepared(broker, topic, group, bodies):
    # One queue: a receive finds every message at once, well within the invisible times.
    broker.create_topic(topic, queues=1)
    broker.create_group(group)
    broker.from_earliest(group, topic)
    with producer(broker, [topic]) as p:
        return {body: p.send(message(topic, body)).message_id for body in bodies}


def test_an_unacked_message_comes_back_after_its_invisible_time(broker):
    topic, group = "RedeliverTopic", "redeliver-readers"
    sent = prepared(broker, topic, group, ["once", "twice"])
    with simple_consumer(broker, group, topic) as c:
        first = receive_all(c, 2, invisible_seconds=3, ack=False)
        received_at = time.monotonic()
        once = next(m for m in first if text(m.body) == "once")
        c.ack(once)
        again = receive_all(c, 1, invisible_seconds=30, ack=False, timeout=60)
        came_back_after = time.monotonic() - received_at
        assert [text(m.body) for m in again] == ["twice"]
        assert again[0].message_id == sent["twice"]
        assert again[0].delivery_attempt == 2
        assert again[0].receipt_handle != next(m for m in first if m is not once).receipt_handle
        c.ack(again[0])
        assert receive_nothing(c, 5, invisible_seconds=1) == []
    # Acked messages are committed as the group's offset: no lag left for /metrics to show.
    wait_until(lambda: broker.metric("rocketmq_consumer_lag_messages", consumer_group=group, topic=topic) == 0,
               30, f"{group}'s lag on {topic} to reach 0")
    assert came_back_after >= 2.5, f"redelivered {came_back_after:.1f}s after receive, invisible for 3s"


def test_change_invisible_duration_hides_longer_or_brings_back_sooner(broker):
    topic, group = "InvisibleTopic", "invisible-readers"
    prepared(broker, topic, group, ["sooner", "longer"])
    with simple_consumer(broker, group, topic) as c:
        got = {text(m.body): m for m in receive_all(c, 2, invisible_seconds=30, ack=False)}
        c.change_invisible_duration(got["sooner"], 1)
        c.change_invisible_duration(got["longer"], 60)
        back = receive_all(c, 1, invisible_seconds=30, ack=False, timeout=30)
        assert [text(m.body) for m in back] == ["sooner"]
        assert back[0].delivery_attempt == 2
        c.ack(back[0])
        assert receive_nothing(c, 4) == [], "'longer' stays hidden for its 60 s"
        # The handle the change answered with acks it; no redelivery follows.
        c.ack(got["longer"])
    with simple_consumer(broker, group, topic) as c:
        assert receive_nothing(c, 3) == []
