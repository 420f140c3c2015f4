"""A stock push consumer (PyPI rocketmq 0.4.4) in a process of its own (the C++ client can
abort its whole process while a consumer shuts down). Appends every delivery to OUT as a JSON
line [key, queue_id, queue_offset, reconsume_times] until the parent terminates it.

usage: consumer_main.py NAMESRV GROUP TOPIC OUT
"""

import json
import os
import sys
import threading
import time

from rocketmq.client import PushConsumer

LIFETIME_S = 900


def main():
    namesrv, group, topic, out_path = sys.argv[1:5]
    lock = threading.Lock()
    out = open(out_path, "a", buffering=1, encoding="utf-8")

    def on_message(msg):
        key = msg.keys.decode() if isinstance(msg.keys, bytes) else msg.keys
        line = json.dumps([key, msg.queue_id, msg.queue_offset, msg.reconsume_times])
        with lock:
            out.write(line + "\n")

    consumer = PushConsumer(group)
    consumer.set_namesrv_addr(namesrv)
    consumer.subscribe(topic, on_message, "*")
    consumer.start()
    print("started", flush=True)
    time.sleep(LIFETIME_S)
    os._exit(0)


if __name__ == "__main__":
    main()
