"""4.x push consumer process (PyPI rocketmq 0.4.4, run with QUIVER_PYTHON):
`python v4_consume.py NAMESRV GROUP TOPIC EXPRESSION COUNT SECONDS` prints one JSON line per
message (body, tags, keys, id, color, topic) until COUNT distinct bodies came, or exits 1 after
SECONDS."""

import json
import os
import sys
import threading
import time

from rocketmq.client import PushConsumer


def text(value):
    return value.decode() if isinstance(value, bytes) else value


def main(namesrv, group, topic, expression, count, seconds):
    seen, lock, done = set(), threading.Lock(), threading.Event()

    def on_message(msg):
        line = json.dumps({
            "body": text(msg.body), "tags": text(msg.tags), "keys": text(msg.keys),
            "id": text(msg.id), "color": text(msg.get_property("color")), "topic": text(msg.topic),
        })
        with lock:
            print(line, flush=True)
            seen.add(text(msg.body))
            if len(seen) >= count:
                done.set()

    consumer = PushConsumer(group)
    consumer.set_namesrv_addr(namesrv)
    consumer.subscribe(topic, on_message, expression)
    consumer.start()
    finished = done.wait(seconds)
    time.sleep(1)  # lets the consumer commit what it consumed
    sys.stdout.flush()
    # The C++ client sometimes aborts its process while a consumer shuts down (see
    # e2e/README.md, disk): the lines are out, so the process ends without it.
    os._exit(0 if finished else 1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), float(sys.argv[6]))
