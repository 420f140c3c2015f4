"""What a new master needs survives a failover: consumer offsets committed on the master (their
state log records travel with the CommitLog), the delay levels' progress (delayed messages
delivered before the failover are not delivered again, those in flight are delivered once; the
same for timed messages, whose fired marks travel in the state log),
group deletions reach every member, and a commit sent to a replica is refused with 14
SERVICE_NOT_AVAILABLE naming the master."""

import collections

import pytest

import remoting
import wire
from quiver_e2e import wait_until

TOPIC = "StateTopic"
GROUP = "StateConsumers"
QUEUES = 4
QUERY_CONSUMER_OFFSET = 14
DELETE_SUBSCRIPTIONGROUP = 207
SYSTEM_BUSY = 2
SEND_MESSAGE = 10
DELAYED_TOPIC = "DelayedTopic"
TIMED_TOPIC = "TimedTopic"


def commit(addr, queue, offset, group=GROUP):
    """(code, remark) of UPDATE_CONSUMER_OFFSET."""
    code, remark, _, _ = remoting.call(addr, wire.UPDATE_CONSUMER_OFFSET, {
        "consumerGroup": group, "topic": TOPIC, "queueId": queue, "commitOffset": offset})
    return code, remark or ""


def query(addr, queue, group=GROUP):
    """(code, committed offset or None) of QUERY_CONSUMER_OFFSET without a zero default."""
    code, _, ext, _ = remoting.call(addr, QUERY_CONSUMER_OFFSET, {
        "consumerGroup": group, "topic": TOPIC, "queueId": queue, "setZeroIfNotFound": "false"})
    return code, (int(ext["offset"]) if code == wire.SUCCESS else None)


def fill(master, per_queue):
    for i in range(per_queue * QUEUES):
        code, remark, _, _ = wire.send(master.addr, TOPIC, f"k{i}", f"m{i}", queue_id=i % QUEUES)
        assert code == wire.SUCCESS, f"send {i}: code {code} {remark}"


def started(group):
    group.start()
    master = group.master()
    wire.create_topic(master.addr, TOPIC, QUEUES)
    return master


@pytest.mark.timeout(240)
def test_commits_answered_before_a_kill9_of_the_master_survive_the_failover(group):
    master = started(group)
    _, epoch, _ = master.view()
    fill(master, 100)
    # Committed round by round, so each queue's last commit comes just before the kill.
    last = {queue: 0 for queue in range(QUEUES)}
    for step in range(1, 11):
        for queue in range(QUEUES):
            code, remark = commit(master.addr, queue, step * 9)
            assert code == wire.SUCCESS, f"commit {queue}: code {code} {remark}"
            last[queue] = step * 9
    master.kill9()
    new = group.wait_writable(exclude=(master.id,), min_epoch=epoch + 1, timeout=60)
    after = {queue: query(new.addr, queue)[1] for queue in range(QUEUES)}
    redelivered = sum(last[q] - (after[q] or 0) for q in range(QUEUES))
    print(f"failover {master} -> {new}: {sum(last.values())} committed, "
          f"{redelivered} re-delivered")
    assert after == last
    group.assert_no_panic()


@pytest.mark.timeout(240)
def test_a_commit_or_group_deletion_sent_to_a_replica_is_refused_naming_the_master(group):
    master = started(group)
    fill(master, 5)
    replica = next(m for m in group.members if m is not master)
    code, remark = commit(replica.addr, 0, 3)
    assert code == wire.SERVICE_NOT_AVAILABLE, f"commit on {replica}: code {code} {remark}"
    assert "master" in remark and master.addr in remark, remark
    code, remark, _, _ = remoting.call(replica.addr, DELETE_SUBSCRIPTIONGROUP, {
        "groupName": GROUP, "cleanOffset": "true"})
    assert code == wire.SERVICE_NOT_AVAILABLE, f"delete on {replica}: code {code} {remark}"
    assert master.addr in (remark or ""), remark
    # The master took neither.
    assert query(master.addr, 0)[0] != wire.SUCCESS


@pytest.mark.timeout(240)
def test_a_group_deletion_reaches_every_replica(group):
    master = started(group)
    fill(master, 5)
    for queue in range(QUEUES):
        assert commit(master.addr, queue, 4)[0] == wire.SUCCESS
    replicas = [m for m in group.members if m is not master]
    for m in replicas:
        wait_until(lambda m=m: all(query(m.addr, q) == (wire.SUCCESS, 4) for q in range(QUEUES)),
                   30, f"{m} to hold the group's offsets")
    code, remark, _, _ = remoting.call(master.addr, DELETE_SUBSCRIPTIONGROUP, {
        "groupName": GROUP, "cleanOffset": "true"})
    assert code == wire.SUCCESS, f"delete: code {code} {remark}"
    # A replica without the group's offsets refuses the query (ask the master).
    for m in replicas:
        wait_until(lambda m=m: all(query(m.addr, q)[0] == SYSTEM_BUSY for q in range(QUEUES)),
                   30, f"{m} to drop the deleted group's offsets")


