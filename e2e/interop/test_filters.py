"""Filters across clients: a SQL92 subscription of the Rust CLI over messages the Python (C++)
client produced, and a multi-tag subscription of the Python client over messages the Rust CLI
produced. The Python client 0.4.4 cannot subscribe with SQL92 (its `subscribe` takes a tag
expression only), so SQL92 is exercised from the Rust side."""

import threading

from rocketmq.client import Message, Producer, PushConsumer, SendStatus

from quiver_e2e import wait_until


def test_rust_sql92_consumer_gets_exactly_the_matching_python_messages(broker, quiver):
    topic = "interop-sql92"
    quiver.create_topic(topic, 4)
    producer = Producer("py-sql-writers")
    producer.set_namesrv_addr(broker.addr)
    producer.start()
    try:
        for i in range(10):
            msg = Message(topic)
            msg.set_tags("TagA" if i % 2 == 0 else "TagB")
            msg.set_property("a", str(i))
            msg.set_body(f"py-{i}")
            assert producer.send_sync(msg).status == SendStatus.OK
    finally:
        producer.shutdown()

    lines = quiver.json_lines(
        "consume", "--topic", topic, "--group", "rust-sql", "--from", "first",
        "--sql", "a > 5", "--idle-timeout-secs", "5",
    )
    assert sorted(m["body"] for m in lines) == ["py-6", "py-7", "py-8", "py-9"]
    assert all(int(m["properties"]["a"]) > 5 for m in lines)

    both = quiver.json_lines(
        "consume", "--topic", topic, "--group", "rust-sql-tags", "--from", "first",
        "--sql", "a BETWEEN 2 AND 7 AND TAGS = 'TagB'", "--idle-timeout-secs", "5",
    )
    assert sorted(m["body"] for m in both) == ["py-3", "py-5", "py-7"]

    # The group saw every queue to its end: nothing is left behind for it, and nothing else came.
    lag = quiver.json("lag", "--group", "rust-sql", "--topic", topic)
    assert lag and all(q["lag_messages"] == 0 for q in lag), lag


def test_a_bad_sql92_filter_exits_2_naming_the_column(quiver):
    result = quiver.run("consume", "--topic", "interop-sql92", "--sql", "a > 'x'", check=False)
    assert result.returncode == 2, result
    assert "column 3" in result.stderr, result.stderr


def test_python_multi_tag_subscription_gets_only_its_tags(broker, quiver):
    topic, group = "interop-tags", "py-tag-readers"
    quiver.create_topic(topic, 2)
    quiver.run("offsets", "reset", "--group", group, "--topic", topic, "--to", "earliest")
    quiver.run("produce", "--topic", topic, "untagged")
    # TagB goes last, three messages round-robin over two queues: each queue ends with one,
    # so once all six arrive every queue was read past what the filter left out.
    for tag in ["TagC", "TagA", "TagB"]:
        quiver.run("produce", "--topic", topic, "--tags", tag, *[f"{tag}-{i}" for i in range(3)])

    received, lock = [], threading.Lock()

    def on_message(msg):
        with lock:
            received.append(msg.body.decode())

    consumer = PushConsumer(group)
    consumer.set_namesrv_addr(broker.addr)
    consumer.subscribe(topic, on_message, "TagA || TagB")
    consumer.start()
    try:
        wait_until(lambda: len(received) >= 6, 60, "the Python consumer to get TagA and TagB")
    finally:
        consumer.shutdown()
    with lock:
        got = sorted(received)
    assert got == sorted([f"{t}-{i}" for t in ["TagA", "TagB"] for i in range(3)])
