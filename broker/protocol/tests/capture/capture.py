"""Capture raw remoting frames sent by a real RocketMQ client (PyPI rocketmq==0.4.4, which
bundles the Apache C++ client) and save them as tests/frames/*.bin.

A tiny fake name server + broker listens on 127.0.0.1 (free port), answers just enough for the
producer and consumers to go through routing, heartbeats, sends, pulls, offsets, locks and a
send-back, and stores the first frames of every request code it sees. See README.md.
"""

import json
import os
import socket
import struct
import sys
import threading
import time
import zlib

from rocketmq.client import Message, Producer, PushConsumer

FRAMES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "frames")
FRAMES_PER_KEY = 2  # per (code, topic), so pulls of both TopicTest and %RETRY% are kept
FRAMES_PER_CODE = 4
TOPIC = "TopicTest"
GROUP = "GroupCapture"
ORDERLY_GROUP = "GroupCaptureOrderly"
QUEUES = 4

CODE_NAMES = {
    10: "send_message", 11: "pull_message", 14: "query_consumer_offset",
    15: "update_consumer_offset", 29: "search_offset_by_timestamp", 30: "get_max_offset",
    31: "get_min_offset", 34: "heart_beat", 35: "unregister_client",
    36: "consumer_send_msg_back", 38: "get_consumer_list_by_group", 41: "lock_batch_mq",
    42: "unlock_batch_mq", 105: "get_routeinfo_by_topic", 310: "send_message_v2",
    320: "send_batch_message",
}


class FakeBroker:
    def __init__(self):
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.port = self.listener.getsockname()[1]
        self.lock = threading.Lock()
        self.saved = {}
        self.saved_per_key = {}
        self.client_ids = {}
        self.delivered = False
        self.running = True

    def address(self):
        return "127.0.0.1:%d" % self.port

    def serve(self):
        self.listener.settimeout(0.2)
        while self.running:
            try:
                conn, _ = self.listener.accept()
            except socket.timeout:
                continue
            threading.Thread(target=self.connection, args=(conn,), daemon=True).start()

    def connection(self, conn):
        send_lock = threading.Lock()
        conn.settimeout(0.5)
        try:
            while self.running:
                prefix = self.read_exact(conn, 4)
                if prefix is None:
                    return
                (total,) = struct.unpack(">i", prefix)
                rest = self.read_exact(conn, total)
                if rest is None:
                    return
                self.handle(conn, send_lock, prefix + rest)
        finally:
            conn.close()

    def read_exact(self, conn, n):
        data = b""
        while len(data) < n:
            try:
                chunk = conn.recv(n - len(data))
            except socket.timeout:
                if not self.running:
                    return None
                continue
            except OSError:
                return None
            if not chunk:
                return None
            data += chunk
        return data

    def handle(self, conn, send_lock, frame):
        (word,) = struct.unpack(">i", frame[4:8])
        header_len = word & 0xFFFFFF
        header = json.loads(frame[8:8 + header_len])
        body = frame[8 + header_len:]
        code = header["code"]
        if header.get("flag", 0) & 1:
            return  # a response to something we never send
        ext = header.get("extFields") or {}
        self.save(code, ext.get("topic"), frame)
        reply = self.answer(code, ext, body)
        if reply is None or header.get("flag", 0) & 2:
            return
        delay, rcode, rext, rbody = reply
        response = {"code": rcode, "language": "JAVA", "version": 0,
                    "opaque": header["opaque"], "flag": 1, "remark": "",
                    "extFields": {k: str(v) for k, v in rext.items()}}
        payload = json.dumps(response).encode()
        out = struct.pack(">ii", 4 + len(payload) + len(rbody), len(payload)) + payload + rbody

        def send():
            with send_lock:
                try:
                    conn.sendall(out)
                except OSError:
                    pass

        if delay:
            threading.Timer(delay, send).start()
        else:
            send()

    def save(self, code, topic, frame):
        name = CODE_NAMES.get(code, "code_%d" % code)
        with self.lock:
            count = self.saved.get(code, 0)
            per_key = self.saved_per_key.get((code, topic), 0)
            # Sends: sync, oneway, batch; heartbeats and unregistrations: one per group.
            key_limit = 3 if code in (10, 34, 35) else FRAMES_PER_KEY
            if count >= FRAMES_PER_CODE or per_key >= key_limit:
                return
            self.saved[code] = count + 1
            self.saved_per_key[(code, topic)] = per_key + 1
        with open(os.path.join(FRAMES_DIR, "%s_%d.bin" % (name, count)), "wb") as out:
            out.write(frame)

    def answer(self, code, ext, body):
        if code == 105:
            route = {
                "orderTopicConf": "",
                "queueDatas": [{"brokerName": "broker-a", "readQueueNums": QUEUES,
                                "writeQueueNums": QUEUES, "perm": 6, "topicSynFlag": 0}],
                "brokerDatas": [{"cluster": "DefaultCluster", "brokerName": "broker-a",
                                 "brokerAddrs": {"0": self.address()}}],
                "filterServerTable": {},
            }
            return 0, 0, {}, json.dumps(route).encode()
        if code in (10, 310, 320):
            queue = ext.get("queueId", ext.get("e", "0"))
            return 0, 0, {"msgId": "7F00000100002A9F0000000000000000", "queueId": queue,
                          "queueOffset": 0}, b""
        if code == 34:
            data = json.loads(body)
            for consumer in data.get("consumerDataSet", []):
                self.client_ids[consumer["groupName"]] = data["clientID"]
            return 0, 0, {}, b""
        if code == 38:
            client = self.client_ids.get(ext.get("consumerGroup"))
            return 0, 0, {}, json.dumps({"consumerIdList": [client] if client else []}).encode()
        if code == 14:
            return 0, 22, {}, b""
        if code in (30, 31, 29):
            return 0, 0, {"offset": 0}, b""
        if code == 41:
            request = json.loads(body)
            return 0, 0, {}, json.dumps({"lockOKMQSet": request.get("mqSet", [])}).encode()
        if code == 11:
            offset = int(ext.get("queueOffset", 0))
            queue = int(ext.get("queueId", 0))
            pull_ext = {"suggestWhichBrokerId": 0, "minOffset": 0, "maxOffset": offset,
                        "nextBeginOffset": offset}
            with self.lock:
                deliver = (not self.delivered and ext.get("topic") == TOPIC
                           and ext.get("consumerGroup") == GROUP)
                self.delivered = self.delivered or deliver
            if deliver:
                pull_ext["maxOffset"] = offset + 1
                pull_ext["nextBeginOffset"] = offset + 1
                return 0, 0, pull_ext, record(TOPIC, queue, offset, self.port)
            return 1.0, 19, pull_ext, b""
        return 0, 0, {}, b""


