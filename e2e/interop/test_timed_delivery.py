"""Timed delivery with the stock Python client (rocketmq 0.4.4, Apache's C++ client): the
RocketMQ 5.x properties TIMER_DELAY_MS and TIMER_DELIVER_MS set with `set_property` reach a
push consumer no earlier than due, as does `quiver produce --delay-ms`; a delay level set with `set_delay_time_level` still works."""

import threading
import time

from rocketmq.client import Message, Producer, PushConsumer, SendStatus

from quiver_e2e import wait_until


def _now_ms():
    return int(time.time() * 1000)


def test_timer_properties_and_delay_levels_arrive_no_earlier_than_due(broker, quiver):
    topic, group = "interop-timed", "py-timed-readers"
    quiver.create_topic(topic, 2)
    quiver.run("offsets", "reset", "--group", group, "--topic", topic, "--to", "earliest")
    producer = Producer("py-timed-writers")
    producer.set_namesrv_addr(broker.addr)
    producer.start()
    due = {}
    try:
        sent_at = _now_ms()
        msg = Message(topic)
        msg.set_body("delay-ms")
        msg.set_property("TIMER_DELAY_MS", "1500")
        msg.set_property("color", "red")
        assert producer.send_sync(msg).status == SendStatus.OK
        due["delay-ms"] = sent_at + 1500

        deliver_at = _now_ms() + 2000
        msg = Message(topic)
        msg.set_body("deliver-ms")
        msg.set_property("TIMER_DELIVER_MS", str(deliver_at))
        assert producer.send_sync(msg).status == SendStatus.OK
        due["deliver-ms"] = deliver_at

        sent_at = _now_ms()
        msg = Message(topic)
        msg.set_body("level-1")
        msg.set_delay_time_level(1)
        assert producer.send_sync(msg).status == SendStatus.OK
        due["level-1"] = sent_at + 1000
    finally:
        producer.shutdown()
    # The Rust CLI sets the same property.
    sent_at = _now_ms()
    quiver.run("produce", "--topic", topic, "--delay-ms", "1000", "cli-delay-ms")
    due["cli-delay-ms"] = sent_at + 1000

    received, lock = {}, threading.Lock()

    def on_message(msg):
        with lock:
            received[msg.body.decode()] = (_now_ms(), msg.store_timestamp, msg.get_property("color"))

    consumer = PushConsumer(group)
    consumer.set_namesrv_addr(broker.addr)
    consumer.subscribe(topic, on_message)
    consumer.start()
    try:
        wait_until(lambda: len(received) >= 4, 60, "the four timed messages")
    finally:
        consumer.shutdown()
    with lock:
        got = dict(received)
    assert sorted(got) == sorted(due)
    for body, (received_ms, stored_ms, _) in got.items():
        assert stored_ms >= due[body], (body, stored_ms, due[body])
        assert received_ms >= due[body], (body, received_ms, due[body])
    assert got["delay-ms"][2] in (b"red", "red"), got
