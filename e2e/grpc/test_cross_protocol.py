"""One store for both protocols: a message sent over gRPC by the 5.x Producer is read by the
4.x push consumer (PyPI rocketmq 0.4.4, a QUIVER_PYTHON subprocess: both clients are named
`rocketmq`), and a 4.x message by the 5.x SimpleConsumer, with tags, keys, properties and
message ids intact."""

import json
import os
import subprocess

from v5 import message, producer, receive_all, receive_nothing, simple_consumer, text

HERE = os.path.dirname(os.path.abspath(__file__))


def v4(script, *args, timeout=120):
    done = subprocess.run([os.environ["QUIVER_PYTHON"], os.path.join(HERE, script), *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0, f"{script} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return lines


def test_a_4x_consumer_reads_what_the_5x_producer_sent(broker):
    topic, group = "FiveToFour", "v4-readers"
    broker.create_topic(topic)
    broker.from_earliest(group, topic)
    with producer(broker, [topic]) as p:
        sent = {}
        for i in range(10):
            body = f"v5-{i}"
            sent[body] = p.send(message(topic, body, tag="TagA", keys=(body, "order-7"),
                                        properties={"color": "blue"})).message_id
        p.send(message(topic, "not-for-TagA", tag="TagB"))
    got = v4("v4_consume.py", broker.addr, group, topic, "TagA", len(sent), 60)
    assert {m["body"] for m in got} == set(sent)
    for m in got:
        assert m["id"] == sent[m["body"]], "the 5.x message id is the 4.x message id"
        assert m["tags"] == "TagA"
        assert set(m["keys"].split()) == {m["body"], "order-7"}
        assert m["color"] == "blue"
        assert m["topic"] == topic


def test_the_5x_simple_consumer_reads_what_a_4x_producer_sent(broker):
    topic, group = "FourToFive", "v5-readers"
    broker.create_topic(topic)
    broker.create_group(group)
    broker.from_earliest(group, topic)
    sent = {line["body"]: line["msg_id"] for line in v4("v4_produce.py", broker.addr, topic, "v4", 10)}
    assert len(sent) == 10
    with simple_consumer(broker, group, topic, "TagA") as c:
        got = receive_all(c, 10)
        assert receive_nothing(c, 3) == []
    assert {text(m.body) for m in got} == set(sent)
    for m in got:
        body = text(m.body)
        assert m.message_id == sent[body], "the 4.x message id is the 5.x message id"
        assert m.tag == "TagA"
        assert set(m.keys) == {body, "order-7"}
        assert m.properties.get("color") == "blue"
        assert m.topic == topic
