"""Messages produced by the Rust client arrive at the Python (C++) client intact."""

import threading

from rocketmq.client import PushConsumer

from quiver_e2e import wait_until


def test_python_consumer_reads_rust_messages_with_tags_keys_and_properties(broker, quiver):
    topic, group = "interop-r2p", "py-readers"
    quiver.create_topic(topic, 4)
    # Commit offset 0 for the new group, so the Python consumer reads from the start.
    quiver.run("offsets", "reset", "--group", group, "--topic", topic, "--to", "earliest")
    bodies = [f"rust-{i}" for i in range(20)]
    sent = quiver.json(
        "produce", "--topic", topic, "--tags", "TagA", "--keys", "order-1,order-2",
        "--property", "color=blue", "--property", "size=XL", *bodies,
    )
    assert sent["sent"] == len(bodies)
    ids = {r["msg_id"] for r in sent["results"]}
    # One untagged message must be filtered out by the Python side's tag subscription.
    quiver.run("produce", "--topic", topic, "untagged")

    received, lock = [], threading.Lock()

    # Returning normally acknowledges the message; raising would ask for redelivery.
    def on_message(msg):
        with lock:
            received.append({
                "body": msg.body.decode(), "tags": msg.tags.decode() if isinstance(msg.tags, bytes) else msg.tags,
                "keys": msg.keys.decode() if isinstance(msg.keys, bytes) else msg.keys, "id": msg.id,
                "color": msg.get_property("color"), "size": msg.get_property("size"), "topic": msg.topic,
            })

    consumer = PushConsumer(group)
    consumer.set_namesrv_addr(broker.addr)
    consumer.subscribe(topic, on_message, "TagA")
    consumer.start()
    try:
        wait_until(lambda: len(received) >= len(bodies), 60, "the Python consumer to get every message")
    finally:
        consumer.shutdown()
    with lock:
        got = list(received)
    assert sorted(m["body"] for m in got) == sorted(bodies)
    for m in got:
        def text(v):
            return v.decode() if isinstance(v, bytes) else v
        assert text(m["tags"]) == "TagA"
        assert text(m["keys"]) == "order-1 order-2"
        assert text(m["color"]) == "blue"
        assert text(m["size"]) == "XL"
        assert text(m["topic"]) == topic
        assert text(m["id"]) in ids
