"""Transactions with the stock client's messages: a half message (property TRAN_MSG, as
Apache's brokers read it) from the C++ producer is invisible to the stock push consumer until
the producer group, asked with CHECK_TRANSACTION_STATE, commits it; rolled-back ones never
arrive. The check answers come over a raw remoting connection (rocketmq 0.4.4 has no
transactional producer)."""

import json

import pytest
from rocketmq.client import Message, Producer, SendStatus

import remoting
from clients import Collector, start_consumer
from quiver_e2e import wait_until

TOPIC = "TxTopic"
TX_GROUP = "tx-e2e-group"


def send_half(producer, body):
    msg = Message(TOPIC)
    msg.set_keys(body)
    msg.set_body(body)
    msg.set_property("TRAN_MSG", "true")
    msg.set_property("PGROUP", TX_GROUP)
    # The C++ client can fail a fresh producer's first sends with "No route info" without
    # sending anything (see clients.produce): such a send is tried again.
    for attempt in range(5):
        try:
            result = producer.send_sync(msg)
            break
        except Exception:
            if attempt == 4:
                raise
    assert result.status == SendStatus.OK, result.status
    return result.msg_id


@pytest.mark.timeout(120)
def test_stock_consumer_gets_only_what_the_check_back_commits(make_broker):
    broker = make_broker(extra=[
        "--transaction-timeout-ms", "500",
        "--transaction-check-interval-ms", "100",
    ]).start()
    checker = remoting.Connection(broker.addr)
    heartbeat = {"clientID": "tx-checker", "producerDataSet": [{"groupName": TX_GROUP}], "consumerDataSet": []}
    code, remark, _ = checker.call(remoting.HEART_BEAT, body=json.dumps(heartbeat).encode())
    assert code == 0, remark
    collector = Collector()
    consumer = start_consumer(broker.addr, "TxConsumers", TOPIC, collector)
    producer = Producer("tx-e2e-plain")
    producer.set_namesrv_addr(broker.addr)
    producer.start()
    try:
        outcomes = {}
        for body in ["commit-0", "rollback-0", "commit-1", "rollback-1"]:
            transaction_id = send_half(producer, body)
            outcomes[transaction_id] = 8 if body.startswith("commit") else 12
        answered = set()
        while answered != set(outcomes):
            ext, body = checker.next_request(remoting.CHECK_TRANSACTION_STATE)
            transaction_id = ext["transactionId"]
            assert transaction_id in outcomes, ext
            checker.oneway(remoting.END_TRANSACTION, {
                "producerGroup": TX_GROUP,
                "tranStateTableOffset": ext["tranStateTableOffset"],
                "commitLogOffset": ext["commitLogOffset"],
                "commitOrRollback": outcomes[transaction_id],
                "fromTransactionCheck": "true",
                "msgId": transaction_id,
                "transactionId": transaction_id,
            })
            answered.add(transaction_id)
        wait_until(lambda: collector.distinct() >= {"commit-0", "commit-1"}, 60, "the commits delivered")
        assert broker.metric("rocketmq_messages_in_total", topic=TOPIC) == 2
        assert collector.distinct() == {"commit-0", "commit-1"}
        assert broker.metric("quiver_transaction_checks_total", result="sent") >= 4
    finally:
        producer.shutdown()
        consumer.shutdown()
        checker.close()
    assert broker.stop() == 0
