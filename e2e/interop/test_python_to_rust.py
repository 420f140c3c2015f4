"""Messages produced by the Python (C++) client arrive at the Rust client intact."""

from rocketmq.client import Message, Producer, SendStatus


def test_rust_consumer_reads_python_messages_with_tags_keys_and_properties(broker, quiver):
    topic = "interop-p2r"
    quiver.create_topic(topic, 4)
    producer = Producer("py-writers")
    producer.set_namesrv_addr(broker.addr)
    producer.start()
    sent_ids = {}
    try:
        for i in range(15):
            msg = Message(topic)
            msg.set_keys(f"key-{i}")
            msg.set_tags("TagP")
            msg.set_property("origin", "python")
            msg.set_body(f"py-{i}")
            result = producer.send_sync(msg)
            assert result.status == SendStatus.OK
            sent_ids[f"py-{i}"] = result.msg_id
    finally:
        producer.shutdown()

    lines = quiver.json_lines(
        "consume", "--topic", topic, "--group", "rust-readers", "--from", "first",
        "--max", str(len(sent_ids)), "--idle-timeout-secs", "30",
    )
    assert sorted(m["body"] for m in lines) == sorted(sent_ids)
    for m in lines:
        assert m["topic"] == topic
        assert m["tags"] == "TagP"
        assert m["keys"] == [f"key-{m['body'].split('-')[1]}"]
        assert m["properties"]["origin"] == "python"
        assert m["msg_id"] == sent_ids[m["body"]]

    # The group committed everything it printed: its lag is now zero on every queue.
    lag = quiver.json("lag", "--group", "rust-readers", "--topic", topic)
    assert lag and all(q["lag_messages"] == 0 for q in lag), lag
