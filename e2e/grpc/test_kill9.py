"""kill -9 of the broker between receive and ack: after the restart an un-acked message is
received again and an acked one never."""

from v5 import message, producer, receive_all, receive_nothing, simple_consumer, text


def test_unacked_messages_survive_kill9_and_acked_ones_stay_acked(broker):
    topic, group = "Kill9Topic", "kill9-readers"
    # One queue: a receive finds every message at once, well within the invisible time.
    broker.create_topic(topic, queues=1)
    broker.create_group(group)
    broker.from_earliest(group, topic)
    bodies = [f"m-{i}" for i in range(6)]
    with producer(broker, [topic]) as p:
        sent = {body: p.send(message(topic, body)).message_id for body in bodies}
    acked = {"m-0", "m-2", "m-4"}
    with simple_consumer(broker, group, topic) as c:
        got = receive_all(c, 6, invisible_seconds=10, ack=False)
        for m in got:
            if text(m.body) in acked:
                c.ack(m)
        broker.kill9()
        broker.start()
        # The same client reconnects to the restarted broker (same ports, same data).
        again = receive_all(c, 3, invisible_seconds=30, timeout=90)
        assert sorted(text(m.body) for m in again) == sorted(set(bodies) - acked)
        for m in again:
            assert m.message_id == sent[text(m.body)]
            assert m.delivery_attempt >= 2
        assert receive_nothing(c, 8, invisible_seconds=2) == [], "acked before the kill, never again"
