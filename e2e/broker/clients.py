"""Thin helpers over the real RocketMQ client (PyPI rocketmq 0.4.4, the Apache C++ client)."""

import os
import subprocess
import sys
import threading

from rocketmq.client import Message, Producer, PushConsumer, SendStatus

HERE = os.path.dirname(os.path.abspath(__file__))
# The C++ client sends it as the `OnsChannel` extField, signed like the others.
ACL_CHANNEL = "LOCAL"


def tags_of(i):
    return "TagA" if i % 2 == 0 else "TagB"


def produce(namesrv, topic, keys, timeout=240, attempts=3, credentials=None):
    """Sends keys (a range) from a separate producer process; fails the test if it fails.

    The C++ client sometimes fails a send with "No route info of this topic": at a fresh
    producer's very first route lookup (about 1 start in 6 against a 3-broker cluster), and,
    more rarely, mid-stream when it opens its connection to another broker. A capturing proxy
    showed the broker's route answer byte-identical in failing and passing starts, and the
    broker logs no refused send then: the client turns a failed name-server call or a
    transport it could not create in time (its timed_mutex) into that message without
    retrying, as apache/rocketmq-client-cpp issues #455 and #485 describe against Apache's own
    brokers. The failed send never left the client, so the process is started again from the
    first key not sent, at most `attempts` times; a duplicate would still show in the counts.
    """
    remaining = keys
    for attempt in range(attempts):
        done = subprocess.run(
            [sys.executable, os.path.join(HERE, "produce_main.py"), namesrv, topic,
             str(remaining.start), str(remaining.stop), *(credentials or ())],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if done.returncode == 0:
            return
        sent = [line for line in done.stdout.splitlines() if line.startswith("sent ")]
        if "No route info" not in done.stderr or not sent or attempt == attempts - 1:
            break
        remaining = range(remaining.start + int(sent[-1].split()[1]), remaining.stop)
    raise AssertionError(f"producer failed:\n{done.stdout}\n{done.stderr}")


def send_range(namesrv, topic, keys, group="quiver-e2e-producer", credentials=None):
    """Sends one message per key (sync), with tags and keys; returns the send results.
    `credentials` (access key, secret key) sign every request (RocketMQ ACL)."""
    producer = Producer(group)
    producer.set_namesrv_addr(namesrv)
    if credentials:
        producer.set_session_credentials(*credentials, ACL_CHANNEL)
    producer.start()
    results = []
    try:
        for i in keys:
            msg = Message(topic)
            msg.set_keys(f"k-{i}")
            msg.set_tags(tags_of(i))
            msg.set_body(f"body-{i}")
            try:
                result = producer.send_sync(msg)
            except Exception:
                # Lets produce() start again from the first key not sent.
                print(f"sent {len(results)}", flush=True)
                raise
            assert result.status == SendStatus.OK, f"send {i}: {result.status}"
            results.append(result)
    finally:
        producer.shutdown()
    return results


class Collector:
    """Records what a push consumer received, thread-safe (callbacks run on C++ threads)."""

    def __init__(self, fail_first_delivery=False):
        self.lock = threading.Lock()
        self.keys = {}
        self.redelivered = set()
        self.fail_first_delivery = fail_first_delivery

    def __call__(self, msg):
        key = msg.keys.decode() if isinstance(msg.keys, bytes) else msg.keys
        with self.lock:
            self.keys[key] = self.keys.get(key, 0) + 1
            if msg.reconsume_times > 0:
                self.redelivered.add(key)
        if self.fail_first_delivery and msg.reconsume_times == 0:
            # The binding turns an exception into RECONSUME_LATER.
            raise RuntimeError("fail the first delivery on purpose")

    def distinct(self):
        with self.lock:
            return set(self.keys)


def start_consumer(namesrv, group, topic, collector, expression="*", credentials=None):
    consumer = PushConsumer(group)
    consumer.set_namesrv_addr(namesrv)
    if credentials:
        consumer.set_session_credentials(*credentials, ACL_CHANNEL)
    consumer.subscribe(topic, collector, expression)
    consumer.start()
    return consumer
