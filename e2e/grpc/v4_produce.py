"""4.x producer process (PyPI rocketmq 0.4.4, run with QUIVER_PYTHON):
`python v4_produce.py NAMESRV TOPIC PREFIX COUNT` sends PREFIX-0..PREFIX-COUNT-1 with tag TagA,
keys `<body> order-7` and property color=blue; prints one JSON line per send: body, msg_id."""

import json
import sys

from rocketmq.client import Message, Producer, SendStatus


def send(producer, msg):
    # A fresh C++ producer can fail its first sends with "No route info" without sending
    # anything (see e2e/broker/clients.py): such a send is tried again.
    for attempt in range(5):
        try:
            return producer.send_sync(msg)
        except Exception:
            if attempt == 4:
                raise


def main(namesrv, topic, prefix, count):
    producer = Producer("v4-cross-producer")
    producer.set_namesrv_addr(namesrv)
    producer.start()
    try:
        for i in range(count):
            body = f"{prefix}-{i}"
            msg = Message(topic)
            msg.set_tags("TagA")
            msg.set_keys(f"{body} order-7")
            msg.set_property("color", "blue")
            msg.set_body(body)
            result = send(producer, msg)
            assert result.status == SendStatus.OK, result.status
            print(json.dumps({"body": body, "msg_id": result.msg_id}), flush=True)
    finally:
        producer.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
