"""Thin helpers over Apache's RocketMQ 5.x Python client (PyPI rocketmq-python-client 5.1.2)."""

import contextlib
import threading
import time

from rocketmq import (ClientConfiguration, ConsumeResult, Credentials, FilterExpression, Message,
                      MessageListener, Producer, PushConsumer, SimpleConsumer)

# Seconds a SimpleConsumer's receive waits for messages on the broker (long polling); the
# client's own deadline is this plus its request timeout.
AWAIT_SECONDS = 2


def config(broker):
    return ClientConfiguration(broker.grpc_endpoint, Credentials(), request_timeout=10)


def message(topic, body, tag=None, keys=(), properties=None, group=None, deliver_at_ms=None):
    msg = Message()
    msg.topic = topic
    msg.body = body.encode() if isinstance(body, str) else body
    if tag:
        msg.tag = tag
    if keys:
        msg.keys = keys[0]
        for key in keys[1:]:
            msg.keys = key
    for name, value in (properties or {}).items():
        msg.add_property(name, value)
    if group:
        msg.message_group = group
    if deliver_at_ms:
        msg.delivery_timestamp = deliver_at_ms
    return msg


@contextlib.contextmanager
def producer(broker, topics, checker=None):
    p = Producer(config(broker), topics=tuple(topics), checker=checker)
    p.startup()
    try:
        yield p
    finally:
        p.shutdown()


@contextlib.contextmanager
def simple_consumer(broker, group, topic, expression="*"):
    c = SimpleConsumer(config(broker), group, {topic: FilterExpression(expression)},
                       await_duration=AWAIT_SECONDS)
    c.startup()
    try:
        yield c
    finally:
        c.shutdown()


def receive_all(consumer, count, invisible_seconds=30, timeout=60, ack=True):
    """Receives until `count` messages came (acking each when `ack`); fails after `timeout`."""
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < count:
        assert time.monotonic() < deadline, f"received {len(got)} of {count} within {timeout}s"
        for msg in consumer.receive(16, invisible_seconds):
            got.append(msg)
            if ack:
                consumer.ack(msg)
    return got


def receive_nothing(consumer, seconds, invisible_seconds=30):
    """Receives for `seconds`, returning whatever came (a test expects none)."""
    got = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        got.extend(consumer.receive(16, invisible_seconds))
    return got


def text(value):
    return value.decode() if isinstance(value, bytes) else value


class Recorder(MessageListener):
    """A PushConsumer's listener: records each delivery (body, attempt), thread-safe; fails the
    first attempt of bodies in `fail_first` on purpose."""

    def __init__(self, fail_first=()):
        self.lock = threading.Lock()
        self.deliveries = []
        self.fail_first = set(fail_first)

    def consume(self, message):
        body = text(message.body)
        with self.lock:
            self.deliveries.append((body, message.delivery_attempt))
        if body in self.fail_first and message.delivery_attempt == 1:
            return ConsumeResult.FAILURE
        return ConsumeResult.SUCCESS

    def bodies(self):
        with self.lock:
            return [body for body, _ in self.deliveries]

    def attempts(self, body):
        with self.lock:
            return [attempt for b, attempt in self.deliveries if b == body]


@contextlib.contextmanager
def push_consumer(broker, group, topic, listener, expression="*"):
    c = PushConsumer(config(broker), group, listener, {topic: FilterExpression(expression)},
                     consumption_thread_count=4)
    c.startup()
    try:
        yield c
    finally:
        c.shutdown()
