"""Producer process for the disk suite: sends 1 KiB messages until the broker refuses them.

    python fill_main.py NAMESRV TOPIC FIRST MAX_COUNT FAIL_STREAK DEADLINE_S OUT_PATH

Sends keys k-FIRST, k-FIRST+1, ... one at a time with send_sync (the stock Apache client,
PyPI rocketmq 0.4.4) and stops after FAIL_STREAK consecutive failed sends, after MAX_COUNT
sends or after DEADLINE_S seconds, whichever comes first. Each outcome is appended to OUT_PATH
(outside the file system under test) and flushed at once, so what was acknowledged is known
even if this process or the broker dies:

    ack KEY_INDEX QUEUE_OFFSET
    notok KEY_INDEX STATUS          (a reply other than SEND_OK: not counted as acknowledged)
    fail KEY_INDEX SECONDS ERROR    (send_sync raised; ERROR is the client's text, one line)

A failed key is not sent again: the next try uses the next key, so every key is sent once.
Run apart from the consumers (see e2e/broker/produce_main.py for why).
"""

import sys
import time

from rocketmq.client import Message, Producer, SendStatus

from disk_helpers import body_of

# Before the first acknowledgement a failure may be the client's known first-route-lookup
# flake (e2e/broker/clients.py); allow more of them, slowly, before giving up.
STARTUP_FAILURES = 20


def main():
    namesrv, topic = sys.argv[1], sys.argv[2]
    first, max_count, fail_streak = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    deadline = time.monotonic() + float(sys.argv[6])
    out = open(sys.argv[7], "a", buffering=1)

    producer = Producer(f"quiver-disk-fill-{first}")
    producer.set_namesrv_addr(namesrv)
    producer.start()
    acked = streak = 0
    try:
        for i in range(first, first + max_count):
            if time.monotonic() > deadline:
                out.write("stop deadline\n")
                break
            msg = Message(topic)
            msg.set_keys(f"k-{i}")
            msg.set_body(body_of(i))
            started = time.monotonic()
            try:
                result = producer.send_sync(msg)
            except Exception as error:  # the binding raises ProducerSendSyncFailed
                text = " ".join(f"{type(error).__name__}: {error}".split())
                out.write(f"fail {i} {time.monotonic() - started:.3f} {text}\n")
                streak += 1
                if acked == 0 and streak < STARTUP_FAILURES:
                    time.sleep(0.5)
                    continue
                if streak >= fail_streak:
                    out.write("stop refused\n")
                    break
                continue
            if result.status == SendStatus.OK:
                out.write(f"ack {i} {result.offset}\n")
                acked += 1
                streak = 0
            else:
                out.write(f"notok {i} {result.status}\n")
                streak += 1
                if streak >= fail_streak:
                    out.write("stop refused\n")
                    break
        else:
            out.write("stop count\n")
    finally:
        out.flush()
        producer.shutdown()
    print(f"acked {acked}")


if __name__ == "__main__":
    main()
