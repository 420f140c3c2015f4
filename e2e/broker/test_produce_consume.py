"""10,000 messages through the real client, a clean restart and a kill -9 under sync flush:
no message is lost and a new consumer resumes from the committed offsets."""

import pytest

from clients import Collector, produce, start_consumer
from quiver_e2e import wait_until

TOPIC = "E2eTopic"
GROUP = "E2eGroup"
QUEUES = 8  # default-queue-nums of an auto-created topic


def wait_pulling(broker, consumers=1):
    """A consumer is placed once its pulls are parked on every queue (topic + retry)."""
    wait_until(
        lambda: (broker.metric("quiver_parked_pulls") or 0) >= consumers * (QUEUES + 1),
        60,
        "the consumer to park pulls on every queue",
    )


def wait_committed(broker, expected):
    wait_until(
        lambda: broker.metric("quiver_consumer_committed_offset", consumer_group=GROUP, topic=TOPIC) == expected,
        60,
        f"committed offsets of {GROUP} to reach {expected}",
    )


@pytest.mark.timeout(300)
def test_ten_thousand_messages_restart_and_kill9(make_broker):
    broker = make_broker(extra=["--flush-mode", "sync"]).start()
    namesrv = broker.addr

    first = Collector()
    consumer = start_consumer(namesrv, GROUP, TOPIC, first)
    try:
        wait_pulling(broker)
        produce(namesrv, TOPIC, range(10_000))
        wait_until(lambda: len(first.distinct()) == 10_000, 120, "all 10,000 messages consumed")
        wait_committed(broker, 10_000)
        assert broker.metric("rocketmq_consumer_lag_messages", consumer_group=GROUP, topic=TOPIC) == 0
    finally:
        consumer.shutdown()
    assert first.distinct() == {f"k-{i}" for i in range(10_000)}

    # Clean restart: offsets and messages survive; only new messages reach a new consumer.
    assert broker.stop() == 0
    broker.start()
    produce(namesrv, TOPIC, range(10_000, 10_500))
    second = Collector()
    consumer = start_consumer(namesrv, GROUP, TOPIC, second)
    try:
        wait_until(lambda: len(second.distinct()) == 500, 90, "the 500 new messages after restart")
        wait_committed(broker, 10_500)
    finally:
        consumer.shutdown()
    assert second.distinct() == {f"k-{i}" for i in range(10_000, 10_500)}

    # kill -9 under sync flush: acknowledged sends survive, committed offsets hold.
    produce(namesrv, TOPIC, range(10_500, 10_800))
    wait_until(
        lambda: broker.metric("rocketmq_consumer_lag_messages", consumer_group=GROUP, topic=TOPIC) == 300,
        30,
        "lag of 300 before the kill",
    )
    broker.kill9()
    broker.start()
    third = Collector()
    consumer = start_consumer(namesrv, GROUP, TOPIC, third)
    try:
        wait_until(lambda: len(third.distinct()) == 300, 90, "the 300 messages sent before kill -9")
        wait_committed(broker, 10_800)
    finally:
        consumer.shutdown()
    assert third.distinct() == {f"k-{i}" for i in range(10_500, 10_800)}
    assert broker.stop() == 0