def send_delayed(addr, key, level, queue):
    """A SEND_MESSAGE with delay level `level`; the master answers it once replicated."""
    code, remark, _, _ = remoting.call(addr, SEND_MESSAGE, {
        "producerGroup": "quiver-state-delayed", "topic": DELAYED_TOPIC,
        "defaultTopic": "TBW102", "defaultTopicQueueNums": QUEUES, "queueId": queue,
        "sysFlag": 0, "bornTimestamp": 0, "flag": 0,
        "properties": f"KEYS\x01{key}\x02DELAY\x01{level}\x02", "reconsumeTimes": 0,
        "unitMode": "false", "batch": "false"}, key.encode())
    assert code == wire.SUCCESS, f"delayed send {key}: code {code} {remark}"


def delivered(member):
    """How often each key reached the delayed topic's queues on `member`."""
    return collections.Counter(r["key"] for r in wire.read_topic(member.addr, DELAYED_TOPIC, QUEUES))


@pytest.mark.timeout(240)
def test_delayed_messages_are_delivered_once_across_a_failover(group):
    master = started(group)
    _, epoch, _ = master.view()
    wire.create_topic(master.addr, DELAYED_TOPIC, QUEUES)
    before = [f"before-{i}" for i in range(40)]
    for i, key in enumerate(before):
        send_delayed(master.addr, key, 1, i % QUEUES)  # level 1: 1 s
    # Delivered by the master, and the delivered messages held by every member.
    for m in group.members:
        wait_until(lambda m=m: set(delivered(m)) >= set(before), 60, f"{m} to serve the first batch")
    in_flight = [f"in-flight-{i}" for i in range(40)]
    for i, key in enumerate(in_flight):
        send_delayed(master.addr, key, 2, i % QUEUES)  # level 2: 5 s, due after the failover
    master.kill9()
    new = group.wait_writable(exclude=(master.id,), min_epoch=epoch + 1, timeout=60)
    wait_until(lambda: set(delivered(new)) >= set(in_flight), 60, f"{new} to deliver the batch in flight")
    counts = delivered(new)
    again = {key: n for key, n in counts.items() if n > 1}
    print(f"delayed across failover {master} -> {new}: {len(before)} delivered before, "
          f"{len(in_flight)} in flight, {sum(n - 1 for n in again.values())} delivered again")
    assert not again, f"delivered more than once: {sorted(again)[:10]}"
    assert set(counts) == set(before) | set(in_flight)


def send_timed(addr, key, delay_sec, queue):
    """A SEND_MESSAGE with TIMER_DELAY_SEC `delay_sec`; the master answers it once replicated."""
    code, remark, _, _ = remoting.call(addr, SEND_MESSAGE, {
        "producerGroup": "quiver-state-timed", "topic": TIMED_TOPIC,
        "defaultTopic": "TBW102", "defaultTopicQueueNums": QUEUES, "queueId": queue,
        "sysFlag": 0, "bornTimestamp": 0, "flag": 0,
        "properties": f"KEYS\x01{key}\x02TIMER_DELAY_SEC\x01{delay_sec}\x02", "reconsumeTimes": 0,
        "unitMode": "false", "batch": "false"}, key.encode())
    assert code == wire.SUCCESS, f"timed send {key}: code {code} {remark}"


def timed_delivered(member):
    """How often each key reached the timed topic's queues on `member`."""
    return collections.Counter(r["key"] for r in wire.read_topic(member.addr, TIMED_TOPIC, QUEUES))


@pytest.mark.timeout(240)
def test_timed_messages_are_delivered_once_across_a_failover(group):
    master = started(group)
    _, epoch, _ = master.view()
    wire.create_topic(master.addr, TIMED_TOPIC, QUEUES)
    before = [f"before-{i}" for i in range(40)]
    for i, key in enumerate(before):
        send_timed(master.addr, key, 1, i % QUEUES)
    # Fired by the master, and the fired messages held by every member.
    for m in group.members:
        wait_until(lambda m=m: set(timed_delivered(m)) >= set(before), 60, f"{m} to serve the first timers")
    in_flight = [f"in-flight-{i}" for i in range(40)]
    for i, key in enumerate(in_flight):
        send_timed(master.addr, key, 6, i % QUEUES)  # due after the failover
    master.kill9()
    new = group.wait_writable(exclude=(master.id,), min_epoch=epoch + 1, timeout=60)
    wait_until(lambda: set(timed_delivered(new)) >= set(in_flight), 60, f"{new} to fire the timers in flight")
    counts = timed_delivered(new)
    again = {key: n for key, n in counts.items() if n > 1}
    print(f"timed across failover {master} -> {new}: {len(before)} fired before, "
          f"{len(in_flight)} in flight, {sum(n - 1 for n in again.values())} fired again")
    assert not again, f"fired more than once: {sorted(again)[:10]}"
    assert set(counts) == set(before) | set(in_flight)
    group.assert_no_panic()
