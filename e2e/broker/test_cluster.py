"""Three brokers with --peers: one route for the whole cluster, sends spread over all of them,
and a broker drained to read-only takes no new sends while its messages are still consumed."""

import pytest

import remoting
from clients import Collector, produce, start_consumer
from quiver_e2e import free_port, wait_until

TOPIC = "ClusterTopic"
GROUP = "ClusterGroup"


@pytest.mark.timeout(240)
def test_three_broker_cluster(make_broker):
    ports = [free_port() for _ in range(3)]
    addrs = [f"127.0.0.1:{p}" for p in ports]
    brokers = [
        make_broker(name=f"broker-{i}", port=ports[i], peers=addrs).start() for i in range(3)
    ]
    for broker in brokers:
        code, remark, _, _ = remoting.call(
            broker.addr, remoting.UPDATE_AND_CREATE_TOPIC,
            {"topic": TOPIC, "readQueueNums": 4, "writeQueueNums": 4, "perm": 6},
        )
        assert code == 0, remark
    every = {f"broker-{i}": 6 for i in range(3)}
    for broker in brokers:
        wait_until(lambda b=broker: remoting.route(b.addr, TOPIC) == every, 30, f"full route from {broker.name}")

    collector = Collector()
    consumer = start_consumer(addrs[1], GROUP, TOPIC, collector)
    try:
        for broker in brokers:
            wait_until(
                lambda b=broker: (b.metric("quiver_parked_pulls") or 0) >= 4,
                60,
                f"the consumer to pull from {broker.name}",
            )
        produce(addrs[0], TOPIC, range(300))
        stored = [b.metric("rocketmq_messages_in_total", topic=TOPIC) or 0 for b in brokers]
        assert sum(stored) == 300 and all(count > 0 for count in stored), stored

        # Drain broker-2: read-only in every broker's route, so new producers skip it.
        code, remark, _, _ = remoting.call(addrs[2], remoting.UPDATE_BROKER_CONFIG, body=b"brokerPermission=4\n")
        assert code == 0, remark
        drained = dict(every, **{"broker-2": 4})
        for broker in brokers:
            wait_until(lambda b=broker: remoting.route(b.addr, TOPIC) == drained, 30, "broker-2 read-only")
        assert brokers[2].metric("quiver_broker_writable") == 0
        produce(addrs[0], TOPIC, range(300, 600))
        after = [b.metric("rocketmq_messages_in_total", topic=TOPIC) or 0 for b in brokers]
        assert after[2] == stored[2], (stored, after)
        assert sum(after) == 600

        # Everything, including what broker-2 holds, is consumed.
        wait_until(lambda: len(collector.distinct()) == 600, 120, "all 600 messages consumed")
        wait_until(
            lambda: brokers[2].metric("rocketmq_consumer_lag_messages", consumer_group=GROUP, topic=TOPIC) == 0,
            60,
            "broker-2 drained",
        )
    finally:
        consumer.shutdown()
    for broker in brokers:
        assert broker.stop() == 0
