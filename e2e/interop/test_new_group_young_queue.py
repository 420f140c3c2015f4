"""A new push-consumer group (CONSUME_FROM_LAST_OFFSET, the client's default) on a young topic
reads what was sent before it started, as against an Apache broker: QUERY_CONSUMER_OFFSET
answers 0 while a queue's first message is still in memory (issue 23)."""

import threading

from rocketmq.client import Message, Producer, PushConsumer, SendStatus

from quiver_e2e import wait_until

COUNT = 200


def test_a_new_group_reads_a_young_topic_from_its_start(broker, quiver):
    topic, group = "interop-young", "py-new-group"
    quiver.create_topic(topic, 4)
    producer = Producer("py-young-writers")
    producer.set_namesrv_addr(broker.addr)
    producer.start()
    try:
        for i in range(COUNT):
            msg = Message(topic)
            msg.set_body(f"young-{i}")
            assert producer.send_sync(msg).status == SendStatus.OK
    finally:
        producer.shutdown()

    received, lock = set(), threading.Lock()

    def on_message(msg):
        with lock:
            received.add(msg.body.decode())

    # No offsets reset: the group is new and starts where the broker says.
    consumer = PushConsumer(group)
    consumer.set_namesrv_addr(broker.addr)
    consumer.subscribe(topic, on_message)
    consumer.start()
    try:
        wait_until(lambda: len(received) >= COUNT, 60, "the new group to get every message")
        # An online subscriber: mqadmin's QUERY_TOPIC_CONSUME_BY_WHO names the group.
        assert group in quiver.json("topics", "consumers", topic)
    finally:
        consumer.shutdown()
    with lock:
        assert received == {f"young-{i}" for i in range(COUNT)}
