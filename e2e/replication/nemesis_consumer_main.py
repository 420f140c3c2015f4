"""The nemesis's push consumer: the stock client (PyPI rocketmq 0.4.4) in a process of its own,
with ONE consume thread, so that its deliveries of a queue come in the order the client pulled
them (the checker's monotonicity rule relies on it). Appends every delivery to OUT as a JSON
line [key, queue_id, queue_offset, reconsume_times, monotonic time] until terminated.

usage: nemesis_consumer_main.py NAMESRV GROUP TOPIC OUT
"""

import json
import os
import sys
import threading
import time

from rocketmq.client import PushConsumer

LIFETIME_S = 3600


def main():
    namesrv, group, topic, out_path = sys.argv[1:5]
    lock = threading.Lock()
    out = open(out_path, "a", buffering=1, encoding="utf-8")

    def on_message(msg):
        key = msg.keys.decode() if isinstance(msg.keys, bytes) else msg.keys
        line = json.dumps([key, msg.queue_id, msg.queue_offset, msg.reconsume_times,
                           round(time.monotonic(), 6)])
        with lock:
            out.write(line + "\n")

    consumer = PushConsumer(group)
    consumer.set_namesrv_addr(namesrv)
    consumer.set_thread_count(1)
    consumer.subscribe(topic, on_message, "*")
    consumer.start()
    print("started", flush=True)
    time.sleep(LIFETIME_S)
    os._exit(0)


if __name__ == "__main__":
    main()
