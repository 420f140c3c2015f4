"""The stock Python (C++) producer sends with keys; the Rust CLI finds the messages by key,
by the send result's message id and by the offset message id, with their properties."""

import signal

from rocketmq.client import Message, Producer, SendStatus

from conftest import Broker, Quiver


def test_python_messages_are_found_by_key_and_by_id(broker, quiver):
    topic = "interop-query"
    quiver.create_topic(topic, 4)
    producer = Producer("py-keyed")
    producer.set_namesrv_addr(broker.addr)
    producer.start()
    sent = {}
    try:
        for i in range(6):
            msg = Message(topic)
            msg.set_keys(f"order-{i % 2}")
            msg.set_tags("TagQ")
            msg.set_property("origin", "python")
            msg.set_body(f"q-{i}")
            result = producer.send_sync(msg)
            assert result.status == SendStatus.OK
            sent[f"q-{i}"] = result.msg_id
    finally:
        producer.shutdown()

    found = quiver.json_lines("message", "--topic", topic, "--key", "order-1")
    assert sorted(m["body"] for m in found) == ["q-1", "q-3", "q-5"]
    for m in found:
        assert m["topic"] == topic
        assert m["keys"] == ["order-1"]
        assert m["tags"] == "TagQ"
        assert m["properties"]["origin"] == "python"
        assert m["msg_id"] == sent[m["body"]]

    # By the message id the stock client's send result gave (its unique key).
    by_id = quiver.json_lines("message", "--topic", topic, "--id", sent["q-4"])
    assert [m["body"] for m in by_id] == ["q-4"]

    # By the offset message id (store host + CommitLog offset): no topic needed.
    offset_id = by_id[0]["offset_msg_id"]
    viewed = quiver.json_lines("message", "--id", offset_id)
    assert [m["body"] for m in viewed] == ["q-4"]
    assert viewed[0]["msg_id"] == sent["q-4"]

    text = quiver.run("message", "--topic", topic, "--key", "order-0").stdout
    assert "origin=python" in text and "q-0" in text and "q-2" in text


def test_a_key_nobody_sent_exits_4(quiver):
    quiver.create_topic("interop-query-none", 2)
    missing = quiver.run("message", "--topic", "interop-query-none", "--key", "nope", check=False)
    assert missing.returncode == 4, missing.stderr
    assert "no message with key nope in topic interop-query-none found" in missing.stderr


def test_keys_are_found_after_the_broker_is_killed(tmp_path):
    """kill -9 the broker right after the sends: the restarted broker rebuilds the index tail
    from the CommitLog and every key and message id is found again."""
    topic = "interop-query-kill"
    data_dir = str(tmp_path)
    first = Broker(data_dir)
    sent = {}
    try:
        Quiver(first.addr).create_topic(topic, 2)
        producer = Producer("py-keyed-kill")
        producer.set_namesrv_addr(first.addr)
        producer.start()
        try:
            for i in range(20):
                msg = Message(topic)
                msg.set_keys(f"kill-{i % 4} everyone")
                msg.set_body(f"k-{i}")
                result = producer.send_sync(msg)
                assert result.status == SendStatus.OK
                sent[f"k-{i}"] = result.msg_id
        finally:
            producer.shutdown()
    finally:
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(timeout=15)

    second = Broker(data_dir)
    try:
        quiver = Quiver(second.addr)
        everyone = quiver.json_lines("message", "--topic", topic, "--key", "everyone")
        assert sorted(m["body"] for m in everyone) == sorted(sent)
        one = quiver.json_lines("message", "--topic", topic, "--key", "kill-3")
        assert sorted(m["body"] for m in one) == sorted(f"k-{i}" for i in range(3, 20, 4))
        for body, msg_id in list(sent.items())[::5]:
            by_id = quiver.json_lines("message", "--topic", topic, "--id", msg_id)
            assert [m["body"] for m in by_id] == [body]
    finally:
        second.stop()