def record(topic, queue_id, queue_offset, port):
    """One CommitLog record (the layout in broker/store/src/record.rs) so the consumer has something to fail on."""
    body = b"capture body"
    props = b"TAGS\x01TagA\x02KEYS\x01key-1\x02UNIQ_KEY\x017F0000010001000000000000000000AA\x02"
    topic = topic.encode()
    host = socket.inet_aton("127.0.0.1")
    now = int(time.time() * 1000)
    fields = struct.pack(">iiiqqiq", zlib.crc32(body) & 0x7FFFFFFF, queue_id, 0,
                         queue_offset, 0, 0, now)
    fields += host + struct.pack(">i", 40000) + struct.pack(">q", now)
    fields += host + struct.pack(">i", port) + struct.pack(">iq", 0, 0)
    fields += struct.pack(">i", len(body)) + body + struct.pack(">b", len(topic)) + topic
    fields += struct.pack(">h", len(props)) + props
    total = 8 + len(fields)
    return struct.pack(">iI", total, 0xDAA320A7) + fields


def wait_for(predicate, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def main():
    os.makedirs(FRAMES_DIR, exist_ok=True)
    broker = FakeBroker()
    threading.Thread(target=broker.serve, daemon=True).start()
    print("fake broker on", broker.address())

    producer = Producer("GroupCaptureProducer")
    producer.set_namesrv_addr(broker.address())
    producer.start()
    msg = Message(TOPIC)
    msg.set_tags("TagA")
    msg.set_keys("key-1")
    msg.set_property("custom", "value")
    msg.set_body("hello from the C++ client")
    print("send_sync", producer.send_sync(msg))
    producer.send_oneway(msg)
    batch = []
    for i in range(3):
        item = Message(TOPIC)
        item.set_tags("TagB")
        item.set_keys("batch-%d" % i)
        item.set_body("batch body %d" % i)
        batch.append(item)
    print("send_batch", producer.send_batch(batch))
    # The producer stays up: the consumers share its client instance, so their heartbeats
    # also carry the producer group.

    received = []

    def fail_once(message):
        received.append(message.id)
        raise RuntimeError("capture: ask for RECONSUME_LATER")

    consumer = PushConsumer(GROUP)
    consumer.set_namesrv_addr(broker.address())
    consumer.subscribe(TOPIC, fail_once, "TagA || TagB")
    consumer.start()
    orderly = PushConsumer(ORDERLY_GROUP, orderly=True)
    orderly.set_namesrv_addr(broker.address())
    orderly.subscribe(TOPIC, lambda message: None)
    orderly.start()
    wanted = {11, 34, 36, 38, 41}
    ok = wait_for(lambda: wanted.issubset(broker.saved), 30)
    # The C++ client persists offsets every 5 s: give it one round.
    wait_for(lambda: 15 in broker.saved, 12)
    orderly.shutdown()
    consumer.shutdown()
    producer.shutdown()
    wait_for(lambda: 35 in broker.saved, 5)
    broker.running = False
    print("received", received)
    print("saved codes", sorted(broker.saved))
    if not ok:
        print("missing codes", sorted(wanted - set(broker.saved)), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
