"""Raw remoting calls of the replication suite (e2e/common/remoting.py frames): sends that show
the broker's own code and remark, pulls that read one member's queue from offset 0 exactly as
it stores it, the group's status (QUIVER_REPLICATION_STATUS), QUIVER_SWITCHOVER and the
consensus message that asks a member to campaign."""

import json
import struct
import time

import remoting

SEND_MESSAGE = 10
PULL_MESSAGE = 11
UPDATE_CONSUMER_OFFSET = 15
GET_MAX_OFFSET = 30
GET_MIN_OFFSET = 31
QUIVER_CONSENSUS = 30002
QUIVER_REPLICATION_STATUS = 30003
QUIVER_SWITCHOVER = 30004

SUCCESS = 0
FLUSH_SLAVE_TIMEOUT = 12
SERVICE_NOT_AVAILABLE = 14
PULL_NOT_FOUND = 19
PULL_RETRY_IMMEDIATELY = 20
PULL_OFFSET_MOVED = 21

MESSAGE_MAGIC = 0xDAA320A7


def send(addr, topic, key, body, queue_id=0, timeout=10):
    """SEND_MESSAGE as a client would; (code, remark, queue id, queue offset). code 0 is
    SEND_OK; the queue fields are -1 when the answer has none."""
    ext = {
        "producerGroup": "quiver-replication-raw",
        "topic": topic,
        "defaultTopic": "TBW102",
        "defaultTopicQueueNums": 4,
        "queueId": queue_id,
        "sysFlag": 0,
        "bornTimestamp": int(time.time() * 1000),
        "flag": 0,
        "properties": f"KEYS\x01{key}\x02",
        "reconsumeTimes": 0,
        "unitMode": "false",
        "batch": "false",
    }
    code, remark, reply, _ = remoting.call(addr, SEND_MESSAGE, ext, body.encode(), timeout=timeout)
    return code, remark or "", int(reply.get("queueId", -1)), int(reply.get("queueOffset", -1))


def create_topic(addr, topic, queues=4):
    code, remark, _, _ = remoting.call(addr, remoting.UPDATE_AND_CREATE_TOPIC, {
        "topic": topic, "readQueueNums": queues, "writeQueueNums": queues, "perm": 6})
    assert code == 0, f"create {topic} on {addr}: code {code} {remark}"


def commit_offsets(addr, group, topic, queues, offset=0):
    """A new group then starts from `offset` (the C++ push consumer of a group with no
    committed offset starts at the end of each queue)."""
    for queue in range(queues):
        code, remark, _, _ = remoting.call(addr, UPDATE_CONSUMER_OFFSET, {
            "consumerGroup": group, "topic": topic, "queueId": queue, "commitOffset": offset})
        assert code == 0, f"commit {group} {topic}:{queue} on {addr}: code {code} {remark}"


def max_offset(addr, topic, queue):
    code, remark, ext, _ = remoting.call(addr, GET_MAX_OFFSET, {"topic": topic, "queueId": queue})
    assert code == 0, f"max offset of {topic}:{queue} on {addr}: code {code} {remark}"
    return int(ext["offset"])


def min_offset(addr, topic, queue):
    code, remark, ext, _ = remoting.call(addr, GET_MIN_OFFSET, {"topic": topic, "queueId": queue})
    assert code == 0, f"min offset of {topic}:{queue} on {addr}: code {code} {remark}"
    return int(ext["offset"])


def status(addr, timeout=3):
    """QUIVER_REPLICATION_STATUS: the group as the member at `addr` sees it (dict), or None."""
    try:
        code, _, _, body = remoting.call(addr, QUIVER_REPLICATION_STATUS, {}, timeout=timeout)
    except OSError:
        return None
    if code != 0 or not body:
        return None
    return json.loads(body)


def switchover(addr, target, timeout_ms=1000):
    """QUIVER_SWITCHOVER against the master; (code, remark)."""
    code, remark, _, _ = remoting.call(addr, QUIVER_SWITCHOVER, {
        "targetReplicaId": target, "timeoutMs": timeout_ms}, timeout=30)
    return code, remark or ""


