"""Committed consumer offsets are as durable as messages: a group consumes and commits (raw
PULL_MESSAGE and UPDATE_CONSUMER_OFFSET, each answered), the standalone broker is killed
with kill -9 at once after the last commit answer and restarted, and the group re-receives
nothing it had committed. In sync flush mode the commit is flushed before its answer; in
async mode it is in the page cache, which a kill -9 keeps. The queues are consumed round by
round, so every queue's last commit comes within milliseconds of the kill, after the last
snapshot of consumerOffset.json (every 200 ms here): what survives comes from the state log."""

import struct

import pytest

import remoting

TOPIC = "DurableOffsets"
GROUP = "durable-offsets"
QUEUES = 4
MESSAGES = 2000
SEND_MESSAGE = 10
PULL_MESSAGE = 11
QUERY_CONSUMER_OFFSET = 14
UPDATE_CONSUMER_OFFSET = 15
PULL_FOUND = 0
MESSAGE_MAGIC = 0xDAA320A7


def send(addr, queue, body):
    code, remark, _, _ = remoting.call(addr, SEND_MESSAGE, {
        "producerGroup": "durable-offsets-producer", "topic": TOPIC, "defaultTopic": "TBW102",
        "defaultTopicQueueNums": QUEUES, "queueId": queue, "sysFlag": 0, "bornTimestamp": 0,
        "flag": 0, "properties": "", "reconsumeTimes": 0, "unitMode": "false", "batch": "false",
    }, body.encode())
    assert code == 0, f"send to {TOPIC}:{queue}: code {code} {remark}"


def queue_offsets(body):
    """The queue offsets of a PULL_MESSAGE body's records."""
    out, pos = [], 0
    while pos + 8 <= len(body):
        total, magic = struct.unpack_from(">iI", body, pos)
        assert magic == MESSAGE_MAGIC, f"bad magic {magic:#x} at {pos}"
        out.append(struct.unpack_from(">q", body, pos + 20)[0])
        pos += total
    return out


def pull(addr, queue, offset, batch=32):
    """Queue offsets of up to `batch` messages from `offset` (empty when none)."""
    code, remark, _, body = remoting.call(addr, PULL_MESSAGE, {
        "consumerGroup": GROUP, "topic": TOPIC, "queueId": queue, "queueOffset": offset,
        "maxMsgNums": batch, "sysFlag": 0, "commitOffset": -1, "suspendTimeoutMillis": 0,
        "subVersion": 0})
    return queue_offsets(body) if code == PULL_FOUND else []


def commit(addr, queue, offset):
    code, remark, _, _ = remoting.call(addr, UPDATE_CONSUMER_OFFSET, {
        "consumerGroup": GROUP, "topic": TOPIC, "queueId": queue, "commitOffset": offset})
    assert code == 0, f"commit {queue}@{offset}: code {code} {remark}"


def committed(addr, queue):
    code, remark, ext, _ = remoting.call(addr, QUERY_CONSUMER_OFFSET, {
        "consumerGroup": GROUP, "topic": TOPIC, "queueId": queue, "setZeroIfNotFound": "false"})
    assert code == 0, f"query {queue}: code {code} {remark}"
    return int(ext["offset"])


@pytest.mark.parametrize("flush_mode", ["sync", "async"])
def test_committed_offsets_survive_kill9(make_broker, flush_mode):
    broker = make_broker(extra=["--flush-mode", flush_mode])
    broker.start()
    for i in range(MESSAGES):
        send(broker.addr, i % QUEUES, f"m{i}")
    # Consume most of each queue, committing after every batch, as a consumer would.
    last = {queue: 0 for queue in range(QUEUES)}
    while min(last.values()) < MESSAGES // QUEUES - 20:
        for queue in range(QUEUES):
            received = pull(broker.addr, queue, last[queue])
            assert received, f"queue {queue} ran dry at {last[queue]}"
            last[queue] = received[-1] + 1
            commit(broker.addr, queue, last[queue])
    broker.kill9()
    broker.start()
    after = {queue: committed(broker.addr, queue) for queue in range(QUEUES)}
    # What the group would receive again: from its offset after the restart to the last commit.
    redelivered = sum(max(0, last[queue] - after[queue]) for queue in range(QUEUES))
    print(f"flush {flush_mode}: {sum(last.values())} of {MESSAGES} committed, "
          f"{redelivered} re-delivered after kill -9")
    assert after == last
