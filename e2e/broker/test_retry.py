"""A consumer that answers RECONSUME_LATER gets the message again from %RETRY%<group>."""

import pytest

from clients import Collector, produce, start_consumer
from quiver_e2e import wait_until


@pytest.mark.timeout(120)
def test_reconsume_later_redelivers_from_retry_topic(make_broker):
    broker = make_broker().start()
    collector = Collector(fail_first_delivery=True)
    consumer = start_consumer(broker.addr, "RetryGroup", "RetryTopic", collector)
    try:
        wait_until(lambda: (broker.metric("quiver_parked_pulls") or 0) >= 9, 60, "consumer placed")
        produce(broker.addr, "RetryTopic", range(5))
        keys = {f"k-{i}" for i in range(5)}
        # Delay level 3 (10 s) applies to the first retry.
        wait_until(lambda: collector.redelivered >= keys, 60, "every message redelivered")
        assert broker.metric("rocketmq_messages_in_total", topic="%RETRY%RetryGroup") >= 5
    finally:
        consumer.shutdown()
    assert broker.stop() == 0
