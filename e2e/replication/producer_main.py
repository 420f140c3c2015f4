"""One producer generation (the stock client, PyPI rocketmq 0.4.4) in a process of its own.

    python producer_main.py NAMESRV TOPIC QUEUES FIRST OUT STOP_FILE RATE

Sends k-FIRST, k-FIRST+1, ... one at a time (send_orderly to queue n % QUEUES, so the queue of
every acknowledged send is known) until STOP_FILE exists, at most RATE sends a second. Every
attempt and outcome is appended to OUT at once (line-buffered), so what was acknowledged is
known even if this process dies:

    try N MONOTONIC
    ack N QUEUE QUEUE_OFFSET MONOTONIC MSG_ID
    notok N STATUS MONOTONIC      (answered, but not SEND_OK: not acknowledged)
    fail N MONOTONIC ERROR        (send_orderly raised; ERROR is the client's text, one line)

After the first send that is not acknowledged the process exits 3 without sending further:
the C++ client refreshes its routes only every 30 s, so the driver (workload.py) starts a new
process, with a fresh route, which retries the same key. It never shuts the client down
(the C++ client can abort its process there); os._exit ends it.
"""

import os
import sys
import time

from rocketmq.client import Message, Producer, SendStatus


def main():
    namesrv, topic = sys.argv[1], sys.argv[2]
    queues, first = int(sys.argv[3]), int(sys.argv[4])
    out = open(sys.argv[5], "a", buffering=1)
    stop_file, rate = sys.argv[6], float(sys.argv[7])
    # The client's timeout above the broker's --replication-timeout-ms (3 s), so an unconfirmed
    # send comes back as FLUSH_SLAVE_TIMEOUT rather than as a client timeout.
    producer = Producer(f"repl-producer-{os.getpid()}", timeout=6000)
    producer.set_namesrv_addr(namesrv)
    producer.start()
    n = first
    interval = 1.0 / rate if rate > 0 else 0.0
    next_at = time.monotonic()
    while not os.path.exists(stop_file):
        if interval:
            pause = next_at - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            next_at = max(next_at + interval, time.monotonic() - 1.0)
        msg = Message(topic)
        msg.set_keys(f"k-{n}")
        msg.set_body(f"body-{n}")
        queue = n % queues
        out.write(f"try {n} {time.monotonic():.6f}\n")
        try:
            result = producer.send_orderly(msg, queue, retry_times=0)
        except Exception as error:  # the binding raises ProducerSendOrderlyFailed and kin
            text = " ".join(f"{type(error).__name__}: {error}".split())[:300]
            out.write(f"fail {n} {time.monotonic():.6f} {text}\n")
            out.flush()
            os._exit(3)
        if result.status == SendStatus.OK:
            out.write(f"ack {n} {queue} {result.offset} {time.monotonic():.6f} {result.msg_id}\n")
            n += 1
        else:
            out.write(f"notok {n} {result.status.name} {time.monotonic():.6f}\n")
            out.flush()
            os._exit(3)
    out.write(f"stop {n} {time.monotonic():.6f}\n")
    out.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