def campaign(addr, broker_name, node):
    """Asks member `node` (at `addr`) to campaign for the group's consensus leadership: the
    message a consensus leader sends when it hands leadership over (QUIVER_CONSENSUS kind
    "elect"). The others grant it only once the current leader has led for a lease (1 s);
    mastership does not move. (code, remark)."""
    code, remark, _, _ = remoting.call(addr, QUIVER_CONSENSUS, {
        "brokerName": broker_name, "kind": "elect", "from": node},
        body=json.dumps({"node": node}).encode(), timeout=10)
    return code, remark or ""


def decode_records(data):
    """The messages of a PULL_MESSAGE body: dicts with queue, offset, key, body, topic."""
    out = []
    pos = 0
    while pos + 8 <= len(data):
        total, magic = struct.unpack_from(">iI", data, pos)
        assert magic == MESSAGE_MAGIC, f"bad magic {magic:#x} at {pos}"
        rec = data[pos:pos + total]
        queue_id, = struct.unpack_from(">i", rec, 12)
        queue_offset, physical = struct.unpack_from(">qq", rec, 20)
        sys_flag, = struct.unpack_from(">i", rec, 36)
        at = 48
        at += 20 if sys_flag & 0x10 else 8  # born host
        at += 8  # store timestamp
        at += 20 if sys_flag & 0x20 else 8  # store host
        at += 4 + 8  # reconsume times, prepared transaction offset
        body_len, = struct.unpack_from(">i", rec, at)
        at += 4
        body = rec[at:at + body_len]
        at += body_len
        topic_len = rec[at]
        at += 1
        topic = rec[at:at + topic_len].decode()
        at += topic_len
        props_len, = struct.unpack_from(">h", rec, at)
        at += 2
        props = rec[at:at + props_len].decode(errors="replace")
        fields = dict(p.split("\x01", 1) for p in props.split("\x02") if "\x01" in p)
        out.append({"queue": queue_id, "offset": queue_offset, "physical": physical,
                    "key": fields.get("KEYS", ""), "body": body.decode(errors="replace"),
                    "topic": topic})
        pos += total
    return out


def read_queue(addr, topic, queue, group="quiver-replication-checker", batch=256, timeout=10,
               start=0):
    """Every message the member at `addr` serves from `topic`:`queue`, from offset `start` (0
    unless said) to the end (raw PULL_MESSAGE, no group state involved: the checker's own
    read)."""
    out = []
    offset = start
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        code, remark, ext, body = remoting.call(addr, PULL_MESSAGE, {
            "consumerGroup": group, "topic": topic, "queueId": queue, "queueOffset": offset,
            "maxMsgNums": batch, "sysFlag": 0, "commitOffset": -1, "suspendTimeoutMillis": 0,
            "subVersion": 0}, timeout=timeout)
        if code == SUCCESS:
            records = decode_records(body)
            assert records, f"{addr} {topic}:{queue}@{offset}: FOUND without records"
            for r in records:
                assert r["offset"] >= offset, (addr, topic, queue, offset, r)
            out.extend(records)
            offset = int(ext.get("nextBeginOffset", records[-1]["offset"] + 1))
        elif code == PULL_RETRY_IMMEDIATELY:
            offset = int(ext["nextBeginOffset"])
        elif code == PULL_NOT_FOUND:
            return out
        elif code == PULL_OFFSET_MOVED:
            raise AssertionError(f"{addr} {topic}:{queue}: offset {offset} moved to "
                                 f"{ext.get('nextBeginOffset')} ({remark})")
        else:
            raise AssertionError(f"{addr} {topic}:{queue}@{offset}: pull code {code} {remark}")
    raise AssertionError(f"reading {topic}:{queue} from {addr} took over 60 s")


def read_topic(addr, topic, queues):
    """Every message of the topic the member at `addr` serves, queue by queue."""
    return [r for q in range(queues) for r in read_queue(addr, topic, q)]
