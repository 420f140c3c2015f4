"""The 5.x Producer over gRPC: normal, FIFO, delayed and transactional messages, read back by
the 5.x SimpleConsumer."""

import threading
import time

import pytest
from rocketmq import TransactionChecker, TransactionResolution

from v5 import message, producer, receive_all, receive_nothing, simple_consumer, text


def test_normal_messages_arrive_with_tag_keys_properties_and_ids(broker):
    topic, group = "NormalTopic", "normal-readers"
    broker.create_topic(topic)
    broker.create_group(group)
    broker.from_earliest(group, topic)
    with producer(broker, [topic]) as p:
        sent = {}
        for i in range(10):
            receipt = p.send(message(topic, f"n-{i}", tag="TagA", keys=(f"k-{i}", "order-7"),
                                     properties={"color": "blue"}))
            sent[f"n-{i}"] = receipt.message_id
        p.send(message(topic, "filtered-out", tag="TagB"))
    with simple_consumer(broker, group, topic, "TagA") as c:
        got = receive_all(c, 10)
        assert receive_nothing(c, 3) == [], "acked messages are never received again"
    assert sorted(text(m.body) for m in got) == sorted(sent)
    for m in got:
        body = text(m.body)
        assert m.message_id == sent[body]
        assert m.topic == topic
        assert m.tag == "TagA"
        assert set(m.keys) == {f"k-{body.split('-')[1]}", "order-7"}
        assert m.properties.get("color") == "blue"
        assert m.delivery_attempt == 1
        assert not m.corrupted, "the body digest matches the body"


def test_fifo_message_groups_arrive_in_order_one_batch_in_flight(broker):
    topic, group = "FifoTopic", "fifo-readers"
    broker.create_topic(topic, queues=1)
    broker.create_group(group, fifo=True)
    broker.from_earliest(group, topic)
    with producer(broker, [topic]) as p:
        for i in range(10):
            for order in ("a", "b"):
                p.send(message(topic, f"{order}-{i}", group=f"order-{order}"))
    with simple_consumer(broker, group, topic) as c:
        first = receive_all(c, 1, ack=False)
        assert text(first[0].body) == "a-0"
        # One queue, its batch in flight: nothing more until that batch is acked.
        assert receive_nothing(c, 3) == []
        for m in first:
            c.ack(m)
        rest = receive_all(c, 20 - len(first))
    bodies = [text(m.body) for m in first + rest]
    for order in ("a", "b"):
        assert [b for b in bodies if b.startswith(order)] == [f"{order}-{i}" for i in range(10)]
    assert all(m.message_group in ("order-a", "order-b") for m in rest)


def test_a_delayed_message_stays_hidden_until_its_delivery_time(broker):
    topic, group = "DelayTopic", "delay-readers"
    broker.create_topic(topic)
    broker.create_group(group)
    broker.from_earliest(group, topic)
    deliver_at_ms = int(time.time() * 1000) + 6000
    with producer(broker, [topic]) as p:
        p.send(message(topic, "later", deliver_at_ms=deliver_at_ms))
        p.send(message(topic, "now"))
    with simple_consumer(broker, group, topic) as c:
        early = receive_all(c, 1)
        assert [text(m.body) for m in early] == ["now"]
        late = receive_all(c, 1, timeout=60)
        received_at_ms = time.time() * 1000
    assert [text(m.body) for m in late] == ["later"]
    assert received_at_ms >= deliver_at_ms, "the delayed message came before its time"
    assert late[0].delivery_timestamp == deliver_at_ms


class Checker(TransactionChecker):
    """Answers the broker's check-back by the body's first word; records what it was asked."""

    def __init__(self):
        self.lock = threading.Lock()
        self.asked = []

    def check(self, msg):
        body = text(msg.body)
        with self.lock:
            self.asked.append(body)
        return TransactionResolution.COMMIT if body.startswith("commit") else TransactionResolution.ROLLBACK

    def asked_for(self):
        with self.lock:
            return set(self.asked)


def test_transactions_commit_and_rollback(broker):
    topic, group = "TxTopic", "tx-readers"
    broker.create_topic(topic)
    broker.create_group(group)
    broker.from_earliest(group, topic)
    with producer(broker, [topic], checker=Checker()) as p, simple_consumer(broker, group, topic) as c:
        committed = p.begin_transaction()
        sent = p.send(message(topic, "commit-me", keys=("tx-1",)), committed)
        rolled_back = p.begin_transaction()
        p.send(message(topic, "roll-me-back"), rolled_back)
        assert receive_nothing(c, 3) == [], "half messages are invisible"
        committed.commit()
        rolled_back.rollback()
        got = receive_all(c, 1)
        assert [(text(m.body), m.message_id) for m in got] == [("commit-me", sent.message_id)]
        assert receive_nothing(c, 4) == [], "a rolled-back message never arrives"


@pytest.mark.parametrize("broker_extra", [["--transaction-timeout-ms", "1000"]], indirect=True)
def test_an_unfinished_transaction_is_resolved_by_check_back(broker):
    topic, group = "TxCheckTopic", "tx-check-readers"
    broker.create_topic(topic)
    broker.create_group(group)
    broker.from_earliest(group, topic)
    checker = Checker()
    with producer(broker, [topic], checker=checker) as p, simple_consumer(broker, group, topic) as c:
        # Neither transaction is ended: the broker asks the producer over its telemetry stream.
        p.send(message(topic, "commit-by-check"), p.begin_transaction())
        p.send(message(topic, "rollback-by-check"), p.begin_transaction())
        got = receive_all(c, 1, timeout=60)
        assert [text(m.body) for m in got] == ["commit-by-check"]
        assert receive_nothing(c, 4) == []
    assert checker.asked_for() == {"commit-by-check", "rollback-by-check"}
